// Runs a per-piece job over many byte ranges on several threads and returns one CRC32 per
// range: each range is cut into pieces, fn hashes (and may copy) a piece, and the pieces'
// CRCs are joined with crc32_combine. One huge record still keeps every core busy.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace ckpt {

// Pieces of this size keep every core busy on one huge record and each thread's resident
// bytes small.
inline constexpr uint64_t kCrcPiece = 16ull << 20;

// The size to give for a range that must be handled in one go (a deflated stream, a strided
// gather): 1, one piece (fn gets offset 0, length 1), or 0 when it is empty.
inline uint64_t WholeRange(uint64_t bytes) {
  return bytes > 0 ? 1 : 0;
}

// fn(range, offset_in_range, length) returns the CRC32 of that piece.
using PieceFn = std::function<uint32_t(size_t range, uint64_t offset, uint64_t length)>;

// Pieces are handed out largest first (a short tail when sizes are uneven), or, when
// `range_order` is given (one key per range), by (key, offset): in the order their bytes are
// read, for inputs where reading out of order costs (a .ckz archive read in place decodes a
// whole chunk to serve any piece of it).
std::vector<uint32_t> ParallelCrc(const std::vector<uint64_t>& range_sizes, unsigned threads,
                                  uint64_t piece_size, const PieceFn& fn,
                                  const std::vector<uint64_t>* range_order = nullptr);

// Ranges below kSmallRange bytes are handled in runs (see ParallelCrcInRuns, Crc32OfRanges)
// of at most kSmallRun bytes: 10^5 tiny tensors then cost a few hundred jobs and syscalls.
inline constexpr uint64_t kSmallRange = 64 << 10;
inline constexpr uint64_t kSmallRun = 256 << 10;

// ParallelCrc for a writer of many ranges, some tiny: consecutive ranges i with small[i]
// whose `span[i]` (the file bytes each takes, headers included) add up to at most kSmallRun
// form one job, run(first, end, crcs) -- which writes ranges [first, end) and stores their
// CRCs in crcs[first..end) -- and every other range goes through fn as in ParallelCrc.
using RunFn = std::function<void(size_t first, size_t end, uint32_t* crcs)>;
std::vector<uint32_t> ParallelCrcInRuns(const std::vector<uint64_t>& range_sizes,
                                        const std::vector<uint64_t>& span,
                                        const std::vector<bool>& small, unsigned threads,
                                        const PieceFn& fn, const RunFn& run);

// CRC of a+b from CRC(a), CRC(b) and len(b).
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

}  // namespace ckpt
