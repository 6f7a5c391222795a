// Bounds on walking an object graph by paths from the root (tensor names, strip's key
// paths are such paths).
//
// Shared references make the number of paths exponential in the pickle's size (billion
// laughs: 60 levels of [x, x] are 2^60 paths in a few hundred bytes). Walks therefore count
// the work they do again inside subtrees some other path walked already: steps, and bytes of
// path built (dict keys can be long strings). First walks cost at most the graph's size.
// Legitimate checkpoints repeat a few thousand steps (tied weights, a config object every
// layer refers to); the bounds stop a hostile pickle in milliseconds.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/error.h"

namespace ckpt::pickle {

class PathBudget {
 public:
  static constexpr uint64_t kMaxSteps = 250'000;
  static constexpr uint64_t kMaxPathBytes = uint64_t{64} << 20;

  // Entering a node; `walked_before` when another path walked it already. Returns what to
  // pass to Leave() on the way out.
  bool Enter(bool walked_before) {
    if (repeating_ || walked_before) Count();
    bool outer = repeating_;
    repeating_ = repeating_ || walked_before;
    return outer;
  }
  void Leave(bool outer) { repeating_ = outer; }
  // A step onto a value that is not entered (a scalar child).
  void Step() {
    if (repeating_) Count();
  }
  // `n` bytes appended to the current path.
  void PathBytes(size_t n) {
    if (repeating_ && (path_bytes_ += n) > kMaxPathBytes) {
      Fail("paths through shared references would be more than {} MiB long; refusing",
           kMaxPathBytes >> 20);
    }
  }

 private:
  void Count() {
    if (++steps_ > kMaxSteps) {
      Fail(
          "object graph has more than {} steps to walk again through shared references; "
          "refusing",
          kMaxSteps);
    }
  }

  bool repeating_ = false;  // inside a subtree some other path walked already
  uint64_t steps_ = 0;
  uint64_t path_bytes_ = 0;
};

}  // namespace ckpt::pickle
