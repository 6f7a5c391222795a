// Overflow-checked arithmetic for sizes and offsets that come from untrusted files.
#pragma once

#include <cstdint>

#include "base/error.h"

namespace ckpt {

inline uint64_t CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) Fail("size overflow: {} + {}", a, b);
  return r;
}

inline uint64_t CheckedMul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) Fail("size overflow: {} * {}", a, b);
  return r;
}

inline int64_t CheckedAddSigned(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) Fail("size overflow: {} + {}", a, b);
  return r;
}

inline int64_t CheckedMulSigned(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) Fail("size overflow: {} * {}", a, b);
  return r;
}

}  // namespace ckpt
