#include "compress/index_stats.h"

#include <vector>

namespace ckpt::ckz {

IndexStats StatsOf(const Index& index) {
  IndexStats s;
  for (const Chunk& c : index.chunks) {
    s.chunk_headers += ChunkHeaderSize(c.planes.size());
    const Entry& e = index.entries[c.file];
    std::vector<Run> runs = RunsOf(e.ranges, c.offset, c.length);
    bool typed_runs = false;
    for (const Run& r : runs) typed_runs |= r.transform != Transform::kBytes;
    if (c.coding == Coding::kWhole) {
      if (typed_runs) {
        ++s.fallback_chunks;
        s.fallback.original += c.length;
        s.fallback.stored += c.planes[0].stored;
      } else {
        PlaneStat& p = s.planes[0][0];
        p.original += c.length;
        p.stored += c.planes[0].stored;
        ++p.methods[static_cast<int>(c.planes[0].method)];
        s.transforms[0].original += c.length;
        s.transforms[0].stored += c.planes[0].stored;
      }
      continue;
    }
    std::vector<PlaneShape> shapes = PlaneShapes(runs);
    for (size_t i = 0; i < shapes.size() && i < c.planes.size(); ++i) {
      int t = static_cast<int>(shapes[i].transform);
      PlaneStat& p = s.planes[t][shapes[i].plane];
      p.original += shapes[i].size;
      p.stored += c.planes[i].stored;
      ++p.methods[static_cast<int>(c.planes[i].method)];
      s.transforms[t].original += shapes[i].size;
      s.transforms[t].stored += c.planes[i].stored;
    }
  }
  return s;
}

}  // namespace ckpt::ckz
