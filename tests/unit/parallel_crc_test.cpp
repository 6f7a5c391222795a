// ParallelCrc: the CRC of every range whatever the piece size, threads and order; pieces
// handed out in read order when a range order is given.
#include "io/parallel_crc.h"

#include <gtest/gtest.h>

#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "io/crc32.h"
#include "test_util.h"

namespace ckpt {
namespace {

TEST(ParallelCrc, EveryRangeGetsItsCrcInAnyOrderOnAnyThreads) {
  std::string data(1 << 16, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + (i >> 7));
  std::vector<uint64_t> sizes = {1000, 0, 7, 30000, 1, 34528};
  std::vector<uint64_t> starts(sizes.size(), 0);
  std::partial_sum(sizes.begin(), sizes.end() - 1, starts.begin() + 1);
  auto fn = [&](size_t r, uint64_t off, uint64_t len) {
    return Crc32(0, test::B(data.substr(starts[r] + off, len)));
  };
  std::vector<uint64_t> order = {5, 4, 3, 2, 1, 0};
  for (unsigned threads : {1u, 3u}) {
    for (uint64_t piece : {64ull, 4096ull, 1ull << 20}) {
      const std::vector<uint64_t>* orders[] = {nullptr, &order};
      for (const std::vector<uint64_t>* o : orders) {
        std::vector<uint32_t> crcs = ParallelCrc(sizes, threads, piece, fn, o);
        for (size_t r = 0; r < sizes.size(); ++r) {
          EXPECT_EQ(crcs[r], Crc32(0, test::B(data.substr(starts[r], sizes[r])))) << r;
        }
      }
    }
  }
}

TEST(ParallelCrc, ARangeOrderHandsPiecesOutInReadOrder) {
  std::vector<uint64_t> sizes = {100, 300, 50, 200};
  std::vector<uint64_t> order = {2, 0, 3, 1};  // read range 1 first, then 3, 0, 2
  std::vector<std::pair<size_t, uint64_t>> calls;
  std::mutex mu;
  ParallelCrc(
      sizes, 1, 64,
      [&](size_t r, uint64_t off, uint64_t) {
        std::lock_guard<std::mutex> lock(mu);
        calls.emplace_back(r, off);
        return 0u;
      },
      &order);
  std::vector<std::pair<size_t, uint64_t>> expected = {{1, 0},   {1, 64}, {1, 128}, {1, 192},
                                                       {1, 256}, {3, 0},  {3, 64},  {3, 128},
                                                       {3, 192}, {0, 0},  {0, 64},  {2, 0}};
  EXPECT_EQ(calls, expected);
  // Without one, the largest pieces go first.
  calls.clear();
  ParallelCrc(sizes, 1, 64, [&](size_t r, uint64_t off, uint64_t) {
    calls.emplace_back(r, off);
    return 0u;
  });
  ASSERT_EQ(calls.size(), expected.size());
  EXPECT_EQ(calls.back(), std::make_pair(size_t{3}, uint64_t{192}));  // the 8-byte piece
}

}  // namespace
}  // namespace ckpt
