// strip's key-path dropper (engines/strip.cpp), through StripFile on small hand-made torch zips:
// nested drops, keep globs over drop globs, shared subtrees, cycles and the PathBudget bound.
#include "engines/strip.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "checkpoint/verify.h"
#include "file/checkpoint_file.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using pickle::Graph;
using pickle::Kind;
using pickle::NodeId;
using test::P;
using test::PushTensor;

// Storage "s<i>" holds 64 * (i + 1) float32 elements: each has its own size, and dropping
// any of them makes the file smaller, so strip rewrites it (it leaves a file as it is
// otherwise).
int32_t Numel(std::string_view key) {
  return 64 * (key.at(1) - '0' + 1);
}
uint64_t StorageBytes(std::string_view key) {
  return 4u * static_cast<uint64_t>(Numel(key));
}

// A float32 tensor over the whole of storage `key`.
P& Tensor(P& p, std::string_view key) {
  return PushTensor(p, Numel(key), 0, Numel(key), "FloatStorage", key);
}

// Every key path of the object (dict keys and list indices, joined with '.'), containers
// included, not following cycles; tensors are leaves.
std::set<std::string> KeyPaths(const Graph& g) {
  std::set<std::string> out;
  std::vector<bool> on_path(g.nodes.size(), false);
  std::function<void(NodeId, const std::string&)> walk = [&](NodeId n, const std::string& path) {
    if (!path.empty()) out.insert(path);
    if (n == pickle::kNil || !g.has_compound(n) || on_path[n]) return;
    if (g.kind(n) == Kind::kObject && g.CalledGlobal(n) != pickle::kNil &&
        g.global_module(g.CalledGlobal(n)) == "torch._utils") {
      return;
    }
    on_path[n] = true;
    std::string prefix = path.empty() ? "" : path + ".";
    const auto& pairs = g.pairs(n);
    for (size_t i = 0; i + 1 < pairs.size(); i += 2)
      walk(pairs[i + 1], prefix + g.KeyText(pairs[i]));
    const auto& items = g.items(n);
    for (size_t i = 0; i < items.size(); ++i) walk(items[i], prefix + std::to_string(i));
    on_path[n] = false;
  };
  walk(g.root, "");
  return out;
}

// The value under dict key `key` of dict (or OrderedDict object) `n`, or kNil.
NodeId Child(const Graph& g, NodeId n, const std::string& key) {
  const auto& pairs = g.pairs(n);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    if (g.KeyText(pairs[i]) == key) return pairs[i + 1];
  }
  return pickle::kNil;
}

// (path, bytes) of every dropped entry, in the order strip reports them.
using Entries = std::vector<std::pair<std::string, uint64_t>>;
Entries Dropped(const StripResult& r) {
  Entries out;
  for (const DroppedEntry& d : r.dropped) out.emplace_back(d.path, d.bytes);
  return out;
}

class StripTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckpt-strip-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a torch zip holding `pickle` and the records of `storages`.
  std::string Checkpoint(const std::string& pickle, const std::vector<std::string>& storages = {}) {
    std::vector<test::ZipRecord> records = {{"ck/data.pkl", pickle}};
    for (const std::string& key : storages) {
      records.push_back({"ck/data/" + key, std::string(StorageBytes(key), '\x01')});
    }
    records.push_back({"ck/version", "3\n"});
    std::string path = dir_ + "/in" + std::to_string(count_++) + ".pt";
    std::ofstream(path, std::ios::binary) << test::BuildZip(records);
    CheckpointFile f = OpenCheckpoint(path);  // a well-formed input, or the test is wrong
    EXPECT_TRUE(f.torch->model.problems.empty()) << f.torch->model.problems[0].what;
    return path;
  }

  // Strips `in` into a new file and returns the result; the output is reopened into `out`.
  StripResult Strip(const std::string& in, std::vector<std::string> drop,
                    std::vector<std::string> keep, CheckpointFile* out) {
    StripOptions o;
    o.drop = std::move(drop);
    o.keep = std::move(keep);
    o.output = dir_ + "/out" + std::to_string(count_++) + ".pt";
    StripResult r = StripFile(in, o);
    // These tests look at the dropper's work in the output: each drops enough storage bytes
    // that the file gets smaller, so it is rewritten.
    EXPECT_EQ(r.rewritten, !r.dropped.empty()) << r.note;
    *out = OpenCheckpoint(r.rewritten ? o.output : in);
    EXPECT_TRUE(Verify(*out, 1).problems.empty());
    if (r.rewritten) {
      EXPECT_EQ(fs::file_size(o.output), r.after);
    }
    return r;
  }

  static std::set<std::string> TensorNames(const CheckpointFile& f) {
    std::set<std::string> names;
    for (const torch::Tensor& t : f.torch->model.tensors)
      names.insert(t.names.begin(), t.names.end());
    return names;
  }

  std::string dir_;
  int count_ = 0;
};

