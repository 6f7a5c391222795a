// ckptool.toml: one team's checkpoint policy, committed next to the training code so that
// everyone runs the same steps with the same options (`ckptool apply`, `ckptool watch`).
//
//   version = 1                 # optional; the only version there is
//   layout = "auto"             # auto | deepspeed | hf-trainer | lightning | megatron | dcp |
//                               # plain: which completion marker a checkpoint must show
//   settle_seconds = 30         # nothing in a checkpoint changed for this long (--settle wins)
//   trust = ["myproject.*"]     # modules whose calls the pickles may make (as --trust): the
//                               #   rewriting steps and verify accept them
//   [retention]                 # as `ckptool prune` (the same planner): newest N complete
//   keep_last = 3               #   ones (>= 1), steps that are multiples of K, name globs;
//   keep_every = 1000           #   the newest complete checkpoint and whatever latest / best /
//   keep = ["*best*"]           #   a symlink points at are always kept
//   delete = true               #   delete without --yes (watch runs unattended); without it
//                               #   and without --yes, apply only says what it would delete
//   [shrink]                    # a table present = the step is on
//   patterns = ["*.pt"]         #   file-name globs (default: every torch file)
//   materialize = false
//   allow_unsafe_globals = false
//   [convert]
//   dtype = "bf16"              #   required: bf16 | fp16
//   keep = ["*norm*"]           #   tensor-name globs that stay float32
//   only = []                   #   convert only these names
//   keep_1d = false
//   include_optimizer = false   #   convert training state too (as --include-optimizer)
//   lossy = false               #   convert tensors whose values would change (as --lossy)
//   output = "beside"           #   beside: a copy in <folder>/<dtype>/ (as `ckptool convert`
//                               #   does for a folder); in_place: the files themselves
//   training_files = false      #   older name of include_optimizer
//   allow_unsafe_globals = false
//   [export]
//   to = "{name}/export"        #   relative to the root; {name} {stem} {step} (default:
//                               #   {name}/export for folders, export/{stem} for files)
//   dtype = "bf16"              #   optional
//   max_shard_size = "5GB"      #   optional, or a number of bytes
//   select = "state_dict"       #   optional
//   exclude_frozen = false      #   DeepSpeed ZeRO
//   [verify]                    # no keys
//   [strip]                     # aging steps: only checkpoints older than the newest N
//   older_than_newest = 1       #   (default 1)
//   drop = []                   #   key-path globs (default: optimizer, scheduler, RNG state...)
//   keep = []
//   delete_files = false        #   delete training-only files in folders
//   allow_unsafe_globals = false
//   [compress]
//   older_than_newest = 2       #   (default 1)
//   level = "fast"              #   fast | max
//
// Per checkpoint the steps always run in this order: shrink, convert, export, verify (when it
// completes), then strip and compress (when it has aged), whatever order the tables are
// written in, so a checkpoint ends the same whether it was processed as it landed or later.
// Every error names the file, line, column and key; unknown tables and keys are errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "kernels/float_convert.h"

namespace ckpt::policy {

// The marker a checkpoint must show before it counts as complete (completeness.h).
enum class Layout { kAuto, kDeepSpeed, kHfTrainer, kLightning, kMegatron, kDcp, kPlain };
const char* LayoutName(Layout l);

struct Retention {
  uint64_t keep_last = 1;
  uint64_t keep_every = 0;
  std::vector<std::string> keep;
  bool delete_confirmed = false;  // `delete = true`: apply and watch delete without --yes
};

struct ShrinkStep {
  std::vector<std::string> patterns;  // empty: every torch file
  bool materialize = false;
  bool allow_unsafe_globals = false;
};

struct ConvertStep {
  kernels::Half dtype = kernels::Half::kBFloat16;
  std::string dtype_name = "bf16";
  std::vector<std::string> keep;
  std::vector<std::string> only;
  bool keep_1d = false;
  bool in_place = false;
  bool training_files = false;  // include_optimizer (the key's older name sets it too)
  bool lossy = false;
  bool allow_unsafe_globals = false;
};

struct ExportStep {
  std::string to;  // empty: the default for the checkpoint's kind
  std::string dtype;
  uint64_t max_shard_size = 0;
  std::string select;
  bool exclude_frozen = false;
};

struct VerifyStep {};

// ckptool manifest: a manifest written as the checkpoint lands (checkpoint/manifest.h); the steps
// after it that rewrite files in place keep it up to date.
struct ManifestStep {
  bool tensors = true;
};

struct StripStep {
  uint64_t older_than_newest = 1;
  std::vector<std::string> drop;
  std::vector<std::string> keep;
  bool delete_files = false;
  bool allow_unsafe_globals = false;
};

struct CompressStep {
  uint64_t older_than_newest = 1;
  std::string level = "fast";
  // false: NAME.ckz replaces the checkpoint (removed once the archive is written, read back
  // and verified); true: the archive is written beside it, an output deleted with it.
  bool keep_original = false;
};

// The steps, in the order they run on a checkpoint.
enum class Step { kShrink, kConvert, kExport, kVerify, kManifest, kStrip, kCompress };
inline constexpr Step kAllSteps[] = {Step::kShrink,   Step::kConvert, Step::kExport,  Step::kVerify,
                                     Step::kManifest, Step::kStrip,   Step::kCompress};
const char* StepName(Step s);

struct Policy {
  std::string file;  // where it was read from ("" for the built-in empty policy)
  Layout layout = Layout::kAuto;
  std::optional<double> settle_seconds;
  std::vector<std::string> trust;  // module globs whose calls are accepted (--trust)
  std::optional<Retention> retention;
  std::optional<ShrinkStep> shrink;
  std::optional<ConvertStep> convert;
  std::optional<ExportStep> export_;
  std::optional<VerifyStep> verify;
  std::optional<ManifestStep> manifest;
  std::optional<StripStep> strip;
  std::optional<CompressStep> compress;

  bool Has(Step s) const;
  // A step's options as the ledger records them: a step runs again on a checkpoint when
  // these differ from what it ran with.
  nlohmann::ordered_json Options(Step s) const;
  // The policy as it was understood, every default filled in (apply --check prints it).
  nlohmann::ordered_json Describe() const;
};

// One problem in a policy file: where it is and what is wrong.
struct PolicyProblem {
  std::string file;
  uint32_t line = 0;  // 1-based; 0 when unknown
  uint32_t column = 0;
  std::string key;  // dotted, "strip.older_than_newest"; "" for the document
  std::string what;
  std::string Text() const;  // "ckptool.toml:7:21: strip.older_than_newest: must be ..."
};

// Every problem found, not just the first. what() is their texts, one per line.
class PolicyError : public Error {
 public:
  explicit PolicyError(std::vector<PolicyProblem> problems);
  const std::vector<PolicyProblem>& problems() const { return problems_; }

 private:
  std::vector<PolicyProblem> problems_;
};

// Parses and validates a policy. `file` names it in errors. Throws PolicyError.
Policy ParsePolicy(std::string_view text, const std::string& file);

// Reads `path` (ckpt::Error when it cannot be read) and parses it.
Policy LoadPolicy(const std::string& path);

// The policy file for ROOT: `given` when not empty, else ROOT/ckptool.toml when it exists,
// else "".
std::string FindPolicy(const std::string& root, const std::string& given);

}  // namespace ckpt::policy
