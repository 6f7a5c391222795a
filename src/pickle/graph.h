// The object graph a pickle describes, built without importing or calling anything.
//
// Every value is a Node in one arena, referred to by NodeId. Objects that a real unpickler
// would construct by calling something (REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ) become
// kObject nodes that record the callable, its arguments and whatever BUILD / APPEND(S) /
// SETITEM(S) / ADDITEMS later applied to them. Memo GETs return the same NodeId, so shared
// references and cycles stay shared nodes, exactly as in the stream.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::pickle {

using NodeId = uint32_t;
inline constexpr NodeId kNil = UINT32_MAX;

enum class Kind : uint8_t {
  kNone,
  kBool,
  kInt,     // fits in int64
  kBigInt,  // text holds the two's complement little-endian bytes (LONG1/LONG4 payload)
  kFloat,
  kStr,
  kBytes,
  kByteArray,
  kTuple,
  kList,
  kDict,
  kSet,
  kFrozenSet,
  kGlobal,  // text holds module, name holds the attribute name
  kObject,  // result of calling `callable` with `args` (and `kwargs`)
  kPersId,  // persistent_load(args): how torch refers to storages
};

const char* KindName(Kind kind);

// How a kObject node was made, so a writer can reproduce it.
enum class Construct : uint8_t { kReduce, kNewObj, kNewObjEx, kInst };

// Children and construction details of containers and objects.
struct Compound {
  std::vector<NodeId> items;   // tuple/list/set elements, or APPENDed items of an object
  std::vector<NodeId> pairs;   // dict key,value,key,value... or SETITEMs of an object
  std::vector<NodeId> states;  // BUILD arguments, in order
  NodeId callable = kNil;      // kObject: what is called; kPersId: unused
  NodeId args = kNil;          // kObject: argument tuple; kPersId: the persistent id
  NodeId kwargs = kNil;        // NEWOBJ_EX keyword arguments
  Construct construct = Construct::kReduce;
};

// 32 bytes: a pickle of 10^5 tensors makes millions of nodes.
struct Node {
  union {
    int64_t integer = 0;  // kInt
    double real;          // kFloat
  };
  uint32_t text_offset = 0;  // into Graph::strings
  uint32_t text_size = 0;
  uint32_t compound = UINT32_MAX;
  uint16_t name_size = 0;  // kGlobal: name follows the module text (kMaxGlobalName at most)
  Kind kind = Kind::kNone;
  bool boolean = false;
  uint64_t stream_offset = 0;  // opcode offset that created the node (for messages)
};
static_assert(sizeof(Node) == 32);

// The longest attribute name a global may have (Python's own are far shorter).
inline constexpr size_t kMaxGlobalName = UINT16_MAX;

class Graph {
 public:
  NodeId root = kNil;
  int protocol = 0;
  // Deques: a graph of millions of nodes grows without reallocating (a vector's doubling
  // would need the old and the new array at once, and up to twice the room it uses).
  std::deque<Node> nodes;
  std::deque<Compound> compounds;
  std::string strings;

  const Node& at(NodeId id) const { return nodes[id]; }
  Kind kind(NodeId id) const { return nodes[id].kind; }
  std::string_view text(NodeId id) const {
    const Node& n = nodes[id];
    return std::string_view(strings).substr(n.text_offset, n.text_size);
  }
  // kGlobal only.
  std::string_view global_module(NodeId id) const { return text(id); }
  std::string_view global_name(NodeId id) const {
    const Node& n = nodes[id];
    return std::string_view(strings).substr(n.text_offset + n.text_size, n.name_size);
  }
  std::string GlobalText(NodeId id) const {
    return std::string(global_module(id)) + "." + std::string(global_name(id));
  }
  bool has_compound(NodeId id) const { return nodes[id].compound != UINT32_MAX; }
  const Compound& compound(NodeId id) const { return compounds[nodes[id].compound]; }
  const std::vector<NodeId>& items(NodeId id) const { return compound(id).items; }
  const std::vector<NodeId>& pairs(NodeId id) const { return compound(id).pairs; }

  // kObject whose callable is the global module.name?
  bool IsCallOf(NodeId id, std::string_view module, std::string_view name) const;
  // For a kObject: the global it calls, or kNil when the callable is not a global.
  NodeId CalledGlobal(NodeId id) const;
  // Positional argument i of a kObject (kNil if absent or args is not a tuple).
  NodeId Arg(NodeId id, size_t i) const;
  size_t ArgCount(NodeId id) const;
  // Short human description of a scalar node (for names and messages).
  std::string Describe(NodeId id) const;
  // A dict key as it appears in a tensor name: strings as is, ints in decimal, tuples as
  // "(a, b)".
  std::string KeyText(NodeId key) const;

  // ---- building (the parser, and transforms that rewrite a checkpoint) ----
  NodeId Add(Kind kind, uint64_t stream_offset = 0);
  NodeId AddCompound(Kind kind, uint64_t stream_offset = 0);
  NodeId AddText(Kind kind, std::string_view text, uint64_t stream_offset = 0);
  NodeId AddInt(int64_t value, uint64_t stream_offset = 0);
  NodeId AddBool(bool value, uint64_t stream_offset = 0);
  NodeId AddFloat(double value, uint64_t stream_offset = 0);
  NodeId AddGlobal(std::string_view module, std::string_view name, uint64_t stream_offset = 0);
  NodeId AddTuple(std::vector<NodeId> items, uint64_t stream_offset = 0);
  NodeId AddPersId(NodeId pid, uint64_t stream_offset = 0);
  Compound& mutable_compound(NodeId id) { return compounds[nodes[id].compound]; }
  // Replaces the text of a kStr/kBytes node.
  void SetText(NodeId id, std::string_view text);
};

}  // namespace ckpt::pickle
