#include "kernels/float_convert.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdlib>
#include <cstring>

#include "base/endian.h"

namespace ckpt::kernels {

// Defined in float_convert_avx2.cpp (compiled for AVX2 + F16C).
void ConvertFloat32Avx2(Half to, const uint8_t* src, uint8_t* dst, size_t n, ConvertStats& stats);

uint16_t Float32ToBFloat16(uint32_t x) {
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x | 0x00400000u) >> 16);
  uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7FFFu + lsb) >> 16);
}

uint16_t Float32ToFloat16(uint32_t x) {
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u | static_cast<uint16_t>((abs >> 13) & 0x3FFu);
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to infinity
  if (abs >= 0x38800000u) {                       // normal in float16 (>= 2^-14)
    uint32_t v = abs - 0x38000000u;               // rebias the exponent: 127 - 15 = 112
    v += 0x0FFFu + ((v >> 13) & 1u);              // round to nearest even on 13 dropped bits
    return sign | static_cast<uint16_t>(v >> 13);
  }
  if (abs < 0x33000000u) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to 0)
  // Subnormal: the result counts units of 2^-24.
  uint32_t exponent = abs >> 23;  // 102..112
  uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126 - exponent;  // 14..24 bits to drop
  uint32_t r = mantissa >> shift;
  uint32_t rest = mantissa & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

namespace {

void ConvertScalar(Half to, const uint8_t* src, uint8_t* dst, size_t n, ConvertStats& stats) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t x = LoadLE<uint32_t>(src + 4 * i);
    uint16_t h;
    if (to == Half::kBFloat16) {
      h = Float32ToBFloat16(x);
    } else {
      h = Float32ToFloat16(x);
      if ((h & 0x7FFFu) == 0x7C00u && (x & 0x7FFFFFFFu) < 0x7F800000u) ++stats.overflow;
    }
    StoreLE<uint16_t>(dst + 2 * i, h);
  }
}

bool CpuHasAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  // avx2 via the compiler (it also checks that the OS saves AVX state); F16C from CPUID
  // leaf 1, ECX bit 29 (not every compiler knows the "f16c" feature name).
  __builtin_cpu_init();
  unsigned eax, ebx, ecx, edx;
  bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
  return __builtin_cpu_supports("avx2") && f16c;
#else
  return false;
#endif
}

}  // namespace

std::optional<Half> ParseHalf(std::string_view option) {
  if (option == "bf16") return Half::kBFloat16;
  if (option == "fp16") return Half::kFloat16;
  return std::nullopt;
}

std::string_view OptionName(Half h) {
  return h == Half::kBFloat16 ? "bf16" : "fp16";
}

std::string_view TorchName(Half h) {
  return h == Half::kBFloat16 ? "bfloat16" : "float16";
}

std::string_view KernelName(Kernel k) {
  switch (k) {
    case Kernel::kScalar:
      return "scalar";
    case Kernel::kAvx2:
      return "avx2+f16c";
  }
  return "?";
}

std::vector<Kernel> AvailableKernels() {
  std::vector<Kernel> k{Kernel::kScalar};
  if (CpuHasAvx2()) k.push_back(Kernel::kAvx2);
  return k;
}

Kernel BestKernel() {
  // CKPT_KERNEL=scalar|avx2+f16c picks a kernel (tests and benchmarks run every code path).
  static const Kernel best = [] {
    std::vector<Kernel> available = AvailableKernels();
    if (const char* want = std::getenv("CKPT_KERNEL")) {
      for (Kernel k : available) {
        if (KernelName(k) == want) return k;
      }
    }
    return available.back();
  }();
  return best;
}

void ConvertFloat32(Half to, const uint8_t* src, uint8_t* dst, size_t n, ConvertStats& stats,
                    Kernel kernel) {
  if (kernel == Kernel::kAvx2) {
    ConvertFloat32Avx2(to, src, dst, n, stats);
    return;
  }
  ConvertScalar(to, src, dst, n, stats);
}

}  // namespace ckpt::kernels
