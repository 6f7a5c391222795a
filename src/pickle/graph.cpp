#include "pickle/graph.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"
#include "pickle/text_codec.h"

namespace ckpt::pickle {

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kBigInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kStr:
      return "str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kByteArray:
      return "bytearray";
    case Kind::kTuple:
      return "tuple";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kSet:
      return "set";
    case Kind::kFrozenSet:
      return "frozenset";
    case Kind::kGlobal:
      return "global";
    case Kind::kObject:
      return "object";
    case Kind::kPersId:
      return "persistent id";
  }
  return "?";
}

NodeId Graph::CalledGlobal(NodeId id) const {
  if (id == kNil || kind(id) != Kind::kObject) return kNil;
  NodeId c = compound(id).callable;
  return c != kNil && kind(c) == Kind::kGlobal ? c : kNil;
}

bool Graph::IsCallOf(NodeId id, std::string_view module, std::string_view name) const {
  NodeId g = CalledGlobal(id);
  return g != kNil && global_module(g) == module && global_name(g) == name;
}

NodeId Graph::Arg(NodeId id, size_t i) const {
  if (id == kNil || !has_compound(id)) return kNil;
  NodeId args = compound(id).args;
  if (args == kNil || kind(args) != Kind::kTuple) return kNil;
  const auto& v = items(args);
  return i < v.size() ? v[i] : kNil;
}

size_t Graph::ArgCount(NodeId id) const {
  if (id == kNil || !has_compound(id)) return 0;
  NodeId args = compound(id).args;
  if (args == kNil || kind(args) != Kind::kTuple) return 0;
  return items(args).size();
}

std::string Graph::Describe(NodeId id) const {
  if (id == kNil) return "<nil>";
  const Node& n = nodes[id];
  switch (n.kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return n.boolean ? "True" : "False";
    case Kind::kInt:
      return std::to_string(n.integer);
    case Kind::kFloat:
      return fmt::format("{}", n.real);
    case Kind::kStr:
      return std::string(text(id));
    case Kind::kGlobal:
      return GlobalText(id);
    default:
      return fmt::format("<{}>", KindName(n.kind));
  }
}

namespace {

// Tuple keys nest, and shared elements can make their full text exponential in the pickle's
// size: the text of a tuple key stops at this many bytes.
constexpr size_t kMaxTupleKeyText = 4096;

void AppendTupleText(const Graph& g, NodeId k, std::string& out) {
  out += '(';
  std::span<const NodeId> items = g.items(k);
  for (size_t i = 0; i < items.size(); ++i) {
    if (out.size() >= kMaxTupleKeyText) {
      out += "...";
      break;
    }
    if (i) out += ", ";
    if (g.kind(items[i]) == Kind::kTuple) {
      AppendTupleText(g, items[i], out);
    } else {
      out += g.KeyText(items[i]).substr(0, kMaxTupleKeyText);
    }
  }
  out += ')';
}

}  // namespace

std::string Graph::KeyText(NodeId k) const {
  switch (kind(k)) {
    case Kind::kStr:
      return std::string(text(k));
    case Kind::kBigInt:
      return TwosComplementToDecimal(text(k));
    case Kind::kTuple: {
      std::string s;
      AppendTupleText(*this, k, s);
      return s;
    }
    default:
      return Describe(k);
  }
}

NodeId Graph::Add(Kind kind, uint64_t stream_offset) {
  if (nodes.size() >= kNil) Fail("too many pickle objects");
  Node n;
  n.kind = kind;
  n.stream_offset = static_cast<uint32_t>(std::min<uint64_t>(stream_offset, UINT32_MAX));
  nodes.push_back(n);
  return static_cast<NodeId>(nodes.size() - 1);
}

NodeId Graph::AddCompound(Kind kind, uint64_t stream_offset) {
  NodeId id = Add(kind, stream_offset);
  if (!HasCompoundRecord(kind)) Fail("internal: a {} has no compound", KindName(kind));
  if (compounds.size() >= UINT32_MAX) Fail("too many pickle objects");
  nodes[id].text.offset = static_cast<uint32_t>(compounds.size());
  compounds.emplace_back();
  return id;
}

