// float32 -> bfloat16 / float16 conversion, bit-exact with torch's `.to()` for every
// non-NaN value: round to nearest, ties to even; infinities and signed zeros kept; float16
// subnormals rounded correctly; values beyond float16's range become infinity. A NaN stays a
// quiet NaN of the same sign (its payload's top bits are kept; torch's own NaN patterns
// differ between its code paths and versions).
//
// Several kernels compute the same function; the fastest one the CPU supports is picked at
// run time. Tests run every kernel the machine can execute against the scalar one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace ckpt::kernels {

enum class Half { kBFloat16, kFloat16 };

// The one spelling of a half type on the command line and in ckptool.toml ("bf16", "fp16"),
// and torch's name for it ("bfloat16", "float16", as config.json's torch_dtype holds it).
std::optional<Half> ParseHalf(std::string_view option);
std::string_view OptionName(Half h);
std::string_view TorchName(Half h);
enum class Kernel { kScalar, kAvx2 };

std::string_view KernelName(Kernel k);
std::vector<Kernel> AvailableKernels();  // scalar first, then what this CPU runs
// The fastest available kernel, or the one named by the CKPT_KERNEL environment variable.
Kernel BestKernel();

struct ConvertStats {
  uint64_t overflow = 0;  // finite inputs that became infinity (float16 only)
};

// Converts n float32 values (little-endian bytes, any alignment) to n 16-bit values.
void ConvertFloat32(Half to, const uint8_t* src, uint8_t* dst, size_t n, ConvertStats& stats,
                    Kernel kernel = BestKernel());

// Single values, for tests and tails.
uint16_t Float32ToBFloat16(uint32_t bits);
uint16_t Float32ToFloat16(uint32_t bits);

}  // namespace ckpt::kernels
