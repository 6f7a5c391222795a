// pickle::PathWalker, and its two clients (the tensor table and strip's dropper) on graphs
// only the walker's mechanics decide: path spelling, key depth vs stack depth, chains of
// BUILD states deeper than the stack guard, cycles through BUILD states, and billion laughs
// made of BUILD states. Hand-made pickles, parsed without a zip around them.
#include "pickle/path_walker.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "base/endian.h"
#include "engines/strip.h"
#include "pickle/parser.h"
#include "test_util.h"
#include "torch/model.h"

namespace ckpt {
namespace {

using pickle::Graph;
using pickle::NodeId;
using pickle::PathWalker;
using test::P;

constexpr uint8_t kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87;

Graph Parse(const std::string& pickle) {
  return pickle::Parse(test::B(pickle)).graph;
}

// LONG_BINPUT / LONG_BINGET: memo indices past 255.
P& LongPut(P& p, uint32_t i) {
  std::string op = "r";
  AppendLE<uint32_t>(op, i);
  return p.raw(op);
}
P& LongGet(P& p, uint32_t i) {
  std::string op = "j";
  AppendLE<uint32_t>(op, i);
  return p.raw(op);
}

// The root is an OrderedDict object whose BUILD state is another, `levels` objects in all;
// the last one's state is what `state` pushes. Built from the top down: the parser's
// nesting limit (2000) counts nesting built from the bottom up, and a hostile pickle need
// not build that way.
std::string BuildChain(uint32_t levels, const std::function<void(P&)>& state) {
  P p;
  p.proto(2).global("collections", "OrderedDict");
  LongPut(p, 0).op('0');
  LongGet(p, 0).op(')').op('R');  // the root stays on the stack
  LongPut(p, 1);
  for (uint32_t k = 1; k < levels; ++k) {
    LongGet(p, 0).op(')').op('R');
    LongPut(p, k + 1).op('0');
    LongGet(p, k);
    LongGet(p, k + 1).op('b').op('0');  // object k's state is object k + 1
  }
  LongGet(p, levels);
  state(p);
  return p.op('b').op('0').stop().bytes();
}

// {"optimizer": 1, "model": {"optimizer": 2}}
void TrainingState(P& p) {
  p.op('}').str("optimizer").bin_int(1).op('s');
  p.str("model").op('}').str("optimizer").bin_int(2).op('s').op('s');
}

std::string TensorTableError(const std::string& pickle) {
  torch::Model m;
  m.graph = Parse(pickle);
  return test::ErrorOf([&] { torch::BuildTensorTable(m, /*legacy=*/false); });
}

std::string StripError(const std::string& pickle, std::vector<std::string> drop) {
  Graph g = Parse(pickle);
  StripOptions o;
  o.drop = std::move(drop);
  return test::ErrorOf([&] { StripGraph(g, o); });
}

// Records where the walk goes: every node reached, with its path and both depths.
class Recorder final : public PathWalker::Client {
 public:
  using Visit = std::tuple<std::string, uint32_t, uint32_t>;  // path, key depth, stack depth

  Recorder(const Graph& g, PathWalker::StateParts parts) : w_(g), parts_(parts) {}

  std::vector<Visit> Run(NodeId root) {
    w_.Run(root, *this);
    return visits_;
  }

 private:
  void Node(NodeId n, bool) override {
    visits_.emplace_back(w_.path(), w_.key_depth(), w_.stack_depth());
    w_.Entries(n);
    w_.Items(n);
    w_.States(n, parts_);
    w_.CallArguments(n);
  }

