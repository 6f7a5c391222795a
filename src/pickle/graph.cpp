#include "pickle/graph.h"

#include <fmt/format.h>

#include "base/error.h"
#include "pickle/text_codec.h"

namespace ckpt::pickle {

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kBigInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kByteArray: return "bytearray";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kSet: return "set";
    case Kind::kFrozenSet: return "frozenset";
    case Kind::kGlobal: return "global";
    case Kind::kObject: return "object";
    case Kind::kPersId: return "persistent id";
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
    case Kind::kNone: return "None";
    case Kind::kBool: return n.boolean ? "True" : "False";
    case Kind::kInt: return std::to_string(n.integer);
    case Kind::kFloat: return fmt::format("{}", n.real);
    case Kind::kStr: return std::string(text(id));
    case Kind::kGlobal: return GlobalText(id);
    default: return fmt::format("<{}>", KindName(n.kind));
  }
}

namespace {

// Tuple keys nest, and shared elements can make their full text exponential in the pickle's
// size: the text of a tuple key stops at this many bytes.
constexpr size_t kMaxTupleKeyText = 4096;

void AppendTupleText(const Graph& g, NodeId k, std::string& out) {
  out += '(';
  const std::vector<NodeId>& items = g.items(k);
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
    case Kind::kStr: return std::string(text(k));
    case Kind::kBigInt: return TwosComplementToDecimal(text(k));
    case Kind::kTuple: {
      std::string s;
      AppendTupleText(*this, k, s);
      return s;
    }
    default: return Describe(k);
  }
}

NodeId Graph::Add(Kind kind, uint64_t stream_offset) {
  if (nodes.size() >= kNil) Fail("too many pickle objects");
  Node n;
  n.kind = kind;
  n.stream_offset = stream_offset;
  nodes.push_back(n);
  return static_cast<NodeId>(nodes.size() - 1);
}

NodeId Graph::AddCompound(Kind kind, uint64_t stream_offset) {
  NodeId id = Add(kind, stream_offset);
  nodes[id].compound = static_cast<uint32_t>(compounds.size());
  compounds.emplace_back();
  return id;
}

void Graph::SetText(NodeId id, std::string_view text) {
  if (strings.size() + text.size() > UINT32_MAX) Fail("pickle strings exceed 4 GiB in total");
  nodes[id].text_offset = static_cast<uint32_t>(strings.size());
  nodes[id].text_size = static_cast<uint32_t>(text.size());
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
  nodes[id].text_size = static_cast<uint32_t>(module.size());
  if (name.size() > kMaxGlobalName) Fail("a global's name is longer than {} bytes", kMaxGlobalName);
  nodes[id].name_size = static_cast<uint16_t>(name.size());
  return id;
}

NodeId Graph::AddTuple(std::vector<NodeId> items, uint64_t stream_offset) {
  NodeId id = AddCompound(Kind::kTuple, stream_offset);
  mutable_compound(id).items = std::move(items);
  return id;
}

NodeId Graph::AddPersId(NodeId pid, uint64_t stream_offset) {
  NodeId id = AddCompound(Kind::kPersId, stream_offset);
  mutable_compound(id).args = pid;
  return id;
}

}  // namespace ckpt::pickle