// {"model": {"enc": {"w": T(s0), "b": T(s1)}, "dec": {"w": T(s2)}},
//  "optimizer": {"state": {"0": {"exp_avg": T(s3), "step": 9},
//                          "1": {"exp_avg": T(s4), "step": 9}}},
//  "step": 7}
std::string TrainingPickle() {
  P p;
  p.proto(2).op('}').str("model").op('}');
  p.str("enc").op('}').str("w");
  Tensor(p, "s0").op('s').str("b");
  Tensor(p, "s1").op('s').op('s');
  p.str("dec").op('}').str("w");
  Tensor(p, "s2").op('s').op('s');
  p.op('s').str("optimizer").op('}').str("state").op('}');
  for (const char* k : {"0", "1"}) {
    p.str(k).op('}').str("exp_avg");
    Tensor(p, k[0] == '0' ? "s3" : "s4").op('s');
    p.str("step").bin_int(9).op('s').op('s');
  }
  p.op('s').op('s').str("step").bin_int(7).op('s');
  return p.stop().bytes();
}

const std::vector<std::string> kTrainingStorages = {"s0", "s1", "s2", "s3", "s4"};

TEST_F(StripTest, NestedKeysAreDroppedByGlobWithTheBytesOnlyTheyHeld) {
  std::string in = Checkpoint(TrainingPickle(), kTrainingStorages);
  CheckpointFile out;
  StripResult r = Strip(in, {"model.enc.b", "optimizer.state.*.exp_avg"}, {}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"model.enc.b", StorageBytes("s1")},
                                 {"optimizer.state.0.exp_avg", StorageBytes("s3")},
                                 {"optimizer.state.1.exp_avg", StorageBytes("s4")}}));
  EXPECT_TRUE(r.rewritten);
  EXPECT_LT(r.after, r.before);
  EXPECT_EQ(TensorNames(out), (std::set<std::string>{"model.dec.w", "model.enc.w"}));
  EXPECT_EQ(KeyPaths(out.torch->model.graph),
            (std::set<std::string>{"model", "model.enc", "model.enc.w", "model.dec", "model.dec.w",
                                   "optimizer", "optimizer.state", "optimizer.state.0",
                                   "optimizer.state.0.step", "optimizer.state.1",
                                   "optimizer.state.1.step", "step"}));
  EXPECT_EQ(out.torch->model.storages.size(), 2u);

  // A dry run reports the same and writes nothing.
  StripOptions dry;
  dry.drop = {"model.enc.b", "optimizer.state.*.exp_avg"};
  dry.dry_run = true;
  dry.output = dir_ + "/dry.pt";
  StripResult d = StripFile(in, dry);
  EXPECT_EQ(Dropped(d), Dropped(r));
  EXPECT_EQ(d.after, r.after);
  EXPECT_FALSE(d.rewritten);
  EXPECT_FALSE(fs::exists(dry.output));
}

