// Shrink's plan: for each storage, the byte ranges its views can reach are merged into
// components (overlapping or touching ranges join); each component becomes a storage of
// exactly those bytes and the gaps are dropped. Views keep dtype, shape and stride; only
// their storage and offset change, so views that aliased still alias.
#pragma once

#include "rewriters/torch_rewrite.h"
#include "torch/torch_file.h"

namespace ckpt {

struct ShrinkPlan {
  RewritePlan rewrite;
  bool changes = false;        // false: the file has nothing to drop
  uint64_t kept_bytes = 0;     // storage bytes the output keeps
  uint64_t dropped_bytes = 0;  // storage bytes no view reaches (plus unreferenced records)
};

// With `materialize`, a non-contiguous view that shares its bytes with no other view is laid
// out contiguously (its stride changes) when that takes fewer bytes than the range it spans.
ShrinkPlan PlanShrink(const torch::TorchFile& file, bool materialize = false);

}  // namespace ckpt