void Graph::SetText(NodeId id, std::string_view text) {
  if (strings.size() + text.size() > UINT32_MAX) Fail("pickle strings exceed 4 GiB in total");
  nodes[id].text.offset = static_cast<uint32_t>(strings.size());
  nodes[id].text.size = static_cast<uint32_t>(text.size());
  strings.append(text);
}

NodeId Graph::AddText(Kind kind, std::string_view text, uint64_t stream_offset) {
  NodeId id = Add(kind, stream_offset);
  SetText(id, text);
  return id;
}

NodeId Graph::AddInt(int64_t value, uint64_t stream_offset) {
  NodeId id = Add(Kind::kInt, stream_offset);
  nodes[id].integer = value;
  return id;
}

NodeId Graph::AddBool(bool value, uint64_t stream_offset) {
  NodeId id = Add(Kind::kBool, stream_offset);
  nodes[id].boolean = value;
  return id;
}

NodeId Graph::AddFloat(double value, uint64_t stream_offset) {
  NodeId id = Add(Kind::kFloat, stream_offset);
  nodes[id].real = value;
  return id;
}

NodeId Graph::AddGlobal(std::string_view module, std::string_view name, uint64_t stream_offset) {
  NodeId id = AddText(Kind::kGlobal, std::string(module) + std::string(name), stream_offset);
  nodes[id].text.size = static_cast<uint32_t>(module.size());
  if (name.size() > kMaxGlobalName) Fail("a global's name is longer than {} bytes", kMaxGlobalName);
  nodes[id].name_size = static_cast<uint16_t>(name.size());
  return id;
}

NodeId Graph::AddTuple(std::span<const NodeId> items, uint64_t stream_offset) {
  NodeId id = Add(Kind::kTuple, stream_offset);
  IdList l = ids.Make(items);
  nodes[id].text.offset = l.pos;
  nodes[id].text.size = l.size;
  return id;
}

const Compound Graph::kEmpty{};

Compound& Graph::mutable_compound(NodeId id) {
  if (!HasCompoundRecord(kind(id))) Fail("internal: a {} has no compound", KindName(kind(id)));
  return compounds[nodes[id].text.offset];
}

CompoundLists& Graph::mutable_lists(NodeId id) {
  Compound& c = mutable_compound(id);
  if (c.lists == kNoLists) {
    if (lists.size() >= kNoLists) Fail("too many pickle containers");
    c.lists = static_cast<uint32_t>(lists.size());
    lists.emplace_back();
  }
  return lists[c.lists];
}

void Graph::SetItem(NodeId id, size_t i, NodeId value) {
  Node& n = nodes[id];
  IdList l = n.kind == Kind::kTuple ? TupleList(n) : mutable_lists(id).items;
  if (i >= l.size) Fail("internal: item {} of {}", i, l.size);
  ids.GetMutable(l)[i] = value;
}

void Graph::SetItems(NodeId id, std::span<const NodeId> items) {
  Node& n = nodes[id];
  if (n.kind == Kind::kTuple) {
    IdList l = TupleList(n);
    ids.Assign(l, items);
    n.text.offset = l.pos;
    n.text.size = l.size;
    return;
  }
  if (items.empty() && !Lists(id)) return;  // an empty container needs no lists
  ids.Assign(mutable_lists(id).items, items);
}

void Graph::SetPairs(NodeId id, std::span<const NodeId> pairs) {
  if (pairs.empty() && !Lists(id)) return;
  ids.Assign(mutable_lists(id).pairs, pairs);
}

void Graph::SetStates(NodeId id, std::span<const NodeId> states) {
  if (states.empty() && !Lists(id)) return;
  ids.Assign(mutable_lists(id).states, states);
}

