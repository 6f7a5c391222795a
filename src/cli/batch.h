// The loop every per-file command shares (shrink, convert, strip): files spread over worker
// threads, the rest of the thread budget given to each file, one progress line, and one error
// per failed file that always names the file, whatever was thrown. Results are reported
// afterwards in input order, so output does not depend on scheduling.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/progress.h"

namespace ckpt::cli {

class Batch {
 public:
  // `threads` is the command's -j; `label` prefixes the progress line.
  Batch(const std::vector<std::string>& files, unsigned threads, std::string label, bool progress);

  unsigned workers() const { return workers_; }
  unsigned threads_per_file() const { return threads_per_file_; }
  // Progress counter for the writers (bytes of input done); valid until Run() returns.
  std::atomic<uint64_t>* bytes_done() { return &progress_->bytes_done(); }

  // Runs work(i) for every file, once. Returns per file "" or the error, naming the file.
  // The progress line is gone when it returns.
  std::vector<std::string> Run(const std::function<void(size_t)>& work);

 private:
  const std::vector<std::string>& files_;
  unsigned workers_;
  unsigned threads_per_file_;
  std::unique_ptr<Progress> progress_;
};

// For one file of a batch: when `error` is set, prints it and adds {path, error} to the
// JSON report's file list; true when the file failed.
bool ReportFailure(const std::string& path, const std::string& error, bool json,
                   nlohmann::ordered_json& json_files);

// `what` with `path: ` in front unless it already names the path there.
std::string NamingFile(const std::string& path, const std::string& what);

}  // namespace ckpt::cli
