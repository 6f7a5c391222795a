#include "torch/storage_ref.h"

#include "base/error.h"

namespace ckpt::torch {

using pickle::Kind;
using pickle::NodeId;

namespace {

uint64_t NonNegative(const pickle::Graph& g, NodeId id, const char* what) {
  if (id == pickle::kNil || g.kind(id) != Kind::kInt || g.at(id).integer < 0) {
    Fail("persistent id {} is not a non-negative integer", what);
  }
  return static_cast<uint64_t>(g.at(id).integer);
}

std::string Text(const pickle::Graph& g, NodeId id, const char* what) {
  if (id == pickle::kNil) Fail("persistent id has no {}", what);
  if (g.kind(id) == Kind::kStr) return std::string(g.text(id));
  if (g.kind(id) == Kind::kInt) return std::to_string(g.at(id).integer);
  Fail("persistent id {} is a {}, not a string", what, pickle::KindName(g.kind(id)));
}

}  // namespace

StorageRef DecodeStorageRef(const pickle::Graph& g, NodeId persid) {
  NodeId pid = g.compound(persid).args;
  if (pid == pickle::kNil || g.kind(pid) != Kind::kTuple) {
    Fail("persistent id is a {}, not a tuple",
         pid == pickle::kNil ? "nil" : pickle::KindName(g.kind(pid)));
  }
  const auto& t = g.items(pid);
  if (t.empty() || g.kind(t[0]) != Kind::kStr || g.text(t[0]) != "storage") {
    Fail("persistent id is not a ('storage', ...) tuple");
  }
  if (t.size() != 5 && t.size() != 6)
    Fail("persistent id has {} fields, expected 5 or 6", t.size());
  StorageRef r;
  if (g.kind(t[1]) != Kind::kGlobal) Fail("persistent id storage type is not a class");
  std::string_view cls = g.global_name(t[1]);
  auto dtype = FromStorageClass(cls);
  if (!dtype) Fail("unknown storage class '{}'", g.GlobalText(t[1]));
  r.dtype = *dtype;
  r.key = Text(g, t[2], "key");
  r.location = Text(g, t[3], "location");
  r.numel = NonNegative(g, t[4], "numel");
  if (t.size() == 6 && g.kind(t[5]) != Kind::kNone) {
    NodeId view = t[5];
    if (g.kind(view) != Kind::kTuple || g.items(view).size() != 3) {
      Fail("persistent id view metadata is not a (key, offset, size) tuple");
    }
    r.is_view = true;
    r.view_key = Text(g, g.items(view)[0], "view key");
    r.view_offset = NonNegative(g, g.items(view)[1], "view offset");
    r.view_size = NonNegative(g, g.items(view)[2], "view size");
  }
  return r;
}

}  // namespace ckpt::torch