void Graph::AppendItem(NodeId id, NodeId value) {
  ids.Push(mutable_lists(id).items, value);
}

void Graph::AppendPair(NodeId id, NodeId key, NodeId value) {
  CompoundLists& c = mutable_lists(id);
  ids.Push(c.pairs, key);
  ids.Push(c.pairs, value);
}

void Graph::AppendState(NodeId id, NodeId state) {
  ids.Push(mutable_lists(id).states, state);
}

// ---- IdArena ----

uint32_t IdArena::Allocate(uint32_t cap) {
  if (cap == 0) return 0;
  bytes_ += uint64_t{cap} * sizeof(NodeId);
  auto new_block = [&](size_t size) {
    if (blocks_.size() >= (size_t{1} << (32 - kBlockBits)))
      Fail("pickle containers hold more than {} ids in all", uint64_t{UINT32_MAX});
    blocks_.emplace_back();
    blocks_.back().reserve(size);
    return static_cast<uint32_t>(blocks_.size() - 1);
  };
  if (cap > kOwnBlock) {
    uint32_t b = new_block(cap);
    blocks_[b].resize(cap);
    return b << kBlockBits;
  }
  // Shared blocks start small and double up to 2^20 ids: most pickles (a DCP item's, a
  // tensor file's small dict) need a few hundred ids, and reserving 4 MiB for each would cost
  // address space, and under the sanitizers the time to poison it.
  if (shared_ == UINT32_MAX ||
      blocks_[shared_].size() + cap > std::min<size_t>(kBlockIds, blocks_[shared_].capacity())) {
    size_t room = shared_ == UINT32_MAX
                      ? kFirstBlockIds
                      : std::min<size_t>(kBlockIds, 2 * blocks_[shared_].capacity());
    shared_ = new_block(std::max<size_t>(room, cap));
  }
  std::vector<NodeId>& blk = blocks_[shared_];
  uint32_t offset = static_cast<uint32_t>(blk.size());
  blk.resize(blk.size() + cap);
  return (shared_ << kBlockBits) | offset;
}

IdList IdArena::Make(std::span<const NodeId> ids) {
  if (ids.size() > UINT32_MAX / 2)
    Fail("a pickle container holds more than {} items", UINT32_MAX / 2);
  IdList l;
  l.size = l.cap = static_cast<uint32_t>(ids.size());
  l.pos = Allocate(l.cap);
  if (!ids.empty()) std::copy(ids.begin(), ids.end(), At(l.pos));
  return l;
}

void IdArena::Assign(IdList& l, std::span<const NodeId> ids) {
  std::vector<NodeId> copy(ids.begin(), ids.end());  // `ids` may point into the arena
  if (copy.size() <= l.cap && l.cap) {
    std::copy(copy.begin(), copy.end(), At(l.pos));
    l.size = static_cast<uint32_t>(copy.size());
    return;
  }
  l = Make(copy);
}

void IdArena::Push(IdList& l, NodeId id) {
  if (l.size == l.cap) {
    if (l.cap >= UINT32_MAX / 4)
      Fail("a pickle container holds more than {} items", UINT32_MAX / 4);
    uint32_t cap = std::max<uint32_t>(4, l.cap * 2);
    uint32_t pos = Allocate(cap);  // before reading the old run: a block may be added
    if (l.size) std::copy(At(l.pos), At(l.pos) + l.size, At(pos));
    if (l.cap > kOwnBlock) {  // a block of its own: give its memory back
      std::vector<NodeId>().swap(blocks_[l.pos >> kBlockBits]);
      bytes_ -= uint64_t{l.cap} * sizeof(NodeId);
    }
    l.pos = pos;
    l.cap = cap;
  }
  At(l.pos)[l.size++] = id;
}

NodeId Graph::AddPersId(NodeId pid, uint64_t stream_offset) {
  NodeId id = AddCompound(Kind::kPersId, stream_offset);
  mutable_compound(id).args = pid;
  return id;
}

}  // namespace ckpt::pickle
