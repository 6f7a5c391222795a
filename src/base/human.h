// Human-readable sizes: binary units (KiB, MiB, GiB), as zstd and most tools print them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {

// 1536 -> "1.50 KiB"; below 1 KiB exact bytes ("512 B").
std::string HumanBytes(uint64_t bytes);

// "12.3%" of `whole` (0 when whole is 0).
std::string Percent(uint64_t part, uint64_t whole);

// "1 file", "3 files": a count and its noun (English plural: + "s").
std::string Count(uint64_t n, const std::string& noun);

// A tensor shape as "[2, 3]" ("[]" for a scalar).
std::string ShapeText(const std::vector<int64_t>& shape);

}  // namespace ckpt
