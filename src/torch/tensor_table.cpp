// Finds every tensor in a torch object graph and checks each view against its storage.
//
// Tensors are recognised by the rebuild function their pickle calls (torch/_utils.py,
// torch/_tensor.py); the forms and argument lists are:
//   _rebuild_tensor(storage, offset, size, stride)
//   _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
//   _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])
//   _rebuild_qtensor(storage, offset, size, stride, qparams, requires_grad, hooks)
//   _rebuild_parameter(data, requires_grad, hooks)
//   _rebuild_parameter_with_state(data, requires_grad, hooks, state)
//   _rebuild_from_type_v2(func, new_type, args, state)      (torch._tensor)
//   _rebuild_sparse_tensor(layout, data), _rebuild_sparse_csr_tensor(layout, data)
//   _rebuild_nested_tensor(buffer, sizes, strides, storage_offsets)
//   _rebuild_device_tensor_from_cpu_tensor(data, dtype, device, requires_grad)
//   _rebuild_device_tensor_from_numpy / _rebuild_xla_tensor(data, dtype, device, rg)
//   _rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad)
//   _rebuild_wrapper_subclass(cls, dtype, size, stride, offset, layout, device, rg)
// Any other torch._utils._rebuild_* is noted, not fatal.
//
// Names are key paths from the root: dict keys as text, sequence indices in decimal,
// object attributes (BUILD state) by name, joined with '.'.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "base/checked.h"
#include "base/error.h"
#include "pickle/path_walker.h"
#include "torch/model.h"
#include "torch/storage_ref.h"

namespace ckpt::torch {

using pickle::Graph;
using pickle::Kind;
using pickle::kNil;
using pickle::NodeId;
using pickle::PathWalker;

int32_t Model::FindStorage(std::string_view key) const {
  uint32_t i =
      storage_index.Find(key, [this](uint32_t k) -> std::string_view { return storages[k].key; });
  return i == NameIndex::kNone ? -1 : static_cast<int32_t>(i);
}

int32_t Model::IndexStorage(int32_t i) {
  return static_cast<int32_t>(
      storage_index.Insert(storages[static_cast<size_t>(i)].key, static_cast<uint32_t>(i),
                           [this](uint32_t k) -> std::string_view { return storages[k].key; }));
}

namespace {

// The walk (a pickle::PathWalker) follows every path to a tensor, since a tensor reachable by
// several paths gets each name (tied weights). A shared subtree in which the first visit
// found nothing (no tensor, storage or problem) is not walked again; what is walked again is
// bounded by the walker's pickle::PathBudget.
// Names are paths, and a path can be long (dict keys are any string): their total size is
// bounded too, far above what any real checkpoint's names take.
constexpr uint64_t kMaxNameBytes = uint64_t{256} << 20;
constexpr size_t kMaxWhere = 1024;  // longer paths in problem messages are cut
constexpr size_t kMaxDims = 64;
constexpr size_t kMaxProblems = 1000;  // more are counted, not listed

class TensorCollector final : private PathWalker::Client {
 public:
  TensorCollector(Model& m, bool legacy) : m_(m), g_(m.graph), legacy_(legacy), w_(m.graph) {}

  void Run() {
    if (g_.root == kNil) return;
    w_.Run(g_.root, *this);
    if (suppressed_) {
      m_.problems.push_back({"<more>", fmt::format("{} more problems not listed", suppressed_)});
    }
  }

 private:
  void Problem(const std::string& where, const std::string& what) {
    if (m_.problems.size() >= kMaxProblems) {
      ++suppressed_;
      return;
    }
    m_.problems.push_back(
        {where.size() > kMaxWhere ? where.substr(0, kMaxWhere) + "..." : where, what});
  }

  // The walker's path as a tensor name, counted against the bound on all names.
  const std::string& NamePath() {
    const std::string& path = w_.path();
    name_bytes_ += path.size() + sizeof(std::string);
    if (name_bytes_ > kMaxNameBytes) {
      Fail(
          "tensor names would take more than {} MiB (tensors reachable by too many or too long "
          "paths); refusing",
          kMaxNameBytes >> 20);
    }
    return path;
  }

