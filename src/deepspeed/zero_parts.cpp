#include "deepspeed/zero_parts.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "base/checked.h"
#include "torch/global_policy.h"

namespace ckpt::deepspeed::detail {

namespace fs = std::filesystem;

NodeId Lookup(const Graph& g, NodeId node, std::string_view key) {
  return g.ValueAt(node, key);
}

bool IsNone(const Graph& g, NodeId n) {
  return n == kNil || g.kind(n) == Kind::kNone;
}

std::span<const NodeId> Elements(const Graph& g, NodeId node, const std::string& what) {
  if (node == kNil || !g.has_compound(node) ||
      !(g.kind(node) == Kind::kList || g.kind(node) == Kind::kTuple ||
        g.kind(node) == Kind::kObject)) {
    Fail("{} is not a list", what);
  }
  return g.items(node);
}

std::vector<std::pair<std::string, NodeId>> Entries(const Graph& g, NodeId node,
                                                    const std::string& what) {
  if (node == kNil || !g.has_compound(node) ||
      !(g.kind(node) == Kind::kDict || g.kind(node) == Kind::kObject)) {
    Fail("{} is not a dict", what);
  }
  std::vector<std::pair<std::string, NodeId>> out;
  std::span<const NodeId> pairs = g.pairs(node);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    if (g.kind(pairs[i]) != Kind::kStr) Fail("{} has a key that is not a string", what);
    out.emplace_back(std::string(g.text(pairs[i])), pairs[i + 1]);
  }
  return out;
}

int64_t IntOf(const Graph& g, NodeId n, const std::string& what) {
  if (n == kNil || g.kind(n) != Kind::kInt) Fail("{} is not an integer", what);
  return g.at(n).integer;
}

std::vector<int64_t> ShapeOf(const Graph& g, NodeId n, const std::string& what) {
  if (n != kNil && g.kind(n) == Kind::kObject && g.IsCallOf(n, "torch", "Size")) n = g.Arg(n, 0);
  std::vector<int64_t> shape;
  for (NodeId d : Elements(g, n, what)) {
    int64_t v = IntOf(g, d, what);
    if (v < 0) Fail("{} has a negative dimension", what);
    shape.push_back(v);
  }
  return shape;
}

uint64_t NumelOf(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n = CheckedMul(n, static_cast<uint64_t>(d));
  return n;  // a 0-d shape is one element
}

int StageOf(const Graph& g, NodeId n, const std::string& what) {
  if (n != kNil && g.kind(n) == Kind::kInt) return static_cast<int>(g.at(n).integer);
  if (n != kNil && g.kind(n) == Kind::kObject) {
    NodeId fn = g.CalledGlobal(n);
    if (fn != kNil && g.global_name(fn) == "getattr" && g.ArgCount(n) == 2 &&
        g.kind(g.Arg(n, 1)) == Kind::kStr) {
      std::string_view member = g.text(g.Arg(n, 1));
      if (member == "disabled") return 0;
      if (member == "optimizer_states") return 1;
      if (member == "gradients") return 2;
      if (member == "weights") return 3;
      Fail("{}: unknown ZeRO stage '{}'", what, member);
    }
    if (fn != kNil && g.ArgCount(n) == 1 && g.kind(g.Arg(n, 0)) == Kind::kInt) {
      return static_cast<int>(g.at(g.Arg(n, 0)).integer);
    }
  }
  Fail("{} is not a ZeRO stage", what);
}

RankFile Index(const CheckpointFile& f, size_t index) {
  if (!f.torch) Fail("{}: not a torch checkpoint", f.path);
  const torch::Model& m = f.torch->model;
  if (!m.problems.empty())
    Fail("{}: {}: {} (run ckptool verify)", f.path, m.problems[0].where, m.problems[0].what);
  RankFile r;
  r.file = &f;
  r.index = index;
  for (size_t i = 0; i < m.tensors.size(); ++i) r.tensor_of.emplace(m.tensors[i].node, i);
  return r;
}

FrozenFragments FrozenFragmentsOf(const RankFile& rf) {
  FrozenFragments out;
  const Graph& g = rf.graph();
  NodeId fragments = Lookup(g, rf.root(), "frozen_param_fragments");
  if (IsNone(g, fragments)) return out;
  for (const auto& [name, node] :
       Entries(g, fragments, rf.file->path + ": frozen_param_fragments")) {
    if (out.count(name)) continue;  // the first of a repeated key, as a lookup finds it
    FrozenFragment& f = out[name];
    try {
      f.where = rf.TensorData(node, "frozen_param_fragments." + name);
    } catch (const Error& e) {
      f.error = e.what();
    }
  }
  return out;
}

