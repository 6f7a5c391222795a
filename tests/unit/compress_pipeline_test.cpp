// The ordered pipeline: items run concurrently, results are emitted strictly in order with at
// most `window` in flight, and the first error stops everything and is rethrown.
#include "compress/pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/error.h"

namespace ckpt::ckz {
namespace {

using namespace std::chrono_literals;

TEST(CompressPipelineTest, WorkRunsConcurrentlyAndIsEmittedInOrder) {
  std::atomic<int> running{0}, most{0};
  std::vector<size_t> emitted;
  size_t widest = 0;
  std::atomic<size_t> started{0};
  auto t0 = std::chrono::steady_clock::now();
  OrderedPipeline(
      40, 4, 8,
      [&](size_t i, unsigned worker, size_t slot) {
        EXPECT_LT(worker, 4u);
        EXPECT_EQ(slot, i % 8);
        int now = ++running;
        for (int m = most; now > m && !most.compare_exchange_weak(m, now);) {
        }
        ++started;
        std::this_thread::sleep_for(std::chrono::milliseconds(i % 3 == 0 ? 30 : 5));
        --running;
      },
      [&](size_t i, size_t) {
        emitted.push_back(i);
        widest = std::max(widest, started.load() - emitted.size());
      });
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(emitted.size(), 40u);
  for (size_t i = 0; i < emitted.size(); ++i) EXPECT_EQ(emitted[i], i);
  EXPECT_GT(most.load(), 1) << "items never overlapped";
  EXPECT_LE(widest, 8u) << "more than a window of items in flight";
  // 14 items of 30 ms and 26 of 5 ms: 0.55 s one at a time.
  EXPECT_LT(secs, 0.45);
}

TEST(CompressPipelineTest, TheFirstErrorStopsTheRestAndIsRethrown) {
  std::atomic<size_t> done{0};
  std::vector<size_t> emitted;
  EXPECT_THROW(OrderedPipeline(
                   1000, 3, 6,
                   [&](size_t i, unsigned, size_t) {
                     if (i == 17) Fail("item {} failed", i);
                     ++done;
                   },
                   [&](size_t i, size_t) { emitted.push_back(i); }),
               Error);
  EXPECT_LT(done.load(), 100u);
  for (size_t i = 0; i < emitted.size(); ++i) EXPECT_EQ(emitted[i], i);
  EXPECT_LE(emitted.size(), 17u);
}

TEST(CompressPipelineTest, ParallelWorkersCoverEveryItemOnce) {
  std::vector<std::atomic<int>> seen(500);
  ParallelWorkers(500, 3, [&](size_t i, unsigned w) {
    EXPECT_LT(w, 3u);
    ++seen[i];
  });
  for (auto& s : seen) EXPECT_EQ(s.load(), 1);
}

}  // namespace
}  // namespace ckpt::ckz