  // The walker's path where a problem or note is: "<root>" for the root.
  std::string Where() const { return w_.path().empty() ? "<root>" : w_.path(); }

  // What the walk has recorded so far: a subtree whose visit changes it has something to
  // name.
  uint64_t Recorded() const {
    return m_.tensors.size() + m_.bare_refs.size() + m_.problems.size() + suppressed_;
  }

  // A container, object or persistent id a path reaches: a tensor, a storage, or something
  // to walk into (entries, items, BUILD states, call arguments).
  void Node(NodeId n, bool first) override {
    uint64_t before = Recorded();
    Kind k = g_.kind(n);
    if (k == Kind::kPersId) {
      BareStorage(n);
    } else if (k != Kind::kObject || !TryTensor(n)) {
      w_.Entries(n);
      w_.Items(n);
      w_.States(n, PathWalker::StateParts::kSlotsUnderState);
      w_.CallArguments(n);
    }
    if (first && Recorded() == before) w_.Prune(n);
  }

  // ---- storages ----
  int32_t StorageFor(const StorageRef& ref, const std::string& where, NodeId persid) {
    if (int32_t found = m_.FindStorage(ref.key); found >= 0) {
      Storage& s = m_.storages[static_cast<size_t>(found)];
      if (s.dtype != ref.dtype || s.numel != ref.numel) {
        Problem(where, fmt::format("storage '{}' is referenced as {} x {} here but as {} x {} "
                                   "elsewhere",
                                   ref.key, ref.numel, Name(ref.dtype), s.numel, Name(s.dtype)));
      }
      return found;
    }
    Storage s;
    s.key = ref.key;
    s.dtype = ref.dtype;
    s.numel = ref.numel;
    s.nbytes = CheckedMul(ref.numel, ElementSize(ref.dtype));
    s.location = ref.location;
    s.first_ref = persid;
    m_.storages.push_back(std::move(s));
    int32_t index = static_cast<int32_t>(m_.storages.size() - 1);
    m_.IndexStorage(index);
    return index;
  }

  void BareStorage(NodeId persid) {
    if (failed_.count(persid) || !bare_seen_.insert(persid).second) return;  // once per node
    // Legacy files saving a whole nn.Module also carry ('module', cls, file, source) ids.
    NodeId pid = g_.compound(persid).args;
    if (pid != kNil && g_.kind(pid) == Kind::kTuple && !g_.items(pid).empty() &&
        g_.kind(g_.items(pid)[0]) == Kind::kStr && g_.text(g_.items(pid)[0]) == "module") {
      return;
    }
    try {
      StorageRef ref = DecodeStorageRef(g_, persid);
      int32_t index = StorageFor(ref, w_.path(), persid);
      m_.storages[index].used_whole = true;
      m_.bare_refs.emplace_back(persid, index);
    } catch (const Error& e) {
      failed_.insert(persid);
      Problem(Where(), e.what());
    }
  }

  // ---- tensors ----
  bool TryTensor(NodeId obj) {
    NodeId fn = g_.CalledGlobal(obj);
    if (fn == kNil) return false;
    // A broken tensor reached again through shared references was reported once already:
    // re-checking it on every path would let a small hostile pickle cost millions of errors.
    if (failed_.count(obj)) return true;
    // The same tensor reached again (tied weights): one more name.
    if (auto it = tensor_of_.find(obj); it != tensor_of_.end()) {
      m_.tensors[it->second].names.push_back(NamePath());
      return true;
    }
    size_t tensors = m_.tensors.size(), problems = m_.problems.size() + suppressed_;
    NodeId args = g_.compound(obj).args;
    // Components of a composite tensor are recorded under the composite's top key.
    size_t outer_top = std::exchange(top_, w_.top_key().size());
    bool recognized = Recognize(fn, args, obj, "tensor");
    top_ = std::move(outer_top);
    if (recognized && m_.tensors.size() == tensors && m_.problems.size() + suppressed_ > problems) {
      failed_.insert(obj);
    }
    if (recognized && m_.tensors.size() == tensors + 1) tensor_of_.emplace(obj, tensors);
    return recognized;
  }

