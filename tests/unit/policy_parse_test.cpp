// ckptool.toml: good policies read as written (defaults filled in), and every bad one is an
// error naming the file, the line and column, and the key.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "policy/apply.h"
#include "policy/policy.h"

namespace ckpt::policy {
namespace {

std::vector<std::string> ProblemsOf(const std::string& text) {
  try {
    ParsePolicy(text, "team/ckptool.toml");
  } catch (const PolicyError& e) {
    std::vector<std::string> out;
    for (const PolicyProblem& p : e.problems()) out.push_back(p.Text());
    return out;
  }
  return {};
}

// The single problem of `text`, checked to be exactly `expected`.
void ExpectProblem(const std::string& text, const std::string& expected) {
  std::vector<std::string> got = ProblemsOf(text);
  ASSERT_EQ(got.size(), 1u) << text << "\n" << (got.empty() ? "(no problem)" : got[0]);
  EXPECT_EQ(got[0], expected) << text;
}

TEST(PolicyParse, TheIssueExample) {
  Policy p = ParsePolicy(R"(
[retention]            # as prune: newest N complete ones, multiples of K, globs; best/latest kept
keep_last = 3
keep_every = 1000
keep = ["*best*"]
[shrink]               # a table present = the step is on; its keys are the command's options
patterns = ["*.pt"]
[strip]
older_than_newest = 1  # strip training state from all kept checkpoints but the newest N
delete_files = true
[convert]
dtype = "bf16"
keep = ["*norm*"]
[compress]
older_than_newest = 2
)",
                         "ckptool.toml");
  ASSERT_TRUE(p.retention);
  EXPECT_EQ(p.retention->keep_last, 3u);
  EXPECT_EQ(p.retention->keep_every, 1000u);
  EXPECT_EQ(p.retention->keep, std::vector<std::string>{"*best*"});
  ASSERT_TRUE(p.shrink);
  EXPECT_EQ(p.shrink->patterns, std::vector<std::string>{"*.pt"});
  ASSERT_TRUE(p.strip);
  EXPECT_EQ(p.strip->older_than_newest, 1u);
  EXPECT_TRUE(p.strip->delete_files);
  ASSERT_TRUE(p.convert);
  EXPECT_EQ(p.convert->dtype, kernels::Half::kBFloat16);
  EXPECT_FALSE(p.convert->in_place);
  ASSERT_TRUE(p.compress);
  EXPECT_EQ(p.compress->older_than_newest, 2u);
  EXPECT_EQ(p.compress->level, "fast");
  EXPECT_FALSE(p.export_);
  EXPECT_FALSE(p.verify);
  EXPECT_EQ(p.layout, Layout::kAuto);
  EXPECT_FALSE(p.compress->keep_original);
}

TEST(PolicyParse, EveryKeyAndDefault) {
  Policy p = ParsePolicy(R"(
version = 1
layout = "hf-trainer"
settle_seconds = 2.5
[retention]
keep_last = 1
[shrink]
materialize = true
allow_unsafe_globals = true
[convert]
dtype = "fp16"
only = ["model.*"]
keep_1d = true
output = "in_place"
training_files = true
allow_unsafe_globals = false
[export]
to = "exports/{stem}-{step}"
dtype = "bf16"
max_shard_size = "5GB"
select = "state_dict"
exclude_frozen = true
[verify]
[strip]
drop = ["optimizer*"]
keep = ["optimizer.param_groups"]
allow_unsafe_globals = true
[compress]
level = "max"
)",
                         "p.toml");
  EXPECT_EQ(p.layout, Layout::kHfTrainer);
  EXPECT_DOUBLE_EQ(*p.settle_seconds, 2.5);
  EXPECT_EQ(p.retention->keep_every, 0u);
  EXPECT_TRUE(p.retention->keep.empty());
  EXPECT_TRUE(p.shrink->patterns.empty());
  EXPECT_TRUE(p.shrink->materialize);
  EXPECT_EQ(p.convert->dtype, kernels::Half::kFloat16);
  EXPECT_EQ(p.convert->dtype_name, "fp16");
  EXPECT_TRUE(p.convert->in_place);
  EXPECT_TRUE(p.convert->training_files);
  EXPECT_TRUE(p.convert->keep_1d);
  EXPECT_EQ(p.export_->to, "exports/{stem}-{step}");
  EXPECT_EQ(p.export_->max_shard_size, 5000000000u);
  EXPECT_TRUE(p.export_->exclude_frozen);
  EXPECT_TRUE(p.verify);
  EXPECT_EQ(p.strip->older_than_newest, 1u);  // the default
  EXPECT_FALSE(p.strip->delete_files);
  EXPECT_EQ(p.compress->older_than_newest, 1u);
  EXPECT_EQ(p.compress->level, "max");
  // Options the ledger compares: a changed option makes the step run again.
  EXPECT_EQ(p.Options(Step::kConvert)["dtype"], "fp16");
  EXPECT_EQ(p.Options(Step::kStrip)["drop"][0], "optimizer*");
  EXPECT_EQ(p.Options(Step::kVerify), nlohmann::ordered_json::object());
  nlohmann::ordered_json d = p.Describe();
  ASSERT_EQ(d["steps"].size(), 6u);  // in the order they run
  EXPECT_EQ(d["steps"][0]["step"], "shrink");
  EXPECT_EQ(d["steps"][4]["step"], "strip");
  EXPECT_EQ(d["steps"][5]["step"], "compress");
}