TEST_F(StripTest, DefaultDropsAreTopLevelKeysOnly) {
  // {"model": {"optimizer": T(s0), "w": T(s1)}, "optimizer": {"state": T(s2)},
  //  "lr_scheduler": {"last_epoch": 3}, "epoch": 1}
  P p;
  p.proto(2).op('}').str("model").op('}').str("optimizer");
  Tensor(p, "s0").op('s').str("w");
  Tensor(p, "s1").op('s').op('s');
  p.str("optimizer").op('}').str("state");
  Tensor(p, "s2").op('s').op('s');
  p.str("lr_scheduler").op('}').str("last_epoch").bin_int(3).op('s').op('s');
  p.str("epoch").bin_int(1).op('s');
  std::string in = Checkpoint(p.stop().bytes(), {"s0", "s1", "s2"});
  CheckpointFile out;
  StripResult r = Strip(in, {}, {}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"optimizer", StorageBytes("s2")}, {"lr_scheduler", 0}}));
  EXPECT_EQ(KeyPaths(out.torch->model.graph),
            (std::set<std::string>{"model", "model.optimizer", "model.w", "epoch"}));
  // --keep protects a default drop too.
  r = Strip(in, {}, {"lr_scheduler"}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"optimizer", StorageBytes("s2")}}));
  EXPECT_TRUE(KeyPaths(out.torch->model.graph).count("lr_scheduler.last_epoch"));
}

TEST_F(StripTest, KeepGlobsOverrideDropGlobs) {
  std::string in = Checkpoint(TrainingPickle(), kTrainingStorages);
  CheckpointFile out;
  // "model.enc" matches the drop glob, but a kept path lies below it: it stays, and only
  // what is below it and not kept goes.
  StripResult r = Strip(in, {"model.*"}, {"model.enc.w"}, &out);
  EXPECT_EQ(Dropped(r),
            (Entries{{"model.dec", StorageBytes("s2")}, {"model.enc.b", StorageBytes("s1")}}));
  EXPECT_EQ(TensorNames(out), (std::set<std::string>{"model.enc.w", "optimizer.state.0.exp_avg",
                                                     "optimizer.state.1.exp_avg"}));
  // A keep glob protects whatever it matches, wherever the drop glob matched.
  r = Strip(in, {"*.exp_avg", "model.enc.?"}, {"optimizer.state.1.*", "*.w"}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"model.enc.b", StorageBytes("s1")},
                                 {"optimizer.state.0.exp_avg", StorageBytes("s3")}}));
  EXPECT_EQ(TensorNames(out),
            (std::set<std::string>{"model.enc.w", "model.dec.w", "optimizer.state.1.exp_avg"}));
  // Nothing matches: the file is copied as it is.
  r = Strip(in, {"nothing.here"}, {}, &out);
  EXPECT_TRUE(r.dropped.empty());
  EXPECT_FALSE(r.rewritten);
}

// A keep glob with a wildcard before the end of a dropped container's path protects what it
// matches below that container, as a literal one does (--drop 'model.*' --keep 'model.*.w'
// once dropped "model.enc" whole, model.enc.w included).
TEST_F(StripTest, WildcardKeepGlobsProtectWhatTheyMatchBelowADroppedContainer) {
  std::string in = Checkpoint(TrainingPickle(), kTrainingStorages);
  CheckpointFile out;
  StripResult r = Strip(in, {"model.*"}, {"model.*.w"}, &out);
  EXPECT_EQ(TensorNames(out),
            (std::set<std::string>{"model.enc.w", "model.dec.w", "optimizer.state.0.exp_avg",
                                   "optimizer.state.1.exp_avg"}));
  EXPECT_EQ(Dropped(r), (Entries{{"model.enc.b", StorageBytes("s1")}}));
}

