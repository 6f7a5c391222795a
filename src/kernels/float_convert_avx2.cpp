// AVX2 + F16C kernels for float_convert.h. This file alone is compiled with -mavx2 -mf16c;
// it is only called after the CPU was checked for both.
#include <immintrin.h>

#include "kernels/float_convert.h"

namespace ckpt::kernels {

namespace {

// 8 floats -> 8 bfloat16 in the low 16 bits of each 32-bit lane.
inline __m256i BFloat16Lanes(__m256i x) {
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
  const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
  return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, is_nan), 16);
}

}  // namespace

void ConvertFloat32Avx2(Half to, const uint8_t* src, uint8_t* dst, size_t n, ConvertStats& stats) {
  size_t i = 0;
  if (to == Half::kBFloat16) {
    for (; i + 16 <= n; i += 16) {
      __m256i a = BFloat16Lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i)));
      __m256i b =
          BFloat16Lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i + 32)));
      // packus works per 128-bit lane; restore element order across lanes.
      __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i), packed);
    }
  } else {
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256i inf = _mm256_set1_epi32(0x7F800000);
    const __m128i half_abs = _mm_set1_epi16(0x7FFF);
    const __m128i half_inf = _mm_set1_epi16(0x7C00);
    uint64_t overflow = 0;
    for (; i + 8 <= n; i += 8) {
      __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i));
      __m128i h =
          _mm256_cvtps_ph(_mm256_castsi256_ps(bits), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
      // Finite inputs that came out infinite.
      __m128i out_inf = _mm_cmpeq_epi16(_mm_and_si128(h, half_abs), half_inf);
      __m256i in_inf = _mm256_cmpeq_epi32(_mm256_and_si256(bits, abs_mask), inf);
      __m256i in_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf);
      __m128i in_special =
          _mm_packs_epi32(_mm256_castsi256_si128(_mm256_or_si256(in_inf, in_nan)),
                          _mm256_extracti128_si256(_mm256_or_si256(in_inf, in_nan), 1));
      __m128i over = _mm_andnot_si128(in_special, out_inf);
      overflow += static_cast<uint64_t>(__builtin_popcount(_mm_movemask_epi8(over))) / 2;
    }
    stats.overflow += overflow;
  }
  // The tail goes through the scalar definition.
  ConvertFloat32(to, src + 4 * i, dst + 2 * i, n - i, stats, Kernel::kScalar);
}

}  // namespace ckpt::kernels
