// Stopping a job that runs inside another program (the Python package) part way through.
//
// The command line needs none of this: a signal ends the process and its handlers remove
// every temp file (io/temp_files.h). A job run in-process answers to an InterruptFlag
// instead: the loops that take time (each item of a parallel loop, each chunk written, read
// or converted) call CheckInterrupt(), which throws Interrupted once the flag is raised; the
// stack unwinds as for an error, so every temp output is removed and nothing is put in place.
#pragma once

#include <atomic>

namespace ckpt {

// Thrown by CheckInterrupt(). Deliberately not a std::exception: code that reports an error
// per file and goes on (catch (const std::exception&)) lets it through, so it ends the job.
struct Interrupted {};

class InterruptFlag {
 public:
  void Raise() { raised_.store(true, std::memory_order_relaxed); }
  bool raised() const { return raised_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> raised_{false};
};

namespace interrupt_detail {
extern thread_local const InterruptFlag* t_flag;
}  // namespace interrupt_detail

// The flag the calling thread's work answers to, or null.
inline const InterruptFlag* CurrentInterruptFlag() {
  return interrupt_detail::t_flag;
}

// Throws Interrupted if the calling thread's flag is raised.
inline void CheckInterrupt() {
  const InterruptFlag* f = interrupt_detail::t_flag;
  if (f && f->raised()) throw Interrupted{};
}

// Makes `flag` the calling thread's until destroyed. A loop that starts threads gives each
// the flag of the thread that started it.
class InterruptScope {
 public:
  explicit InterruptScope(const InterruptFlag* flag) : saved_(interrupt_detail::t_flag) {
    interrupt_detail::t_flag = flag;
  }
  ~InterruptScope() { interrupt_detail::t_flag = saved_; }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  const InterruptFlag* saved_;
};

}  // namespace ckpt
