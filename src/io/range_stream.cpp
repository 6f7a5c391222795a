#include "io/range_stream.h"

#include <algorithm>
#include <numeric>

#include "io/crc32.h"
#include "io/parallel_crc.h"

namespace ckpt {

uint32_t Crc32OfRange(const MappedFile& f, uint64_t offset, uint64_t size) {
  uint32_t crc = 0;
  StreamRange(f, offset, size, [&crc](uint64_t, Bytes b) { crc = Crc32(crc, b); });
  return crc;
}

std::optional<FileRange> CoveringRange(const std::vector<FileRange>& reads) {
  if (reads.size() < 2) return std::nullopt;
  uint64_t begin = UINT64_MAX, end = 0, wanted = 0;
  for (const FileRange& r : reads) {
    begin = std::min(begin, r.offset);
    end = std::max(end, r.offset + r.size);
    wanted += r.size;
  }
  uint64_t span = end - begin;
  if (span > 2 * kSmallRun || span > 4 * wanted) return std::nullopt;
  return FileRange{begin, span};
}

std::vector<uint32_t> Crc32OfRanges(const MappedFile& f, const std::vector<FileRange>& ranges,
                                    unsigned threads) {
  // Sorted by offset, a range is small when it is below kSmallRange and the next one starts
  // at most kMaxGap bytes after its end (its span counts that gap); a run takes consecutive
  // small ranges while the bytes it reads stay within kSmallRun.
  constexpr uint64_t kMaxGap = 4096;
  std::vector<size_t> order(ranges.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ranges[a].offset < ranges[b].offset; });
  std::vector<uint64_t> sizes(order.size()), span(order.size());
  std::vector<bool> small(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const FileRange& r = ranges[order[k]];
    sizes[k] = r.size;
    uint64_t next = k + 1 < order.size() ? ranges[order[k + 1]].offset : r.offset + r.size;
    uint64_t gap = next >= r.offset + r.size ? next - (r.offset + r.size) : kMaxGap + 1;
    span[k] = r.size + std::min(gap, kMaxGap);
    small[k] = r.size < kSmallRange && gap <= kMaxGap;
  }
  std::vector<uint32_t> sorted = ParallelCrcInRuns(
      sizes, span, small, threads,
      [&](size_t k, uint64_t off, uint64_t len) {
        return Crc32OfRange(f, ranges[order[k]].offset + off, len);
      },
      [&](size_t first, size_t end, uint32_t* crcs) {
        uint64_t begin = ranges[order[first]].offset;
        const FileRange& last = ranges[order[end - 1]];
        MappedFile::Window w(f, begin, last.offset + last.size - begin);
        for (size_t k = first; k < end; ++k) {
          const FileRange& r = ranges[order[k]];
          crcs[k] = Crc32(0, w.bytes().subspan(r.offset - begin, r.size));
        }
      });
  std::vector<uint32_t> out(ranges.size());
  for (size_t k = 0; k < order.size(); ++k) out[order[k]] = sorted[k];
  return out;
}

}  // namespace ckpt
