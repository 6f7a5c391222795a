// The jobs (jobs/): what the CLI, the policy and the Python package all run, called here as the
// policy calls them: typed options in, a typed report out, one rank, nothing printed. Small
// torch files from tests/fixtures (real torch.save output).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"
#include "jobs/batch.h"
#include "jobs/compress.h"
#include "jobs/convert.h"
#include "jobs/shrink.h"
#include "jobs/strip.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

// A model folder: the model, an optimizer file (training-only) and a config.
void ModelFolder(const test::TempDir& d, const std::string& name) {
  fs::create_directories(d.Path(name));
  d.Put(name + "/pytorch_model.bin", test::ReadFixture("small.pt"));
  d.Put(name + "/optimizer.pt", test::ReadFixture("small.pt"));
  d.Put(name + "/config.json", "{\"model_type\": \"tiny\"}");
}

template <typename Fn>
bool ThrowsUsageError(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError&) {
    return true;
  } catch (const Error&) {
    return false;
  }
  return false;
}

TEST(Jobs, UsageProblemsAreUsageErrors) {
  test::TempDir d;
  const std::string a = d.Put("a.pt", test::ReadFixture("small.pt"));
  const std::string b = d.Put("b.pt", test::ReadFixture("small.pt"));
  jobs::ConvertJobOptions co;
  co.dtype = "bf16";
  co.output_file = d.Path("out.pt");
  co.spread = false;
  EXPECT_TRUE(ThrowsUsageError([&] { jobs::Convert({a, b}, co); }));
  EXPECT_TRUE(ThrowsUsageError([&] { jobs::Convert({}, co); }));
  jobs::ShrinkJobOptions so;
  so.spread = false;
  EXPECT_TRUE(ThrowsUsageError([&] { jobs::Shrink(so); }));
  so.files = {a, b};
  so.output = d.Path("out.pt");
  EXPECT_TRUE(ThrowsUsageError([&] { jobs::Shrink(so); }));
  jobs::CompressJobOptions zo;
  zo.paths = {a, b};
  zo.engine.output = d.Path("out.ckz");
  zo.spread = false;
  EXPECT_TRUE(ThrowsUsageError([&] { jobs::Compress(zo); }));
  ModelFolder(d, "run");
  jobs::StripJobOptions to;
  to.paths = {d.Path("run")};
  to.output = d.Path("stripped");
  to.delete_files = true;
  to.spread = false;
  EXPECT_TRUE(ThrowsUsageError([&] { jobs::Strip(to); }));
  // Nothing was written by any of them.
  EXPECT_FALSE(fs::exists(d.Path("out.pt")));
  EXPECT_FALSE(fs::exists(d.Path("out.ckz")));
  EXPECT_FALSE(fs::exists(d.Path("stripped")));
}

TEST(Jobs, ConvertCopiesOrLeavesOutTrainingFilesAsAsked) {
  test::TempDir d;
  ModelFolder(d, "run");
  jobs::ConvertJobOptions o;
  o.dtype = "bf16";
  o.spread = false;
  o.output_dir = d.Path("copied");
  jobs::ConvertReport copied = jobs::Convert({d.Path("run")}, o);
  ASSERT_TRUE(copied.ok());
  ASSERT_EQ(copied.files.size(), 1u);
  EXPECT_EQ(fs::path(copied.files[0].input).filename(), "pytorch_model.bin");
  EXPECT_GT(copied.files[0].result.converted, 0u);
  EXPECT_TRUE(fs::exists(d.Path("copied/optimizer.pt")));
  EXPECT_TRUE(fs::exists(d.Path("copied/config.json")));

  o.output_dir = d.Path("left_out");
  o.leave_out_training_files = true;
  jobs::ConvertReport left = jobs::Convert({d.Path("run")}, o);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left.files.size(), 1u);
  EXPECT_FALSE(fs::exists(d.Path("left_out/optimizer.pt")));
  EXPECT_TRUE(fs::exists(d.Path("left_out/config.json")));
  EXPECT_EQ(test::ReadBytes(d.Path("left_out/pytorch_model.bin")),
            test::ReadBytes(d.Path("copied/pytorch_model.bin")));
}

