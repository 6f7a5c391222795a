// The strip job, as `ckptool strip` and the policy's [strip] step both run it: training-only
// entries (optimizer, scheduler, scaler, RNG state) dropped from torch files and
// torch.distributed.checkpoint folders (engines/strip.h, engines/dcp_strip.h), in place or
// into an output; a folder's training-only files (optimizer.pt...) deleted when asked, or left
// out of a stripped copy of the folder (`output` for a folder).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engines/strip.h"
#include "jobs/outcome.h"
#include "jobs/progress.h"

namespace ckpt::jobs {

struct StripJobOptions {
  StripOptions engine;  // what is dropped and kept, dry run, trust (output and threads: set here)
  std::vector<std::string> paths;  // files and folders (.ckz archives too, with `output`)
  std::string output;              // one input's output (a folder: a stripped copy of it)
  bool delete_files = false;       // delete the training-only files of folders (in place)
  bool force = false;              // replace an existing output
  std::function<bool(const std::string&)> skip;  // paths left out (the policy's outputs)
  unsigned threads = 1;
  bool spread = true;  // over the ranks of an MPI job (false: a policy step, on one rank)
  ProgressShown progress;
};

// A file or torch.distributed.checkpoint folder stripped, or why not (the error names it).
using StrippedFile = Outcome<StripResult>;

// A training-only file found in a folder given, and what became of it.
struct TrainingFile {
  std::string path;
  uint64_t bytes = 0;
  bool deleted = false;
  std::string error;  // why it could not be deleted
};

struct StripReport {
  bool reports = true;  // false on ranks other than 0: rank 0's report holds every rank's files
  bool dry_run = false;
  bool folder_copy = false;  // `output` is a stripped copy of the folder given
  std::vector<StrippedFile> files;
  std::vector<TrainingFile> training_files;
  size_t copied = 0;  // a folder copy's other files, copied as they are
  uint64_t before = 0;
  uint64_t after = 0;

  size_t failed() const;
  bool ok() const;  // no file failed, every deletion asked for done
};

// --json's report: {"files": [...], "training_only_files": [{path, bytes, deleted, error?}],
// "before", "after", "copied_files" (a folder copy)}.
nlohmann::ordered_json ToJson(const StripReport& r);

// Throws ckpt::UsageError when inputs and options do not fit, ckpt::Error when the output
// exists (without `force`) or a folder to copy is damaged (nothing written).
StripReport Strip(const StripJobOptions& o);

}  // namespace ckpt::jobs
