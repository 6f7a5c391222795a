#include "deepspeed/zero_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <unordered_map>

#include "base/checked.h"
#include "base/error.h"
#include "io/text_file.h"
#include "torch/global_policy.h"
#include "torch/tensor_bytes.h"

namespace ckpt::deepspeed {

namespace fs = std::filesystem;
using pickle::Graph;
using pickle::Kind;
using pickle::kNil;
using pickle::NodeId;

namespace {

// ---- reading values out of a pickle graph ----

// A dict, or an object built with SETITEMS (OrderedDict): the value under a string key.
NodeId Lookup(const Graph& g, NodeId node, std::string_view key) {
  return g.ValueAt(node, key);
}

bool IsNone(const Graph& g, NodeId n) {
  return n == kNil || g.kind(n) == Kind::kNone;
}

// A list or tuple (or an object built with APPENDS): its elements.
std::span<const NodeId> Elements(const Graph& g, NodeId node, const std::string& what) {
  if (node == kNil || !g.has_compound(node) ||
      !(g.kind(node) == Kind::kList || g.kind(node) == Kind::kTuple ||
        g.kind(node) == Kind::kObject)) {
    Fail("{} is not a list", what);
  }
  return g.items(node);
}

// String-keyed entries of a dict or OrderedDict, in order.
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

// torch.Size((...)), or a plain tuple or list of ints.
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

// ZeroStageEnum: a plain int, ZeroStageEnum(2) (Python <= 3.10) or getattr(ZeroStageEnum,
// 'gradients') (Python >= 3.11).
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

// ---- one rank file ----

struct RankFile {
  const CheckpointFile* file = nullptr;
  size_t index = 0;
  std::unordered_map<NodeId, size_t> tensor_of;  // rebuild call -> tensor

  const Graph& graph() const { return file->torch->model.graph; }
  NodeId root() const { return graph().root; }

  // The data of the tensor at `node`: where its elements start, how many, which dtype.
  using Data = Fragment;
  Data TensorData(NodeId node, const std::string& what) const {
    auto it = tensor_of.find(node);
    if (it == tensor_of.end()) Fail("{}: {} is not a tensor", file->path, what);
    const torch::Tensor& t = file->torch->model.tensors[it->second];
    if (t.numel == 0) return {0, 0, t.dtype};
    if (t.storage < 0 || !IsContiguous(t))
      Fail("{}: {} is not a contiguous tensor", file->path, what);
    const torch::Storage& s = file->torch->model.storages[t.storage];
    if (!s.present || s.compressed)
      Fail("{}: {}: its storage record is compressed or missing", file->path, what);
    return {s.data_offset + t.byte_begin, t.numel, t.dtype};
  }
};

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

// A model states file's frozen_param_fragments (none when it has none).
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

// A flat run of elements spread over consecutive pieces (a group's ranks, a rank's
// sub-groups): the pieces covering elements [begin, end).
struct FlatRun {
  std::vector<Piece> parts;
  std::vector<uint64_t> starts;  // element offset of each part
  uint64_t total = 0;

  void Add(Piece p) {
    starts.push_back(total);
    total += p.count;
    parts.push_back(p);
  }
  void Cut(uint64_t begin, uint64_t end, uint64_t element_size, std::vector<Piece>& out) const {
    auto it = std::upper_bound(starts.begin(), starts.end(), begin);
    size_t k = it == starts.begin() ? 0 : static_cast<size_t>(it - starts.begin()) - 1;
    for (; k < parts.size() && begin < end; ++k) {
      uint64_t lo = std::max(begin, starts[k]), hi = std::min(end, starts[k] + parts[k].count);
      if (lo >= hi) continue;
      out.push_back({parts[k].file, parts[k].offset + (lo - starts[k]) * element_size, hi - lo});
      begin = hi;
    }
  }
};

// One optimizer file's fp32 partitions: per group (stages 1/2) or sub-group (stage 3), where
// this rank's flat piece lies.
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

// A dict keyed by integers (an optimizer's `state`): the value under `key`.
NodeId LookupInt(const Graph& g, NodeId node, int64_t key) {
  if (node == kNil || !g.has_compound(node)) return kNil;
  std::span<const NodeId> pairs = g.pairs(node);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    if (g.kind(pairs[i]) == Kind::kInt && g.at(pairs[i]).integer == key) return pairs[i + 1];
  }
  return kNil;
}

// The optimizer's `state` dict in an optimizer file: base_optimizer_state.state (stages 1/2),
// optimizer_state_dict.state (stage 3).
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

using ShapeGroups = std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>>;

// The first model states file's param_shapes: per group, each trainable parameter's name and
// shape, in flat order.
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

// DeepSpeed >= 0.19.7 (stages 1 and 2, zero_optimization.parameter_alignment): elements of
// padding after each parameter in its group's flat partition, per group.
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

// Per trainable parameter (param_shapes order): the pieces of one per-element buffer that hold
// it, given each rank's flat partition of it per group (stages 1/2) or sub-group (stage 3).
// Stages 1/2: a group's buffer is the ranks' pieces joined; parameters are consecutive ranges
// with their alignment paddings between. Stage 3: each parameter takes ceil(numel / world)
// elements at the same offset of every rank's joined sub-groups. `group_of` (optional) gets
// each parameter's group or sub-group.
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

// The buffers and frozen parameters the model states files hold (zero_to_fp32's order: buffers,
// then frozen parameters), appended to z.tensors. `ranks` starts with the model states files.
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

// shared_params: each alias of a tensor that is there, by its owner's name.
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

std::vector<std::string> Matching(const std::string& folder, std::string_view suffix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    std::string name = e.path().filename().string();
    if (name.ends_with(suffix) && e.is_regular_file(ec)) out.push_back(name);
  }
  std::sort(out.begin(), out.end(), DigitAwareLess);
  return out;
}

}  // namespace

