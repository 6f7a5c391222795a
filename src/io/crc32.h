// CRC-32 (zip polynomial) at memory speed: libdeflate picks PCLMUL/VPCLMUL code at run time.
#pragma once

#include <cstdint>

#include "base/byte_cursor.h"

namespace ckpt {

// Continues a CRC: Crc32(Crc32(0, a), b) == Crc32(0, a+b).
uint32_t Crc32(uint32_t crc, Bytes data);

}  // namespace ckpt
