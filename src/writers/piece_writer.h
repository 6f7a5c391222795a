// Writing one piece of tensor data into an output file, converted from float32 on the way
// when asked, with the CRC32 of what was written. Shared by every writer (torch rewrite,
// safetensors convert, export).
#pragma once

#include <cstdint>
#include <optional>

#include "base/byte_cursor.h"
#include "io/atomic_output.h"
#include "io/mapped_file.h"
#include "kernels/conversion_loss.h"
#include "kernels/float_convert.h"

namespace ckpt {

// Writes `src` at `dst`; with `to`, src holds float32 values and half as many bytes are
// written. Adds float16 overflows to *overflow and, when `loss` is given, what the
// conversion did to the values (kernels/conversion_loss.h). Returns the CRC32 of the bytes
// written, continuing `crc` (the CRC of what precedes them).
uint32_t WritePiece(AtomicOutput& out, uint64_t dst, Bytes src, std::optional<kernels::Half> to,
                    uint64_t* overflow, uint32_t crc = 0, kernels::ConversionLoss* loss = nullptr);

// WritePiece of [offset, offset + size) of `in`, read through small windows
// (io/range_stream.h) so that each byte is read, hashed and written while in cache.
uint32_t WriteRange(AtomicOutput& out, uint64_t dst, const MappedFile& in, uint64_t offset,
                    uint64_t size, std::optional<kernels::Half> to, uint64_t* overflow,
                    kernels::ConversionLoss* loss = nullptr);

}  // namespace ckpt