TEST(Jobs, ConvertInPlaceRewritesOnlyWhatItFinds) {
  test::TempDir d;
  ModelFolder(d, "run");
  jobs::ConvertJobOptions o;
  o.dtype = "bf16";
  o.spread = false;
  o.skip = [](const std::string& f) { return f.ends_with("pytorch_model.bin"); };
  EXPECT_TRUE(jobs::InPlaceTargets({d.Path("run")}, o).empty())
      << "the model is skipped and optimizer.pt is training state";
  o.skip = nullptr;
  const std::string before = test::ReadBytes(d.Path("run/optimizer.pt"));
  jobs::ConvertReport r = jobs::ConvertInPlace({d.Path("run")}, o);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.files.size(), 1u);
  EXPECT_LT(r.after, r.before);
  EXPECT_EQ(fs::file_size(d.Path("run/pytorch_model.bin")), r.after);
  EXPECT_EQ(test::ReadBytes(d.Path("run/optimizer.pt")), before);
}

TEST(Jobs, ShrinkLeavesOutWhatSkipNames) {
  test::TempDir d;
  ModelFolder(d, "run");
  fs::create_directories(d.Path("run/export"));
  d.Put("run/export/model.pt", test::ReadFixture("small.pt"));
  jobs::ShrinkJobOptions o;
  o.checkpoint_dir = d.Path("run");
  o.engine.dry_run = true;
  o.spread = false;
  o.skip = [&](const std::string& f) { return f.starts_with(d.Path("run/export")); };
  jobs::ShrinkReport r = jobs::Shrink(o);
  ASSERT_TRUE(r.reports);
  std::vector<std::string> names;
  for (const jobs::ShrunkFile& f : r.files) {
    EXPECT_TRUE(f.error.empty()) << f.error;
    names.push_back(fs::path(f.input).filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"optimizer.pt", "pytorch_model.bin"}));
  EXPECT_LT(r.after, r.before) << "the views leave most of the storage unused";
  EXPECT_EQ(test::ReadBytes(d.Path("run/pytorch_model.bin")), test::ReadFixture("small.pt"))
      << "a dry run writes nothing";
}

TEST(Jobs, CompressTellsOfEachPathInOrderAndFailsOnlyTheBadOne) {
  test::TempDir d;
  const std::string a = d.Put("a.pt", test::ReadFixture("small.pt"));
  const std::string b = d.Path("missing.pt");
  const std::string c = d.Put("c.pt", test::ReadFixture("small_legacy.pt"));
  jobs::CompressJobOptions o;
  o.paths = {a, b, c};
  o.spread = false;
  std::vector<std::string> told;
  jobs::CompressReport r = jobs::Compress(
      o, [&](const jobs::PathOutcome<CompressResult>& p) { told.push_back(p.input); });
  EXPECT_EQ(told, o.paths);
  ASSERT_EQ(r.paths.size(), 3u);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.paths[0].error.empty()) << r.paths[0].error;
  EXPECT_FALSE(r.paths[1].error.empty());
  EXPECT_TRUE(r.paths[2].error.empty()) << r.paths[2].error;
  EXPECT_TRUE(fs::exists(a + ".ckz"));
  EXPECT_TRUE(fs::exists(c + ".ckz"));
}

TEST(Jobs, ALocalBatchRunsEveryFileOnThisRankAndReports) {
  std::vector<std::string> files = {"x", "y", "z"};
  jobs::Batch batch(files, 2, "test", {}, SIZE_MAX, false);
  std::vector<int> results(files.size());
  std::vector<std::string> errors = batch.Run<int>(results, [&](size_t i) -> int {
    if (i == 1) Fail("no");
    return static_cast<int>(i) + 10;
  });
  EXPECT_TRUE(batch.reports());
  EXPECT_EQ(results[0], 10);
  EXPECT_EQ(results[2], 12);
  EXPECT_EQ(errors[1], "y: no");
  EXPECT_TRUE(errors[0].empty() && errors[2].empty());
}

}  // namespace
}  // namespace ckpt
