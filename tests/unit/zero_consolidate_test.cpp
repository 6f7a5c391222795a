// DeepSpeed ZeRO consolidation from rank files given in memory: the fuzz seeds
// (fuzz/make_zero_seeds.py: small checkpoints laid out as DeepSpeed writes them, by real
// torch.save), each consolidated, then every truncation of one rank file refused or still
// consistent.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "base/endian.h"
#include "base/error.h"
#include "deepspeed/zero_checkpoint.h"
#include "test_util.h"
#include "torch/torch_file.h"

namespace ckpt::deepspeed {
namespace {

// Splits a seed into its files: (is optimizer file, bytes).
std::vector<std::pair<bool, std::string>> Files(const std::string& seed) {
  std::vector<std::pair<bool, std::string>> out;
  for (size_t at = 0; at + 5 <= seed.size();) {
    bool optim = seed[at] % 2;
    uint32_t len = LoadLE<uint32_t>(reinterpret_cast<const uint8_t*>(seed.data()) + at + 1);
    out.emplace_back(optim, seed.substr(at + 5, len));
    at += 5 + len;
  }
  return out;
}

ZeroCheckpoint Build(const std::vector<std::pair<bool, std::string>>& files) {
  ZeroCheckpoint z;
  z.folder = "test";
  for (bool optim : {false, true}) {
    for (const auto& [is_optim, bytes] : files) {
      if (is_optim != optim) continue;
      auto f = std::make_unique<CheckpointFile>();
      f->path = optim ? "optim" : "model";
      f->torch = torch::ReadTorchZip(test::B(bytes));
      z.files.push_back(std::move(f));
    }
    if (!optim) z.model_files = z.files.size();
  }
  Consolidate(z);
  return z;
}

TEST(ZeroConsolidate, SeedsConsolidateToTheirModel) {
  size_t seen = 0;
  for (const auto& [name, bytes] : test::FuzzSeeds("zero")) {
    ++seen;
    ZeroCheckpoint z = Build(Files(bytes));
    int stage = name[10] - '0', ranks = name[17] - '0';
    EXPECT_EQ(z.stage, stage) << name;
    EXPECT_EQ(z.world_size, ranks) << name;
    std::set<std::string> names;
    for (const ZeroTensor& t : z.tensors) {
      names.insert(t.name);
      uint64_t count = 0;
      for (const Piece& p : t.pieces) count += p.count;
      EXPECT_EQ(count, t.numel) << name << " " << t.name;
      if (t.kind == ZeroTensor::Kind::kTrainable) {
        EXPECT_EQ(t.dtype, torch::DType::kFloat32);
      }
    }
    for (const char* p : {"w", "b", "s", "x"}) EXPECT_TRUE(names.count(p)) << name << " " << p;
  }
  EXPECT_EQ(seen, 4u);
}

TEST(ZeroConsolidate, TruncatedRankFilesAreRefused) {
  std::vector<std::pair<bool, std::string>> files =
      Files(test::ReadBytes(test::FuzzCorpus("zero") / "seed-stage3-ranks3"));
  ASSERT_EQ(files.size(), 6u);
  std::string& victim = files.back().second;  // the last optimizer file
  const std::string whole = victim;
  for (size_t len = 0; len < whole.size(); len += 97) {
    victim = whole.substr(0, len);
    EXPECT_THROW(Build(files), Error) << len;
  }
  victim = whole;
  EXPECT_NO_THROW(Build(files));
}

}  // namespace
}  // namespace ckpt::deepspeed
