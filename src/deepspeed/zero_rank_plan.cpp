// ZeRO rank files for another world size: deepspeed/zero_rank_plan.h.
#include "deepspeed/zero_rank_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "deepspeed/zero_parts.h"

namespace ckpt::deepspeed {

using namespace detail;
namespace fs = std::filesystem;

namespace {

constexpr int kMaxWorld = 1 << 20;
constexpr double kDefaultSubGroupSize = 1e9;  // zero_optimization.sub_group_size

uint64_t CeilDiv(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

// ds_config.zero_optimization.<key> in a rank file, when it is a number or a flag.
std::optional<double> ZeroConfig(const RankFile& rf, std::string_view key) {
  const Graph& g = rf.graph();
  NodeId v = Lookup(g, Lookup(g, Lookup(g, rf.root(), "ds_config"), "zero_optimization"), key);
  if (v == kNil) return std::nullopt;
  switch (g.kind(v)) {
    case Kind::kInt:
      return static_cast<double>(g.at(v).integer);
    case Kind::kFloat:
      return g.at(v).real;
    case Kind::kBool:
      return g.at(v).boolean ? 1.0 : 0.0;
    default:
      return std::nullopt;
  }
}

// The value under the string key `key` of the dict (or object) `node` set to `value`.
void SetValue(Graph& g, NodeId node, std::string_view key, NodeId value, const std::string& what) {
  if (node == kNil || !g.has_compound(node)) Fail("{} is not a dict", what);
  std::span<NodeId> pairs = g.mutable_pairs(node);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    if (g.kind(pairs[i]) == Kind::kStr && g.text(pairs[i]) == key) {
      pairs[i + 1] = value;
      return;
    }
  }
  Fail("{} has no '{}'", what, key);
}

// A list (or tuple) value's element i set to `value`.
void SetElement(Graph& g, NodeId list, size_t i, NodeId value, const std::string& what) {
  if (i >= Elements(g, list, what).size()) Fail("{} has no element {}", what, i);
  if (g.kind(list) == Kind::kTuple) {
    std::vector<NodeId> items(g.items(list).begin(), g.items(list).end());
    items[i] = value;
    g.SetItems(list, items);
  } else {
    g.SetItem(list, i, value);
  }
}

// Element i of a list (or tuple) value; fails when there is none.
NodeId ElementAt(const Graph& g, NodeId list, size_t i, const std::string& what) {
  std::span<const NodeId> items = Elements(g, list, what);
  if (i >= items.size()) Fail("{} has no element {}", what, i);
  return items[i];
}

// The file name of rank `rank` made from rank 0's.
std::string RankName(const std::string& rank0_path, int rank) {
  std::string name = fs::path(rank0_path).filename().string();
  size_t at = name.find("zero_pp_rank_0_");
  if (at == std::string::npos) Fail("{}: not named like a rank 0 file", rank0_path);
  return name.replace(at, 15, fmt::format("zero_pp_rank_{}_", rank));
}

// The trainable parameters (indexes into os.params) of each group (stages 1/2) or sub-group
// (stage 3), in flat order.
std::vector<std::vector<size_t>> ParamsByGroup(const ZeroOptimizerState& os, size_t groups) {
  std::vector<std::vector<size_t>> out(groups);
  for (size_t i = 0; i < os.params.size(); ++i) {
    size_t g = static_cast<size_t>(os.params[i].group);
    if (os.params[i].group < 0 || g >= groups) Fail("internal: parameter {} has no group", i);
    out[g].push_back(i);
  }
  return out;
}

// Stages 1/2: one group's flat buffer laid out for `world` ranks.
struct FlatGroup {
  std::vector<size_t> params;     // indexes into os.params
  std::vector<uint64_t> offsets;  // each parameter's first element in the buffer
  std::vector<uint64_t> paddings;
  uint64_t padded = 0;     // the parameters and their alignment paddings
  uint64_t partition = 0;  // elements per rank

