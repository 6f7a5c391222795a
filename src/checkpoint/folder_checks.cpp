#include "checkpoint/folder_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "base/error.h"
#include "io/mapped_file.h"
#include "io/temp_files.h"
#include "safetensors/safetensors_file.h"
#include "safetensors/shard_index.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

// A link a checkpoint is reached by (Lightning's last.ckpt), as opposed to any other link a
// folder may hold: by the names of the files the frameworks write.
bool LooksLikeCheckpointName(const std::string& name) {
  for (const char* ext : {".ckpt", ".pt", ".pth", ".bin", ".safetensors", ".distcp"}) {
    if (name.ends_with(ext)) return true;
  }
  return false;
}

void CheckIndex(const fs::path& index, const std::string& rel,
                std::vector<torch::Problem>& problems) {
  const fs::path folder = index.parent_path();
  for (const auto& [shard, names] : safetensors::WeightMap(index.string())) {
    fs::path file = folder / shard;
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) {
      problems.push_back({rel, fmt::format("names the shard {} ({} tensors), which is missing",
                                           shard, names.size())});
      continue;
    }
    MappedFile m = MappedFile::Open(file.string());
    if (!safetensors::LooksLikeSafetensors(m.bytes())) continue;  // a torch shard: it exists
    std::set<std::string> held;
    try {
      safetensors::ParseEach(m.bytes(),
                             [&](safetensors::TensorEntry&& e) { held.insert(std::move(e.name)); });
    } catch (const Error&) {
      continue;  // the shard's own verification says what is wrong with it
    }
    size_t absent = 0;
    std::string first;
    for (const std::string& n : names) {
      if (held.count(n)) continue;
      if (absent++ == 0) first = n;
    }
    if (absent) {
      problems.push_back(
          {rel, fmt::format("maps {} to {}, which does not hold it{}", first, shard,
                            absent > 1 ? fmt::format(" ({} tensors in all)", absent) : "")});
    }
  }
}

}  // namespace

std::vector<torch::Problem> CheckFolderPromises(const std::string& path) {
  std::vector<torch::Problem> problems;
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(path, ec))) return problems;
  for (auto it = fs::recursive_directory_iterator(path, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (IsTempFileName(name)) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) it.disable_recursion_pending();
      continue;
    }
    const std::string rel = it->path().lexically_relative(path).generic_string();
    if (it->is_symlink(ec)) {
      std::error_code missing;
      const std::string target = fs::read_symlink(it->path(), missing).string();
      if (LooksLikeCheckpointName(name) || LooksLikeCheckpointName(target)) {
        if (!fs::exists(it->path(), missing))
          problems.push_back({rel, fmt::format("a link to {}, which does not exist", target)});
      }
      continue;
    }
    if (name.ends_with(".index.json") && it->is_regular_file(ec))
      CheckIndex(it->path(), rel, problems);
  }
  std::sort(problems.begin(), problems.end(),
            [](const torch::Problem& a, const torch::Problem& b) { return a.where < b.where; });
  return problems;
}

}  // namespace ckpt
