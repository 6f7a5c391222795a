#include "writers/piece_writer.h"

#include <algorithm>
#include <vector>

#include "io/crc32.h"
#include "io/range_stream.h"

namespace ckpt {

uint32_t WritePiece(AtomicOutput& out, uint64_t dst, Bytes src, std::optional<kernels::Half> to,
                    uint64_t* overflow, uint32_t crc, kernels::ConversionLoss* loss) {
  if (!to) {
    out.Write(dst, src);
    return Crc32(crc, src);
  }
  // Convert through a small per-thread buffer so memory stays flat.
  constexpr size_t kChunk = kStreamChunk / 4;  // float32 values per step
  thread_local std::vector<uint8_t> buf(2 * kChunk);
  kernels::ConvertStats stats;
  for (size_t done = 0; done < src.size() / 4;) {
    size_t n = std::min(kChunk, src.size() / 4 - done);
    if (loss) loss->Add(kernels::MeasureLoss(*to, src.data() + 4 * done, n));
    kernels::ConvertFloat32(*to, src.data() + 4 * done, buf.data(), n, stats);
    Bytes piece(buf.data(), 2 * n);
    crc = Crc32(crc, piece);
    out.Write(dst + 2 * done, piece);
    done += n;
  }
  if (overflow) *overflow += stats.overflow;
  return crc;
}

uint32_t WriteRange(AtomicOutput& out, uint64_t dst, const MappedFile& in, uint64_t offset,
                    uint64_t size, std::optional<kernels::Half> to, uint64_t* overflow,
                    kernels::ConversionLoss* loss) {
  uint32_t crc = 0;
  StreamRange(in, offset, size, [&](uint64_t done, Bytes piece) {
    crc = WritePiece(out, dst + (to ? done / 2 : done), piece, to, overflow, crc, loss);
  });
  return crc;
}

}  // namespace ckpt
