// The optimizer state of a ZeRO checkpoint laid out per parameter: deepspeed/zero_checkpoint.h.
#include <fmt/format.h>

#include <unordered_map>

#include "deepspeed/zero_parts.h"

namespace ckpt::deepspeed {

using namespace detail;

ZeroOptimizerState ConsolidateOptimizerState(const ZeroCheckpoint& z) {
  ZeroOptimizerState out;
  if (z.model_files == 0 || z.model_files >= z.files.size() || !z.files[0]->torch)
    Fail("{}: needs its model states and optimizer files read", z.folder);
  std::vector<RankFile> optim;
  for (size_t i = z.model_files; i < z.files.size(); ++i) {
    if (!z.files[i]->torch) Fail("internal: {} is no longer read", z.files[i]->path);
    optim.push_back(Index(*z.files[i], i));
  }
  const RankFile m0 = Index(*z.files[0], 0);
  const RankFile& first = optim[0];
  NodeId osd0 = Lookup(first.graph(), first.root(), "optimizer_state_dict");
  ShapeGroups shape_groups = ParamShapes(m0);
  std::vector<std::vector<uint64_t>> paddings = AlignmentPaddings(first, osd0);
  std::vector<std::vector<Piece>> fp32;
  for (const RankFile& rf : optim) fp32.push_back(Fp32Partitions(rf, z.stage));
  const size_t groups = fp32[0].size();
  out.step_file = first.index;
  // The keys: what the first group's state holds as tensors of at least its partition's length
  // (exp_avg, exp_avg_sq, momentum_buffer...); `step` apart.
  {
    const Graph& g = first.graph();
    NodeId st = LookupInt(g, OptimizerStateOf(first, z.stage), 0);
    if (st == kNil)
      Fail("{}: no optimizer state for group 0 (has the optimizer stepped?)", first.file->path);
    for (const auto& [key, value] : Entries(g, st, first.file->path + ": state.0")) {
      if (key == "step") continue;
      if (!first.tensor_of.count(value)) continue;  // a number or a flag: no per-element state
      RankFile::Data d = first.TensorData(value, "state.0." + key);
      if (d.numel < fp32[0][0].count) continue;
      out.keys.push_back(key);
      out.dtypes.push_back(d.dtype);
    }
  }
  // The step, per group (stages 1/2 keep one per group; stage 3 one per sub-group).
  for (size_t gi = 0; gi < groups; ++gi) {
    const Graph& g = first.graph();
    NodeId st = LookupInt(g, OptimizerStateOf(first, z.stage), static_cast<int64_t>(gi));
    out.steps.push_back(st == kNil ? kNil : Lookup(g, st, "step"));
  }
  std::vector<std::vector<std::vector<Piece>>> per_key;  // [key][trainable]
  std::vector<int> group_of;
  for (size_t k = 0; k < out.keys.size(); ++k) {
    const std::string& key = out.keys[k];
    std::vector<std::vector<Piece>> partitions;
    for (size_t r = 0; r < optim.size(); ++r) {
      const RankFile& rf = optim[r];
      const Graph& g = rf.graph();
      NodeId state = OptimizerStateOf(rf, z.stage);
      std::vector<Piece> ps;
      for (size_t gi = 0; gi < groups; ++gi) {
        std::string what = fmt::format("state.{}.{}", gi, key);
        NodeId st = LookupInt(g, state, static_cast<int64_t>(gi));
        NodeId t = Lookup(g, st, key);
        if (t == kNil) Fail("{}: no optimizer {}", rf.file->path, what);
        RankFile::Data d = rf.TensorData(t, what);
        if (d.dtype != out.dtypes[k])
          Fail("{}: {} is {}, not {}", rf.file->path, what, torch::Name(d.dtype),
               torch::Name(out.dtypes[k]));
        // Laid out as the fp32 partition; a group's padding at the end of the last rank's
        // piece (kept in the moments, not in the fp32 partition) is left out.
        if (d.numel < fp32[r][gi].count)
          Fail("{}: {} holds {} elements, its fp32 partition {}", rf.file->path, what, d.numel,
               fp32[r][gi].count);
        ps.push_back({rf.index, d.offset, fp32[r][gi].count});
      }
      partitions.push_back(std::move(ps));
    }
    group_of.clear();
    per_key.push_back(LayOutTrainable(z, shape_groups, paddings, partitions,
                                      torch::ElementSize(out.dtypes[k]), &group_of));
  }
  if (out.keys.empty()) LayOutTrainable(z, shape_groups, paddings, fp32, 4, &group_of);
  std::unordered_map<std::string, size_t> tensor_of;
  for (size_t i = 0; i < z.tensors.size(); ++i) {
    if (z.tensors[i].kind == ZeroTensor::Kind::kTrainable) tensor_of.emplace(z.tensors[i].name, i);
  }
  size_t n = 0;
  for (const auto& group : shape_groups) {
    for (const auto& [name, shape] : group) {
      ZeroOptimizerState::Param p;
      auto it = tensor_of.find(name);
      if (it == tensor_of.end()) Fail("internal: parameter '{}' was not consolidated", name);
      p.tensor = it->second;
      p.group = group_of.at(n);
      for (auto& key_pieces : per_key) p.pieces.push_back(std::move(key_pieces[n]));
      out.params.push_back(std::move(p));
      ++n;
    }
  }
  return out;
}

}  // namespace ckpt::deepspeed
