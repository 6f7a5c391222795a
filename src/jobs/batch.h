// The loop every per-file job shares (shrink, convert, strip; verify, compress and
// decompress use Spread alone): files spread over worker threads, the rest of the thread
// budget given to each file, one progress meter, and one error per failed file that always
// names the file, whatever was thrown. Results come back in input order, so a report does not
// depend on scheduling.
//
// In an MPI job (cluster/) the files are first spread over the ranks: every rank finds the
// same files, Spread gives each its share (balanced by bytes, cluster/partition.h), each
// rank runs its share with its own threads, and the results travel to rank 0 as JSON
// (jobs/result_json.h), which reports for all. Other ranks report nothing. A job run on one
// rank alone (a policy step: apply runs on rank 0) spreads nothing: `Local()`.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/world.h"
#include "jobs/progress.h"

namespace ckpt::jobs {

// Items (files or folders, named by `keys`) spread over the ranks of the job: one rank each.
// The constructor is the job's Agree step (cluster/steps.h): it throws cluster::Stopped on
// every rank when some rank sees other items.
class Spread {
 public:
  Spread(const std::vector<std::string>& keys, const std::vector<uint64_t>& bytes);
  // Every item on this rank, nothing agreed or gathered: for a job that runs on one rank
  // while the others wait (the policy's steps).
  static Spread Local(const std::vector<std::string>& keys);

  // The items this rank runs, in input order (all of them in a single process).
  const std::vector<size_t>& mine() const { return mine_; }
  // Only rank 0 reports; other ranks return once Gather() has sent their results.
  bool reports() const { return local_ || cluster::IsRoot(); }

  // The Collect step: sends this rank's outcomes (errors[i], and encode(i) for the items
  // without one) to rank 0, which fills in every other rank's items with decode(i, value).
  // An item whose rank failed before sending gets an error naming that rank.
  void Gather(std::vector<std::string>& errors, const std::function<nlohmann::json(size_t)>& encode,
              const std::function<void(size_t, const nlohmann::json&)>& decode);

  template <typename R>
  void Gather(std::vector<std::string>& errors, std::vector<R>& results) {
    Gather(
        errors, [&](size_t i) { return nlohmann::json(results[i]); },
        [&](size_t i, const nlohmann::json& j) { results[i] = j.get<R>(); });
  }

 private:
  explicit Spread(const std::vector<std::string>& keys) : keys_(keys), local_(true) {}

  const std::vector<std::string>& keys_;
  bool local_ = false;
  std::vector<int> owner_;
  std::vector<size_t> mine_;
};

class Batch {
 public:
  // `threads` is the job's thread budget; `label` names the progress meter. The first
  // `parallel` files run side by side; any after them (folders that want every thread) one at a
  // time afterwards, each with all `threads`, and keep their errors as thrown. `spread`: over
  // the ranks of an MPI job, or (false) all on this rank.
  Batch(const std::vector<std::string>& files, unsigned threads, const std::string& label,
        const ProgressShown& progress, size_t parallel = SIZE_MAX, bool spread = true);

  unsigned threads_per_file() const { return threads_per_file_; }
  // Progress counter for the writers (bytes of input done); valid until Run() returns.
  std::atomic<uint64_t>* bytes_done() { return &meter_->bytes_done(); }
  bool reports() const { return spread_->reports(); }

  // Runs work(i) for every file this rank owns, once, then gathers: on rank 0 `results`
  // and the returned errors ("" or the error, naming the file) cover every file. The
  // progress line is gone when it returns.
  template <typename R>
  std::vector<std::string> Run(std::vector<R>& results, const std::function<R(size_t)>& work) {
    std::vector<std::string> errors = RunMine([&](size_t i) { results[i] = work(i); });
    spread_->Gather(errors, results);
    return errors;
  }

 private:
  std::vector<std::string> RunMine(const std::function<void(size_t)>& work);

  const std::vector<std::string>& files_;
  size_t parallel_;
  unsigned threads_;
  unsigned workers_;
  unsigned threads_per_file_;
  std::unique_ptr<Spread> spread_;
  std::unique_ptr<ProgressMeter> meter_;
  bool ran_ = false;
};

// `what` with `path: ` in front unless it already names the path there.
std::string NamingFile(const std::string& path, const std::string& what);

// Bytes of a file, or of the regular files below a folder (0 when unreadable).
uint64_t TreeBytes(const std::string& path);

}  // namespace ckpt::jobs
