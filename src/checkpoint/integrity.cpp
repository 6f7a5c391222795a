#include "checkpoint/integrity.h"

#include <fmt/format.h>

#include <filesystem>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/discovery.h"
#include "checkpoint/folder_checks.h"
#include "checkpoint/manifest.h"
#include "checkpoint/verify.h"
#include "file/checkpoint_file.h"
#include "io/mapped_file.h"

namespace ckpt {

std::vector<torch::Problem> FindDamage(const std::string& path, unsigned threads, bool checksums) {
  std::vector<torch::Problem> damage;
  std::vector<Located> items = Locate({path});
  // Trusting every module: what a pickle imports is not damage, and no pickle runs either way.
  const torch::Trust trust{};
  for (const Located& item : items) {
    try {
      // A file named on its own may be no checkpoint at all (compress takes any file): there is
      // nothing of a checkpoint's to check in it. (Inside folders, discovery keeps only
      // checkpoints; a broken zip still counts as one.)
      if (item.kind == Container::kFile) {
        MappedFile m = MappedFile::Open(item.path);
        if (!DetectFormat(m.bytes()) && CutCheckpointReason(item.path, m.bytes()).empty()) continue;
      }
      VerifyOutcome v = CheckpointAt(item)->Verify(threads, trust, checksums);
      for (torch::Problem& p : v.problems) {
        if (p.unsafe) continue;
        p.where = p.where.empty() ? item.path : fmt::format("{}: {}", item.path, p.where);
        damage.push_back(std::move(p));
      }
    } catch (const InputChanged&) {
      throw;
    } catch (const Error& e) {
      // "PATH: what", or "PATH/file: what" for a file inside a folder checkpoint.
      std::string what = e.what();
      std::string where = item.path;
      size_t colon = what.find(": ");
      if (what.starts_with(item.path + ": ")) {
        what = what.substr(item.path.size() + 2);
      } else if (what.starts_with(item.path + "/") && colon != std::string::npos) {
        where = what.substr(0, colon);
        what = what.substr(colon + 2);
      }
      damage.push_back({where, what});
    }
  }
  // What the folder promises: its indexes' shards and tensors, its links' targets.
  for (torch::Problem& p : CheckFolderPromises(path))
    damage.push_back({fmt::format("{}: {}", path, p.where), p.what});
  // What a manifest says the bytes were: the only check a safetensors file or a DCP chunk has.
  std::string manifest_name = std::filesystem::path(ManifestPathOf(path)).filename().string();
  for (torch::Problem& p : CheckManifest(path, threads, nullptr, checksums))
    damage.push_back(
        {fmt::format("{}: {}", path, p.where), fmt::format("{} ({})", p.what, manifest_name)});
  return damage;
}

std::string DescribeDamage(const std::vector<torch::Problem>& damage, const std::string& path) {
  if (damage.empty()) return "";
  std::string_view where = damage[0].where;
  if (where == path) {
    where = "";
  } else if (where.starts_with(path + ": ") || where.starts_with(path + "/")) {
    where.remove_prefix(path.size() + (where[path.size()] == ':' ? 2 : 1));
  }
  return fmt::format("{}{}{}", where.empty() ? "" : fmt::format("{}: ", where), damage[0].what,
                     damage.size() > 1 ? fmt::format("; {} problems in all", damage.size()) : "");
}

void RefuseDamaged(const std::string& path, unsigned threads, const std::string& refusal) {
  std::vector<torch::Problem> damage = FindDamage(path, threads);
  if (damage.empty()) return;
  Fail("{}: {}{}; refusing a damaged input: {} (run ckptool verify)", damage[0].where,
       damage[0].what, damage.size() > 1 ? fmt::format(" ({} problems in all)", damage.size()) : "",
       refusal);
}

}  // namespace ckpt
