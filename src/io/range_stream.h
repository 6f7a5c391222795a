// Streaming a byte range of a file through small reused windows.
//
// A window the size of a whole piece (16 MiB) costs twice: its fresh buffer takes a page
// fault per 4 KiB on the first read (a worker thread's spares die with it), and by the time
// the bytes are hashed and written they have left the cache, so memory is crossed three
// times instead of once. Windows of kStreamChunk bytes keep the bytes in the core's cache
// between the read, the CRC and the write. Measured on the 1 GiB cut-storage case
// (bench/run --only cut): see README "One big cut storage".
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "base/byte_cursor.h"
#include "base/interrupt.h"
#include "io/mapped_file.h"

namespace ckpt {

inline constexpr uint64_t kStreamChunk = 256 << 10;

// fn(offset_in_range, bytes) for consecutive windows covering [offset, offset + size), each
// at most `chunk` bytes (keep it a multiple of 4: float32 values are never split). Every 64
// windows (16 MiB) it answers an interrupt (base/interrupt.h).
template <typename Fn>
void StreamRange(const MappedFile& f, uint64_t offset, uint64_t size, Fn&& fn,
                 uint64_t chunk = kStreamChunk) {
  for (uint64_t done = 0, k = 0; done < size; ++k) {
    if (k % 64 == 63) CheckInterrupt();
    uint64_t n = std::min(chunk, size - done);
    MappedFile::Window w(f, offset + done, n);
    fn(done, w.bytes());
    done += n;
  }
}

// CRC32 of [offset, offset + size) of `f`.
uint32_t Crc32OfRange(const MappedFile& f, uint64_t offset, uint64_t size);

struct FileRange {
  uint64_t offset = 0;
  uint64_t size = 0;
};
// For a run of small reads of one file: the range covering them when one read of it costs
// less than a read of each (it spans at most 2 x kSmallRun bytes, at most 4x those wanted).
std::optional<FileRange> CoveringRange(const std::vector<FileRange>& reads);

// CRC32 of each range, on `threads` threads: small ranges lying close together (a table of
// 10^5 tiny records or tensors) are read a run at a time (parallel_crc.h: kSmallRun), one
// pread per run instead of one per range; large ones in pieces across threads.
std::vector<uint32_t> Crc32OfRanges(const MappedFile& f, const std::vector<FileRange>& ranges,
                                    unsigned threads);

// The ranges of a written file that its verification reads again, each with the CRC32 it must
// hash to and an id the caller's message names it by.
class CrcChecks {
 public:
  void Add(uint64_t offset, uint64_t size, uint32_t crc, size_t id) {
    ranges_.push_back({offset, size});
    crcs_.push_back(crc);
    ids_.push_back(id);
  }
  // Hashes every range of `f` (Crc32OfRanges on `threads` threads) and calls mismatch(id),
  // which throws, for the first one whose CRC differs.
  template <typename Mismatch>
  void Run(const MappedFile& f, unsigned threads, Mismatch&& mismatch) const {
    std::vector<uint32_t> got = Crc32OfRanges(f, ranges_, threads);
    for (size_t k = 0; k < got.size(); ++k) {
      if (got[k] != crcs_[k]) mismatch(ids_[k]);
    }
  }

 private:
  std::vector<FileRange> ranges_;
  std::vector<uint32_t> crcs_;
  std::vector<size_t> ids_;
};

}  // namespace ckpt
