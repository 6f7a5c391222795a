#include "io/crc32.h"

#include <libdeflate.h>

namespace ckpt {

uint32_t Crc32(uint32_t crc, Bytes data) {
  return libdeflate_crc32(crc, data.data(), data.size());
}

}  // namespace ckpt
