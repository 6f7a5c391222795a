// The shrink job, as `ckptool shrink` and the policy's [shrink] step both run it: torch files
// rewritten without the bytes no tensor uses (engines/shrink.h), in place or into new files.
// Which files: those named (always taken) and, in the folders named, those --patterns picks;
// with `checkpoint_dir` (the reference script's option) every file below it that holds what
// shrink rewrites. torch.distributed.checkpoint folders found are checked for damage and
// reported, not rewritten (their items are compact already).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engines/shrink.h"
#include "jobs/outcome.h"
#include "jobs/progress.h"

namespace ckpt::jobs {

struct ShrinkJobOptions {
  ShrinkOptions engine;  // dry run, trust, --materialize (output, threads, counter: per file)
  std::vector<std::string> files;                // files and folders
  std::string checkpoint_dir;                    // every shrinkable file below this folder
  std::vector<std::string> patterns;             // base-name globs for what folders hold
  std::function<bool(const std::string&)> skip;  // files left out (the policy's outputs)
  std::string output;                            // one input's output
  std::string output_dir;  // outputs below here, each at its path from its folder
  bool force = false;      // replace existing outputs
  // torch.distributed.checkpoint folders found are read whole for damage (a damaged one is
  // not reported as fine); the policy leaves that to its [verify] step.
  bool check_dcp_folders = true;
  unsigned threads = 1;
  bool spread = true;  // over the ranks of an MPI job (false: a policy step, on one rank)
  ProgressShown progress;
};

// A file shrunk, or why not (the error names the file).
using ShrunkFile = Outcome<ShrinkResult>;

struct ShrinkReport {
  bool reports = true;  // false on ranks other than 0: rank 0's report holds every rank's files
  bool dry_run = false;
  std::vector<std::string> dcp_folders;  // found (intact, when checked): nothing to shrink
  std::vector<ShrunkFile> files;
  uint64_t before = 0;  // of the files done
  uint64_t after = 0;

  size_t failed() const;
  uint64_t saved() const { return before - std::min(before, after); }
};

// --json's report: {"files": [result or {path, error}...], "before", "after", "saved",
// "dry_run"}.
nlohmann::ordered_json ToJson(const ShrinkReport& r);

// Throws ckpt::UsageError when inputs and outputs do not fit (none given; -o with several
// files; two inputs to one output), ckpt::Error for an output that exists (without `force`) or
// a damaged torch.distributed.checkpoint folder. No file found is no error: the report is
// empty.
ShrinkReport Shrink(const ShrinkJobOptions& o);

}  // namespace ckpt::jobs
