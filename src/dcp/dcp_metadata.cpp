// ParseMetadata: the metadata pickle of a torch.distributed.checkpoint folder, read from the
// object graph by field names (dataclasses arrive as NEWOBJ + BUILD(dict); TensorProperties
// as BUILD(tuple)), never by running it.
#include <fmt/format.h>

#include <unordered_map>

#include "base/error.h"
#include "dcp/dcp_checkpoint.h"
#include "pickle/parser.h"
#include "torch/pickle_read.h"

namespace ckpt::dcp {

namespace {

using pickle::Graph;
using pickle::Kind;
using pickle::kNil;
using pickle::NodeId;

// The class a kObject instantiates ("module.Name"), through copyreg._reconstructor too.
std::string ClassName(const Graph& g, NodeId obj) {
  if (g.kind(obj) != Kind::kObject) return "";
  NodeId callable = g.CalledGlobal(obj);
  if (callable == kNil) return "";
  if (g.GlobalText(callable) == "copyreg._reconstructor") {
    NodeId cls = g.Arg(obj, 0);
    return cls != kNil && g.kind(cls) == Kind::kGlobal ? g.GlobalText(cls) : "";
  }
  return g.GlobalText(callable);
}

bool EndsWithName(const std::string& cls, std::string_view name) {
  return cls == name || cls.ends_with("." + std::string(name));
}

NodeId Need(const Graph& g, NodeId obj, std::string_view name, std::string_view what) {
  NodeId n = Field(g, obj, name);
  if (n == kNil) Fail("{} has no field '{}'", what, name);
  return n;
}

std::string Str(const Graph& g, NodeId n, std::string_view what) {
  if (n == kNil || g.kind(n) != Kind::kStr) Fail("{} is not a string", what);
  return std::string(g.text(n));
}

uint64_t Count(const Graph& g, NodeId n, std::string_view what) {
  if (n == kNil || g.kind(n) != Kind::kInt || g.at(n).integer < 0)
    Fail("{} is not a non-negative integer", what);
  return static_cast<uint64_t>(g.at(n).integer);
}

// A torch.Size, tuple or list of non-negative ints.
std::vector<int64_t> Ints(const Graph& g, NodeId n, std::string_view what) {
  if (n != kNil && g.kind(n) == Kind::kObject && g.ArgCount(n) == 1) n = g.Arg(n, 0);
  if (n == kNil || (g.kind(n) != Kind::kTuple && g.kind(n) != Kind::kList))
    Fail("{} is not a size", what);
  std::vector<int64_t> out;
  for (NodeId x : g.items(n)) {
    if (g.kind(x) != Kind::kInt || g.at(x).integer < 0) Fail("{} is not a size", what);
    out.push_back(g.at(x).integer);
  }
  return out;
}

torch::DType DTypeOf(const Graph& g, NodeId properties, const std::string& fqn) {
  NodeId dtype = Field(g, properties, "dtype");
  if (dtype == kNil && g.kind(properties) == Kind::kObject) {  // state (dtype, layout, ...)
    std::span<const NodeId> states = g.states(properties);
    if (!states.empty() && g.kind(states.back()) == Kind::kTuple && !g.items(states.back()).empty())
      dtype = g.items(states.back())[0];
  }
  if (dtype == kNil || g.kind(dtype) != Kind::kGlobal || g.global_module(dtype) != "torch")
    Fail("'{}': its properties name no torch dtype", fqn);
  auto d = torch::FromName(g.global_name(dtype));
  if (!d || *d == torch::DType::kUntyped)
    Fail("'{}': unknown dtype torch.{}", fqn, g.global_name(dtype));
  return *d;
}

}  // namespace

// The attribute dict of an object (its last BUILD state that is a dict, or the dict of a
// (dict, slots) state), or the node itself when it is a plain dict.
NodeId StateDict(const Graph& g, NodeId n) {
  if (n == kNil) return kNil;
  if (g.kind(n) == Kind::kDict) return n;
  if (g.kind(n) != Kind::kObject) return kNil;
  std::span<const NodeId> states = g.states(n);
  for (size_t i = states.size(); i-- > 0;) {
    NodeId s = states[i];
    if (g.kind(s) == Kind::kDict) return s;
    if (g.kind(s) == Kind::kTuple && g.items(s).size() == 2) {
      for (NodeId part : {g.items(s)[1], g.items(s)[0]}) {
        if (g.kind(part) == Kind::kDict) return part;
      }
    }
  }
  return kNil;
}

// Field `name` of an object or dict; kNil when absent.
NodeId Field(const Graph& g, NodeId obj, std::string_view name) {
  return g.ValueAt(StateDict(g, obj), name);
}

Metadata ParseMetadata(Bytes bytes) {
  Metadata m;
  pickle::ParseResult parsed = torch::ParseTorchPickle(bytes, 0);
  if (parsed.leftover)
    Fail("the metadata pickle is damaged ({} values left on its stack)", parsed.leftover);
  m.graph = std::move(parsed.graph);
  const Graph& g = m.graph;
  m.scan = torch::ScanPickle(g);
  NodeId root = g.root;
  m.class_name = ClassName(g, root);
  NodeId sdm = Field(g, root, "state_dict_metadata");
  if (sdm == kNil || g.kind(sdm) != Kind::kDict)
    Fail("not DCP metadata: no state_dict_metadata dict (a {})",
         m.class_name.empty() ? pickle::KindName(g.kind(root)) : m.class_name);
  std::unordered_map<std::string, size_t> by_fqn;
  const auto& pairs = g.pairs(sdm);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    EntryMeta e;
    e.fqn = Str(g, pairs[i], "a state_dict_metadata key");
    NodeId v = pairs[i + 1];
    std::string cls = ClassName(g, v);
    if (EndsWithName(cls, "BytesStorageMetadata")) {
      e.bytes = true;
    } else {
      std::string what = fmt::format("state_dict_metadata['{}']", e.fqn);
      e.dtype = DTypeOf(g, Need(g, v, "properties", what), e.fqn);
      e.shape = Ints(g, Need(g, v, "size", what), what + ".size");
      NodeId chunks = Need(g, v, "chunks", what);
      if (g.kind(chunks) != Kind::kList && g.kind(chunks) != Kind::kTuple)
        Fail("{}.chunks is not a list", what);
      for (NodeId c : g.items(chunks)) {
        ChunkMeta cm;
        cm.offsets = Ints(g, Need(g, c, "offsets", what + " chunk"), what + " chunk offsets");
        cm.sizes = Ints(g, Need(g, c, "sizes", what + " chunk"), what + " chunk sizes");
        if (cm.offsets.size() != e.shape.size() || cm.sizes.size() != e.shape.size())
          Fail("{}: a chunk has {} offsets and {} sizes for {} dimensions", what, cm.offsets.size(),
               cm.sizes.size(), e.shape.size());
        e.chunks.push_back(std::move(cm));
      }
    }
    auto [it, fresh] = by_fqn.emplace(e.fqn, m.entries.size());
    if (fresh) {
      m.entries.push_back(std::move(e));
    } else {
      m.entries[it->second] = std::move(e);  // a dict keeps the last value of a key
    }
  }
  NodeId sd = Field(g, root, "storage_data");
  if (sd == kNil || g.kind(sd) != Kind::kDict) Fail("not DCP metadata: no storage_data dict");
  const auto& spairs = g.pairs(sd);
  for (size_t i = 0; i + 1 < spairs.size(); i += 2) {
    StorageEntry s;
    NodeId key = spairs[i], info = spairs[i + 1];
    s.fqn = Str(g, Need(g, key, "fqn", "a storage_data key"), "a storage_data key's fqn");
    std::string what = fmt::format("storage_data['{}']", s.fqn);
    NodeId off = Field(g, key, "offset");
    if (off != kNil && g.kind(off) != Kind::kNone) s.offsets = Ints(g, off, what + " offset");
    s.path = Str(g, Need(g, info, "relative_path", what), what + ".relative_path");
    s.offset = Count(g, Need(g, info, "offset", what), what + ".offset");
    s.length = Count(g, Need(g, info, "length", what), what + ".length");
    NodeId tr = Field(g, info, "transform_descriptors");
    if (tr != kNil && g.kind(tr) != Kind::kNone) {
      if (g.kind(tr) != Kind::kList && g.kind(tr) != Kind::kTuple)
        Fail("{}.transform_descriptors is not a list", what);
      for (NodeId x : g.items(tr)) s.transforms.push_back(Str(g, x, what + " transform"));
    }
    s.info = info;
    m.storage.push_back(std::move(s));
  }
  return m;
}

}  // namespace ckpt::dcp
