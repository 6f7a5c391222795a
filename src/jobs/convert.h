// The convert job, as `ckptool convert` and the policy's [convert] step both run it: float32
// tensors of checkpoint files and model folders to bfloat16 or float16 (engines/convert.h),
// a folder's other files copied and its indexes rewritten (engines/convert_tree.h), every
// file of a folder checked for damage first. A job never prints: what it did, and what failed,
// is in its report.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engines/convert.h"
#include "engines/convert_tree.h"
#include "jobs/outcome.h"
#include "jobs/progress.h"

namespace ckpt::jobs {

struct ConvertJobOptions {
  ConvertOptions engine;    // what is converted (its threads and counter are set per file)
  std::string dtype;        // "bf16" or "fp16": the default folder's name, config.json's dtype
  std::string output_dir;   // where outputs go (a folder's default: <folder>/<dtype>)
  std::string output_file;  // one input file's output
  bool force = false;       // write over existing outputs
  // A folder's training-only files (optimizer.pt, rng_state.pth...) when training state is not
  // converted: copied as they are (the command line), or left out of the copy (the policy).
  bool leave_out_training_files = false;
  std::function<bool(const std::string&)> skip;  // files left out (in place: the policy's outputs)
  unsigned threads = 1;
  bool spread = true;  // over the ranks of an MPI job (false: a policy step, on one rank)
  ProgressShown progress;
};

// A file converted, or why not (the error names the file).
using ConvertedFile = Outcome<ConvertResult>;

// A folder's other file copied, or an index rewritten (`total_size` its new total).
struct CarriedFile {
  PathPair files;
  std::string error;
  uint64_t total_size = 0;
};

struct ConvertReport {
  bool reports = true;  // false on ranks other than 0: rank 0's report holds every rank's files
  bool dry_run = false;
  std::vector<ConvertedFile> files;
  std::vector<CarriedFile> copies;
  std::vector<CarriedFile> indexes;
  uint64_t before = 0;  // the converted files' sizes, before and after
  uint64_t after = 0;

  size_t failed() const;  // files that failed
  bool ok() const;        // nothing failed: no file, copy or index
};

// --json's report: {"files": [result or {path, error}...], "before", "after", "copied_files"}.
nlohmann::ordered_json ToJson(const ConvertReport& r);

// What Convert would convert, copy and rewrite, found as it finds them and nothing more read
// (a dry run of the policy). Throws as Convert does.
ConvertTree PlanConvert(const std::vector<std::string>& paths, const ConvertJobOptions& o);

// Throws ckpt::UsageError when the paths and outputs do not fit (no path; -o with several
// inputs), ckpt::Error when nothing can be converted or a folder is damaged (nothing written).
ConvertReport Convert(std::vector<std::string> paths, const ConvertJobOptions& o);

// The files ConvertInPlace converts: every checkpoint file discovery finds in `paths` (training-
// only files only with include_optimizer), those `skip` names left out.
std::vector<std::string> InPlaceTargets(const std::vector<std::string>& paths,
                                        const ConvertJobOptions& o);

// Converts those files in place (the output options unused): each into a temp file beside it,
// renamed over it when something was converted (never when the file changed meanwhile); a file
// with nothing to convert is left as it is.
ConvertReport ConvertInPlace(const std::vector<std::string>& paths, const ConvertJobOptions& o);

}  // namespace ckpt::jobs