// {"model": D, "ema": D, "optimizer": T(s2)} with D = {"w": T(s0), "m": T(s1)}: one dict,
// two paths.
std::string SharedPickle() {
  P p;
  p.proto(2).op('}').str("model").op('}').put(0).str("w");
  Tensor(p, "s0").op('s').str("m");
  Tensor(p, "s1").op('s').op('s');
  p.str("ema").get(0).op('s').str("optimizer");
  Tensor(p, "s2").op('s');
  return p.stop().bytes();
}

TEST_F(StripTest, SharedSubtreeDroppedByOnePathStaysUnderTheOther) {
  std::string in = Checkpoint(SharedPickle(), {"s0", "s1", "s2"});
  CheckpointFile out;
  StripResult r = Strip(in, {"ema", "optimizer"}, {}, &out);
  // Nothing went with "ema": the dict is still reachable as "model".
  EXPECT_EQ(Dropped(r), (Entries{{"ema", 0}, {"optimizer", StorageBytes("s2")}}));
  EXPECT_EQ(TensorNames(out), (std::set<std::string>{"model.w", "model.m"}));
  EXPECT_EQ(out.torch->model.storages.size(), 2u);
}

// Dropping an entry of a shared dict through one path removes it from the one dict: torch
// would load one object under both names, so it is gone under both.
TEST_F(StripTest, EntryOfASharedDictGoesUnderEveryPath) {
  std::string in = Checkpoint(SharedPickle(), {"s0", "s1", "s2"});
  CheckpointFile out;
  StripResult r = Strip(in, {"ema.m"}, {}, &out);
  ASSERT_EQ(r.dropped.size(), 1u);
  EXPECT_EQ(r.dropped[0].path, "ema.m");
  EXPECT_EQ(TensorNames(out), (std::set<std::string>{"model.w", "ema.w", "optimizer"}));
  EXPECT_EQ(out.torch->model.storages.size(), 2u);
  const Graph& g = out.torch->model.graph;
  EXPECT_EQ(Child(g, g.root, "model"), Child(g, g.root, "ema"));  // still one dict
}

// The storage bytes that went with a dropped entry are reported with it, through any of the
// tensor's names (here "ema.m"; its first name is "model.m").
TEST_F(StripTest, BytesOfAnEntryDroppedThroughASharedDictAreReported) {
  std::string in = Checkpoint(SharedPickle(), {"s0", "s1", "s2"});
  CheckpointFile out;
  StripResult r = Strip(in, {"ema.m"}, {}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"ema.m", StorageBytes("s1")}}));
}

// A path that is kept does not lose an entry because the same dict is also reachable by a
// dropped path: the entry is one object, and --keep wins (it was once removed when the dict
// was walked as "ema" after "model").
TEST_F(StripTest, KeptPathKeepsASharedEntryThatAnotherPathDrops) {
  std::string in = Checkpoint(SharedPickle(), {"s0", "s1", "s2"});
  CheckpointFile out;
  StripResult r = Strip(in, {"ema.m", "optimizer"}, {"model.*"}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"optimizer", StorageBytes("s2")}}));
  EXPECT_EQ(TensorNames(out), (std::set<std::string>{"model.w", "model.m", "ema.w", "ema.m"}));
}

TEST_F(StripTest, CyclesAreWalkedOnceAndSurvive) {
  // {"model": D} with D = {"w": T(s0), "self": D, "opt": {"x": T(s1)}}
  P p;
  p.proto(2).op('}').str("model").op('}').put(0).str("w");
  Tensor(p, "s0").op('s').str("self").get(0).op('s').str("opt").op('}').str("x");
  Tensor(p, "s1").op('s').op('s').op('s');
  std::string in = Checkpoint(p.stop().bytes(), {"s0", "s1"});
  CheckpointFile out;
  StripResult r = Strip(in, {"*.opt"}, {}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"model.opt", StorageBytes("s1")}}));
  const Graph& g = out.torch->model.graph;
  NodeId d = Child(g, g.root, "model");
  ASSERT_NE(d, pickle::kNil);
  EXPECT_EQ(Child(g, d, "self"), d);  // the cycle is still a cycle
  EXPECT_EQ(KeyPaths(g), (std::set<std::string>{"model", "model.w", "model.self"}));
  // The edge that closes the cycle can itself be dropped.
  r = Strip(in, {"model.self", "model.opt"}, {}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"model.self", 0}, {"model.opt", StorageBytes("s1")}}));
  EXPECT_EQ(KeyPaths(out.torch->model.graph), (std::set<std::string>{"model", "model.w"}));
}

