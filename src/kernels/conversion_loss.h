// What converting float32 values to bfloat16 or float16 would do to them, measured before
// converting: `convert` keeps a tensor as it is when the conversion would change what it
// holds (counters, tiny optimizer moments, values beyond float16's range), not only round it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/float_convert.h"

namespace ckpt::kernels {

struct ConversionLoss {
  uint64_t values = 0;
  uint64_t nonzero = 0;           // finite non-zero inputs
  uint64_t overflow = 0;          // finite inputs that would become infinity
  uint64_t to_zero = 0;           // non-zero inputs that would become zero
  uint64_t to_subnormal = 0;      // inputs that would become subnormal (lose precision)
  bool all_integers = true;       // every input is a whole number (counters, indices)
  uint64_t integers_changed = 0;  // whole numbers the conversion would change (4097 -> 4096)

  void Add(const ConversionLoss& o);
  // Why the conversion would change what the values mean, or "" when it only rounds them:
  // any value would overflow; more than 1% of the non-zero values would become zero or
  // subnormal; or the values are all whole numbers and some would change.
  std::string Reason(Half to) const;
};

// Scans n float32 values (little-endian bytes, any alignment).
ConversionLoss MeasureLoss(Half to, const uint8_t* src, size_t n);

}  // namespace ckpt::kernels
