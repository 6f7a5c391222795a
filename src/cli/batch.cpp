#include "cli/batch.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <system_error>

#include "base/error.h"
#include "cli/commands.h"
#include "io/parallel.h"

namespace ckpt::cli {

std::string NamingFile(const std::string& path, const std::string& what) {
  if (what.size() > path.size() && what.compare(0, path.size(), path) == 0 &&
      what[path.size()] == ':') {
    return what;
  }
  return path + ": " + what;
}

bool ReportFailure(const std::string& path, const std::string& error, bool json,
                   nlohmann::ordered_json& json_files) {
  if (error.empty()) return false;
  PrintError(error);
  if (json) json_files.push_back({{"path", path}, {"error", error}});
  return true;
}

Batch::Batch(const std::vector<std::string>& files, unsigned threads, std::string label,
             bool progress)
    : files_(files) {
  threads = std::max(1u, threads);
  workers_ = static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(threads, files.size())));
  threads_per_file_ = std::max(1u, threads / workers_);
  uint64_t total = 0;
  for (const std::string& f : files_) {
    std::error_code ec;
    uint64_t size = std::filesystem::file_size(f, ec);
    if (!ec) total += size;
  }
  progress_ = std::make_unique<Progress>(std::move(label), total, progress);
}

std::vector<std::string> Batch::Run(const std::function<void(size_t)>& work) {
  if (!progress_) Fail("internal: a batch runs once");
  std::vector<std::string> errors(files_.size());
  ParallelFor(files_.size(), workers_, [&](size_t i) {
    try {
      work(i);
    } catch (const std::exception& e) {
      errors[i] = NamingFile(files_[i], e.what());
    } catch (...) {
      errors[i] = NamingFile(files_[i], "unknown internal error");
    }
    progress_->FileDone();
  });
  progress_.reset();
  return errors;
}

}  // namespace ckpt::cli
