// Strict size arguments: "5GB" (10^9), "500MiB" (2^20 x 500), "1024" (bytes). Accepted
// suffixes: B, KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024),
// case-insensitive; anything else is an error (no silent "M means something").
#pragma once

#include <cstdint>
#include <string_view>

namespace ckpt {

uint64_t ParseSize(std::string_view text);

}  // namespace ckpt
