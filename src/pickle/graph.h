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
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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

// A run of node ids in the graph's id arena (Graph::ids): where it starts, how many ids it
// holds and how many it has room for before it moves.
struct IdList {
  uint32_t pos = 0;
  uint32_t size = 0;
  uint32_t cap = 0;
};

// Children of a list, dict, set or object (what APPEND(S), SETITEM(S), ADDITEMS and BUILD
// gave it). Only compounds that have any get one: a tensor's rebuild call and its empty
// OrderedDict() have none.
struct CompoundLists {
  IdList items;   // list/set elements, or APPENDed items of an object
  IdList pairs;   // dict key,value,key,value... or SETITEMs of an object
  IdList states;  // BUILD arguments, in order
};

inline constexpr uint32_t kNoLists = UINT32_MAX;

// Construction details of lists, dicts, sets, objects and persistent ids (tuples, the most
// numerous containers, keep their items in their Node and have none). 20 bytes and no
// allocation of its own: a pickle of 10^5 tensors makes ~3 per tensor.
struct Compound {
  NodeId callable = kNil;     // kObject: what is called; kPersId: unused
  NodeId args = kNil;         // kObject: argument tuple; kPersId: the persistent id
  NodeId kwargs = kNil;       // NEWOBJ_EX keyword arguments
  uint32_t lists = kNoLists;  // index into Graph::lists once it has children
  Construct construct = Construct::kReduce;
};
static_assert(sizeof(Compound) == 20);

// Where lists of node ids live: blocks of up to 2^20 ids (4 MiB; the first 2^10, each next
// twice as large) filled one after another; a list
// longer than 2^16 ids gets a block of its own. Positions are (block << 20) | offset. A list
// that outgrows its room moves to a new run twice as large (the old run is left unused, as a
// vector's old buffer would be freed: at most as much again as the lists hold).
class IdArena {
 public:
  std::span<const NodeId> Get(const IdList& l) const {
    return l.size ? std::span<const NodeId>(At(l.pos), l.size) : std::span<const NodeId>();
  }
  std::span<NodeId> GetMutable(const IdList& l) {
    return l.size ? std::span<NodeId>(At(l.pos), l.size) : std::span<NodeId>();
  }
  // A new list holding `ids` exactly.
  IdList Make(std::span<const NodeId> ids);
  // Replaces the list's contents (in place when there is room).
  void Assign(IdList& l, std::span<const NodeId> ids);
  void Push(IdList& l, NodeId id);
  uint64_t bytes() const { return bytes_; }

 private:
  static constexpr uint32_t kBlockBits = 20;
  static constexpr uint32_t kBlockIds = 1u << kBlockBits;
  static constexpr uint32_t kOwnBlock = 1u << 16;
  static constexpr uint32_t kFirstBlockIds = 1u << 10;
  NodeId* At(uint32_t pos) const {
    return const_cast<NodeId*>(blocks_[pos >> kBlockBits].data()) + (pos & (kBlockIds - 1));
  }
  uint32_t Allocate(uint32_t cap);

  std::vector<std::vector<NodeId>> blocks_;
  uint32_t shared_ = UINT32_MAX;  // the block small lists are cut from
  uint64_t bytes_ = 0;
};

// Kinds whose children and construction details live in a Compound (tuples keep their items
// in the Node itself).
constexpr bool HasCompoundRecord(Kind k) {
  return k == Kind::kList || k == Kind::kDict || k == Kind::kSet || k == Kind::kFrozenSet ||
         k == Kind::kObject || k == Kind::kPersId;
}

// Where a node's text or items are: an offset and a size.
struct Span32 {
  uint32_t offset;
  uint32_t size;
};