// An OrderedDict object, as torch.save writes a state_dict: its attributes (`_metadata`)
// come back through BUILD.
P& OrderedDict(P& p) {
  return p.global("collections", "OrderedDict").op(')').op('R');
}

// The keys of an object's BUILD state read as the object's own: the state of the top-level
// object holds top-level keys for the default drops, however many BUILD states lead to it.
TEST_F(StripTest, DefaultDropsReachTopLevelKeysThroughBuildStates) {
  // OrderedDict() with the state OrderedDict() with the state
  // {"optimizer": T(s0), "model": {"optimizer": T(s1)}, "w": T(s2)}
  P p;
  p.proto(2);
  OrderedDict(OrderedDict(p)).op('}').mark().str("optimizer");
  Tensor(p, "s0").str("model").op('}').str("optimizer");
  Tensor(p, "s1").op('s').str("w");
  Tensor(p, "s2").op('u').op('b').op('b');
  std::string in = Checkpoint(p.stop().bytes(), {"s0", "s1", "s2"});
  EXPECT_EQ(TensorNames(OpenCheckpoint(in)),
            (std::set<std::string>{"optimizer", "model.optimizer", "w"}));
  CheckpointFile out;
  StripResult r = Strip(in, {}, {}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"optimizer", StorageBytes("s0")}}));
  EXPECT_EQ(TensorNames(out), (std::set<std::string>{"model.optimizer", "w"}));
}

// A keep glob looks below a dropped entry through BUILD states as the drop walk does.
TEST_F(StripTest, KeepGlobsSeeThroughBuildStates) {
  // {"model": OrderedDict() with the state {"w": T(s0), "b": T(s1)}, "step": 1}
  P p;
  p.proto(2).op('}').mark().str("model");
  OrderedDict(p).op('}').mark().str("w");
  Tensor(p, "s0").str("b");
  Tensor(p, "s1").op('u').op('b').str("step").bin_int(1).op('u');
  std::string in = Checkpoint(p.stop().bytes(), {"s0", "s1"});
  CheckpointFile out;
  StripResult r = Strip(in, {"model*"}, {"model.w"}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"model.b", StorageBytes("s1")}}));
  EXPECT_EQ(TensorNames(out), (std::set<std::string>{"model.w"}));
}

TEST_F(StripTest, CycleThroughABuildStateIsWalkedOnceAndSurvives) {
  // x = OrderedDict() with the state {"w": T(s0), "self": x, "optimizer": T(s1)}
  P p;
  p.proto(2);
  OrderedDict(p).put(0).op('}').mark().str("w");
  Tensor(p, "s0").str("self").get(0).str("optimizer");
  Tensor(p, "s1").op('u').op('b');
  std::string in = Checkpoint(p.stop().bytes(), {"s0", "s1"});
  EXPECT_EQ(TensorNames(OpenCheckpoint(in)), (std::set<std::string>{"w", "optimizer"}));
  CheckpointFile out;
  StripResult r = Strip(in, {}, {}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"optimizer", StorageBytes("s1")}}));
  EXPECT_EQ(TensorNames(out), (std::set<std::string>{"w"}));
  const Graph& g = out.torch->model.graph;
  ASSERT_EQ(g.states(g.root).size(), 1u);
  EXPECT_EQ(Child(g, g.states(g.root)[0], "self"), g.root);  // still a cycle
  // The edge that closes the cycle can itself be dropped.
  r = Strip(in, {"self", "optimizer"}, {}, &out);
  EXPECT_EQ(Dropped(r), (Entries{{"self", 0}, {"optimizer", StorageBytes("s1")}}));
  const Graph& h = out.torch->model.graph;
  EXPECT_EQ(Child(h, h.states(h.root)[0], "self"), pickle::kNil);
  EXPECT_EQ(TensorNames(out), (std::set<std::string>{"w"}));
}