std::vector<Piece> Fp32Partitions(const RankFile& rf, int stage) {
  const char* groups_key = stage <= 2 ? "single_partition_of_fp32_groups" : "fp32_flat_groups";
  const Graph& g = rf.graph();
  NodeId osd = Lookup(g, rf.root(), "optimizer_state_dict");
  NodeId groups = Lookup(g, osd, groups_key);
  if (groups == kNil) Fail("{}: no optimizer_state_dict.{}", rf.file->path, groups_key);
  std::vector<Piece> ps;
  std::span<const NodeId> elems = Elements(g, groups, rf.file->path + ": " + groups_key);
  for (size_t i = 0; i < elems.size(); ++i) {
    std::string what = fmt::format("{}.{}", groups_key, i);
    RankFile::Data d = rf.TensorData(elems[i], what);
    if (d.numel && d.dtype != torch::DType::kFloat32)
      Fail("{}: {} is {}, not float32", rf.file->path, what, torch::Name(d.dtype));
    ps.push_back({rf.index, d.offset, d.numel});
  }
  return ps;
}

NodeId LookupInt(const Graph& g, NodeId node, int64_t key) {
  if (node == kNil || !g.has_compound(node)) return kNil;
  std::span<const NodeId> pairs = g.pairs(node);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    if (g.kind(pairs[i]) == Kind::kInt && g.at(pairs[i]).integer == key) return pairs[i + 1];
  }
  return kNil;
}

NodeId OptimizerStateOf(const RankFile& rf, int stage) {
  const Graph& g = rf.graph();
  NodeId osd = Lookup(g, rf.root(), "optimizer_state_dict");
  NodeId inner = Lookup(g, osd, stage <= 2 ? "base_optimizer_state" : "optimizer_state_dict");
  NodeId state = Lookup(g, inner, "state");
  if (state == kNil) {
    Fail("{}: no optimizer_state_dict.{}.state", rf.file->path,
         stage <= 2 ? "base_optimizer_state" : "optimizer_state_dict");
  }
  return state;
}

ShapeGroups ParamShapes(const RankFile& m0) {
  const Graph& g0 = m0.graph();
  const std::string& p0 = m0.file->path;
  NodeId param_shapes = Lookup(g0, m0.root(), "param_shapes");
  if (IsNone(g0, param_shapes))
    Fail("{}: no param_shapes (was the model trained with a ZeRO optimizer?)", p0);
  ShapeGroups shape_groups;
  for (NodeId group : Elements(g0, param_shapes, p0 + ": param_shapes")) {
    shape_groups.emplace_back();
    for (const auto& [name, shape_node] : Entries(g0, group, p0 + ": param_shapes")) {
      shape_groups.back().emplace_back(name,
                                       ShapeOf(g0, shape_node, p0 + ": param_shapes." + name));
    }
  }
  return shape_groups;
}

std::vector<std::vector<uint64_t>> AlignmentPaddings(const RankFile& optim, NodeId osd) {
  std::vector<std::vector<uint64_t>> paddings;
  const Graph& g = optim.graph();
  NodeId pad = Lookup(g, osd, "param_alignment_paddings");
  if (IsNone(g, pad)) return paddings;
  for (NodeId group : Elements(g, pad, optim.file->path + ": param_alignment_paddings")) {
    paddings.emplace_back();
    for (NodeId n : Elements(g, group, optim.file->path + ": param_alignment_paddings")) {
      int64_t v = IntOf(g, n, "param_alignment_paddings");
      if (v < 0) Fail("{}: negative param_alignment_paddings", optim.file->path);
      paddings.back().push_back(static_cast<uint64_t>(v));
    }
  }
  return paddings;
}

