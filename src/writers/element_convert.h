// Writing tensor elements into an output file as another dtype, the way torch's `.to()` makes
// them: widening to float32 is exact (16-bit floats, integers, bool; float64 rounds to
// nearest), narrowing to bfloat16/float16 rounds once, from float32 (kernels/float_convert.h),
// so a 16-bit source is widened first (exact) and then narrowed. Shared by every export.
#pragma once

#include <cstdint>

#include "base/byte_cursor.h"
#include "io/atomic_output.h"
#include "kernels/conversion_loss.h"
#include "torch/dtype.h"

namespace ckpt {

// n elements of `from` as float32, the way torch's .float() makes them (exact but for
// float64 and integers beyond 2^24, which round to nearest).
void ToFloat32(torch::DType from, const uint8_t* src, float* dst, size_t n);

// Can WriteConverted make `to` out of `from`?
bool CanConvert(torch::DType from, torch::DType to);

// Writes the elements in `src` (stored as `from`) at `dst` as `to`; returns the CRC32 of the
// bytes written (src.size() / size(from) * size(to) of them). With `loss`, a narrowing to a
// half type adds what it did to the values (writers/piece_writer.h).
uint32_t WriteConverted(AtomicOutput& out, uint64_t dst, Bytes src, torch::DType from,
                        torch::DType to, kernels::ConversionLoss* loss = nullptr);

}  // namespace ckpt