// {"layers": [D, D, ... `refs` times], "big": T(s0)} with D = {"drop_me": 1, "keep": 2}.
std::string SharedConfig(int refs) {
  P p;
  p.proto(2).op('}').str("layers").op(']').op('}').put(1);
  p.mark().str("drop_me").bin_int(1).str("keep").bin_int(2).op('u').op('a');
  for (int i = 1; i < refs; ++i) p.get(1).op('a');
  p.op('s').str("big");
  return Tensor(p, "s0").op('s').stop().bytes();
}

TEST_F(StripTest, PathBudgetBoundsWorkThroughSharedReferences) {
  // 2000 paths to one small dict: within the budget; the entry goes on the first path.
  {
    std::string in = Checkpoint(SharedConfig(2000), {"s0"});
    CheckpointFile out;
    StripResult r = Strip(in, {"*.drop_me", "big"}, {}, &out);
    EXPECT_EQ(Dropped(r), (Entries{{"big", StorageBytes("s0")}, {"layers.0.drop_me", 0}}));
    std::set<std::string> paths = KeyPaths(out.torch->model.graph);
    EXPECT_TRUE(paths.count("layers.1999.keep"));
    EXPECT_FALSE(paths.count("layers.1999.drop_me"));
  }
  // 300000 distinct dicts: first walks are never counted against the budget.
  {
    P p;
    p.proto(2).op('}').str("many").op(']').mark();
    for (int i = 0; i < 300000; ++i) p.op('}').str("a").bin_int(i).op('s');
    p.op('e').op('s');
    std::string in = Checkpoint(p.stop().bytes());
    StripOptions o;
    o.drop = {"many.*.b"};
    o.dry_run = true;
    EXPECT_TRUE(StripFile(in, o).dropped.empty());
  }
  // 60 levels of [previous, previous]: 2^60 paths, refused after a bounded number of steps.
  // Checkpoint() opened the file: the tensor table never walks them again (no tensor below),
  // so the refusal is the dropper's.
  {
    P p;
    p.proto(2).op('}').str("model").op(']').put(0).op('0');
    for (uint8_t level = 1; level < 60; ++level) {
      p.op('(').get(level - 1).get(level - 1).op('l').put(level).op('0');
    }
    std::string in = Checkpoint(p.get(59).op('s').stop().bytes());
    StripOptions o;
    o.drop = {"*.nothing"};
    o.dry_run = true;
    std::string err = test::ErrorOf([&] { StripFile(in, o); });
    EXPECT_EQ(err, in + ": object graph has more than 250000 steps to walk again through shared "
                        "references; refusing");
  }
  // 100 paths through a dict with a 1 MiB key: 100 MiB of paths, refused past 64 MiB.
  {
    P p;
    p.proto(2).op('}').str("model").op(']').put(0).op('}').put(1);
    p.str(std::string(1 << 20, 'k')).bin_int(0).op('s').op('a');
    for (int i = 1; i < 100; ++i) p.get(1).op('a');
    std::string in = Checkpoint(p.op('s').stop().bytes());
    StripOptions o;
    o.drop = {"*.nothing"};
    o.dry_run = true;
    std::string err = test::ErrorOf([&] { StripFile(in, o); });
    EXPECT_EQ(err,
              in + ": paths through shared references would be more than 64 MiB long; refusing");
  }
}

}  // namespace
}  // namespace ckpt
