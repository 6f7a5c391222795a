// Walks an object graph by key paths from the root: the mechanics the tensor table
// (torch/tensor_table.cpp: tensor names) and strip's dropper (engines/strip.cpp: key paths to
// drop or keep) share. What a node means, and which of its children to walk, is the client's.
//
// A path is the keys that lead to a value, joined with '.': dict keys as Graph::KeyText
// spells them (SETITEMs on an object too), sequence items and call arguments by index in
// decimal, and "__state__" for the slot part of a BUILD state where the client names it so.
// BUILD states and keyword arguments add no key: an object's attributes read as its own keys.
//
// Two depths, kept apart:
// - key depth: how many keys the path has ("optimizer" is 1, "optimizer.state.0" is 3). A
//   dict reached through an object's BUILD state keeps the object's key depth, so the keys of
//   the state of a top-level object are top-level keys.
// - stack depth: how many nodes are being walked one inside the other, whatever they add to
//   the path (BUILD states and their parts, keyword arguments, a client's own recursion
//   counted with Deeper). Past kMaxDepth the walk fails with an Error instead of running out
//   of stack: a chain of BUILD states adds no key but one level each.
//
// A node already on the current path (a cycle back to an ancestor) is not walked again along
// it. Nodes some earlier path walked are known, so that walking them again is counted against
// a PathBudget (shared references make the number of paths exponential); a client may also
// prune a node it found nothing in, so that later paths step over it.
//
// An Error (too deep, over the budget) ends the walk; the walker is not used after it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "pickle/graph.h"
#include "pickle/path_budget.h"

namespace ckpt::pickle {

class PathWalker {
 public:
  static constexpr uint32_t kMaxDepth = 4096;

  // What to do at each node a path reaches. Node(n, first) is called for every container,
  // object or persistent id reached by path() that is not on it already; `first` when no
  // earlier path walked it. The client walks the children it wants with Entries, Items,
  // States, CallArguments and Walk, or none (a leaf to this client). Scalars and nodes on
  // the path are never passed to Node.
  class Client {
   public:
    virtual void Node(NodeId n, bool first) = 0;

   protected:
    ~Client() = default;
  };

  // Says whether to walk a child, path() ending in its key: `index` is an entry's key index
  // into Graph::pairs (even) or an item's index.
  using Judge = std::function<bool(size_t index)>;

  // How an object's BUILD states are walked. Each state is walked at the object's path; a
  // tuple state is taken apart:
  enum class StateParts {
    // every part of a tuple state at the object's path (strip)
    kAtObjectPath,
    // (state, slotstate) pairs as Python's default __setstate__ reads them: a dict part at
    // the object's path, any other part (not None) under "__state__"; any other tuple is a
    // value, walked with its items by index (tensor names)
    kSlotsUnderState,
  };

  explicit PathWalker(const Graph& g);
  PathWalker(const PathWalker&) = delete;
  PathWalker& operator=(const PathWalker&) = delete;

  // Walks from `root` (path "") with `client`.
  void Run(NodeId root, Client& client);

  // ---- inside Client::Node: the children of `n`, each at path() extended by its key ----
  // Dict entries (also SETITEMs on an object), by key text.
  void Entries(NodeId n);
  // The same, judged first: `judge` is called for every entry before any is walked; only
  // entries it returns true for are walked.
  void Entries(NodeId n, const Judge& judge);
  // Sequence and set items (also APPENDs on an object), by index.
  void Items(NodeId n);
  void Items(NodeId n, const Judge& judge);
  // An object's BUILD states, at path() (see StateParts); nothing for other nodes.
  void States(NodeId n, StateParts parts);
  // An object's call arguments: the argument tuple's items by index, then the keyword
  // arguments at path(); nothing for other nodes.
  void CallArguments(NodeId n);
  // Walks `n` at path(), one stack level deeper.
  void Walk(NodeId n);

  // Walks `n` at path() with another client, as a look below the node being walked (does
  // some path below match?): it shares the path, the nodes on it, the depths and the budget,
  // and leaves walked-before marks as they are (a later walk of the same nodes is not a
  // repeat). Returns true when the probe called Stop().
  bool Probe(NodeId n, Client& client);
  // Ends the innermost Probe (or the Run): no more children are walked.
  void Stop() { stopped_ = true; }

  // Later paths that reach `n` step over it (its first walk found nothing the client needs).
  void Prune(NodeId n) { walked_[n] = kPruned; }

  // Extends path() by `key` for the scope of the object (one more key of key depth); for a
  // client that walks a child under a key of its own (a tensor's component by name).
  class Key {
   public:
    Key(PathWalker& w, std::string_view key);
    ~Key();
    Key(const Key&) = delete;
    Key& operator=(const Key&) = delete;

   private:
    PathWalker& w_;
    size_t path_size_, top_size_;
  };
  // One more level of stack depth for the scope of the object: a client's own recursion
  // (a tensor form wrapping another) is counted against kMaxDepth too.
  class Deeper {
   public:
    explicit Deeper(PathWalker& w);
    ~Deeper() { --w_.stack_depth_; }
    Deeper(const Deeper&) = delete;
    Deeper& operator=(const Deeper&) = delete;

   private:
    PathWalker& w_;
  };

  const std::string& path() const { return path_; }
  // The key the path starts with ("model" for "model.enc.w"), "" at the root.
  std::string_view top_key() const { return std::string_view(path_).substr(0, top_size_); }
  uint32_t key_depth() const { return key_depth_; }
  uint32_t stack_depth() const { return stack_depth_; }

 private:
  enum Walked : uint8_t { kUnseen, kWalked, kPruned };

  void Child(NodeId n, std::string_view key);
  void EnterLevel();  // fails past kMaxDepth

  const Graph& g_;
  Client* client_ = nullptr;
  std::vector<bool> on_path_;
  std::vector<uint8_t> walked_;  // Walked, per node
  PathBudget budget_;
  std::string path_;
  size_t top_size_ = 0;  // path_ starts with its top key of this size
  uint32_t key_depth_ = 0;
  uint32_t stack_depth_ = 0;
  bool marking_ = true;  // false inside a Probe
  bool stopped_ = false;
};

}  // namespace ckpt::pickle