  // Is `fn(*args)` a tensor? Records it (under the walker's path) if so. Tensor forms that
  // wrap another recurse, and a composite's components are walked (Component): each call is
  // one more level of the walker's stack depth, so a chain of them cannot overflow the stack.
  bool Recognize(NodeId fn, NodeId args, NodeId node, const std::string& kind) {
    PathWalker::Deeper deeper(w_);
    std::string_view module = g_.global_module(fn), name = g_.global_name(fn);
    if (args == kNil || g_.kind(args) != Kind::kTuple) return false;
    const auto& a = g_.items(args);
    auto arg = [&](size_t i) { return i < a.size() ? a[i] : kNil; };
    if (module == "torch._tensor" &&
        (name == "_rebuild_from_type_v2" || name == "_rebuild_from_type")) {
      NodeId inner_fn = arg(0), type = arg(1), inner_args = arg(2);
      std::string sub = kind;
      if (type != kNil && g_.kind(type) == Kind::kGlobal) {
        std::string t = g_.GlobalText(type);
        if (t == "torch.nn.parameter.Parameter") {
          sub = "parameter";
        } else if (t != "torch.Tensor") {
          sub = "subclass:" + t;
        }
      }
      if (inner_fn != kNil && g_.kind(inner_fn) == Kind::kGlobal &&
          g_.GlobalText(inner_fn) == "torch.nested._internal.nested_tensor._rebuild_njt") {
        JaggedComponents(inner_args);
        return true;
      }
      if (inner_fn != kNil && g_.kind(inner_fn) == Kind::kGlobal &&
          Recognize(inner_fn, inner_args, node, sub)) {
        return true;
      }
      Note(fmt::format("{}.{} wraps something that is not a tensor", module, name));
      return true;
    }
    if (module != "torch._utils") return false;
    if (name == "_rebuild_tensor" || name == "_rebuild_tensor_v2" || name == "_rebuild_tensor_v3" ||
        name == "_rebuild_qtensor") {
      AddStorageTensor(name, args, node, name == "_rebuild_qtensor" ? "qtensor" : kind);
      // A per-channel quantizer holds tensors of its own: (qscheme, scales, zero_points, axis)
      // (torch/_tensor.py _reduce_ex_internal). Their storages are the file's records too.
      NodeId q = arg(4);
      if (name == "_rebuild_qtensor" && q != kNil && g_.kind(q) == Kind::kTuple) {
        const auto& params = g_.items(q);
        static const char* kParts[] = {"", "scales", "zero_points"};
        for (size_t i = 1; i < 3 && i < params.size(); ++i) {
          if (g_.kind(params[i]) == Kind::kObject) Component(params[i], kParts[i], "qtensor");
        }
      }
      return true;
    }
    if (name == "_rebuild_parameter" || name == "_rebuild_parameter_with_state") {
      size_t before = m_.tensors.size();
      NodeId data = arg(0);
      if (!(data != kNil && g_.kind(data) == Kind::kObject && g_.CalledGlobal(data) != kNil &&
            Recognize(g_.CalledGlobal(data), g_.compound(data).args, node, "parameter"))) {
        Note(fmt::format("{} of something that is not a tensor", name));
        return true;
      }
      if (m_.tensors.size() > before && arg(1) != kNil && g_.kind(arg(1)) == Kind::kBool) {
        m_.tensors.back().requires_grad = g_.at(arg(1)).boolean;
        m_.tensors.back().node = node;
      }
      return true;
    }
    if (name == "_rebuild_sparse_tensor" || name == "_rebuild_sparse_csr_tensor") {
      NodeId data = arg(1);
      if (data != kNil && g_.kind(data) == Kind::kTuple) {
        const auto& d = g_.items(data);
        static const char* kCoo[] = {"indices", "values"};
        static const char* kCompressed[] = {"compressed_indices", "plain_indices", "values"};
        bool coo = d.size() == 3 || (d.size() == 4 && g_.kind(d[3]) == Kind::kBool);
        size_t n = coo ? 2 : std::min<size_t>(3, d.size());
        for (size_t i = 0; i < n && i < d.size(); ++i) {
          Component(d[i], coo ? kCoo[i] : kCompressed[i], "sparse");
        }
      }
      return true;
    }
    if (name == "_rebuild_nested_tensor") {
      static const char* kParts[] = {"buffer", "sizes", "strides", "storage_offsets"};
      for (size_t i = 0; i < 4; ++i) Component(arg(i), kParts[i], "nested");
      return true;
    }
    if (name == "_rebuild_device_tensor_from_cpu_tensor") {
      Component(arg(0), "", kind);
      return true;
    }
    if (name == "_rebuild_meta_tensor_no_storage" || name == "_rebuild_wrapper_subclass" ||
        name == "_rebuild_device_tensor_from_numpy" || name == "_rebuild_xla_tensor") {
      AddStoragelessTensor(name, a, node);
      return true;
    }
    if (name.starts_with("_rebuild")) {
      Note(fmt::format("unknown tensor form torch._utils.{}; its contents are not listed", name));
      return true;
    }
    return false;
  }