namespace {

// DeepSpeed's `latest`: a small text file holding the tag folder's name. A file of that name
// that is anything else (a symlink to a model file, say) is no ZeRO marker: nullopt.
std::optional<std::string> LatestTag(const fs::path& root, const char* marker = "latest") {
  std::error_code ec;
  fs::path latest = root / marker;
  if (!fs::is_regular_file(latest, ec)) return std::nullopt;
  uintmax_t size = fs::file_size(latest, ec);
  if (ec || size > 4096) return std::nullopt;
  std::string tag = ReadMarkerFile(latest.string());
  for (unsigned char c : tag) {
    if (c < 0x20 || c == 0x7F || c == '/') return std::nullopt;
  }
  return tag;  // "" when empty: OpenZeroCheckpoint says so
}

// One file of the checkpoint, read, with what its pickle would import or call noted in
// z.findings, and shown to `on_file`.
std::unique_ptr<CheckpointFile> OpenRankFile(ZeroCheckpoint& z, const std::string& path,
                                             const OnRankFile& on_file) {
  auto f = std::make_unique<CheckpointFile>(OpenCheckpoint(path));
  if (f->torch) {
    for (const torch::UnsafeFinding& u : torch::FindUnsafe(f->torch->model.graph))
      z.findings.push_back(fmt::format("{}: the pickle {}", f->path, u.what));
  }
  if (on_file) on_file(*f);
  return f;
}

// Every *.pt of a parameter's folder in zero/, sorted: its state files.
std::vector<std::string> StateFiles(const fs::path& folder) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    std::string name = e.path().filename().string();
    if (name.ends_with(".pt") && e.is_regular_file(ec)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

bool LooksLikeUniversalCheckpoint(const std::string& path);

namespace {

// A universal checkpoint (what ds_to_universal.py and `ckptool reshard` write): the model
// states files as DeepSpeed saved them, and per trainable parameter zero/<name>/fp32.pt (a
// dict {'cat_dim', 'param'}, or the flat tensor for stage 3) beside its optimizer state files.
// Read as the consolidated model: buffers and frozen parameters from the model states, each
// trainable parameter's fp32.pt in param_shapes order, aliases.
void OpenUniversal(ZeroCheckpoint& z, const OnRankFile& on_file) {
  z.universal = true;
  std::vector<std::string> model_names = Matching(z.folder, "_model_states.pt");
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
  const RankFile m0 = Index(*z.files[0], 0);
  const Graph& g0 = m0.graph();
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
  const fs::path zero = fs::path(z.folder) / "zero";
  std::vector<std::string> first_files;
  std::string first_name;
  for (const auto& group : ParamShapes(m0)) {
    for (const auto& [name, shape] : group) {
      if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
        Fail("{}: parameter name '{}' cannot be a folder of zero/", z.folder, name);
      const fs::path folder = zero / name;
      std::error_code ec;
      if (!fs::is_regular_file(folder / "fp32.pt", ec))
        Fail("{}: missing: parameter '{}' has no zero/{}/fp32.pt", z.folder, name, name);
      // DeepSpeed's loader takes every *.pt of a folder as a state of the parameter: every
      // folder must hold the same ones.
      std::vector<std::string> files = StateFiles(folder);
      if (first_name.empty()) {
        first_files = files;
        first_name = name;
      } else if (files != first_files) {
        Fail("{}: zero/{} holds {} but zero/{} holds {}", z.folder, name, fmt::join(files, ", "),
             first_name, fmt::join(first_files, ", "));
      }
      z.files.push_back(open(folder / "fp32.pt"));
      const RankFile rf = Index(*z.files.back(), z.files.size() - 1);
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

}  // namespace

bool LooksLikeUniversalCheckpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(path) / "zero" / "optimizer_state.pt", ec) &&
         !Matching(path, "_model_states.pt").empty() && Matching(path, "_optim_states.pt").empty();
}

bool LooksLikeZeroCheckpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  if (LatestTag(path) || LatestTag(path, "latest_universal")) return true;
  return !Matching(path, "_optim_states.pt").empty() || LooksLikeUniversalCheckpoint(path);
}

ZeroCheckpoint OpenZeroCheckpoint(const std::string& path, const std::string& tag,
                                  const OnRankFile& on_file) {
  ZeroCheckpoint z;
  std::error_code ec;
  fs::path root(path);
  if (!tag.empty()) {
    z.tag = tag;
  } else if (std::optional<std::string> latest = LatestTag(root)) {
    z.tag = *latest;
    if (z.tag.empty()) Fail("{}: the 'latest' file is empty", (root / "latest").string());
  } else if (!Matching(path, "_optim_states.pt").empty() || LooksLikeUniversalCheckpoint(path)) {
    z.tag = root.filename().string();
    root = root.parent_path();
  } else if (std::optional<std::string> universal = LatestTag(root, "latest_universal")) {
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
  if (!fs::is_directory(z.folder, ec))
    Fail("{}: no such checkpoint folder (tag '{}')", z.folder, z.tag);
  if (LooksLikeUniversalCheckpoint(z.folder)) {
    OpenUniversal(z, on_file);
    return z;
  }
  std::vector<std::string> model_names = Matching(z.folder, "_model_states.pt");
  std::vector<std::string> optim_names = Matching(z.folder, "_optim_states.pt");
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
