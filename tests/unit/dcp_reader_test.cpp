// torch.distributed.checkpoint folders from memory: the fuzz seeds (fuzz/make_dcp_seeds.py:
// folders written as torch's FileSystemWriter writes them, by tests/integration/
// dcp_fixtures.py) read whole, then tortured: the metadata truncated at every byte, every
// data file truncated and flipped at many places. Each damaged folder must be refused or
// reported (reader problems or a verify problem); where nothing is reported, every tensor the
// reader gives must be bit for bit the healthy folder's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "base/endian.h"
#include "base/error.h"
#include "dcp/dcp_checkpoint.h"
#include "reports/dcp_report.h"

namespace ckpt::dcp {
namespace {

struct Folder {
  std::string metadata;
  std::map<std::string, std::string> files;
};

Folder Load(const std::string& seed_name) {
  std::filesystem::path p = std::filesystem::path(CKPT_FIXTURES_DIR) / ".." / ".." / "fuzz" /
                            "corpus" / "dcp" / seed_name;
  std::ifstream in(p, std::ios::binary);
  std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Folder f;
  bool first = true;
  for (size_t at = 0; at < seed.size();) {
    size_t n = static_cast<uint8_t>(seed[at++]);
    std::string name = seed.substr(at, n);
    at += n;
    uint32_t len = LoadLE<uint32_t>(reinterpret_cast<const uint8_t*>(seed.data()) + at);
    at += 4;
    (first ? f.metadata : f.files[name]) = seed.substr(at, len);
    first = false;
    at += len;
  }
  return f;
}

Checkpoint Read(const Folder& f) {
  std::map<std::string, Bytes> files;
  for (const auto& [name, bytes] : f.files) files[name] = AsBytes(bytes);
  return ReadDcp(AsBytes(f.metadata), files);
}

// fqn -> the tensor's bytes, as the logical model reads them.
std::map<std::string, std::string> Contents(const Checkpoint& c) {
  std::map<std::string, std::string> out;
  for (const LogicalTensor& t : DcpLogicalModel(c).tensors) {
    std::string& s = out[t.name];
    t.read(0, t.numel,
           [&](Bytes b) { s.append(reinterpret_cast<const char*>(b.data()), b.size()); });
  }
  return out;
}

// The normal build tries every place below; the sanitizer build (-O0, ~100x slower here:
// one seed's flips took 285 s) a quarter of them, spread the same way, for memory errors.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kCuts = 8, kFlips = 12;
#else
constexpr size_t kCuts = 32, kFlips = 48;
#endif

enum class Verdict { kRefused, kReported, kSame };

Verdict Judge(const Folder& damaged, const std::map<std::string, std::string>& healthy) {
  try {
    Checkpoint c = Read(damaged);
    if (!c.problems.empty()) return Verdict::kReported;
    if (!VerifyDcp(c, 1).problems.empty()) return Verdict::kReported;
    EXPECT_EQ(Contents(c), healthy) << "an undetected change altered the tensors";
    return Verdict::kSame;
  } catch (const Error&) {
    return Verdict::kRefused;
  }
}

class DcpSeeds : public ::testing::TestWithParam<const char*> {};

TEST_P(DcpSeeds, HealthyFolderReadsWhole) {
  Folder f = Load(GetParam());
  ASSERT_FALSE(f.files.empty());
  Checkpoint c = Read(f);
  for (const auto& p : c.problems) ADD_FAILURE() << p.where << ": " << p.what;
  ASSERT_FALSE(c.tensors.empty());
  for (const Tensor& t : c.tensors) EXPECT_TRUE(t.complete) << t.fqn;
  // seed-zstd's extra state holds a dataclass and Enums of a project's own module (on no
  // allowlist: their __setstate__ would run); nothing else may be reported.
  for (const auto& p : VerifyDcp(c, 2).problems) {
    if (p.what.find(" ckpt_enums.") == std::string::npos)
      ADD_FAILURE() << p.where << ": " << p.what;
  }
  std::map<std::string, std::string> contents = Contents(c);
  for (const Tensor& t : c.tensors)
    EXPECT_EQ(contents[t.fqn].size(), t.numel * torch::ElementSize(t.dtype)) << t.fqn;
}

TEST_P(DcpSeeds, EveryMetadataTruncationIsRefused) {
  Folder f = Load(GetParam());
  for (size_t n = 0; n < f.metadata.size(); ++n) {
    Folder d = f;
    d.metadata.resize(n);
    EXPECT_THROW(Read(d), Error) << "metadata cut at " << n;
  }
}

TEST_P(DcpSeeds, TruncatedDataFilesAreReported) {
  Folder f = Load(GetParam());
  std::map<std::string, std::string> healthy = Contents(Read(f));
  for (const auto& [name, bytes] : f.files) {
    for (size_t k = 0; k < kCuts; ++k) {
      size_t n = bytes.size() * k / kCuts;
      Folder d = f;
      d.files[name].resize(n);
      EXPECT_NE(Judge(d, healthy), Verdict::kSame) << name << " cut at " << n;
    }
  }
}

TEST_P(DcpSeeds, FlippedBytesAreReportedOrChangeNothing) {
  Folder f = Load(GetParam());
  Checkpoint c = Read(f);
  std::map<std::string, std::string> healthy = Contents(c);
  // Tensor data ranges of untransformed items, per file: a flip there must be reported (CRC).
  std::map<std::string, std::vector<std::pair<size_t, size_t>>> data;
  for (const Tensor& t : c.tensors) {
    for (const Chunk& ch : t.chunks) {
      const Item& item = c.items[static_cast<size_t>(ch.item)];
      const StorageEntry& s = c.meta.storage[item.entry];
      if (!s.transforms.empty()) continue;
      uint64_t n = 1;
      for (int64_t d : ch.meta.sizes) n *= static_cast<uint64_t>(d);
      data[s.path].emplace_back(s.offset + item.data,
                                s.offset + item.data + n * torch::ElementSize(t.dtype));
    }
  }
  size_t in_data = 0;
  for (const auto& [name, bytes] : f.files) {
    for (size_t k = 0; k < kFlips; ++k) {
      size_t at = bytes.size() * k / kFlips + k % 7;
      if (at >= bytes.size()) continue;
      Folder d = f;
      d.files[name][at] = static_cast<char>(d.files[name][at] ^ 0x10);
      Verdict v = Judge(d, healthy);  // an unnoticed flip must leave the tensors as they were
      bool tensor_data = false;
      for (const auto& [lo, hi] : data[name]) tensor_data = tensor_data || (at >= lo && at < hi);
      if (tensor_data) {
        ++in_data;
        EXPECT_EQ(v, Verdict::kReported) << name << " byte " << at << " (tensor data)";
      }
    }
  }
  if (std::string(GetParam()) != "seed-zstd") {
    EXPECT_GT(in_data, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, DcpSeeds,
                         ::testing::Values("seed-uneven_fp32", "seed-zstd", "seed-legacy_shard_113",
                                           "seed-megatron"));

}  // namespace
}  // namespace ckpt::dcp