// 16 bytes: a pickle of 10^5 tensors makes millions of nodes (~15 per tensor).
struct Node {
  union {
    int64_t integer = 0;  // kInt
    double real;          // kFloat
    // kStr/kBytes/kBigInt/kGlobal: into Graph::strings; kTuple: IdList position and number
    // of its items; kinds with a Compound (HasCompoundRecord): offset = its index in
    // Graph::compounds.
    Span32 text;
  };
  // Offset of the opcode that created the node (for messages; saturates at 4 GiB - 1).
  uint32_t stream_offset = 0;
  uint16_t name_size = 0;  // kGlobal: name follows the module text (kMaxGlobalName at most)
  Kind kind = Kind::kNone;
  bool boolean = false;
};
static_assert(sizeof(Node) == 16);

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
  std::deque<CompoundLists> lists;
  IdArena ids;
  std::string strings;

  const Node& at(NodeId id) const { return nodes[id]; }
  Kind kind(NodeId id) const { return nodes[id].kind; }
  std::string_view text(NodeId id) const {
    const Node& n = nodes[id];
    return std::string_view(strings).substr(n.text.offset, n.text.size);
  }
  // kGlobal only.
  std::string_view global_module(NodeId id) const { return text(id); }
  std::string_view global_name(NodeId id) const {
    const Node& n = nodes[id];
    return std::string_view(strings).substr(n.text.offset + n.text.size, n.name_size);
  }
  std::string GlobalText(NodeId id) const {
    return std::string(global_module(id)) + "." + std::string(global_name(id));
  }
  // Does the node have children (a tuple, list, dict, set, object or persistent id)?
  bool has_compound(NodeId id) const {
    return HasCompoundRecord(nodes[id].kind) || nodes[id].kind == Kind::kTuple;
  }
  // Construction details (callable, args, kwargs); an empty Compound for a tuple or scalar.
  const Compound& compound(NodeId id) const {
    const Node& n = nodes[id];
    return HasCompoundRecord(n.kind) ? compounds[n.text.offset] : kEmpty;
  }
  std::span<const NodeId> items(NodeId id) const {
    const Node& n = nodes[id];
    if (n.kind == Kind::kTuple) return ids.Get(TupleList(n));
    const CompoundLists* l = Lists(id);
    return l ? ids.Get(l->items) : std::span<const NodeId>();
  }
  std::span<const NodeId> pairs(NodeId id) const {
    const CompoundLists* l = Lists(id);
    return l ? ids.Get(l->pairs) : std::span<const NodeId>();
  }
  std::span<const NodeId> states(NodeId id) const {
    const CompoundLists* l = Lists(id);
    return l ? ids.Get(l->states) : std::span<const NodeId>();
  }
  // The value under the string key `key` among the pairs of a dict (or of an object built
  // with SETITEMS: an OrderedDict), the first one given; kNil when there is none (or `id` is
  // kNil or holds no pairs).
  NodeId ValueAt(NodeId id, std::string_view key) const {
    if (id == kNil || !has_compound(id)) return kNil;
    std::span<const NodeId> p = pairs(id);
    for (size_t i = 0; i + 1 < p.size(); i += 2) {
      if (kind(p[i]) == Kind::kStr && text(p[i]) == key) return p[i + 1];
    }
    return kNil;
  }

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
  NodeId AddTuple(std::span<const NodeId> items, uint64_t stream_offset = 0);
  NodeId AddTuple(std::initializer_list<NodeId> items) {
    return AddTuple(std::span<const NodeId>(items.begin(), items.size()));
  }
  NodeId AddPersId(NodeId pid, uint64_t stream_offset = 0);
  // Not for tuples (they have no Compound).
  Compound& mutable_compound(NodeId id);
  // The children lists of a compound, made when it has none yet.
  CompoundLists& mutable_lists(NodeId id);
  // Pairs of a dict (or SETITEMs of an object), to replace values in place.
  std::span<NodeId> mutable_pairs(NodeId id) {
    mutable_compound(id);  // fails for a kind that has no pairs
    return Lists(id) ? ids.GetMutable(mutable_lists(id).pairs) : std::span<NodeId>();
  }
  // Item i of a node's items (a tuple's too), replaced in place.
  void SetItem(NodeId id, size_t i, NodeId value);
  void SetItems(NodeId id, std::span<const NodeId> items);
  void SetPairs(NodeId id, std::span<const NodeId> pairs);
  void SetStates(NodeId id, std::span<const NodeId> states);
  void AppendItem(NodeId id, NodeId value);
  void AppendPair(NodeId id, NodeId key, NodeId value);
  void AppendState(NodeId id, NodeId state);
  // Replaces the text of a kStr/kBytes node.
  void SetText(NodeId id, std::string_view text);

  // Frees every node, string and id list (assigning an empty Graph would not: a moved-into
  // std::string keeps its buffer).
  void Release() {
    Graph empty;
    std::swap(*this, empty);
  }

 private:
  static IdList TupleList(const Node& n) { return IdList{n.text.offset, n.text.size, n.text.size}; }
  const CompoundLists* Lists(NodeId id) const {
    const Node& n = nodes[id];
    if (!HasCompoundRecord(n.kind)) return nullptr;
    uint32_t l = compounds[n.text.offset].lists;
    return l == kNoLists ? nullptr : &lists[l];
  }
  static const Compound kEmpty;
};

}  // namespace ckpt::pickle
