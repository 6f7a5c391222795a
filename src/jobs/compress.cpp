#include "jobs/compress.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/interrupt.h"
#include "cluster/world.h"
#include "compress/archive.h"
#include "jobs/batch.h"
#include "jobs/result_json.h"

namespace ckpt::jobs {

namespace {

// This rank's paths one at a time under one meter; rank 0 learns of every path in input
// order: `live` (a single process, or a job on one rank) as soon as each is done, an MPI job
// once every rank's are in.
template <typename R>
PathsReport<R> RunEach(const std::vector<std::string>& paths, Spread& spread, bool live,
                       const char* label, uint64_t total, const ProgressShown& progress,
                       const std::function<R(size_t, std::atomic<uint64_t>*)>& work,
                       const PathDone<R>& done) {
  std::vector<std::string> errors(paths.size());
  std::vector<R> results(paths.size());
  PathsReport<R> report;
  auto outcome = [&](size_t i) {
    report.paths.push_back({paths[i], errors[i], std::move(results[i])});
    if (done) done(report.paths.back());
  };
  {
    std::unique_ptr<ProgressMeter> meter;
    if (progress && live) meter = progress(label, total);
    if (!meter) meter = std::make_unique<ProgressMeter>();
    for (size_t i : spread.mine()) {
      try {
        results[i] = work(i, &meter->bytes_done());
        meter->FileDone();
      } catch (const Interrupted&) {
        throw;
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
      if (live) outcome(i);
    }
  }
  spread.Gather(errors, results);
  if (!spread.reports()) {
    report.reports = false;
    return report;
  }
  for (size_t i = 0; i < paths.size() && !live; ++i) outcome(i);
  return report;
}

Spread SpreadOf(const std::vector<std::string>& paths, const std::vector<uint64_t>& sizes,
                bool spread) {
  return spread ? Spread(paths, sizes) : Spread::Local(paths);
}

}  // namespace

void CheckPaths(const std::vector<std::string>& paths, const std::string& output, bool to_stdout,
                bool remove_input) {
  if (!output.empty() && paths.size() > 1)
    throw UsageError("-o names one output: give one input with it");
  if (to_stdout && paths.size() > 1)
    throw UsageError("-c streams one input: give one input with it");
  if (to_stdout && !output.empty()) throw UsageError("-c and -o cannot be used together");
  if (to_stdout && remove_input) throw UsageError("--rm cannot be used with -c");
}

nlohmann::ordered_json ToJson(const CompressReport& r) {
  nlohmann::ordered_json doc = OutcomesJson(r.paths, "input");
  uint64_t before = 0, after = 0;
  for (const PathOutcome<CompressResult>& p : r.paths) {
    if (!p.error.empty()) continue;
    before += p.result.before;
    after += p.result.after;
  }
  doc["before"] = before;
  doc["after"] = after;
  return doc;
}

nlohmann::ordered_json ToJson(const DecompressReport& r) {
  return OutcomesJson(r.paths, "input");
}

CompressReport Compress(const CompressJobOptions& o, const PathDone<CompressResult>& done) {
  CheckPaths(o.paths, o.engine.output, o.engine.to_stdout, o.engine.remove_input);
  std::vector<uint64_t> sizes;
  for (const std::string& p : o.paths) sizes.push_back(TreeBytes(p));
  Spread spread = SpreadOf(o.paths, sizes, o.spread);
  uint64_t total = 0;
  for (size_t i : spread.mine()) total += sizes[i];
  CompressOptions co = o.engine;
  co.threads = std::max(1u, co.threads);
  return RunEach<CompressResult>(
      o.paths, spread, !o.spread || !cluster::Distributed(), "compress", total, o.progress,
      [&](size_t i, std::atomic<uint64_t>* bytes_done) {
        co.bytes_done = bytes_done;
        return CompressPath(o.paths[i], co);
      },
      done);
}

DecompressReport Decompress(const DecompressJobOptions& o, const PathDone<DecompressResult>& done) {
  CheckPaths(o.paths, o.engine.output, o.engine.to_stdout, o.engine.remove_input);
  std::vector<uint64_t> sizes;
  for (const std::string& p : o.paths) sizes.push_back(TreeBytes(p));
  Spread spread = SpreadOf(o.paths, sizes, o.spread);
  uint64_t total = 0;  // of the files the archives restore
  for (size_t i : spread.mine()) {
    if (!o.progress) break;
    try {
      ckz::Archive a = ckz::Archive::Open(o.paths[i]);
      for (const ckz::Entry& e : a.index().entries) total += e.size;
    } catch (const Error&) {
      // Reported when the archive's turn comes.
    }
  }
  DecompressOptions d = o.engine;
  d.threads = std::max(1u, d.threads);
  return RunEach<DecompressResult>(
      o.paths, spread, !o.spread || !cluster::Distributed(), "decompress", total, o.progress,
      [&](size_t i, std::atomic<uint64_t>* bytes_done) {
        d.bytes_done = bytes_done;
        return DecompressArchive(o.paths[i], d);
      },
      done);
}

}  // namespace ckpt::jobs