std::vector<std::vector<Piece>> LayOutTrainable(const ZeroCheckpoint& z,
                                                const ShapeGroups& shape_groups,
                                                const std::vector<std::vector<uint64_t>>& paddings,
                                                const std::vector<std::vector<Piece>>& partitions,
                                                uint64_t element_size, std::vector<int>* group_of) {
  std::vector<std::vector<Piece>> out;
  const uint64_t ws = static_cast<uint64_t>(z.world_size);
  if (z.stage <= 2) {
    if (shape_groups.size() != partitions[0].size()) {
      Fail("{}: param_shapes has {} groups but the optimizer files have {}", z.folder,
           shape_groups.size(), partitions[0].size());
    }
    if (!paddings.empty() && paddings.size() != shape_groups.size()) {
      Fail("{}: param_alignment_paddings has {} groups but param_shapes has {}", z.folder,
           paddings.size(), shape_groups.size());
    }
    for (size_t gi = 0; gi < shape_groups.size(); ++gi) {
      FlatRun group;
      for (const std::vector<Piece>& rank : partitions) group.Add(rank[gi]);
      if (!paddings.empty() && paddings[gi].size() != shape_groups[gi].size()) {
        Fail("{}: group {}: {} parameter alignment paddings for {} parameters", z.folder, gi,
             paddings[gi].size(), shape_groups[gi].size());
      }
      uint64_t offset = 0;
      for (size_t pi = 0; pi < shape_groups[gi].size(); ++pi) {
        const auto& [name, shape] = shape_groups[gi][pi];
        uint64_t numel = NumelOf(shape);
        if (offset + numel > group.total) {
          Fail("{}: group {} holds {} elements, too few for parameter '{}'", z.folder, gi,
               group.total, name);
        }
        out.emplace_back();
        group.Cut(offset, offset + numel, element_size, out.back());
        if (group_of) group_of->push_back(static_cast<int>(gi));
        offset += numel;
        if (!paddings.empty()) offset += paddings[gi][pi];
      }
      auto align = [&](uint64_t x) { return (x + 2 * ws - 1) / (2 * ws) * (2 * ws); };
      if (align(offset) != align(group.total)) {
        Fail(
            "{}: group {}: consumed {} elements out of {}; the partitions do not match "
            "param_shapes",
            z.folder, gi, align(offset), align(group.total));
      }
    }
    return out;
  }
  std::vector<FlatRun> rank_flat(partitions.size());
  for (size_t r = 0; r < partitions.size(); ++r) {
    for (const Piece& p : partitions[r]) rank_flat[r].Add(p);
  }
  uint64_t offset = 0;
  // Which sub-group each rank-flat offset falls in (sub-groups have the same length on every
  // rank).
  std::vector<uint64_t> sub_ends;
  for (const Piece& p : partitions[0])
    sub_ends.push_back((sub_ends.empty() ? 0 : sub_ends.back()) + p.count);
  for (const auto& group : shape_groups) {
    for (const auto& [name, shape] : group) {
      uint64_t numel = NumelOf(shape);
      uint64_t ps = (numel + ws - 1) / ws;
      std::vector<Piece> joined;
      for (const FlatRun& run : rank_flat) {
        if (offset + ps > run.total)
          Fail("{}: a rank's partitions are too short for parameter '{}'", z.folder, name);
        run.Cut(offset, offset + ps, element_size, joined);
      }
      FlatRun all;
      for (const Piece& p : joined) all.Add(p);
      out.emplace_back();
      all.Cut(0, numel, element_size, out.back());
      if (group_of) {
        // (an empty parameter at the very end sits at the last sub-group's end)
        auto it = std::upper_bound(sub_ends.begin(), sub_ends.end(), offset);
        size_t sub = static_cast<size_t>(it - sub_ends.begin());
        group_of->push_back(static_cast<int>(std::min(sub, sub_ends.size() - 1)));
      }
      offset += ps;
    }
  }
  for (const FlatRun& run : rank_flat) {
    if (run.total != rank_flat[0].total)
      Fail("{}: the ranks' partitions differ in length", z.folder);
  }
  if (offset != rank_flat[0].total) {
    Fail("{}: consumed {} elements out of {}; the partitions do not match param_shapes", z.folder,
         offset * ws, rank_flat[0].total * ws);
  }
  return out;
}

