#include "jobs/reshard.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cluster/steps.h"
#include "cluster/world.h"

namespace ckpt::jobs {

nlohmann::ordered_json ToJson(const ReshardReport& report) {
  const ReshardResult& r = report.result;
  const bool zero = report.to == ReshardTo::kZero;
  nlohmann::ordered_json j = {{"source", r.source}, {"output", r.output}};
  if (zero) {
    j["tag"] = r.tag;
  } else {
    j["latest_universal"] = r.latest_universal;
  }
  j["stage"] = r.stage;
  j["world_size"] = r.world_size;
  if (zero) j["to_world_size"] = r.to_world_size;
  j["parameters"] = r.parameters;
  j["optimizer_state"] = r.keys;
  j["files"] = r.files;
  j["bytes"] = r.bytes;
  return j;
}

ReshardReport Reshard(const ReshardJobOptions& o) {
  ReshardOptions ro = o.engine;
  ro.threads = std::max(1u, ro.threads);
  if (o.to == ReshardTo::kZero && ro.world_size <= 0)
    throw UsageError("--to zero needs --world-size M (the ranks to resume on)");
  if (o.to == ReshardTo::kUniversal && ro.world_size > 0)
    throw UsageError(
        "--world-size is for --to zero: a universal checkpoint loads on any number of ranks");
  if (o.spread && cluster::Distributed()) {
    // Every rank writes its share of the parameters; rank 0 checks, prepares and commits.
    ro.team.rank = cluster::Rank();
    ro.team.size = cluster::Size();
    ro.team.agree = [](const std::string& view, const std::string& summary) {
      cluster::Agree(view, summary);
      cluster::Collect("");
    };
    ro.team.decide = [](const std::string& value) { return cluster::Decide(value); };
    ro.team.confirm = [](const std::string& error) { return cluster::Confirm(error); };
  }
  ReshardReport report;
  report.to = o.to;
  report.result = o.to == ReshardTo::kZero ? ReshardToZero(o.checkpoint, ro)
                                           : ReshardToUniversal(o.checkpoint, ro);
  report.reports = !o.spread || cluster::IsRoot();  // rank 0 reports
  return report;
}

}  // namespace ckpt::jobs