  // What of rank r's partition lies past the parameters (stage_1_and_2.py: groups_padding).
  uint64_t Padding(uint64_t r) const {
    uint64_t left = r * partition;
    if (padded <= left) return partition;
    if (padded < left + partition) return left + partition - padded;
    return 0;
  }
};

FlatGroup LayOutGroup(const ZeroCheckpoint& z, const ZeroOptimizerState& os,
                      std::vector<size_t> params, const std::vector<uint64_t>& paddings,
                      uint64_t world) {
  FlatGroup f;
  f.params = std::move(params);
  if (!paddings.empty() && paddings.size() != f.params.size())
    Fail("{}: param_alignment_paddings has {} entries for {} parameters", z.folder, paddings.size(),
         f.params.size());
  for (size_t j = 0; j < f.params.size(); ++j) {
    f.offsets.push_back(f.padded);
    f.paddings.push_back(paddings.empty() ? 0 : paddings[j]);
    f.padded += z.tensors[os.params[f.params[j]].tensor].numel + f.paddings.back();
  }
  const uint64_t alignment = 2 * world;  // nccl_start_alignment_factor x world size
  f.partition = CeilDiv(f.padded, alignment) * alignment / world;
  return f;
}

// A group's whole flat buffer of one per-element state (`key` -1: the fp32 weights).
FlatRun FlatBuffer(const ZeroCheckpoint& z, const ZeroOptimizerState& os, const FlatGroup& f,
                   int key, uint64_t world) {
  FlatRun run;
  for (size_t j = 0; j < f.params.size(); ++j) {
    const ZeroOptimizerState::Param& p = os.params[f.params[j]];
    for (const Piece& piece : key < 0 ? z.tensors[p.tensor].pieces : p.pieces[key])
      if (piece.count) run.Add(piece);
    if (f.paddings[j]) run.Add({Piece::kZeros, 0, f.paddings[j]});
  }
  if (f.partition * world > f.padded) run.Add({Piece::kZeros, 0, f.partition * world - f.padded});
  return run;
}

// Stage 3: rank r's piece of one parameter (its elements, pieces of `run`), padded with zeros
// to ceil(numel / world), appended to `out`.
void AppendStage3Piece(const FlatRun& run, uint64_t numel, uint64_t world, uint64_t r,
                       uint64_t element_size, std::vector<Piece>& out) {
  const uint64_t size = CeilDiv(numel, world);
  const uint64_t lo = std::min(r * size, numel), hi = std::min(lo + size, numel);
  run.Cut(lo, hi, element_size, out);
  if (size > hi - lo) out.push_back({Piece::kZeros, 0, size - (hi - lo)});
}

FlatRun RunOf(const std::vector<Piece>& pieces) {
  FlatRun run;
  for (const Piece& p : pieces)
    if (p.count) run.Add(p);
  return run;
}

uint64_t Count(const std::vector<Piece>& pieces) {
  uint64_t n = 0;
  for (const Piece& p : pieces) n += p.count;
  return n;
}

// Builds one planned file from a source rank file: replaced tensors are added with Replace,
// every other tensor the pickle holds is kept with its bytes by Finish.
class FileBuilder {
 public:
  FileBuilder(const RankFile& source, std::string name) : source_(source) {
    out_.name = std::move(name);
    out_.graph = source.graph();  // node ids stay those of the source
    if (!source.file->torch->model.bare_refs.empty())
      Fail("{}: holds a storage outside any tensor; cannot be rewritten", source.file->path);
  }
  Graph& graph() { return out_.graph; }

  void Replace(NodeId node, const std::string& what, torch::DType dtype,
               std::vector<Piece> pieces) {
    if (!source_.tensor_of.count(node)) Fail("{}: {} is not a tensor", source_.file->path, what);
    if (!replaced_.insert(node).second) Fail("{}: {} is held twice", source_.file->path, what);
    ZeroTensor t;
    t.name = what;
    t.stored = t.dtype = dtype;
    t.numel = Count(pieces);
    t.shape = {static_cast<int64_t>(t.numel)};
    t.pieces = std::move(pieces);
    out_.tensors.emplace_back(node, std::move(t));
  }

  PlannedRankFile Finish() {
    const torch::Model& m = source_.file->torch->model;
    std::vector<std::pair<NodeId, size_t>> kept;
    for (const auto& [node, index] : source_.tensor_of) {
      if (!replaced_.count(node)) kept.emplace_back(node, index);
    }
    std::sort(kept.begin(), kept.end());
    for (const auto& [node, index] : kept) {
      const torch::Tensor& src = m.tensors[index];
      std::string what =
          src.names.empty() ? fmt::format("tensor {}", index) : std::string(src.names.front());
      if (src.kind != "tensor" || src.requires_grad)
        Fail("{}: {} is a {}{}; only plain tensors are carried over", source_.file->path, what,
             src.kind, src.requires_grad ? " that requires grad" : "");
      RankFile::Data d = source_.TensorData(node, what);
      ZeroTensor t;
      t.name = what;
      t.stored = t.dtype = src.dtype;
      t.shape = src.shape.vec();
      t.numel = src.numel;
      if (d.numel) t.pieces.push_back({source_.index, d.offset, d.numel});
      out_.tensors.emplace_back(node, std::move(t));
    }
    return std::move(out_);
  }

