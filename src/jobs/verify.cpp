#include "jobs/verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/folder_checks.h"
#include "checkpoint/manifest.h"
#include "jobs/result_json.h"

namespace ckpt::jobs {

void to_json(nlohmann::json& j, const CheckpointVerdict& v) {
  j = {{"outcome", v.outcome}, {"failed", v.failed}, {"internal", v.internal}};
}
void from_json(const nlohmann::json& j, CheckpointVerdict& v) {
  j.at("outcome").get_to(v.outcome);
  j.at("failed").get_to(v.failed);
  j.at("internal").get_to(v.internal);
}

std::vector<Located> VerifyTargets(const std::vector<std::string>& paths,
                                   const std::function<bool(const std::string&)>& skip) {
  std::vector<Located> items = Locate(paths);
  if (skip) std::erase_if(items, [&](const Located& l) { return skip(l.path); });
  return items;
}

CheckpointVerdict VerifyCheckpoint(const Located& item, const VerifyOptions& o) {
  CheckpointVerdict v;
  try {
    v.outcome = CheckpointAt(item)->Verify(o.threads, o.trust, !o.structure);
  } catch (const Error& e) {
    v.failed = e.what();
  } catch (const std::filesystem::filesystem_error& e) {
    v.failed = fmt::format("{}: {}", e.path1().string(), e.code().message());
    v.internal = true;
  } catch (const std::exception& e) {
    v.failed = std::string("internal error: ") + e.what();
    v.internal = true;
  }
  return v;
}

std::vector<FolderVerdict> VerifyFolders(const std::vector<std::string>& paths,
                                         const VerifyOptions& o) {
  std::vector<FolderVerdict> out;
  for (const std::string& p : paths) {
    std::vector<torch::Problem> broken = CheckFolderPromises(p);
    if (!broken.empty()) out.push_back({p, p, std::move(broken), false, 0});
  }
  std::vector<std::string> manifested;
  for (const std::string& given : paths) {
    for (std::string& m : ManifestedAt(given)) manifested.push_back(std::move(m));
  }
  std::sort(manifested.begin(), manifested.end());
  manifested.erase(std::unique(manifested.begin(), manifested.end()), manifested.end());
  for (const std::string& p : manifested) {
    FolderVerdict v{p, ManifestPathOf(p), {}, true, 0};
    v.problems = CheckManifest(p, o.threads, &v.hashed, !o.structure);
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace ckpt::jobs
