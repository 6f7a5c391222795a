// `--perf`: a timing tree of the phases a command went through (mold's Timer, reduced).
// A PerfTimer measures its scope; nested timers on the same thread form the tree. Times of
// the same phase on several threads (files processed concurrently) add up.
#pragma once

#include <chrono>
#include <cstdio>

namespace ckpt {

class PerfTimer {
 public:
  explicit PerfTimer(const char* name);
  ~PerfTimer();
  PerfTimer(const PerfTimer&) = delete;
  PerfTimer& operator=(const PerfTimer&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
  size_t node_;
};

void EnablePerf();
// Prints the tree (phase, total seconds, count) to `out`; nothing when perf is off.
void PrintPerf(std::FILE* out);

}  // namespace ckpt
