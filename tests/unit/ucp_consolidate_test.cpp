// DeepSpeed universal checkpoints read as a model from files given in memory: the fuzz seeds
// (fuzz/make_ucp_seeds.py: universal checkpoints `ckptool reshard` made of small ZeRO
// checkpoints, and of the real DeepSpeed runs), each consolidated, then every truncation of a
// parameter's fp32.pt refused.
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

struct Seed {
  int stage = 0;
  std::vector<std::string> models, params;  // file bytes
};

Seed Parse(const std::string& bytes) {
  Seed s;
  s.stage = bytes.at(0);
  for (size_t at = 1; at + 5 <= bytes.size();) {
    uint32_t len = LoadLE<uint32_t>(reinterpret_cast<const uint8_t*>(bytes.data()) + at + 1);
    (bytes[at] == 0 ? s.models : s.params).push_back(bytes.substr(at + 5, len));
    at += 5 + len;
  }
  return s;
}

ZeroCheckpoint Build(const Seed& s) {
  ZeroCheckpoint z;
  z.folder = "test";
  z.universal = true;
  z.stage = s.stage;
  auto add = [&z](const std::string& bytes) {
    auto f = std::make_unique<CheckpointFile>();
    f->path = "file";
    f->torch = torch::ReadTorchZip(test::B(bytes));
    z.files.push_back(std::move(f));
    return z.files.size() - 1;
  };
  for (const std::string& m : s.models) add(m);
  z.model_files = z.files.size();
  size_t next = 0;
  ConsolidateUniversal(z, [&](const std::string&) {
    if (next >= s.params.size()) Fail("no fp32.pt left");
    return add(s.params[next++]);
  });
  return z;
}

TEST(UcpConsolidate, SeedsConsolidateToTheirModel) {
  size_t seen = 0;
  for (const auto& [name, bytes] : test::FuzzSeeds("ucp")) {
    ++seen;
    Seed s = Parse(bytes);
    ZeroCheckpoint z = Build(s);
    std::set<std::string> names;
    size_t trainable = 0;
    for (const ZeroTensor& t : z.tensors) {
      names.insert(t.name);
      uint64_t count = 0;
      for (const Piece& p : t.pieces) count += p.count;
      EXPECT_EQ(count, t.numel) << name << " " << t.name;
      if (t.kind == ZeroTensor::Kind::kTrainable) {
        ++trainable;
        EXPECT_EQ(t.dtype, torch::DType::kFloat32);
        ASSERT_EQ(t.pieces.size(), t.numel ? 1u : 0u) << name << " " << t.name;
        if (t.numel) {
          EXPECT_GE(t.pieces[0].file, z.model_files) << name << " " << t.name;
        }
      }
    }
    EXPECT_EQ(trainable, s.params.size()) << name;
    const bool real = !name.starts_with("seed-stage");  // the real runs: parameters, buffers
    std::vector<std::string> expected = {"w", "b", "s", "x"};
    if (real) expected = {"emb.weight", "l1.weight", "l2.bias", "count"};
    for (const std::string& p : expected) {
      EXPECT_TRUE(names.count(p)) << name << " " << p;
    }
    if (real) {
      EXPECT_EQ(z.world_size, 2) << name;
    }
  }
  EXPECT_EQ(seen, 7u);
}

TEST(UcpConsolidate, TruncatedParameterFilesAreRefused) {
  Seed s = Parse(test::ReadBytes(test::FuzzCorpus("ucp") / "seed-real-s2-bf16-align"));
  ASSERT_GE(s.params.size(), 2u);
  std::string& victim = s.params[1];
  const std::string whole = victim;
  for (size_t len = 0; len < whole.size(); len += 61) {
    victim = whole.substr(0, len);
    EXPECT_THROW(Build(s), Error) << len;
  }
  victim = whole;
  EXPECT_NO_THROW(Build(s));
  s.params.pop_back();  // a parameter without its fp32.pt
  EXPECT_THROW(Build(s), Error);
}

}  // namespace
}  // namespace ckpt::deepspeed
