#include "jobs/export.h"

#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/error.h"
#include "checkpoint/discovery.h"
#include "cluster/steps.h"
#include "cluster/world.h"
#include "engines/logical_export.h"
#include "jobs/batch.h"
#include "jobs/output_place.h"
#include "jobs/result_json.h"
#include "writers/output_set.h"
#include "writers/safetensors_output.h"

namespace ckpt::jobs {

namespace {

// Sharded safetensors output in an MPI job: every rank plans the same shards, writes its share
// (balanced by bytes), and rank 0 writes the index once every rank's shards are written and
// verified; a failed rank means no index.
struct RankTeam {
  std::vector<std::string> names;
  std::unique_ptr<Spread> spread;
  ShardTeam team;

  RankTeam(const RankTeam&) = delete;  // the callbacks hold `this`
  RankTeam& operator=(const RankTeam&) = delete;
  RankTeam() {
    team.writes_index = cluster::IsRoot();
    team.plan = [this](const std::vector<std::string>& shard_names,
                       const std::vector<uint64_t>& bytes) {
      names = shard_names;
      spread = std::make_unique<Spread>(names, bytes);  // every rank plans the same shards
      return spread->mine();
    };
    team.written = [this](size_t shard, const std::string& error) {
      nlohmann::json mine = nlohmann::json::object();
      if (!error.empty()) mine = {{"shard", shard}, {"error", error}};
      std::vector<cluster::RankResult> all = cluster::Collect(ToCbor(mine));
      // The failure a single process would have met first: a rank that failed before it
      // wrote anything (nothing goes into place), else the failed shard with the lowest
      // index (the shards below it do).
      ShardVerdict v;
      v.commit_below = names.size();
      for (size_t r = 0; r < all.size(); ++r) {
        size_t at = 0;
        std::string e = all[r].error;
        if (all[r].ok) {
          nlohmann::json x = FromCbor(all[r].payload);
          if (!x.contains("error")) continue;
          at = x["shard"].get<size_t>();
          e = x["error"].get<std::string>();
        }
        if (e.empty()) e = fmt::format("rank {} of {} failed", r, all.size());
        if (v.error.empty() || at < v.commit_below) {
          v.commit_below = at;
          v.error = e;
        }
      }
      v.commit_below = std::stoull(cluster::Decide(std::to_string(v.commit_below)));
      if (!cluster::IsRoot()) v.error.clear();  // rank 0 reports
      return v;
    };
    team.committed = [](const std::string& error) { return cluster::Confirm(error); };
  }
};

}  // namespace

nlohmann::ordered_json ToJson(const ExportReport& r) {
  return nlohmann::ordered_json(r.result);
}

ExportReport Export(const ExportJobOptions& o) {
  ExportReport report;
  // In an MPI job sharded safetensors are written by all ranks; anything else (one file, a
  // torch file) by rank 0 while the others wait.
  const bool shared = o.spread && cluster::Distributed() && o.engine.max_shard_size != 0 &&
                      !IsTorchOutputPath(o.to);
  if (!shared && o.spread && !cluster::IsRoot()) {
    report.reports = false;
    return report;
  }
  if (o.skip_safetensors_model && o.sources.size() == 1 && IsSafetensorsModelFolder(o.sources[0])) {
    report.already_safetensors = true;
    report.result.source = o.sources[0];
    return report;
  }
  RankTeam team;
  ExportOptions eo = o.engine;
  if (shared) eo.team = &team.team;
  // The new files go into place as a whole, replacing a previous export's (output_set.h). In
  // an MPI job rank 0 makes the place and every rank writes its shards there.
  std::optional<SharedPlace> made;
  std::string write_to = o.to;
  if (eo.dry_run) {
    OutputPlace::Check(o.to, o.force);
  } else {
    made = MakeSharedPlace(o.to, o.force, OutputPlace::Kind::kModelSet, shared);
    if (!made) throw cluster::Stopped{1};  // rank 0 says why
    write_to = made->write_to;
  }
  OutputPlace* place = made && made->place ? &*made->place : nullptr;
  try {
    report.result = ckpt::Export(o.sources, write_to, eo);
  } catch (const Error& e) {
    if (!place || place->Unmasked(e.what()) == e.what()) throw;
    Rethrow(e, place->Unmasked(e.what()));
  }
  if (place) report.result.files = place->Commit(report.result.files);
  report.reports = !o.spread || cluster::IsRoot();  // rank 0 reports
  return report;
}

}  // namespace ckpt::jobs
