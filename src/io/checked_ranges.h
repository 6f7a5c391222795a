// Which ranges of a parallel write were read back as they were written.
//
// A writer cuts its ranges into pieces written on several threads (parallel_crc.h) and runs
// each piece inside an AtomicOutput::CheckedWrites scope: a range whose every piece passed
// its checks needs no re-read when the finished file is verified; the rest (bytes the kernel
// copied, or that a Staged run collected) does.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "io/atomic_output.h"

namespace ckpt {

class CheckedRanges {
 public:
  explicit CheckedRanges(size_t ranges) : state_(new std::atomic<uint8_t>[ranges]()) {}

  // Runs fn(), which writes a piece of range i to `out`, with its writes checked, and keeps
  // the verdict. Returns what fn returns.
  template <typename Fn>
  auto Write(AtomicOutput& out, size_t i, Fn&& fn) {
    AtomicOutput::CheckedWrites scope(out);
    auto result = fn();
    if (!scope.all_checked()) {
      state_[i] = kUnchecked;
    } else {
      uint8_t none = kNone;
      state_[i].compare_exchange_strong(none, kChecked);
    }
    return result;
  }

  // Every piece of range i written so far went through Write and was checked (and there was
  // at least one).
  bool checked(size_t i) const { return state_[i] == kChecked; }

 private:
  static constexpr uint8_t kNone = 0, kChecked = 1, kUnchecked = 2;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
};

}  // namespace ckpt
