// ParallelCrc: the CRC of every range whatever the piece size, threads and order; pieces
// handed out in read order when a range order is given.
#include "io/parallel_crc.h"

#include <gtest/gtest.h>

#include <algorithm>
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

TEST(ParallelCrc, RunsOfSmallRangesAreOneJobEachAndEveryCrcIsRight) {
  // Small ranges of 1 KiB (runs of at most kSmallRun bytes), a large one between them, an
  // empty one, and one not marked small.
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 600; ++i) sizes.push_back(i == 300 ? kSmallRange * 3 : i == 7 ? 0 : 1024);
  std::vector<uint64_t> starts(sizes.size(), 0);
  std::partial_sum(sizes.begin(), sizes.end() - 1, starts.begin() + 1);
  std::string data(starts.back() + sizes.back(), '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + (i >> 9));
  std::vector<bool> small(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) small[i] = sizes[i] < kSmallRange && i != 500;
  auto crc_of = [&](size_t r) { return Crc32(0, test::B(data.substr(starts[r], sizes[r]))); };
  for (unsigned threads : {1u, 3u}) {
    std::mutex mu;
    std::vector<std::pair<size_t, size_t>> runs;
    std::vector<size_t> alone;
    std::vector<uint32_t> crcs = ParallelCrcInRuns(
        sizes, sizes, small, threads,
        [&](size_t r, uint64_t off, uint64_t len) {
          std::lock_guard<std::mutex> lock(mu);
          if (off == 0) alone.push_back(r);
          return Crc32(0, test::B(data.substr(starts[r] + off, len)));
        },
        [&](size_t first, size_t end, uint32_t* out) {
          for (size_t r = first; r < end; ++r) out[r] = crc_of(r);
          std::lock_guard<std::mutex> lock(mu);
          runs.emplace_back(first, end);
        });
    for (size_t r = 0; r < sizes.size(); ++r) EXPECT_EQ(crcs[r], crc_of(r)) << r;
    std::sort(runs.begin(), runs.end());
    std::sort(alone.begin(), alone.end());
    // Every range is handled once: in a run of small ones within kSmallRun, or alone.
    std::vector<int> seen(sizes.size(), 0);
    for (auto [first, end] : runs) {
      uint64_t bytes = 0;
      for (size_t r = first; r < end; ++r) {
        EXPECT_TRUE(small[r]) << r;
        bytes += sizes[r];
        ++seen[r];
      }
      EXPECT_LE(bytes, kSmallRun);
    }
    for (size_t r : alone) ++seen[r];
    for (size_t r = 0; r < sizes.size(); ++r) EXPECT_EQ(seen[r], 1) << r;
    EXPECT_TRUE(std::binary_search(alone.begin(), alone.end(), size_t{300}));
    EXPECT_TRUE(std::binary_search(alone.begin(), alone.end(), size_t{500}));
    EXPECT_LE(runs.size(), 8u);  // ~590 KiB of small ranges: a few runs, not 590 jobs
  }
}

}  // namespace
}  // namespace ckpt
