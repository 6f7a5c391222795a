#include "pickle/graph.h"

#include <fmt/format.h>

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

}  // namespace ckpt::pickle