  PathWalker w_;
  PathWalker::StateParts parts_;
  std::vector<Visit> visits_;
};

// {"a": [1, {"b": 2}],
//  "o": OrderedDict() with o["k"] = 3 and BUILD state ({"x": 4}, [5]),
//  "c": OrderedDict([6]), "self": <the root>}
std::string EveryKindOfChild() {
  P p;
  p.proto(2).op('}').put(0).mark();
  p.str("a").op(']').mark().bin_int(1).op('}').str("b").bin_int(2).op('s').op('e');
  p.str("o").global("collections", "OrderedDict").op(')').op('R').str("k").bin_int(3).op('s');
  p.op('}').str("x").bin_int(4).op('s').op(']').bin_int(5).op('a').op(kTuple2).op('b');
  p.str("c").global("collections", "OrderedDict").op(']').bin_int(6).op('a').op(kTuple1).op('R');
  p.str("self").get(0);
  return p.op('u').stop().bytes();
}

TEST(PathWalker, PathsAndBothDepths) {
  Graph g = Parse(EveryKindOfChild());
  using V = Recorder::Visit;
  // Keys add to the key depth and the stack depth; BUILD states and their parts add only to
  // the stack depth; the root is not walked again along the "self" cycle.
  EXPECT_EQ(Recorder(g, PathWalker::StateParts::kSlotsUnderState).Run(g.root),
            (std::vector<V>{V{"", 0, 1}, V{"a", 1, 2}, V{"a.1", 2, 3}, V{"o", 1, 2}, V{"o", 1, 3},
                            V{"o.__state__", 2, 3}, V{"c", 1, 2}, V{"c.0", 2, 3}}));
  EXPECT_EQ(Recorder(g, PathWalker::StateParts::kAtObjectPath).Run(g.root),
            (std::vector<V>{V{"", 0, 1}, V{"a", 1, 2}, V{"a.1", 2, 3}, V{"o", 1, 2}, V{"o", 1, 3},
                            V{"o", 1, 3}, V{"c", 1, 2}, V{"c.0", 2, 3}}));
}

// A chain of BUILD states adds no key but one stack level each: past 4096 levels both
// walkers refuse it (strip's once recursed through BUILD states without counting them).
TEST(PathWalker, ChainOfBuildStatesDeeperThanTheGuardIsRefusedByBoth) {
  std::string deep = BuildChain(5000, TrainingState);
  const std::string kTooDeep = "object graph nested deeper than 4096 levels";
  EXPECT_EQ(TensorTableError(deep), kTooDeep);
  EXPECT_EQ(StripError(deep, {}), kTooDeep);  // the default drops walk BUILD states too
  EXPECT_EQ(StripError(deep, {"*.nothing"}), kTooDeep);

  // Within the guard both walk it. The keys of the dict at the bottom are top-level keys
  // (key depth 1) at a stack depth of about 4000: strip's default drop takes "optimizer"
  // there and leaves "model.optimizer".
  std::string within = BuildChain(4000, TrainingState);
  EXPECT_EQ(TensorTableError(within), "");
  Graph g = Parse(within);
  EXPECT_EQ(StripGraph(g, {}), (std::vector<std::string>{"optimizer"}));
  g = Parse(within);
  StripOptions nested;
  nested.drop = {"model.optimizer"};
  EXPECT_EQ(StripGraph(g, nested), (std::vector<std::string>{"model.optimizer"}));
}

// The tensor table walks into what a composite tensor's component is when it is not a
// tensor; that walk counts its depth on from the composite's (it once restarted at 0, so a
// chain of sparse tensors through lists recursed without bound: this one overflowed the
// stack).
TEST(PathWalker, ChainThroughSparseTensorComponentsIsRefused) {
  // sparse_k = _rebuild_sparse_tensor(None, (list_k, None, None)) with list_k = [sparse_k+1],
  // built from the top down; list k is memo 2k + 1, sparse k memo 2k + 2.
  P p;
  p.proto(2).global("torch._utils", "_rebuild_sparse_tensor");
  LongPut(p, 0).op('0');
  auto sparse = [&](uint32_t list) {
    LongGet(p, 0).none();
    LongGet(p, list).none().none().op(kTuple3).op(kTuple2).op('R');
  };
  p.op(']');
  LongPut(p, 1).op('0');
  sparse(1);  // the root stays on the stack
  for (uint32_t k = 1; k < 5000; ++k) {
    p.op(']');
    LongPut(p, 2 * k + 1).op('0');
    sparse(2 * k + 1);
    LongPut(p, 2 * k + 2).op('0');
    LongGet(p, 2 * k - 1);
    LongGet(p, 2 * k + 2).op('a').op('0');  // list k - 1 holds sparse k
  }
  EXPECT_EQ(TensorTableError(p.stop().bytes()), "object graph nested deeper than 4096 levels");
}

// A BUILD state that leads back to its object (directly, or through another object's state)
// is walked once along each path.
TEST(PathWalker, CyclesThroughBuildStatesAreWalkedOnce) {
  // x = OrderedDict(); y = OrderedDict(); x.state = {"optimizer": 1, "y": y, "x": x};
  // y.state = (x, {"w": 2})
  P p;
  p.proto(2).global("collections", "OrderedDict").put(0).op(')').op('R').put(1);
  p.get(0).op(')').op('R').put(2).op('0');
  p.op('}').mark().str("optimizer").bin_int(1).str("y").get(2).str("x").get(1);
  p.op('u').op('b');  // x's state; x is left on the stack
  p.get(2).get(1).op('}').str("w").bin_int(2).op('s').op(kTuple2).op('b').op('0');
  std::string pickle = p.stop().bytes();
  Graph g = Parse(pickle);
  using V = Recorder::Visit;
  EXPECT_EQ(Recorder(g, PathWalker::StateParts::kAtObjectPath).Run(g.root),
            (std::vector<V>{V{"", 0, 1}, V{"", 0, 2}, V{"y", 1, 3}, V{"y", 1, 4}}));
  EXPECT_EQ(TensorTableError(pickle), "");
  EXPECT_EQ(StripGraph(g, {}), (std::vector<std::string>{"optimizer"}));
  g = Parse(pickle);
  StripOptions o;
  o.drop = {"x", "y.w"};
  EXPECT_EQ(StripGraph(g, o), (std::vector<std::string>{"x", "y.w"}));
}

// 60 objects, each with the BUILD state (previous, previous): 2^60 paths in a few hundred
// bytes, made of BUILD states only, so even strip's default drops walk them. Both walkers
// stop at the PathBudget.
TEST(PathWalker, BillionLaughsThroughBuildStatesAreRefusedByBoth) {
  P p;
  p.proto(2).global("collections", "OrderedDict").put(0).op('0');
  // The first object holds a tensor, so the tensor table finds something below every one.
  p.get(0).op(')').op('R').str("w");
  test::PushTensor(p, 4, 0, 4).op('s').put(1).op('0');
  for (uint8_t level = 2; level <= 60; ++level) {
    p.get(0).op(')').op('R').get(level - 1).get(level - 1).op(kTuple2).op('b').put(level);
    if (level < 60) p.op('0');
  }
  std::string laughs = p.stop().bytes();
  const std::string kRefused =
      "object graph has more than 250000 steps to walk again through shared references; "
      "refusing";
  EXPECT_EQ(TensorTableError(laughs), kRefused);
  EXPECT_EQ(StripError(laughs, {}), kRefused);
  EXPECT_EQ(StripError(laughs, {"*.nothing"}), kRefused);
}

}  // namespace
}  // namespace ckpt
