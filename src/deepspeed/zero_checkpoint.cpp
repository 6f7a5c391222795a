#include "deepspeed/zero_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <optional>
#include <set>
#include <unordered_map>

#include "base/error.h"
#include "deepspeed/zero_parts.h"
#include "io/text_file.h"
#include "torch/global_policy.h"

namespace ckpt::deepspeed {

namespace fs = std::filesystem;
using namespace detail;

namespace {

// DeepSpeed's `latest`: a small text file holding the tag folder's name. A file of that name
// that is anything else (a symlink to a model file, say) is no ZeRO marker: nullopt.
std::optional<std::string> LatestTag(const fs::path& root, const Volume& volume,
                                     const char* marker = "latest") {
  fs::path latest = root / marker;
  if (!volume.IsFile(latest.string())) return std::nullopt;
  std::string tag;
  try {
    tag = MarkerText(volume.ReadText(latest.string(), 4096));
  } catch (const Error&) {
    return std::nullopt;  // too big to be a tag
  }
  for (unsigned char c : tag) {
    if (c < 0x20 || c == 0x7F || c == '/') return std::nullopt;
  }
  return tag;  // "" when empty: OpenZeroCheckpoint says so
}

}  // namespace

bool LooksLikeZeroCheckpoint(const std::string& path, const Volume& volume) {
  if (!volume.IsFolder(path)) return false;
  if (LatestTag(path, volume) || LatestTag(path, volume, "latest_universal")) return true;
  return !Matching(path, "_optim_states.pt", volume).empty() ||
         LooksLikeUniversalCheckpoint(path, volume);
}

ZeroCheckpoint OpenZeroCheckpoint(const std::string& path, const std::string& tag,
                                  const OnRankFile& on_file, const Volume& volume) {
  ZeroCheckpoint z;
  z.volume = &volume;
  fs::path root(path);
  if (!tag.empty()) {
    z.tag = tag;
  } else if (std::optional<std::string> latest = LatestTag(root, volume)) {
    z.tag = *latest;
    if (z.tag.empty()) Fail("{}: the 'latest' file is empty", (root / "latest").string());
  } else if (!Matching(path, "_optim_states.pt", volume).empty() ||
             LooksLikeUniversalCheckpoint(path, volume)) {
    z.tag = root.filename().string();
    root = root.parent_path();
  } else if (std::optional<std::string> universal = LatestTag(root, volume, "latest_universal")) {
    z.tag = *universal;
    if (z.tag.empty())
      Fail("{}: the 'latest_universal' file is empty", (root / "latest_universal").string());
  } else {
    Fail(
        "{}: neither a DeepSpeed checkpoint folder (no 'latest' file) nor a tag folder (no "
        "*_optim_states.pt) nor a universal checkpoint (no zero/optimizer_state.pt)",
        path);
  }
  z.folder = (root / z.tag).string();
  if (!volume.IsFolder(z.folder)) Fail("{}: no such checkpoint folder (tag '{}')", z.folder, z.tag);
  if (LooksLikeUniversalCheckpoint(z.folder, volume)) {
    OpenUniversal(z, on_file);
    return z;
  }
  std::vector<std::string> model_names = Matching(z.folder, "_model_states.pt", volume);
  std::vector<std::string> optim_names = Matching(z.folder, "_optim_states.pt", volume);
  for (const std::string& n : model_names) {
    if (n.find("_expert_") != std::string::npos) {
      Fail(
          "{}: {}: a Mixture-of-Experts checkpoint; experts are partitioned over expert-parallel "
          "groups, "
          "which zero_to_fp32 does not consolidate either",
          z.folder, n);
    }
  }
  for (const std::string& n : model_names) {
    if (n.find("mp_rank_") != std::string::npos && n.find("mp_rank_00") == std::string::npos) {
      Fail(
          "{}: {}: tensor parallel (more than one mp rank); its shards cannot be joined without "
          "the model's "
          "parallel layout",
          z.folder, n);
    }
  }
  if (model_names.empty()) Fail("{}: no *_model_states.pt files", z.folder);
  if (optim_names.empty()) Fail("{}: no *_optim_states.pt files", z.folder);
  auto open = [&](const std::string& name) {
    return OpenRankFile(z, (fs::path(z.folder) / name).string(), on_file);
  };
  z.fragments.resize(model_names.size());
  for (size_t i = 0; i < model_names.size(); ++i) {
    auto f = open(model_names[i]);
    if (i > 0) {
      z.fragments[i] = FrozenFragmentsOf(Index(*f, i));
      f->torch.reset();
    }
    z.files.push_back(std::move(f));
  }
  z.model_files = z.files.size();
  for (const std::string& n : optim_names) {
    z.files.push_back(open(n));
    z.optimizer_bytes += z.files.back()->map.size();
  }
  Consolidate(z);
  return z;
}

void Consolidate(ZeroCheckpoint& z) {
  if (z.model_files == 0 || z.model_files >= z.files.size()) {
    Fail("{}: needs model states files and optimizer files", z.folder);
  }
  std::vector<RankFile> ranks;
  for (size_t i = 0; i < z.files.size(); ++i) {
    if (i > 0 && i < z.model_files && !z.files[i]->torch) {  // read at open (z.fragments)
      ranks.push_back({z.files[i].get(), i, {}});
      continue;
    }
    ranks.push_back(Index(*z.files[i], i));
  }

  // Optimizer files: stage, world size, each rank's fp32 partitions.
  const RankFile& first_optim = ranks[z.model_files];
  NodeId osd0 = Lookup(first_optim.graph(), first_optim.root(), "optimizer_state_dict");
  if (osd0 == kNil)
    Fail("{}: no optimizer_state_dict: not a ZeRO optimizer file", first_optim.file->path);
  NodeId stage_node = Lookup(first_optim.graph(), osd0, "zero_stage");
  if (stage_node == kNil) {
    Fail(
        "{}: no zero_stage: not a ZeRO checkpoint (DeepSpeed's BF16_Optimizer or another optimizer "
        "wrote it; "
        "zero_to_fp32 refuses it too)",
        first_optim.file->path);
  }
  z.stage = StageOf(first_optim.graph(), stage_node, first_optim.file->path + ": zero_stage");
  if (z.stage < 1 || z.stage > 3)
    Fail("{}: unknown zero stage {}", first_optim.file->path, z.stage);
  {
    const Graph& g = first_optim.graph();
    NodeId pc = Lookup(g, osd0, "partition_count");
    if (pc == kNil) Fail("{}: no partition_count", first_optim.file->path);
    if (g.kind(pc) == Kind::kInt) {
      z.world_size = static_cast<int>(g.at(pc).integer);
    } else {
      for (NodeId c : Elements(g, pc, first_optim.file->path + ": partition_count")) {
        z.world_size =
            std::max<int>(z.world_size, static_cast<int>(IntOf(g, c, "partition_count")));
      }
    }
  }
  size_t optim_files = z.files.size() - z.model_files;
  if (z.world_size < 1 || static_cast<size_t>(z.world_size) != optim_files) {
    // Name the ranks whose file is not there (zero_pp_rank_<r>_...: DeepSpeed's names).
    std::set<int> present;
    std::string example;
    for (size_t i = z.model_files; i < z.files.size(); ++i) {
      std::string name = fs::path(z.files[i]->path).filename().string();
      size_t at = name.find("zero_pp_rank_");
      if (at == std::string::npos) continue;
      example = name;
      present.insert(std::atoi(name.c_str() + at + 13));
    }
    std::string missing;
    for (int r = 0; r < z.world_size && !example.empty(); ++r) {
      if (present.count(r)) continue;
      size_t at = example.find("zero_pp_rank_") + 13;
      size_t end = example.find('_', at);
      std::string name = example.substr(0, at) + std::to_string(r) + example.substr(end);
      missing += (missing.empty() ? "" : ", ") + name;
    }
    Fail(
        "{}: partition_count says {} ranks but there are {} *_optim_states.pt files{} (an "
        "overwritten checkpoint, or a rank that did not save)",
        z.folder, z.world_size, optim_files, missing.empty() ? "" : "; missing: " + missing);
  }
  std::vector<std::vector<uint64_t>> paddings = AlignmentPaddings(first_optim, osd0);
  // Per rank, per group: the rank's fp32 piece.
  std::vector<std::vector<Piece>> partitions;
  for (size_t r = z.model_files; r < ranks.size(); ++r) {
    partitions.push_back(Fp32Partitions(ranks[r], z.stage));
    if (partitions.back().size() != partitions[0].size()) {
      Fail("{}: {} groups, but the first rank file has {}", ranks[r].file->path,
           partitions.back().size(), partitions[0].size());
    }
  }

  // Model states of the first file: buffers, frozen params, param shapes, aliases.
  const RankFile& m0 = ranks[0];
  AddBuffersAndFrozen(z, ranks);
  ShapeGroups shape_groups = ParamShapes(m0);
  std::vector<std::vector<Piece>> laid =
      LayOutTrainable(z, shape_groups, paddings, partitions, 4, nullptr);
  size_t k = 0;
  for (const auto& group : shape_groups) {
    for (const auto& [name, shape] : group) {
      ZeroTensor zt;
      zt.name = name;
      zt.kind = ZeroTensor::Kind::kTrainable;
      zt.shape = shape;
      zt.numel = NumelOf(shape);
      zt.pieces = std::move(laid[k++]);
      z.tensors.push_back(std::move(zt));
    }
  }

  AddAliases(z, m0);
}

}  // namespace ckpt::deepspeed