  // A tensor that is an argument of a composite (sparse/nested): named path.part. What is
  // not a tensor is walked there.
  void Component(NodeId t, std::string_view part, const std::string& kind) {
    if (t == kNil) return;
    PathWalker::Deeper deeper(w_);
    std::optional<PathWalker::Key> key;
    if (!part.empty()) key.emplace(w_, part);
    std::string sub_kind = part.empty() ? kind : kind + "." + std::string(part);
    if (g_.kind(t) == Kind::kObject && g_.CalledGlobal(t) != kNil &&
        Recognize(g_.CalledGlobal(t), g_.compound(t).args, t, sub_kind)) {
      return;
    }
    w_.Walk(t);
  }

  // A jagged nested tensor (torch.nested, layout=torch.jagged): _rebuild_njt takes one dict
  // of its parts, values, offsets, lengths and a _metadata_cache of min_seqlen/max_seqlen
  // (tensors whose shape carries the number), each a tensor of its own.
  void JaggedComponents(NodeId args) {
    if (args == kNil || g_.kind(args) != Kind::kTuple || g_.items(args).size() != 1 ||
        g_.kind(g_.items(args)[0]) != Kind::kDict) {
      Note("torch.nested._internal.nested_tensor._rebuild_njt of something that is not its dict");
      return;
    }
    auto parts = [&](NodeId dict, auto&& self, int depth) -> void {
      const auto& p = g_.pairs(dict);
      for (size_t i = 0; i + 1 < p.size(); i += 2) {
        if (g_.kind(p[i]) != Kind::kStr) continue;
        std::string_view key = g_.text(p[i]);
        if (depth == 0 && key == "_metadata_cache" && g_.kind(p[i + 1]) == Kind::kDict) {
          PathWalker::Deeper deeper(w_);
          PathWalker::Key k(w_, key);
          self(p[i + 1], self, depth + 1);
        } else if (g_.kind(p[i + 1]) == Kind::kObject) {
          Component(p[i + 1], key, "nested_jagged");
        }
      }
    };
    parts(g_.items(args)[0], parts, 0);
  }

  void Note(const std::string& what) { m_.notes.push_back(fmt::format("{}: {}", Where(), what)); }

  bool IntList(NodeId id, Dims& out) {
    if (id == kNil) return false;
    // torch.Size((...)) pickles as a call of torch.Size on a tuple.
    if (g_.kind(id) == Kind::kObject && g_.IsCallOf(id, "torch", "Size")) id = g_.Arg(id, 0);
    if (id == kNil || (g_.kind(id) != Kind::kTuple && g_.kind(id) != Kind::kList)) return false;
    out.clear();
    for (NodeId v : g_.items(id)) {
      if (g_.kind(v) != Kind::kInt) return false;
      out.push_back(g_.at(v).integer);
    }
    return out.size() <= kMaxDims;
  }

  std::optional<DType> DTypeArg(NodeId id) {
    if (id == kNil || g_.kind(id) != Kind::kGlobal || g_.global_module(id) != "torch") {
      return std::nullopt;
    }
    return FromName(g_.global_name(id));
  }

