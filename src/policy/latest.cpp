#include "policy/latest.h"

#include <filesystem>
#include <map>

#include "base/error.h"
#include "checkpoint/integrity.h"
#include "engines/prune.h"
#include "policy/completeness.h"

namespace ckpt::policy {

namespace fs = std::filesystem;

LatestResult FindLatest(const std::string& root, unsigned threads, bool checksums) {
  if (!fs::is_directory(root)) Fail("{}: not a folder", root);
  Completeness::Options co;
  co.settle_seconds = 0;
  Completeness completeness(root, co);
  completeness.BeginPass();
  PruneOptions po;
  po.keep_last = 1;
  // Damage is judged below, newest first, down to the first intact checkpoint only.
  std::map<std::string, std::string> incomplete;  // name -> what it waits for
  PruneResult plan = PlanPrune(
      root, po,
      [&](const std::string& path, std::string* why) {
        bool ok = completeness.Complete(path, why);
        if (!ok) incomplete[fs::path(path).filename().string()] = *why;
        return ok;
      },
      [](const std::string&, std::string*) { return true; });
  LatestResult r;
  for (size_t i = plan.entries.size(); i-- > 0;) {
    const PruneEntry& e = plan.entries[i];
    if (e.latest_copy) continue;  // Lightning's last.ckpt repeats a checkpoint with a step
    ++r.candidates;
    if (!r.path.empty()) continue;
    int64_t step = static_cast<int64_t>(e.step);
    std::string path = (fs::path(root) / e.name).string();
    if (!e.complete) {
      r.skipped.push_back({e.name, step, "incomplete: " + incomplete[e.name]});
      continue;
    }
    if (e.archive) {
      r.skipped.push_back(
          {e.name, step, "compressed (.ckz): ckptool decompress it to resume from it"});
      continue;
    }
    std::vector<torch::Problem> damage = FindDamage(path, threads, checksums);
    if (!damage.empty()) {
      r.skipped.push_back({e.name, step, "damaged: " + DescribeDamage(damage, path)});
      continue;
    }
    r.path = path;
    r.name = e.name;
    r.step = step;
  }
  return r;
}

}  // namespace ckpt::policy
