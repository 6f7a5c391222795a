#include "kernels/conversion_loss.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstring>

namespace ckpt::kernels {

void ConversionLoss::Add(const ConversionLoss& o) {
  values += o.values;
  nonzero += o.nonzero;
  overflow += o.overflow;
  to_zero += o.to_zero;
  to_subnormal += o.to_subnormal;
  all_integers = all_integers && o.all_integers;
  integers_changed += o.integers_changed;
}

std::string ConversionLoss::Reason(Half to) const {
  std::string_view name = TorchName(to);
  if (overflow) return fmt::format("{} values would become infinity in {}", overflow, name);
  if (values && all_integers && integers_changed) {
    return fmt::format("it holds whole numbers and {} of them would change in {}", integers_changed,
                       name);
  }
  // More than 1% of the non-zero values: trained weights have a few tiny values that any
  // half-precision copy rounds away; optimizer moments and other small quantities have most.
  uint64_t lost = to_zero + to_subnormal;
  if (nonzero && lost * 100 > nonzero) {
    return fmt::format("{} of its {} non-zero values would become zero or subnormal in {}", lost,
                       nonzero, name);
  }
  return "";
}

namespace {

// Classifies one value after rounding to `to` (exact, via the converters).
void Classify(Half to, uint32_t bits, ConversionLoss& l) {
  float x = std::bit_cast<float>(bits);
  if (!std::isfinite(x)) {
    l.all_integers = false;
    return;
  }
  uint16_t h = to == Half::kBFloat16 ? Float32ToBFloat16(bits) : Float32ToFloat16(bits);
  // Back to float32: exponent and mantissa fields of the 16-bit result.
  float back;
  bool subnormal, zero, inf;
  if (to == Half::kBFloat16) {
    uint32_t e = (h >> 7) & 0xFF, m = h & 0x7F;
    inf = e == 0xFF;
    zero = e == 0 && m == 0;
    subnormal = e == 0 && m != 0;
    back = std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
  } else {
    uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
    inf = e == 0x1F;
    zero = e == 0 && m == 0;
    subnormal = e == 0 && m != 0;
    float mag = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                       : std::ldexp(static_cast<float>(m | 0x400), static_cast<int>(e) - 25);
    back = (h & 0x8000) ? -mag : mag;
  }
  if (x != 0) {
    l.nonzero++;
    if (inf) l.overflow++;
    if (zero) l.to_zero++;
    if (subnormal) l.to_subnormal++;
  }
  if (l.all_integers) {
    if (std::trunc(x) != x) {
      l.all_integers = false;
    } else if (back != x) {
      l.integers_changed++;
    }
  }
}

// How many of n values have a magnitude in [lo, hi): a branch-free loop the compiler
// vectorises (this file is built with -O3).
size_t CountInRange(const uint8_t* src, size_t n, uint32_t lo, uint32_t hi) {
  size_t in = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + 4 * i, 4);
    in += static_cast<uint32_t>((bits & 0x7FFFFFFFu) - lo) < hi - lo;
  }
  return in;
}

}  // namespace

ConversionLoss MeasureLoss(Half to, const uint8_t* src, size_t n) {
  ConversionLoss l;
  l.values = n;
  size_t i = 0;
  // While every value may still be a whole number (a counter), each one is classified.
  for (; i < n && l.all_integers; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + 4 * i, 4);
    Classify(to, bits, l);
  }
  // The common case, checked fast: bits whose rounding can neither overflow nor reach the
  // subnormal range need no conversion to judge. When all the rest are such, one pass counts
  // them; otherwise each one outside the range is classified.
  const uint32_t lo = to == Half::kBFloat16 ? 0x00800000u : 0x38800000u;  // 2^-126 / 2^-14
  const uint32_t hi = to == Half::kBFloat16 ? 0x7F7F0000u : 0x477FE000u;  // near max
  if (CountInRange(src + 4 * i, n - i, lo, hi) == n - i) {
    l.nonzero += n - i;
    return l;
  }
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + 4 * i, 4);
    uint32_t mag = bits & 0x7FFFFFFFu;
    if (mag >= lo && mag < hi) {
      l.nonzero++;
      continue;
    }
    Classify(to, bits, l);
  }
  return l;
}

}  // namespace ckpt::kernels