  void AddStoragelessTensor(std::string_view fn, std::span<const NodeId> a, NodeId node) {
    Tensor t;
    t.names.push_back(NamePath());
    t.node = node;
    bool wrapper = fn == "_rebuild_wrapper_subclass";
    bool meta = fn == "_rebuild_meta_tensor_no_storage";
    t.kind = meta ? "meta" : wrapper ? "wrapper_subclass" : "device_numpy";
    size_t dtype_at = wrapper ? 1 : meta ? 0 : 1;
    if (auto d = DTypeArg(dtype_at < a.size() ? a[dtype_at] : kNil)) t.dtype = *d;
    if (meta || wrapper) {
      size_t at = wrapper ? 2 : 1;
      if (at + 1 < a.size()) {
        IntList(a[at], t.shape);
        IntList(a[at + 1], t.stride);
      }
    }
    t.top_size = static_cast<uint32_t>(std::min(top_, t.names.front().size()));
    m_.tensors.push_back(std::move(t));
  }

  void AddStorageTensor(std::string_view fn, NodeId args, NodeId node, const std::string& kind) {
    std::span<const NodeId> a = g_.items(args);
    std::string where = Where();
    size_t need = fn == "_rebuild_tensor" ? 4 : fn == "_rebuild_tensor_v3" ? 7 : 6;
    if (a.size() < need) {
      Problem(where,
              fmt::format("{} called with {} arguments, expected at least {}", fn, a.size(), need));
      return;
    }
    if (g_.kind(a[0]) != Kind::kPersId) {
      Problem(where, fmt::format("{} storage argument is a {}, not a storage", fn,
                                 pickle::KindName(g_.kind(a[0]))));
      return;
    }
    Tensor t;
    t.names.push_back(NamePath());
    t.kind = kind;
    t.node = node;
    StorageRef ref;
    try {
      ref = DecodeStorageRef(g_, a[0]);
    } catch (const Error& e) {
      Problem(where, e.what());
      return;
    }
    if (ref.is_view && !legacy_) Problem(where, "view metadata in a zip checkpoint");
    t.storage = StorageFor(ref, where, a[0]);
    t.args = args;
    t.dtype = ref.dtype;
    if (fn == "_rebuild_tensor_v3") {
      auto d = DTypeArg(a[6]);
      if (!d) {
        Problem(where, fmt::format("_rebuild_tensor_v3 dtype argument {} is not a torch dtype",
                                   g_.Describe(a[6])));
        return;
      }
      t.dtype = *d;
    } else if (t.dtype == DType::kUntyped) {
      t.dtype = DType::kUInt8;
    }
    if (g_.kind(a[1]) != Kind::kInt || g_.at(a[1]).integer < 0) {
      Problem(where,
              fmt::format("storage offset {} is not a non-negative integer", g_.Describe(a[1])));
      return;
    }
    t.offset = g_.at(a[1]).integer;
    if (!IntList(a[2], t.shape) || !IntList(a[3], t.stride) || t.shape.size() != t.stride.size()) {
      Problem(where, "size and stride are not integer tuples of the same length");
      return;
    }
    size_t rg_at = fn == "_rebuild_qtensor" ? 5 : 4;
    if (rg_at < a.size() && g_.kind(a[rg_at]) == Kind::kBool) {
      t.requires_grad = g_.at(a[rg_at]).boolean;
    }
    if (!Extent(t, ref, where)) return;
    t.top_size = static_cast<uint32_t>(std::min(top_, t.names.front().size()));
    m_.tensors.push_back(std::move(t));
  }

