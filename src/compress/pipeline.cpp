#include "compress/pipeline.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "base/interrupt.h"

namespace ckpt::ckz {

void OrderedPipeline(size_t items, unsigned threads, size_t window,
                     const std::function<void(size_t, unsigned, size_t)>& work,
                     const std::function<void(size_t, size_t)>& emit) {
  if (items == 0) return;
  threads = static_cast<unsigned>(std::clamp<size_t>(threads, 1, items));
  window = std::max<size_t>(window, threads);
  std::mutex mu;
  std::condition_variable cv;
  size_t next_start = 0, next_emit = 0;
  bool emitting = false, failed = false;
  std::vector<char> done(window, 0);
  std::exception_ptr error;
  const InterruptFlag* flag = CurrentInterruptFlag();
  auto worker = [&](unsigned id) {
    InterruptScope scope(flag);
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock,
              [&] { return failed || next_start >= items || next_start < next_emit + window; });
      if (failed || next_start >= items) break;
      size_t i = next_start++;
      lock.unlock();
      try {
        CheckInterrupt();
        work(i, id, i % window);
      } catch (...) {
        lock.lock();
        if (!error) error = std::current_exception();
        failed = true;
        cv.notify_all();
        break;
      }
      lock.lock();
      done[i % window] = 1;
      // One worker at a time emits, in order, everything that is ready.
      if (emitting) continue;
      emitting = true;
      while (!failed && next_emit < items && done[next_emit % window]) {
        size_t e = next_emit;
        lock.unlock();
        try {
          emit(e, e % window);
        } catch (...) {
          lock.lock();
          if (!error) error = std::current_exception();
          failed = true;
          break;
        }
        lock.lock();
        done[e % window] = 0;
        ++next_emit;
        cv.notify_all();
      }
      emitting = false;
      cv.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace ckpt::ckz

namespace ckpt::ckz {

void ParallelWorkers(size_t items, unsigned threads,
                     const std::function<void(size_t, unsigned)>& fn) {
  if (items == 0) return;
  threads = static_cast<unsigned>(std::clamp<size_t>(threads, 1, items));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  const InterruptFlag* flag = CurrentInterruptFlag();
  auto worker = [&](unsigned id) {
    InterruptScope scope(flag);
    for (size_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < items;) {
      try {
        CheckInterrupt();
        fn(i, id);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace ckpt::ckz
