#include "io/parallel_crc.h"

#include <zlib.h>

#include <algorithm>

#include "io/parallel.h"

namespace ckpt {

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return static_cast<uint32_t>(crc32_combine64(crc_a, crc_b, static_cast<z_off64_t>(length_b)));
}

std::vector<uint32_t> ParallelCrc(const std::vector<uint64_t>& range_sizes, unsigned threads,
                                  uint64_t piece_size, const PieceFn& fn,
                                  const std::vector<uint64_t>* range_order) {
  struct Piece {
    size_t range;
    uint64_t offset;
    uint64_t length;
  };
  std::vector<Piece> pieces;
  for (size_t r = 0; r < range_sizes.size(); ++r) {
    uint64_t off = 0;
    do {
      uint64_t n = std::min(piece_size, range_sizes[r] - off);
      pieces.push_back({r, off, n});
      off += n;
    } while (off < range_sizes[r]);
  }
  // Largest first keeps the tail short when sizes are uneven.
  std::vector<size_t> order(pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (range_order) {  // pieces of one range are already in offset order
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return (*range_order)[pieces[a].range] < (*range_order)[pieces[b].range];
    });
  } else {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return pieces[a].length > pieces[b].length; });
  }
  std::vector<uint32_t> crcs(pieces.size(), 0);
  ParallelFor(order.size(), threads, [&](size_t k) {
    const Piece& p = pieces[order[k]];
    crcs[order[k]] = p.length ? fn(p.range, p.offset, p.length) : 0;
  });
  std::vector<uint32_t> out(range_sizes.size(), 0);
  std::vector<bool> started(range_sizes.size(), false);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    out[p.range] = started[p.range] ? Crc32Combine(out[p.range], crcs[i], p.length) : crcs[i];
    started[p.range] = true;
  }
  return out;
}

std::vector<uint32_t> ParallelCrcInRuns(const std::vector<uint64_t>& range_sizes,
                                        const std::vector<uint64_t>& span,
                                        const std::vector<bool>& small, unsigned threads,
                                        const PieceFn& fn, const RunFn& run) {
  struct Unit {
    size_t first, end;
    bool run;
  };
  std::vector<Unit> units;
  std::vector<uint64_t> unit_sizes;
  for (size_t i = 0; i < range_sizes.size();) {
    size_t end = i;
    for (uint64_t bytes = 0;
         end < range_sizes.size() && small[end] && (end == i || bytes + span[end] <= kSmallRun);
         ++end)
      bytes += span[end];
    if (end - i >= 2) {
      units.push_back({i, end, true});
      unit_sizes.push_back(1);  // one job
      i = end;
    } else {
      units.push_back({i, i + 1, false});
      unit_sizes.push_back(range_sizes[i]);
      ++i;
    }
  }
  std::vector<uint32_t> out(range_sizes.size(), 0);
  std::vector<uint32_t> single = ParallelCrc(unit_sizes, threads, kCrcPiece,
                                             [&](size_t u, uint64_t off, uint64_t len) -> uint32_t {
                                               const Unit& unit = units[u];
                                               if (!unit.run) return fn(unit.first, off, len);
                                               run(unit.first, unit.end, out.data());
                                               return 0;
                                             });
  for (size_t u = 0; u < units.size(); ++u) {
    if (!units[u].run) out[units[u].first] = single[u];
  }
  return out;
}

}  // namespace ckpt