  // Computes numel and the reachable byte range, and checks it against the storage.
  bool Extent(Tensor& t, const StorageRef& ref, const std::string& where) {
    try {
      uint64_t numel = 1;
      uint64_t span = 0;  // sum((size_i - 1) * stride_i)
      for (size_t i = 0; i < t.shape.size(); ++i) {
        if (t.shape[i] < 0 || t.stride[i] < 0) Fail("negative size or stride");
        numel = CheckedMul(numel, static_cast<uint64_t>(t.shape[i]));
      }
      t.numel = numel;
      if (numel == 0) return true;
      for (size_t i = 0; i < t.shape.size(); ++i) {
        span = CheckedAdd(span, CheckedMul(static_cast<uint64_t>(t.shape[i] - 1),
                                           static_cast<uint64_t>(t.stride[i])));
      }
      uint64_t es = ElementSize(t.dtype);
      uint64_t first = static_cast<uint64_t>(t.offset);
      uint64_t last = CheckedAdd(first, span);  // inclusive, in elements
      uint64_t storage_bytes = m_.storages[t.storage].nbytes;
      uint64_t base = 0;
      if (ref.is_view) {
        uint64_t view_es = ElementSize(ref.dtype);
        base = CheckedMul(ref.view_offset, view_es);
        uint64_t view_bytes = CheckedMul(ref.view_size, view_es);
        if (CheckedMul(CheckedAdd(last, 1), es) > view_bytes) {
          Fail("elements [{}, {}] run past its storage view of {} bytes", first, last, view_bytes);
        }
        if (CheckedAdd(base, view_bytes) > storage_bytes) {
          Fail("storage view [{}, +{}) runs past storage '{}' of {} bytes", base, view_bytes,
               ref.key, storage_bytes);
        }
      }
      t.byte_begin = CheckedAdd(base, CheckedMul(first, es));
      t.byte_end = CheckedAdd(base, CheckedMul(CheckedAdd(last, 1), es));
      if (t.byte_end > storage_bytes) {
        Fail("view reaches bytes [{}, {}) but storage '{}' has {} bytes", t.byte_begin, t.byte_end,
             ref.key, storage_bytes);
      }
      return true;
    } catch (const Error& e) {
      Problem(where, e.what());
      return false;
    }
  }

  Model& m_;
  const Graph& g_;
  bool legacy_;
  PathWalker w_;
  uint64_t name_bytes_ = 0;
  std::unordered_map<NodeId, size_t> tensor_of_;  // rebuild node -> its (only) tensor
  std::unordered_set<NodeId> bare_seen_;          // storage ids outside tensors, recorded
  uint64_t suppressed_ = 0;
  std::unordered_set<NodeId> failed_;
  size_t top_ = 0;  // size of the top key of the tensor being recognised (a prefix of its path)
};

// The same rebuild node reached by several paths is one tensor with several names.
void MergeByNode(Model& m) {
  // In place: a second table would double the peak for files of many tensors.
  std::unordered_map<NodeId, size_t> first;
  size_t kept = 0;
  for (size_t r = 0; r < m.tensors.size(); ++r) {
    Tensor& t = m.tensors[r];
    auto [it, inserted] = first.emplace(t.node, kept);
    if (inserted || t.node == kNil) {
      if (!inserted) it->second = kept;
      if (kept != r) m.tensors[kept] = std::move(t);
      ++kept;
    } else {
      for (std::string_view n : t.names) m.tensors[it->second].names.push_back(n);
    }
  }
  m.tensors.erase(m.tensors.begin() + static_cast<ptrdiff_t>(kept), m.tensors.end());
}

}  // namespace

void BuildTensorTable(Model& model, bool legacy) {
  // Room for every rebuild call at once: growing by doubling would hold the old rows and the
  // new ones together (a third more memory at the peak for 10^5 tensors).
  const pickle::Graph& g = model.graph;
  // Likewise every storage: each has a persistent id (shared through the memo).
  size_t calls = 0, persids = 0;
  for (pickle::NodeId n = 0; n < g.nodes.size(); ++n) {
    if (g.kind(n) == pickle::Kind::kPersId) ++persids;
    if (g.kind(n) != pickle::Kind::kObject) continue;
    pickle::NodeId f = g.CalledGlobal(n);
    if (f != pickle::kNil && g.global_name(f).starts_with("_rebuild")) ++calls;
  }
  model.tensors.reserve(model.tensors.size() + calls);
  model.storages.reserve(model.storages.size() + persids);
  model.storage_index.Reserve(model.storage_index.size() + persids);
  TensorCollector(model, legacy).Run();
  MergeByNode(model);
}

}  // namespace ckpt::torch