TEST(PolicyParse, EmptyPolicyDoesNothing) {
  Policy p = ParsePolicy("", "empty.toml");
  for (Step s : kAllSteps) EXPECT_FALSE(p.Has(s));
  EXPECT_FALSE(p.retention);
}

TEST(PolicyParse, UnknownKeysAndTablesNameFileLineAndKey) {
  ExpectProblem("[shrink]\npattern = [\"*.pt\"]\n",
                "team/ckptool.toml:2:1: shrink.pattern: unknown key (did you mean 'patterns'? "
                "known: patterns, materialize, allow_unsafe_globals)");
  ExpectProblem("[shrnk]\n",
                "team/ckptool.toml:1:2: shrnk: unknown table (did you mean 'shrink'? known: "
                "retention, shrink, convert, export, verify, manifest, strip, compress)");
  ExpectProblem("keep_last = 3\n",
                "team/ckptool.toml:1:1: keep_last: unknown key (known: version, layout, "
                "settle_seconds, trust, retention, shrink, convert, export, verify, manifest, "
                "strip, compress)");
  ExpectProblem("[verify]\nstrict = true\n",
                "team/ckptool.toml:2:1: verify.strict: unknown key (known: none)");
  ExpectProblem("[retention]\nkeep_last = 2\n[retention.more]\nx = 1\n",
                "team/ckptool.toml:3:12: retention.more: unknown key (known: keep_last, "
                "keep_every, keep, delete)");
}

TEST(PolicyParse, BadValuesNameFileLineAndKey) {
  ExpectProblem("[retention]\nkeep_last = 0\n",
                "team/ckptool.toml:2:13: retention.keep_last: must be an integer >= 1 (got 0)");
  ExpectProblem("[retention]\nkeep_every = 5\n",
                "team/ckptool.toml:1:2: retention.keep_last: missing: how many of the newest "
                "complete checkpoints to keep (>= 1)");
  ExpectProblem("[retention]\nkeep_last = \"3\"\n",
                "team/ckptool.toml:2:13: retention.keep_last: must be an integer >= 1, not a "
                "string");
  ExpectProblem("[strip]\nolder_than_newest = -1\n",
                "team/ckptool.toml:2:21: strip.older_than_newest: must be an integer >= 0 (got "
                "-1)");
  ExpectProblem("[strip]\ndelete_files = \"yes\"\n",
                "team/ckptool.toml:2:16: strip.delete_files: must be true or false, not a "
                "string");
  ExpectProblem("[convert]\ndtype = \"fp8\"\n",
                "team/ckptool.toml:2:9: convert.dtype: must be one of \"bf16\", \"fp16\" (got "
                "\"fp8\")");
  ExpectProblem("[convert]\nkeep = [\"*norm*\"]\n",
                "team/ckptool.toml:1:2: convert.dtype: missing: \"bf16\" or \"fp16\"");
  ExpectProblem("[convert]\ndtype = \"bf16\"\noutput = \"elsewhere\"\n",
                "team/ckptool.toml:3:10: convert.output: must be one of \"beside\", \"in_place\" "
                "(got \"elsewhere\")");
  ExpectProblem("[shrink]\npatterns = \"*.pt\"\n",
                "team/ckptool.toml:2:12: shrink.patterns: must be an array of glob strings, not "
                "a string");
  ExpectProblem("[shrink]\npatterns = [\"*.pt\", 3]\n",
                "team/ckptool.toml:2:21: shrink.patterns[1]: must be a glob string, not an "
                "integer");
  ExpectProblem("[shrink]\npatterns = [\"\"]\n",
                "team/ckptool.toml:2:13: shrink.patterns[0]: an empty glob matches nothing");
  ExpectProblem("[compress]\nlevel = 19\n",
                "team/ckptool.toml:2:9: compress.level: must be one of \"fast\", \"max\", not an "
                "integer");
  ExpectProblem("[export]\nmax_shard_size = \"5 gigs\"\n",
                "team/ckptool.toml:2:18: export.max_shard_size: '5 gigs': unknown size unit (use "
                "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  ExpectProblem("[export]\nmax_shard_size = 0\n",
                "team/ckptool.toml:2:18: export.max_shard_size: must be a size (\"5GB\", "
                "\"500MiB\") or a number of bytes > 0, not that number");
  ExpectProblem("[export]\nto = \"hf\"\n",
                "team/ckptool.toml:2:6: export.to: must contain {name}, {stem} or {step}: every "
                "checkpoint needs its own output");
  ExpectProblem("[export]\nto = \"out/{tag}\"\n",
                "team/ckptool.toml:2:6: export.to: unknown placeholder {tag} (known: {name}, "
                "{stem}, {step})");
  ExpectProblem("[export]\nto = \"{stem}.safetensors\"\n",
                "team/ckptool.toml:2:6: export.to: 'checkpoint-100.safetensors' (for "
                "checkpoint-100) "
                "would itself look like a checkpoint to retention and the next pass; put "
                "outputs in a folder (\"export/{stem}\") or inside the checkpoint folder "
                "(\"{name}/export\")");
  ExpectProblem("version = 2\n",
                "team/ckptool.toml:1:11: version: this ckptool reads policy version 1 (got 2)");
  ExpectProblem("layout = \"tf\"\n",
                "team/ckptool.toml:1:10: layout: must be one of \"auto\", \"deepspeed\", "
                "\"hf-trainer\", \"lightning\", \"megatron\", \"dcp\", \"plain\" (got \"tf\")");
  ExpectProblem("settle_seconds = -1\n",
                "team/ckptool.toml:1:18: settle_seconds: must be a number of seconds between 0 "
                "and one year (got -1)");
  ExpectProblem("shrink = true\n",
                "team/ckptool.toml:1:10: shrink: must be a table ([shrink]), not a boolean");
}

