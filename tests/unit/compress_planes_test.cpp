// The byte-plane transform and the chunk coder: exact round trips for every dtype, every
// bit pattern class and odd sizes; the planes hold what format.h says they hold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/endian.h"
#include "compress/chunk_coder.h"
#include "compress/format.h"
#include "compress/planes.h"
#include "test_util.h"

namespace ckpt::ckz {
namespace {

using Transform = ckz::Transform;

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Realistic weights: normal(0, 0.02) as f32, with its bf16/f16 roundings (truncation is
// enough for statistics) and a few special values.
std::vector<uint8_t> Weights(Transform t, size_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint8_t> out(elements * ElementBytes(t));
  for (size_t i = 0; i < elements; ++i) {
    float f = normal(rng);
    if (i % 997 == 5) f = std::numeric_limits<float>::quiet_NaN();
    if (i % 991 == 7) f = -0.0f;
    if (i % 983 == 11) f = std::numeric_limits<float>::infinity();
    if (i % 977 == 13) f = 1e-40f;  // subnormal
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    switch (t) {
      case Transform::kF32:
        StoreLE<uint32_t>(&out[4 * i], bits);
        break;
      case Transform::kBF16:
        StoreLE<uint16_t>(&out[2 * i], static_cast<uint16_t>(bits >> 16));
        break;
      case Transform::kF16:
        StoreLE<uint16_t>(&out[2 * i],
                          static_cast<uint16_t>(((bits >> 16) & 0x8000) | ((bits >> 13) & 0x7fff)));
        break;
      case Transform::kF64: {
        double d = f;
        uint64_t b64;
        std::memcpy(&b64, &d, 8);
        StoreLE<uint64_t>(&out[8 * i], b64);
        break;
      }
      case Transform::kBytes:
        out[i] = static_cast<uint8_t>(bits);
        break;
    }
  }
  return out;
}

void RoundTrip(const std::vector<uint8_t>& data, const std::vector<ckz::Run>& runs) {
  std::vector<uint8_t> planes(data.size() + 1, 0xAB), back(data.size() + 1, 0xCD);
  SplitPlanes(Bytes(data.data(), data.size()), runs, planes.data());
  EXPECT_EQ(planes[data.size()], 0xAB) << "wrote past the planes";
  JoinPlanes(planes.data(), runs, back.data());
  EXPECT_EQ(back[data.size()], 0xCD) << "wrote past the chunk";
  back.resize(data.size());
  EXPECT_EQ(back, data);
}

TEST(CompressPlanesTest, EveryTransformRoundTripsRandomBitsAtOddSizes) {
  for (int t = 0; t < kTransforms; ++t) {
    Transform tr = static_cast<Transform>(t);
    for (size_t n : {0ul, 1ul, 2ul, 3ul, 7ul, 17ul, 255ul, 4097ul, 65537ul}) {
      SCOPED_TRACE(std::string(TransformName(tr)) + " x " + std::to_string(n));
      std::vector<uint8_t> data = RandomBytes(n * ElementBytes(tr), static_cast<uint32_t>(n + t));
      std::vector<ckz::Run> runs;
      if (n) runs.push_back({static_cast<uint32_t>(data.size()), tr});
      RoundTrip(data, runs);
    }
  }
}

TEST(CompressPlanesTest, EveryBitPatternOfSixteenBitTypes) {
  std::vector<uint8_t> all(2 * 65536);
  for (uint32_t v = 0; v < 65536; ++v) StoreLE<uint16_t>(&all[2 * v], static_cast<uint16_t>(v));
  RoundTrip(all, {{static_cast<uint32_t>(all.size()), Transform::kBF16}});
  RoundTrip(all, {{static_cast<uint32_t>(all.size()), Transform::kF16}});
}

TEST(CompressPlanesTest, MixedRunsOfEveryTransform) {
  std::vector<uint8_t> data;
  std::vector<ckz::Run> runs;
  std::mt19937 rng(7);
  for (int i = 0; i < 60; ++i) {
    Transform t = static_cast<Transform>(rng() % kTransforms);
    uint32_t elems = 1 + rng() % 37;
    std::vector<uint8_t> part = RandomBytes(elems * ElementBytes(t), rng());
    data.insert(data.end(), part.begin(), part.end());
    if (!runs.empty() && runs.back().transform == t) {
      runs.back().length += static_cast<uint32_t>(part.size());
    } else {
      runs.push_back({static_cast<uint32_t>(part.size()), t});
    }
  }
  RoundTrip(data, runs);
}

TEST(CompressPlanesTest, BF16ExponentPlaneHoldsTheExponentAndSignSitsWithTheMantissa) {
  // -1.5 in bf16: sign 1, exponent 127, mantissa 0b1000000.
  std::vector<uint8_t> data(2);
  StoreLE<uint16_t>(data.data(), 0xBFC0);
  std::vector<uint8_t> planes(2);
  SplitPlanes(Bytes(data.data(), 2), {{2, Transform::kBF16}}, planes.data());
  EXPECT_EQ(planes[0], 127);
  EXPECT_EQ(planes[1], 0x80 | 0x40);
  // f32 -1.5: exponent 127, sign + top 7 mantissa bits, then the other two mantissa bytes.
  std::vector<uint8_t> f(4);
  StoreLE<uint32_t>(f.data(), 0xBFC01234);
  std::vector<uint8_t> p4(4);
  SplitPlanes(Bytes(f.data(), 4), {{4, Transform::kF32}}, p4.data());
  EXPECT_EQ(p4, (std::vector<uint8_t>{127, 0xC0, 0x12, 0x34}));
}

TEST(CompressPlanesTest, RunsOfATypedChunkFollowTheRanges) {
  std::vector<TypedRange> ranges = {{100, 400, Transform::kF32}, {600, 64, Transform::kBF16}};
  std::vector<ckz::Run> runs = RunsOf(ranges, 0, 1000);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(runs[0].length, 100u);
  EXPECT_EQ(runs[0].transform, Transform::kBytes);
  EXPECT_EQ(runs[1].length, 400u);
  EXPECT_EQ(runs[1].transform, Transform::kF32);
  EXPECT_EQ(runs[2].length, 100u);
  EXPECT_EQ(runs[3].transform, Transform::kBF16);
  EXPECT_EQ(runs[4].length, 336u);
  // A chunk inside a range, and one that would cut an element.
  EXPECT_EQ(RunsOf(ranges, 104, 40).size(), 1u);
  EXPECT_NE(test::ErrorOf([&] { RunsOf(ranges, 102, 40); }), "");
  EXPECT_NE(test::ErrorOf([&] { RunsOf(ranges, 100, 41); }), "");
}

class ChunkCoderTest : public ::testing::TestWithParam<Level> {};

void CoderRoundTrip(ChunkCoder& coder, const std::vector<uint8_t>& data,
                    const std::vector<ckz::Run>& runs, Chunk* out_chunk = nullptr) {
  Chunk chunk;
  std::string stored;
  coder.Encode(Bytes(data.data(), data.size()), runs, chunk, stored);
  EXPECT_EQ(chunk.length, data.size());
  EXPECT_EQ(chunk.stored_bytes(), stored.size());
  std::vector<uint8_t> back(data.size());
  std::vector<ckz::Run> decode_runs = chunk.coding == Coding::kWhole
                                          ? std::vector<ckz::Run>{{chunk.length, Transform::kBytes}}
                                          : runs;
  coder.Decode(test::B(stored), chunk, decode_runs, back.data());
  EXPECT_EQ(back, data);
  if (out_chunk) *out_chunk = chunk;
}

TEST_P(ChunkCoderTest, WeightsOfEveryDtypeRoundTripAndShrink) {
  ChunkCoder coder(GetParam());
  for (Transform t : {Transform::kBF16, Transform::kF32, Transform::kF16, Transform::kF64}) {
    for (size_t n : {1ul, 3ul, 31ul, 1000ul, 65536ul + 3}) {
      SCOPED_TRACE(std::string(TransformName(t)) + " x " + std::to_string(n));
      std::vector<uint8_t> data = Weights(t, n, static_cast<uint32_t>(n));
      Chunk chunk;
      CoderRoundTrip(coder, data, {{static_cast<uint32_t>(data.size()), t}}, &chunk);
      if (n >= 1000) {
        EXPECT_LT(chunk.stored_bytes(), data.size() * 0.95) << "exponents should shrink";
      }
    }
  }
}

TEST_P(ChunkCoderTest, IncompressibleZeroAndRepeatedDataRoundTripWithinBounds) {
  ChunkCoder coder(GetParam());
  std::vector<uint8_t> random = RandomBytes(1 << 18, 3);
  Chunk chunk;
  CoderRoundTrip(coder, random, {{static_cast<uint32_t>(random.size()), Transform::kF32}}, &chunk);
  EXPECT_LE(chunk.stored_bytes(), random.size() + 64) << "raw planes, never bigger";
  std::vector<uint8_t> zeros(1 << 18, 0);
  CoderRoundTrip(coder, zeros, {{static_cast<uint32_t>(zeros.size()), Transform::kBF16}}, &chunk);
  EXPECT_LT(chunk.stored_bytes(), 1024u);
  // A tensor of repeated rows: LZ structure the planes cannot see; plain zstd must win.
  std::vector<uint8_t> row = Weights(Transform::kF32, 1024, 9), rows;
  for (int i = 0; i < 64; ++i) rows.insert(rows.end(), row.begin(), row.end());
  CoderRoundTrip(coder, rows, {{static_cast<uint32_t>(rows.size()), Transform::kF32}}, &chunk);
  EXPECT_EQ(chunk.coding, Coding::kWhole);
  EXPECT_LT(chunk.stored_bytes(), rows.size() / 20);
}

TEST_P(ChunkCoderTest, DamagedChunksAreRefused) {
  ChunkCoder coder(GetParam());
  std::vector<uint8_t> data = Weights(Transform::kBF16, 50000, 1);
  std::vector<ckz::Run> runs = {{static_cast<uint32_t>(data.size()), Transform::kBF16}};
  Chunk chunk;
  std::string stored;
  coder.Encode(Bytes(data.data(), data.size()), runs, chunk, stored);
  std::vector<uint8_t> back(data.size());
  size_t refused = 0, same = 0;
  for (size_t i = 0; i < stored.size(); i += 7) {
    std::string bad = stored;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    std::string err = test::ErrorOf([&] { coder.Decode(test::B(bad), chunk, runs, back.data()); });
    if (err.empty()) {
      EXPECT_EQ(back, data) << "a flip at " << i << " decoded to other bytes unnoticed";
      ++same;
    } else {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0u);
  for (size_t n = 0; n < stored.size(); n += 13) {
    EXPECT_NE(test::ErrorOf(
                  [&] { coder.Decode(test::B(stored.substr(0, n)), chunk, runs, back.data()); }),
              "")
        << "truncated to " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, ChunkCoderTest, ::testing::Values(Level::kFast, Level::kMax),
                         [](const auto& param_info) {
                           return std::string(param_info.param == Level::kFast ? "Fast" : "Max");
                         });

TEST(CompressLayoutTest, PathSafety) {
  EXPECT_TRUE(IsSafeRelativePath(""));
  EXPECT_TRUE(IsSafeRelativePath("a/b.json"));
  EXPECT_TRUE(IsSafeRelativePath("..a/b.."));
  for (const char* bad : {"/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a/", ".", ".."})
    EXPECT_FALSE(IsSafeRelativePath(bad)) << bad;
  EXPECT_FALSE(IsSafeRelativePath(std::string("a\0b", 3)));
}

}  // namespace
}  // namespace ckpt::ckz
