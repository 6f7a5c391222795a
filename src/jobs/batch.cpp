#include "jobs/batch.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <system_error>

#include "base/error.h"
#include "base/human.h"
#include "base/interrupt.h"
#include "cluster/partition.h"
#include "cluster/steps.h"
#include "io/parallel.h"
#include "jobs/result_json.h"

namespace ckpt::jobs {

std::string NamingFile(const std::string& path, const std::string& what) {
  if (what.size() > path.size() && what.compare(0, path.size(), path) == 0 &&
      what[path.size()] == ':') {
    return what;
  }
  return path + ": " + what;
}

uint64_t TreeBytes(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    uint64_t n = fs::file_size(path, ec);
    return ec ? 0 : n;
  }
  uint64_t total = 0;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) total += it->file_size(ec);
  }
  return total;
}

namespace {

// FNV-1a over the items and their sizes: what every rank must agree on before any work.
std::string Fingerprint(const std::vector<std::string>& keys, const std::vector<uint64_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<const unsigned char*>(p)[i];
      h *= 1099511628211ull;
    }
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    mix(keys[i].data(), keys[i].size() + 1);
    mix(&bytes[i], sizeof bytes[i]);
  }
  return fmt::format("{:016x}", h);
}

}  // namespace

Spread::Spread(const std::vector<std::string>& keys, const std::vector<uint64_t>& bytes)
    : keys_(keys) {
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  cluster::Agree(Fingerprint(keys, bytes), fmt::format("{} paths, {} bytes", keys.size(), total));
  owner_ = cluster::PartitionByBytes(bytes, cluster::Size());
  mine_ = cluster::ItemsOf(owner_, cluster::Rank());
}

Spread Spread::Local(const std::vector<std::string>& keys) {
  Spread s(keys);
  for (size_t i = 0; i < keys.size(); ++i) s.mine_.push_back(i);
  return s;
}

void Spread::Gather(std::vector<std::string>& errors,
                    const std::function<nlohmann::json(size_t)>& encode,
                    const std::function<void(size_t, const nlohmann::json&)>& decode) {
  if (local_) return;  // every result is in place, and no other rank takes part
  // A single process has every result in place already: nothing to encode.
  if (!cluster::Distributed()) {
    cluster::Collect("");
    return;
  }
  nlohmann::json items = nlohmann::json::array();
  for (size_t i : mine_) {
    if (errors[i].empty()) {
      items.push_back({{"i", i}, {"r", encode(i)}});
    } else {
      items.push_back({{"i", i}, {"e", errors[i]}});
    }
  }
  std::vector<cluster::RankResult> all = cluster::Collect(ToCbor(items));
  if (!reports()) return;
  for (size_t r = 1; r < all.size(); ++r) {
    if (!all[r].ok) {
      for (size_t i : cluster::ItemsOf(owner_, static_cast<int>(r))) {
        errors[i] = NamingFile(keys_[i], fmt::format("not done: rank {} of {} failed first: {}", r,
                                                     all.size(), all[r].error));
      }
      continue;
    }
    for (const nlohmann::json& item : FromCbor(all[r].payload)) {
      size_t i = item.at("i").get<size_t>();
      if (i >= errors.size() || owner_[i] != static_cast<int>(r))
        Fail("internal: rank {} sent a result for item {} it does not own", r, i);
      if (item.contains("e")) {
        errors[i] = item["e"].get<std::string>();
      } else {
        decode(i, item.at("r"));
      }
    }
  }
}

Batch::Batch(const std::vector<std::string>& files, unsigned threads, const std::string& label,
             const ProgressShown& progress, size_t parallel, bool spread)
    : files_(files), parallel_(std::min(parallel, files.size())) {
  threads_ = std::max(1u, threads);
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const std::string& f : files_) {
    sizes.push_back(TreeBytes(f));
    total += sizes.back();
  }
  spread_ = spread ? std::make_unique<Spread>(files_, sizes)
                   : std::make_unique<Spread>(Spread::Local(files_));
  size_t side_by_side = 0;
  for (size_t i : spread_->mine()) side_by_side += i < parallel_;
  workers_ = static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(threads_, side_by_side)));
  threads_per_file_ = std::max(1u, threads_ / workers_);
  // Under MPI no rank knows the job's progress: no meter.
  if (progress && !(spread && cluster::Distributed())) meter_ = progress(label, total);
  if (!meter_) meter_ = std::make_unique<ProgressMeter>();  // counted, shown to nobody
}

std::vector<std::string> Batch::RunMine(const std::function<void(size_t)>& work) {
  if (ran_) Fail("internal: a batch runs once");
  ran_ = true;
  std::vector<std::string> errors(files_.size());
  std::vector<size_t> side_by_side, one_by_one;
  for (size_t i : spread_->mine()) (i < parallel_ ? side_by_side : one_by_one).push_back(i);
  auto run = [&](size_t i) {
    try {
      work(i);
    } catch (const Interrupted&) {
      throw;  // the whole job stops
    } catch (const std::exception& e) {
      errors[i] = i < parallel_ ? NamingFile(files_[i], e.what()) : e.what();
    } catch (...) {
      errors[i] = NamingFile(files_[i], "unknown internal error");
    }
    meter_->FileDone();
  };
  ParallelFor(side_by_side.size(), workers_, [&](size_t k) { run(side_by_side[k]); });
  for (size_t i : one_by_one) run(i);
  meter_.reset(new ProgressMeter());  // the shown one is gone (its line cleared) on return
  return errors;
}

}  // namespace ckpt::jobs
