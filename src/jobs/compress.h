// The compress and decompress jobs, as `ckptool compress` / `decompress` and the policy's
// [compress] step run them: each path (a file, a folder; an archive) one at a time with every
// thread (engines/compress.h). In an MPI job each rank does its share of the paths and rank 0
// reports them all. A job never prints: what became of each path goes to `done` as soon as it
// is known (in input order), and into the report.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engines/compress.h"
#include "jobs/outcome.h"
#include "jobs/progress.h"

namespace ckpt::jobs {

// What became of one path (the error does not name it: NamingFile(input, error) does).
template <typename R>
using PathOutcome = Outcome<R>;

template <typename R>
struct PathsReport {
  bool reports = true;  // false on ranks other than 0: rank 0's report holds every rank's paths
  std::vector<PathOutcome<R>> paths;

  bool ok() const { return FailedOf(paths) == 0; }
};

template <typename R>
using PathDone = std::function<void(const PathOutcome<R>&)>;

struct CompressJobOptions {
  CompressOptions engine;  // its counter is set here
  std::vector<std::string> paths;
  bool spread = true;  // over the ranks of an MPI job (false: a policy step, on one rank)
  ProgressShown progress;
};
using CompressReport = PathsReport<CompressResult>;

struct DecompressJobOptions {
  DecompressOptions engine;  // its counter is set here
  std::vector<std::string> paths;
  bool spread = true;
  ProgressShown progress;
};
using DecompressReport = PathsReport<DecompressResult>;

// --json's reports: {"files": [result or {input, error}...]}, and for compress "before" and
// "after" (bytes of the paths done).
nlohmann::ordered_json ToJson(const CompressReport& r);
nlohmann::ordered_json ToJson(const DecompressReport& r);

// Throws ckpt::UsageError when paths and outputs do not fit (-o or -c with several paths; -c
// with -o or with removing the input): what Compress and Decompress check first.
void CheckPaths(const std::vector<std::string>& paths, const std::string& output, bool to_stdout,
                bool remove_input);

// Throw ckpt::UsageError when paths and outputs do not fit (-o or -c with several paths; -c
// with -o or with removing the input).
CompressReport Compress(const CompressJobOptions& o, const PathDone<CompressResult>& done = {});
DecompressReport Decompress(const DecompressJobOptions& o,
                            const PathDone<DecompressResult>& done = {});

}  // namespace ckpt::jobs
