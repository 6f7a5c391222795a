// Strict size arguments: "5GB" (10^9), "500MiB" (2^20 x 500), "1024B" (bytes). A unit is
// required: B, KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024),
// case-insensitive; anything else, a bare number included, is an error (no silent "M means
// something", no "5" that writes 5-byte shards).
#pragma once

#include <cstdint>
#include <string_view>

namespace ckpt {

uint64_t ParseSize(std::string_view text);

}  // namespace ckpt
