// What an archive's index says its chunks hold and store, per transform and byte plane,
// without decoding anything: inspect's table of how each kind of bytes was coded, and the
// totals compress reports.
#pragma once

#include <cstdint>

#include "compress/chunk_coder.h"
#include "compress/format.h"

namespace ckpt::ckz {

struct PlaneStat {
  uint64_t original = 0;
  uint64_t stored = 0;
  uint64_t methods[3] = {};  // planes per method
};
struct IndexStats {
  PlaneStat planes[kTransforms][8];
  CodingStats transforms[kTransforms];
  CodingStats fallback;  // typed chunks coded whole by plain zstd
  uint64_t fallback_chunks = 0;
  uint64_t chunk_headers = 0;
};

// Per transform and plane, what the index's chunks hold and store.
IndexStats StatsOf(const Index& index);

}  // namespace ckpt::ckz
