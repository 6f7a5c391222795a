// The pieces of MPI support that need no MPI: the byte-balanced partitioner, launch
// detection, and the round trip of every per-file result through the CBOR ranks send.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cluster/launch.h"
#include "cluster/partition.h"
#include "jobs/result_json.h"

namespace ckpt::cluster {
namespace {

std::vector<uint64_t> Loads(const std::vector<uint64_t>& bytes, const std::vector<int>& owner,
                            int ranks) {
  std::vector<uint64_t> loads(static_cast<size_t>(ranks));
  for (size_t i = 0; i < bytes.size(); ++i) loads[static_cast<size_t>(owner[i])] += bytes[i];
  return loads;
}

TEST(PartitionTest, LargestFirstToLeastLoadedTiesByIndexAndRank) {
  std::vector<uint64_t> bytes = {40, 100, 10, 60, 50, 30};
  std::vector<int> owner = PartitionByBytes(bytes, 3);
  // Largest first: 100 (item 1) -> r0, 60 (3) -> r1, 50 (4) -> r2, 40 (0) -> r2 (51 is the
  // least load), 30 (5) -> r1 (61); 10 (2): r1 and r2 both hold 92 (bytes + 1 per item),
  // the lower rank takes it.
  EXPECT_EQ(owner, (std::vector<int>{2, 0, 1, 1, 2, 1}));
  EXPECT_EQ(Loads(bytes, owner, 3), (std::vector<uint64_t>{100, 100, 90}));
}

TEST(PartitionTest, EqualSizesGoRoundRobinInIndexOrder) {
  std::vector<uint64_t> bytes(8, 7);
  EXPECT_EQ(PartitionByBytes(bytes, 4), (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
  std::vector<uint64_t> empty(5, 0);  // empty files spread too (each counts one byte)
  EXPECT_EQ(PartitionByBytes(empty, 2), (std::vector<int>{0, 1, 0, 1, 0}));
}

TEST(PartitionTest, OneRankFewItemsAndNoItems) {
  EXPECT_EQ(PartitionByBytes({5, 1, 9}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(PartitionByBytes({5, 9}, 4), (std::vector<int>{1, 0}));  // 9 first -> rank 0
  EXPECT_TRUE(PartitionByBytes({}, 3).empty());
  EXPECT_EQ(PartitionByBytes({3}, 0), (std::vector<int>{0}));  // no ranks reads as one
  EXPECT_EQ(ItemsOf({1, 0, 1, 2}, 1), (std::vector<size_t>{0, 2}));
  EXPECT_TRUE(ItemsOf({1, 0}, 5).empty());
}

TEST(PartitionTest, DeterministicAndWithinLptBound) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 200; ++round) {
    int ranks = 1 + static_cast<int>(rng() % 16);
    std::vector<uint64_t> bytes(rng() % 60);
    for (uint64_t& b : bytes) b = rng() % (uint64_t{1} << (rng() % 40));
    std::vector<int> owner = PartitionByBytes(bytes, ranks);
    EXPECT_EQ(owner, PartitionByBytes(bytes, ranks));  // the same on every rank
    ASSERT_EQ(owner.size(), bytes.size());
    for (int r : owner) ASSERT_TRUE(r >= 0 && r < ranks);
    std::vector<uint64_t> loads = Loads(bytes, owner, ranks);
    uint64_t total = std::accumulate(bytes.begin(), bytes.end(), uint64_t{0});
    uint64_t largest = bytes.empty() ? 0 : *std::max_element(bytes.begin(), bytes.end());
    // Greedy largest-first: the fullest rank holds at most the mean plus one item (plus the
    // one byte each item counts).
    uint64_t bound = total / static_cast<uint64_t>(ranks) + largest + bytes.size();
    EXPECT_LE(*std::max_element(loads.begin(), loads.end()), bound);
  }
}

Launch Detect(const std::map<std::string, std::string>& env) {
  return DetectLaunch([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchTest, PlainRunIsAlone) {
  Launch l = Detect({});
  EXPECT_FALSE(l.wired);
  EXPECT_EQ(l.declared, 1);
  EXPECT_EQ(Decide(l, true), Role::kAlone);
  EXPECT_EQ(Decide(l, false), Role::kAlone);
}

TEST(LaunchTest, MpirunStartsMpiOrIsRefusedWithoutIt) {
  Launch l = Detect({{"OMPI_COMM_WORLD_SIZE", "4"}, {"PMIX_RANK", "2"}});
  EXPECT_TRUE(l.wired);
  EXPECT_EQ(l.declared, 4);
  EXPECT_EQ(l.variable, "OMPI_COMM_WORLD_SIZE=4");
  EXPECT_EQ(Decide(l, true), Role::kMpi);
  EXPECT_EQ(Decide(l, false), Role::kRefuse);
  EXPECT_NE(RefusalMessage(l, false).find("built without MPI"), std::string::npos);
  // mpirun -np 1: one process, with or without MPI built in.
  EXPECT_EQ(Decide(Detect({{"OMPI_COMM_WORLD_SIZE", "1"}}), false), Role::kAlone);
}

TEST(LaunchTest, TasksWithoutWiringAreRefusedEvenWithMpi) {
  for (auto env : std::vector<std::map<std::string, std::string>>{
           {{"WORLD_SIZE", "8"}},
           {{"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_STEP_ID", "0"}},
           {{"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "3"}},
           {{"SLURM_NTASKS", "4"}, {"SLURM_STEPID", "3"}}}) {
    Launch l = Detect(env);
    EXPECT_FALSE(l.wired);
    EXPECT_GT(l.declared, 1);
    EXPECT_EQ(Decide(l, true), Role::kRefuse) << l.variable;
    EXPECT_EQ(Decide(l, false), Role::kRefuse) << l.variable;
    EXPECT_NE(RefusalMessage(l, true).find(l.variable), std::string::npos);
  }
}

TEST(LaunchTest, BatchScriptOverrideAndNonsense) {
  // An sbatch script is one process although SLURM_NTASKS counts the whole allocation.
  EXPECT_EQ(Decide(Detect({{"SLURM_NTASKS", "32"}, {"SLURM_PROCID", "0"}}), false), Role::kAlone);
  Launch forced = Detect({{"WORLD_SIZE", "8"}, {"CKPTOOL_ONE_PROCESS", "1"}});
  EXPECT_TRUE(forced.forced_single);
  EXPECT_EQ(Decide(forced, false), Role::kAlone);
  EXPECT_EQ(Decide(forced, true), Role::kAlone);
  for (const char* bad : {"", "0", "-3", "4x", "x"})
    EXPECT_EQ(Detect({{"WORLD_SIZE", bad}}).declared, 1) << bad;
  // PMI-1/2 (srun --mpi=pmi2, MPICH's hydra) is wiring too; MPI then checks the world size.
  Launch pmi = Detect({{"PMI_SIZE", "3"}, {"PMI_RANK", "0"}});
  EXPECT_EQ(Decide(pmi, true), Role::kMpi);
  EXPECT_NE(RefusalMessage(pmi, true, 1).find("world of 1"), std::string::npos);
}

}  // namespace
}  // namespace ckpt::cluster

namespace ckpt {
namespace {

template <typename T>
T RoundTrip(const T& value) {
  std::string bytes = ToCbor(nlohmann::json(value));
  return FromCbor(bytes).get<T>();
}

// Not UTF-8: paths and messages are bytes, and must arrive as they left.
const std::string kOdd = std::string("dir/\xff\xfe-caf\xc3\xa9\x00-x.pt", 18);

TEST(ResultJsonTest, ShrinkAndStripRoundTrip) {
  ShrinkResult s{kOdd, kOdd + ".out", UINT64_MAX, 12345678901234ull, true, "note \x80"};
  ShrinkResult s2 = RoundTrip(s);
  EXPECT_EQ(s2.path, s.path);
  EXPECT_EQ(s2.output, s.output);
  EXPECT_EQ(s2.before, s.before);
  EXPECT_EQ(s2.after, s.after);
  EXPECT_EQ(s2.rewritten, s.rewritten);
  EXPECT_EQ(s2.note, s.note);

  StripResult t;
  t.path = kOdd;
  t.output = "o";
  t.before = 9;
  t.after = 3;
  t.dropped = {{"optimizer.state", 6}, {kOdd, 0}};
  t.note = "";
  StripResult t2 = RoundTrip(t);
  EXPECT_EQ(t2.path, t.path);
  ASSERT_EQ(t2.dropped.size(), 2u);
  EXPECT_EQ(t2.dropped[1].path, kOdd);
  EXPECT_EQ(t2.dropped[0].bytes, 6u);
  EXPECT_EQ(t2.before, 9u);
  EXPECT_FALSE(t2.rewritten);
}

TEST(ResultJsonTest, ConvertCompressDecompressVerifyRoundTrip) {
  ConvertResult c;
  c.path = kOdd;
  c.output = "b.pt";
  c.before = 10;
  c.after = 5;
  c.storage_bytes = 4;
  c.converted = 3;
  c.kept_float32 = 2;
  c.kept_training = 1;
  c.kept = {"optimizer.state.0.step: it holds whole numbers", kOdd};
  c.lost_precision = {kOdd};
  c.warnings = {"w1", kOdd};
  ConvertResult c2 = RoundTrip(c);
  EXPECT_EQ(c2.warnings, c.warnings);
  EXPECT_EQ(c2.kept, c.kept);
  EXPECT_EQ(c2.lost_precision, c.lost_precision);
  EXPECT_EQ(c2.kept_training, 1u);
  EXPECT_EQ(c2.storage_bytes, 4u);
  EXPECT_EQ(c2.converted, 3u);
  EXPECT_EQ(c2.kept_float32, 2u);

  CompressResult z;
  z.input = kOdd;
  z.output = "-";
  z.before = 1ull << 40;
  z.after = 7;
  z.files = 3;
  z.chunks = 4;
  z.tensors = 5;
  z.whole_chunks = 6;
  for (int i = 0; i < ckz::kTransforms; ++i) z.by_transform[i] = {uint64_t(i) * 11, uint64_t(i)};
  z.warnings = {"skipped a socket"};
  z.removed = true;
  CompressResult z2 = RoundTrip(z);
  EXPECT_EQ(z2.input, z.input);
  EXPECT_EQ(z2.before, z.before);
  EXPECT_EQ(z2.whole_chunks, 6u);
  EXPECT_EQ(z2.by_transform[ckz::kTransforms - 1].original,
            z.by_transform[ckz::kTransforms - 1].original);
  EXPECT_EQ(z2.warnings, z.warnings);
  EXPECT_TRUE(z2.removed);

  DecompressResult d{kOdd, "x", 1, 2, 3, true};
  DecompressResult d2 = RoundTrip(d);
  EXPECT_EQ(d2.input, kOdd);
  EXPECT_EQ(d2.restored_bytes, 2u);
  EXPECT_TRUE(d2.removed);

  VerifyOutcome v{{{"data/0", "CRC mismatch"}, {kOdd, "\xc0"}}, "", {"note"}};
  VerifyOutcome v2 = RoundTrip(v);
  ASSERT_EQ(v2.problems.size(), 2u);
  EXPECT_EQ(v2.problems[1].where, kOdd);
  EXPECT_EQ(v2.problems[1].what, "\xc0");
  EXPECT_EQ(v2.notes, v.notes);
}

TEST(ResultJsonTest, MissingFieldsAreRefused) {
  EXPECT_ANY_THROW(FromCbor(ToCbor(nlohmann::json{{"path", "x"}})).get<ShrinkResult>());
  EXPECT_ANY_THROW(FromCbor(std::string("\xff\x01", 2)));
}

}  // namespace
}  // namespace ckpt
