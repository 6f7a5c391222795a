// Runs a per-piece job over many byte ranges on several threads and returns one CRC32 per
// range: each range is cut into pieces, fn hashes (and may copy) a piece, and the pieces'
// CRCs are joined with crc32_combine. One huge record still keeps every core busy.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace ckpt {

// fn(range, offset_in_range, length) returns the CRC32 of that piece.
using PieceFn = std::function<uint32_t(size_t range, uint64_t offset, uint64_t length)>;

std::vector<uint32_t> ParallelCrc(const std::vector<uint64_t>& range_sizes, unsigned threads,
                                  uint64_t piece_size, const PieceFn& fn);

// CRC of a+b from CRC(a), CRC(b) and len(b).
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

}  // namespace ckpt
