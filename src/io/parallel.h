// Runs fn(i) for i in [0, n) on up to `threads` threads. The first exception stops the
// other workers from taking new items and is rethrown after all have joined. Each item
// starts with CheckInterrupt(); the workers answer to the caller's interrupt flag.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "base/interrupt.h"

namespace ckpt {

// The CPUs this process may run on (its affinity: taskset, a Slurm or cgroup cpuset, an MPI
// rank bound to its cores), else every CPU of the machine.
inline unsigned DefaultThreads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return static_cast<unsigned>(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

template <typename Fn>
void ParallelFor(size_t n, unsigned threads, Fn&& fn) {
  threads = static_cast<unsigned>(std::min<size_t>(std::max(1u, threads), n));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) {
      CheckInterrupt();
      fn(i);
    }
    return;
  }
  const InterruptFlag* flag = CurrentInterruptFlag();
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    InterruptScope scope(flag);
    for (size_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < n;) {
      try {
        CheckInterrupt();
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace ckpt
