// Universal checkpoints (ds_to_universal.py's and `ckptool reshard`'s layout) read as the
// model they hold: deepspeed/zero_checkpoint.h.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "deepspeed/zero_parts.h"
#include "torch/global_policy.h"

namespace ckpt::deepspeed {

namespace fs = std::filesystem;
using namespace detail;

bool LooksLikeUniversalCheckpoint(const std::string& path, const Volume& volume) {
  return volume.IsFile((fs::path(path) / "zero" / "optimizer_state.pt").string()) &&
         !Matching(path, "_model_states.pt", volume).empty() &&
         Matching(path, "_optim_states.pt", volume).empty();
}

namespace detail {

// A universal checkpoint (what ds_to_universal.py and `ckptool reshard` write): the model
// states files as DeepSpeed saved them, and per trainable parameter zero/<name>/fp32.pt (a
// dict {'cat_dim', 'param'}, or the flat tensor for stage 3) beside its optimizer state files.
// Read as the consolidated model: buffers and frozen parameters from the model states, each
// trainable parameter's fp32.pt in param_shapes order, aliases.
void OpenUniversal(ZeroCheckpoint& z, const OnRankFile& on_file) {
  z.universal = true;
  std::vector<std::string> model_names = Matching(z.folder, "_model_states.pt", *z.volume);
  auto open = [&](const fs::path& file) { return OpenRankFile(z, file.string(), on_file); };
  z.fragments.resize(model_names.size());
  for (size_t i = 0; i < model_names.size(); ++i) {
    auto f = open(fs::path(z.folder) / model_names[i]);
    if (i > 0) {
      z.fragments[i] = FrozenFragmentsOf(Index(*f, i));
      f->torch.reset();
    }
    z.files.push_back(std::move(f));
  }
  z.model_files = z.files.size();
  const bool stage3 = model_names[0].starts_with("zero_pp_rank_");
  // The stage: the optimizer state's zero_stage (BF16_Optimizer has none: stage 1), else the
  // model states files' names.
  {
    std::unique_ptr<CheckpointFile> os = open(fs::path(z.folder) / "zero" / "optimizer_state.pt");
    const RankFile o = Index(*os, 0);
    NodeId stage = Lookup(o.graph(), o.root(), "zero_stage");
    z.stage = stage != kNil ? StageOf(o.graph(), stage, os->path + ": zero_stage") : stage3 ? 3 : 1;
    z.optimizer_bytes = os->map.size();
  }
  if ((z.stage == 3) != stage3)
    Fail("{}: zero_stage {} but model states files named {}", z.folder, z.stage, model_names[0]);
  const fs::path zero = fs::path(z.folder) / "zero";
  std::vector<std::string> first_files;
  std::string first_name;
  ConsolidateUniversal(z, [&](const std::string& name) {
    const fs::path folder = zero / name;
    if (!z.volume->IsFile((folder / "fp32.pt").string()))
      Fail("{}: missing: parameter '{}' has no zero/{}/fp32.pt", z.folder, name, name);
    // DeepSpeed's loader takes every *.pt of a folder as a state of the parameter: every
    // folder must hold the same ones.
    std::vector<std::string> files = Matching(folder.string(), ".pt", *z.volume);
    if (first_name.empty()) {
      first_files = files;
      first_name = name;
    } else if (files != first_files) {
      Fail("{}: zero/{} holds {} but zero/{} holds {}", z.folder, name, fmt::join(files, ", "),
           first_name, fmt::join(first_files, ", "));
    }
    z.files.push_back(open(folder / "fp32.pt"));
    return z.files.size() - 1;
  });
}

}  // namespace detail

void ConsolidateUniversal(ZeroCheckpoint& z, const Fp32FileOf& fp32_file) {
  if (z.model_files == 0 || z.files.size() < z.model_files || !z.files[0]->torch)
    Fail("{}: needs its model states files read", z.folder);
  const RankFile m0 = Index(*z.files[0], 0);
  const Graph& g0 = m0.graph();
  NodeId dp = Lookup(g0, m0.root(), "dp_world_size");
  z.world_size = dp != kNil && g0.kind(dp) == Kind::kInt ? static_cast<int>(g0.at(dp).integer) : 0;
  std::vector<RankFile> ranks;
  for (size_t i = 0; i < z.model_files; ++i) {
    if (i > 0 && !z.files[i]->torch) {
      ranks.push_back({z.files[i].get(), i, {}});
      continue;
    }
    ranks.push_back(Index(*z.files[i], i));
  }
  AddBuffersAndFrozen(z, ranks);
  for (const auto& group : ParamShapes(m0)) {
    for (const auto& [name, shape] : group) {
      if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
        Fail("{}: parameter name '{}' cannot be a folder of zero/", z.folder, name);
      const size_t file = fp32_file(name);
      if (file >= z.files.size()) Fail("internal: no fp32.pt file for parameter '{}'", name);
      const RankFile rf = Index(*z.files[file], file);
      NodeId param = Lookup(rf.graph(), rf.root(), "param");
      NodeId t = param != kNil ? param : rf.root();
      RankFile::Data d = rf.TensorData(t, "zero/" + name + "/fp32.pt");
      ZeroTensor zt;
      zt.name = name;
      zt.kind = ZeroTensor::Kind::kTrainable;
      zt.shape = shape;
      zt.numel = NumelOf(shape);
      if (d.dtype != torch::DType::kFloat32 || d.numel != zt.numel) {
        Fail("{}: zero/{}/fp32.pt holds {} {} elements; parameter '{}' has {} float32", z.folder,
             name, d.numel, torch::Name(d.dtype), name, zt.numel);
      }
      if (zt.numel) zt.pieces.push_back({rf.index, d.offset, d.numel});
      z.tensors.push_back(std::move(zt));
    }
  }
  AddAliases(z, m0);
}

}  // namespace ckpt::deepspeed
