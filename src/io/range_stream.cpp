#include "io/range_stream.h"

#include "io/crc32.h"

namespace ckpt {

uint32_t Crc32OfRange(const MappedFile& f, uint64_t offset, uint64_t size) {
  uint32_t crc = 0;
  StreamRange(f, offset, size, [&crc](uint64_t, Bytes b) { crc = Crc32(crc, b); });
  return crc;
}

}  // namespace ckpt