 private:
  const RankFile& source_;
  PlannedRankFile out_;
  std::unordered_set<NodeId> replaced_;
};

// fragment_address(numel=, start=) made like `proto` (a dataclass built with a state dict, or a
// namedtuple-style call of (numel, start)).
NodeId FragmentAddress(Graph& g, NodeId proto, uint64_t numel, uint64_t start) {
  const pickle::Compound pc = g.compound(proto);
  std::vector<NodeId> states(g.states(proto).begin(), g.states(proto).end());
  NodeId n = g.AddCompound(Kind::kObject);
  pickle::Compound& c = g.mutable_compound(n);
  c.callable = pc.callable;
  c.construct = pc.construct;
  c.kwargs = pc.kwargs;
  NodeId vn = g.AddInt(static_cast<int64_t>(numel)), vs = g.AddInt(static_cast<int64_t>(start));
  if (states.size() == 1 && g.kind(states[0]) == Kind::kDict) {
    g.mutable_compound(n).args = pc.args;
    NodeId d = g.AddCompound(Kind::kDict);
    std::vector<NodeId> pairs;
    for (const auto& [key, value] : Entries(g, states[0], "fragment_address")) {
      pairs.push_back(g.AddText(Kind::kStr, key));
      pairs.push_back(key == "numel" ? vn : key == "start" ? vs : value);
    }
    g.SetPairs(d, pairs);
    g.SetStates(n, std::vector<NodeId>{d});
  } else if (states.empty() && pc.args != kNil && g.kind(pc.args) == Kind::kTuple &&
             g.items(pc.args).size() == 2) {
    g.mutable_compound(n).args = g.AddTuple({vn, vs});
  } else {
    Fail("param_slice_mappings holds a fragment_address of an unknown form");
  }
  return n;
}

void CheckWorld(int world) {
  if (world < 1 || world > kMaxWorld)
    Fail("the world size must be 1 to {}, not {}", kMaxWorld, world);
}

}  // namespace

void SetWorldSize(Graph& g, int world) {
  CheckWorld(world);
  SetValue(g, g.root, "dp_world_size", g.AddInt(world), "the model states");
}

void CheckRepartition(const ZeroCheckpoint& z, const ZeroOptimizerState& os, int world) {
  CheckWorld(world);
  if (z.universal) Fail("{}: a universal checkpoint, not ZeRO rank files", z.folder);
  const RankFile t = Index(*z.files[z.model_files], z.model_files);
  const uint64_t w = static_cast<uint64_t>(world), ws = static_cast<uint64_t>(z.world_size);
  const size_t groups = os.steps.size();
  std::vector<std::vector<Piece>> fp32;  // the source's partitions, per rank and group
  for (size_t i = z.model_files; i < z.files.size(); ++i)
    fp32.push_back(Fp32Partitions(Index(*z.files[i], i), z.stage));
  auto refuse = [&](const std::string& why) {
    Fail("{}: cannot be written for {} ranks: {}", z.folder, world, why);
  };
  if (fp32.size() != ws)
    refuse(fmt::format("{} optimizer files for a world size of {}", fp32.size(), ws));
  for (const std::vector<Piece>& rank : fp32) {
    if (rank.size() != groups)
      refuse(fmt::format("a rank holds {} fp32 groups, the optimizer {}", rank.size(), groups));
  }
  if (z.stage <= 2) {
    if (ZeroConfig(t, "round_robin_gradients").value_or(0) != 0)
      refuse("round_robin_gradients orders the flat groups by the world size");
    NodeId osd = Lookup(t.graph(), t.root(), "optimizer_state_dict");
    std::vector<std::vector<uint64_t>> paddings = AlignmentPaddings(t, osd);
    std::vector<std::vector<size_t>> by_group = ParamsByGroup(os, groups);
    for (size_t gi = 0; gi < groups; ++gi) {
      // The source's partitions must be what the rules give for its own world size.
      FlatGroup f = LayOutGroup(z, os, by_group[gi],
                                gi < paddings.size() ? paddings[gi] : std::vector<uint64_t>{}, ws);
      for (uint64_t r = 0; r < ws; ++r) {
        if (fp32[r][gi].count != f.partition - std::min(f.partition, f.Padding(r)))
          refuse(fmt::format(
              "rank {} holds {} fp32 elements of group {}, DeepSpeed's layout {}: not a layout "
              "this version knows",
              r, fp32[r][gi].count, gi, f.partition - std::min(f.partition, f.Padding(r))));
      }
    }
    return;
  }
  // Stage 3: every sub-group must stay one (sub_group_size splits a group whose partition
  // reaches it), and the source's partitions must follow the rules.
  const double sub_group_size = ZeroConfig(t, "sub_group_size").value_or(kDefaultSubGroupSize);
  std::vector<std::vector<size_t>> by_group = ParamsByGroup(os, groups);
  for (size_t gi = 0; gi < groups; ++gi) {
    uint64_t at_source = 0, at_target = 0;
    for (size_t i : by_group[gi]) {
      at_source += CeilDiv(z.tensors[os.params[i].tensor].numel, ws);
      at_target += CeilDiv(z.tensors[os.params[i].tensor].numel, w);
    }
    for (uint64_t r = 0; r < ws; ++r) {
      if (fp32[r][gi].count != at_source)
        refuse(fmt::format("rank {} holds {} fp32 elements of sub-group {}, DeepSpeed's layout {}",
                           r, fp32[r][gi].count, gi, at_source));
    }
    if (static_cast<double>(at_source) >= sub_group_size ||
        static_cast<double>(at_target) > sub_group_size)
      refuse(
          fmt::format("sub-group {} holds {} elements a rank ({} on {} ranks) and "
                      "sub_group_size is {}: its sub-groups could split differently",
                      gi, at_source, at_target, world, sub_group_size));
  }
}

std::vector<PlannedRankFile> PlanRankFiles(const ZeroCheckpoint& z, const ZeroOptimizerState& os,
                                           int world, int rank) {
  CheckWorld(world);
  if (rank < 0 || rank >= world) Fail("internal: rank {} of {}", rank, world);
  const uint64_t w = static_cast<uint64_t>(world), r = static_cast<uint64_t>(rank);
  const size_t groups = os.steps.size();
  const RankFile t = Index(*z.files[z.model_files], z.model_files);
  const std::string where = t.file->path;
  std::vector<PlannedRankFile> out;
  FileBuilder b(t, RankName(where, rank));
  Graph& g = b.graph();
  NodeId osd = Lookup(g, g.root, "optimizer_state_dict");
  NodeId state = OptimizerStateOf(t, z.stage);
  std::vector<std::vector<size_t>> by_group = ParamsByGroup(os, groups);
  auto state_of = [&](size_t gi, size_t k) {
    NodeId st = LookupInt(g, state, static_cast<int64_t>(gi));
    NodeId n = Lookup(g, st, os.keys[k]);
    if (n == kNil) Fail("{}: no optimizer state.{}.{}", where, gi, os.keys[k]);
    return n;
  };
  if (z.stage <= 2) {
    std::vector<std::vector<uint64_t>> paddings = AlignmentPaddings(t, osd);
    NodeId singles = Lookup(g, osd, "single_partition_of_fp32_groups");
    NodeId group_paddings = Lookup(g, osd, "group_paddings");
    NodeId counts = Lookup(g, osd, "partition_count");
    NodeId mappings = Lookup(g, osd, "param_slice_mappings");
    NodeId proto = kNil;  // a fragment_address to make the new ones like
    if (!IsNone(g, mappings)) {
      for (NodeId m : Elements(g, mappings, where + ": param_slice_mappings")) {
        for (const auto& [name, address] : Entries(g, m, where + ": param_slice_mappings")) {
          if (proto == kNil) proto = address;
        }
      }
    }
    for (size_t gi = 0; gi < groups; ++gi) {
      FlatGroup f = LayOutGroup(z, os, by_group[gi],
                                gi < paddings.size() ? paddings[gi] : std::vector<uint64_t>{}, w);
      const uint64_t begin = r * f.partition, pad = std::min(f.partition, f.Padding(r));
      std::vector<Piece> pieces;
      FlatBuffer(z, os, f, -1, w).Cut(begin, begin + f.partition - pad, 4, pieces);
      const std::string what = fmt::format("single_partition_of_fp32_groups.{}", gi);
      b.Replace(ElementAt(g, singles, gi, where + ": " + what), what, torch::DType::kFloat32,
                std::move(pieces));
      for (size_t k = 0; k < os.keys.size(); ++k) {
        std::vector<Piece> kp;
        FlatBuffer(z, os, f, static_cast<int>(k), w)
            .Cut(begin, begin + f.partition, torch::ElementSize(os.dtypes[k]), kp);
        b.Replace(state_of(gi, k), fmt::format("state.{}.{}", gi, os.keys[k]), os.dtypes[k],
                  std::move(kp));
      }
      if (!IsNone(g, group_paddings))
        SetElement(g, group_paddings, gi, g.AddInt(static_cast<int64_t>(pad)),
                   where + ": group_paddings");
      if (!IsNone(g, counts))
        SetElement(g, counts, gi, g.AddInt(world), where + ": partition_count");
      if (!IsNone(g, mappings)) {
        NodeId m = ElementAt(g, mappings, gi, where + ": param_slice_mappings");
        std::vector<NodeId> pairs;
        for (size_t j = 0; j < f.params.size(); ++j) {
          const ZeroTensor& p = z.tensors[os.params[f.params[j]].tensor];
          uint64_t lo = std::max(f.offsets[j], begin);
          uint64_t hi = std::min(f.offsets[j] + p.numel, begin + f.partition);
          if (lo >= hi) continue;
          if (proto == kNil) Fail("{}: param_slice_mappings is empty", where);
          pairs.push_back(g.AddText(Kind::kStr, p.name));
          pairs.push_back(FragmentAddress(g, proto, hi - lo, lo - begin));
        }
        g.SetPairs(m, pairs);
      }
    }
    out.push_back(b.Finish());
    return out;
  }

  // Stage 3.
  for (size_t gi = 0; gi < groups; ++gi) {
    std::vector<Piece> fp32;
    std::vector<std::vector<Piece>> per_key(os.keys.size());
    for (size_t i : by_group[gi]) {
      const ZeroOptimizerState::Param& p = os.params[i];
      const uint64_t numel = z.tensors[p.tensor].numel;
      AppendStage3Piece(RunOf(z.tensors[p.tensor].pieces), numel, w, r, 4, fp32);
      for (size_t k = 0; k < os.keys.size(); ++k)
        AppendStage3Piece(RunOf(p.pieces[k]), numel, w, r, torch::ElementSize(os.dtypes[k]),
                          per_key[k]);
    }
    const std::string what = fmt::format("fp32_flat_groups.{}", gi);
    b.Replace(ElementAt(g, Lookup(g, osd, "fp32_flat_groups"), gi, where + ": " + what), what,
              torch::DType::kFloat32, std::move(fp32));
    for (size_t k = 0; k < os.keys.size(); ++k)
      b.Replace(state_of(gi, k), fmt::format("state.{}.{}", gi, os.keys[k]), os.dtypes[k],
                std::move(per_key[k]));
  }
  NodeId counts = Lookup(g, osd, "partition_count");
  if (counts != kNil && g.kind(counts) == Kind::kInt) {
    SetValue(g, osd, "partition_count", g.AddInt(world), where + ": optimizer_state_dict");
  } else if (!IsNone(g, counts)) {
    for (size_t i = 0; i < Elements(g, counts, where + ": partition_count").size(); ++i)
      SetElement(g, counts, i, g.AddInt(world), where + ": partition_count");
  }
  out.push_back(b.Finish());

  // Its model states file: rank 0's, with its piece of every frozen parameter.
  const RankFile m0 = Index(*z.files[0], 0);
  FileBuilder mb(m0, RankName(m0.file->path, rank));
  Graph& mg = mb.graph();
  SetWorldSize(mg, world);
  // DeepSpeed's _get_shared_params fills shared_params on rank 0 alone.
  if (rank != 0 && Lookup(mg, mg.root, "shared_params") != kNil)
    SetValue(mg, mg.root, "shared_params", mg.AddCompound(Kind::kDict), m0.file->path);
  NodeId fragments = Lookup(mg, mg.root, "frozen_param_fragments");
  if (!IsNone(mg, fragments)) {
    std::unordered_map<std::string_view, const ZeroTensor*> frozen;
    for (const ZeroTensor& zt : z.tensors) {
      if (zt.kind == ZeroTensor::Kind::kFrozen) frozen.emplace(zt.name, &zt);
    }
    for (const auto& [name, node] :
         Entries(mg, fragments, m0.file->path + ": frozen_param_fragments")) {
      auto it = frozen.find(name);
      if (it == frozen.end())
        Fail("{}: frozen parameter '{}' was not consolidated", m0.file->path, name);
      const ZeroTensor& fz = *it->second;
      std::vector<Piece> pieces;
      AppendStage3Piece(RunOf(fz.pieces), fz.numel, w, r, torch::ElementSize(fz.stored), pieces);
      mb.Replace(node, "frozen_param_fragments." + name, fz.stored, std::move(pieces));
    }
  }
  out.push_back(mb.Finish());
  return out;
}

}  // namespace ckpt::deepspeed
