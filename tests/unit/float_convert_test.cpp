#include "kernels/float_convert.h"

#include <gtest/gtest.h>
#if !defined(__FLT16_MANT_DIG__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace ckpt::kernels {
namespace {

// Independent reference: round through double arithmetic (exact for these formats).
uint16_t ReferenceBFloat16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return 0xFFFF;  // compared as "a NaN of the same sign" below
  if (std::isinf(f)) return static_cast<uint16_t>(x >> 16);
  // Candidates: truncation and the next bfloat16 toward larger magnitude.
  uint32_t lo = x & 0xFFFF0000u, hi = lo + 0x10000u;
  double d = std::fabs(static_cast<double>(f));
  double dlo = std::fabs(static_cast<double>(std::bit_cast<float>(lo)));
  // Past the largest finite value the next step is 2^128 (what rounds to infinity).
  double dhi = (hi & 0x7FFFFFFFu) == 0x7F800000u
                   ? std::ldexp(1.0, 128)
                   : std::fabs(static_cast<double>(std::bit_cast<float>(hi)));
  if (d - dlo < dhi - d) return static_cast<uint16_t>(lo >> 16);
  if (d - dlo > dhi - d) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

bool SameNaNSign(uint16_t h, uint32_t x, uint16_t exp_mask) {
  bool nan = (h & exp_mask) == exp_mask && (h & static_cast<uint16_t>(~exp_mask & 0x7FFF));
  return nan && ((h >> 15) == (x >> 31));
}

std::vector<uint32_t> SpecialValues() {
  std::vector<uint32_t> v = {
      0x00000000, 0x80000000, 0x7F800000, 0xFF800000,                          // zeros, infinities
      0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF,  // NaNs
      0x7F7FFFFF, 0xFF7FFFFF, 0x00800000, 0x00000001, 0x807FFFFF,  // extremes, subnormals
      0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,              // bf16 ties and near-ties
      0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000, 0xC77FF000,  // fp16 max/overflow
      0x38800000, 0x387FE000, 0x387FF000, 0x33000000, 0x33000001, 0x337FFFFF, 0x32FFFFFF,
      0x33800000, 0x33C00000, 0x34000000, 0x3A800800, 0x3A801000, 0x3A801800,  // fp16 subnormal
                                                                               // ties
      0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,  // bf16 rounding to infinity
  };
  return v;
}

TEST(FloatConvert, ScalarBFloat16MatchesTheDefinition) {
  std::mt19937 rng(1);
  std::vector<uint32_t> values = SpecialValues();
  for (int i = 0; i < 200000; ++i) values.push_back(rng());
  for (uint32_t x : values) {
    uint16_t got = Float32ToBFloat16(x);
    float f = std::bit_cast<float>(x);
    if (std::isnan(f)) {
      EXPECT_TRUE(SameNaNSign(got, x, 0x7F80)) << std::hex << x;
    } else {
      EXPECT_EQ(got, ReferenceBFloat16(f)) << std::hex << x;
    }
  }
}

// float -> IEEE binary16 bits, rounded to nearest even, as the compiler's _Float16 does (gcc;
// clang before 15 has no _Float16 on x86) or the CPU's F16C instruction.
#if defined(__FLT16_MANT_DIG__)
bool HaveReferenceFloat16() {
  return true;
}
uint16_t ReferenceFloat16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
#else
bool HaveReferenceFloat16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
__attribute__((target("f16c"))) uint16_t ReferenceFloat16(float f) {
  __m128i h = _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT);
  return static_cast<uint16_t>(_mm_extract_epi16(h, 0));
}
#endif

TEST(FloatConvert, ScalarFloat16MatchesTheCompiler) {
  ASSERT_TRUE(HaveReferenceFloat16()) << "no _Float16 in this compiler and no F16C in this CPU";
  // _Float16 conversion in GCC is IEEE round-to-nearest-even: an independent reference.
  std::mt19937 rng(2);
  std::vector<uint32_t> values = SpecialValues();
  for (int i = 0; i < 200000; ++i) values.push_back(rng());
  for (uint32_t e = 95; e < 145; ++e) {  // every exponent around float16's range
    for (int i = 0; i < 2000; ++i) values.push_back((e << 23) | (rng() & 0x807FFFFF));
  }
  for (uint32_t x : values) {
    uint16_t got = Float32ToFloat16(x);
    float f = std::bit_cast<float>(x);
    if (std::isnan(f)) {
      EXPECT_TRUE(SameNaNSign(got, x, 0x7C00)) << std::hex << x;
      continue;
    }
    EXPECT_EQ(got, ReferenceFloat16(f)) << std::hex << x;
  }
}

TEST(FloatConvert, EveryKernelAgreesWithScalar) {
  std::mt19937 rng(3);
  std::vector<uint32_t> values = SpecialValues();
  for (int i = 0; i < 100003; ++i) values.push_back(rng());  // odd count: exercises tails
  for (uint32_t e = 95; e < 145; ++e) {
    for (int i = 0; i < 100; ++i) values.push_back((e << 23) | (rng() & 0x807FFFFF));
  }
  std::vector<uint8_t> src(values.size() * 4 + 1);
  std::memcpy(src.data() + 1, values.data(), values.size() * 4);  // unaligned on purpose
  for (Half to : {Half::kBFloat16, Half::kFloat16}) {
    std::vector<uint8_t> want(values.size() * 2);
    ConvertStats want_stats;
    ConvertFloat32(to, src.data() + 1, want.data(), values.size(), want_stats, Kernel::kScalar);
    for (Kernel k : AvailableKernels()) {
      std::vector<uint8_t> got(values.size() * 2);
      ConvertStats stats;
      ConvertFloat32(to, src.data() + 1, got.data(), values.size(), stats, k);
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t g, w;
        std::memcpy(&g, got.data() + 2 * i, 2);
        std::memcpy(&w, want.data() + 2 * i, 2);
        uint16_t exp = to == Half::kBFloat16 ? 0x7F80 : 0x7C00;
        if (std::isnan(std::bit_cast<float>(values[i]))) {
          EXPECT_TRUE(SameNaNSign(g, values[i], exp))
              << KernelName(k) << " " << std::hex << values[i];
        } else {
          ASSERT_EQ(g, w) << KernelName(k) << " " << std::hex << values[i];
        }
      }
      EXPECT_EQ(stats.overflow, want_stats.overflow) << KernelName(k);
    }
    if (to == Half::kFloat16) {
      EXPECT_GT(want_stats.overflow, 0u);
    }
  }
  std::printf("kernels tested:");
  for (Kernel k : AvailableKernels()) std::printf(" %s", std::string(KernelName(k)).c_str());
  std::printf("\n");
}

}  // namespace
}  // namespace ckpt::kernels