TEST(PolicyParse, SyntaxErrorsNameFileLineAndColumn) {
  std::vector<std::string> got = ProblemsOf("[shrink]\npatterns = [\"*.pt\"\n");
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], "team/ckptool.toml:2:20: Error while parsing array: encountered end-of-file");
  got = ProblemsOf("[strip]\nkeep = []\nkeep = []\n");
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].rfind("team/ckptool.toml:3:", 0), 0u) << got[0];
  EXPECT_NE(got[0].find("keep"), std::string::npos) << got[0];
}

TEST(PolicyParse, EveryProblemIsReportedInFileOrder) {
  std::vector<std::string> got = ProblemsOf(
      "[strip]\nolder_than_newest = \"1\"\nfoo = 1\n[retention]\nkeep_last = 0\n[bogus]\n");
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].rfind("team/ckptool.toml:2:21: strip.older_than_newest:", 0), 0u) << got[0];
  EXPECT_EQ(got[1].rfind("team/ckptool.toml:3:1: strip.foo:", 0), 0u) << got[1];
  EXPECT_EQ(got[2].rfind("team/ckptool.toml:5:13: retention.keep_last:", 0), 0u) << got[2];
  EXPECT_EQ(got[3].rfind("team/ckptool.toml:6:2: bogus:", 0), 0u) << got[3];
}

}  // namespace
}  // namespace ckpt::policy

namespace ckpt::policy {
namespace {

TEST(PolicyParse, TrustAndConvertOptions) {
  Policy p = ParsePolicy(
      "trust = [\"myproject.*\"]\n[convert]\ndtype = \"fp16\"\ninclude_optimizer = true\nlossy = "
      "true\n",
      "t.toml");
  EXPECT_EQ(p.trust, std::vector<std::string>{"myproject.*"});
  ASSERT_TRUE(p.convert);
  EXPECT_TRUE(p.convert->training_files);
  EXPECT_TRUE(p.convert->lossy);
  EXPECT_EQ(p.Options(Step::kConvert)["trust"][0], "myproject.*");
  // Options a ledger recorded before these keys existed still match when they are unset.
  Policy q = ParsePolicy("[convert]\ndtype = \"bf16\"\n[verify]\n", "t.toml");
  EXPECT_FALSE(q.Options(Step::kConvert).contains("trust"));
  EXPECT_FALSE(q.Options(Step::kConvert).contains("lossy"));
  EXPECT_TRUE(q.Options(Step::kVerify).empty());
  EXPECT_THROW(ParsePolicy("trust = \"x\"\n", "t.toml"), PolicyError);
}

}  // namespace
}  // namespace ckpt::policy