void AddBuffersAndFrozen(ZeroCheckpoint& z, const std::vector<RankFile>& ranks) {
  const RankFile& m0 = ranks[0];
  const Graph& g0 = m0.graph();
  const std::string& p0 = m0.file->path;
  NodeId buffer_names = Lookup(g0, m0.root(), "buffer_names");
  if (buffer_names == kNil) Fail("{}: no buffer_names: not a model states file", p0);
  std::vector<std::string> buffers;
  for (NodeId n : Elements(g0, buffer_names, p0 + ": buffer_names")) {
    if (g0.kind(n) != Kind::kStr) Fail("{}: buffer_names holds a non-string", p0);
    buffers.emplace_back(g0.text(n));
  }
  NodeId module = Lookup(g0, m0.root(), "module");
  if (module == kNil) Fail("{}: no module", p0);
  for (const auto& [name, value] : Entries(g0, module, p0 + ": module")) {
    if (std::find(buffers.begin(), buffers.end(), name) == buffers.end()) continue;
    RankFile::Data d = m0.TensorData(value, "module." + name);
    const torch::Tensor& t = m0.file->torch->model.tensors[m0.tensor_of.at(value)];
    ZeroTensor zt;
    zt.name = name;
    zt.kind = ZeroTensor::Kind::kBuffer;
    zt.stored = d.dtype;
    // zero_to_fp32: `v.float() if v.is_floating_point() else v`.
    zt.dtype = torch::IsFloatingPoint(d.dtype) ? torch::DType::kFloat32 : d.dtype;
    zt.shape = t.shape;
    zt.numel = d.numel;
    if (d.numel) zt.pieces.push_back({m0.index, d.offset, d.numel});
    z.tensors.push_back(std::move(zt));
  }

  NodeId frozen_shapes = Lookup(g0, m0.root(), "frozen_param_shapes");
  // Each model file's fragments by name: read now from a parsed file, at open from the rest.
  std::vector<FrozenFragments> parsed_fragments(z.model_files);
  std::vector<const FrozenFragments*> fragments_of(z.model_files);
  if (!IsNone(g0, frozen_shapes)) {
    for (size_t r = 0; r < z.model_files; ++r) {
      if (z.files[r]->torch) {
        parsed_fragments[r] = FrozenFragmentsOf(ranks[r]);
        fragments_of[r] = &parsed_fragments[r];
      } else {
        if (r >= z.fragments.size()) Fail("internal: {} was not read", z.files[r]->path);
        fragments_of[r] = &z.fragments[r];
      }
    }
    for (const auto& [name, shape_node] :
         Entries(g0, frozen_shapes, p0 + ": frozen_param_shapes")) {
      ZeroTensor zt;
      zt.name = name;
      zt.kind = ZeroTensor::Kind::kFrozen;
      zt.shape = ShapeOf(g0, shape_node, p0 + ": frozen_param_shapes." + name);
      zt.numel = NumelOf(zt.shape);
      // Stage 2: the first file holds each frozen param whole; stage 3: every rank a fragment.
      size_t last = z.stage <= 2 ? 1 : z.model_files;
      FlatRun run;
      for (size_t r = 0; r < last; ++r) {
        const std::string& path = z.files[r]->path;
        auto frag = fragments_of[r]->find(name);
        if (frag == fragments_of[r]->end()) Fail("{}: no frozen_param_fragments.{}", path, name);
        if (!frag->second.error.empty()) Fail("{}", frag->second.error);
        const Fragment& d = frag->second.where;
        if (r == 0) zt.stored = zt.dtype = d.dtype;
        if (d.dtype != zt.stored)
          Fail("{}: frozen_param_fragments.{} changes dtype between ranks", path, name);
        run.Add({r, d.offset, d.numel});
      }
      if (run.total < zt.numel) {
        Fail("{}: frozen parameter '{}' needs {} elements but its fragments hold {}", z.folder,
             name, zt.numel, run.total);
      }
      run.Cut(0, zt.numel, torch::ElementSize(zt.stored), zt.pieces);
      z.tensors.push_back(std::move(zt));
    }
  }
}

void AddAliases(ZeroCheckpoint& z, const RankFile& m0) {
  const Graph& g0 = m0.graph();
  const std::string& p0 = m0.file->path;
  NodeId shared = Lookup(g0, m0.root(), "shared_params");
  if (!IsNone(g0, shared)) {
    std::unordered_map<std::string, size_t> known;
    for (size_t i = 0; i < z.tensors.size(); ++i) known.emplace(z.tensors[i].name, i);
    for (const auto& [alias, owner] : Entries(g0, shared, p0 + ": shared_params")) {
      if (g0.kind(owner) != Kind::kStr) Fail("{}: shared_params.{} is not a name", p0, alias);
      std::string owner_name(g0.text(owner));
      if (known.count(owner_name) && !known.count(alias)) z.aliases.emplace_back(alias, owner_name);
    }
  }
}

std::vector<std::string> Matching(const std::string& folder, std::string_view suffix,
                                  const Volume& volume) {
  std::vector<std::string> out;
  if (!volume.IsFolder(folder)) return out;
  for (const Node& e : volume.List(folder)) {
    std::string name = fs::path(e.path).filename().string();
    if (name.ends_with(suffix) && e.type == NodeType::kFile) out.push_back(name);
  }
  std::sort(out.begin(), out.end(), DigitAwareLess);
  return out;
}

std::unique_ptr<CheckpointFile> OpenRankFile(ZeroCheckpoint& z, const std::string& path,
                                             const OnRankFile& on_file) {
  auto f = std::make_unique<CheckpointFile>(OpenCheckpoint(*z.volume, path));
  if (f->torch) {
    for (const torch::UnsafeFinding& u : torch::FindUnsafe(f->torch->model.graph))
      z.findings.push_back(fmt::format("{}: the pickle {}", f->path, u.what));
  }
  if (on_file) on_file(*f);
  return f;
}

}  // namespace ckpt::deepspeed::detail
