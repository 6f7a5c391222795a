// What a torch rewrite produces, decided before anything is written (shrink_plan.h, strip and
// convert make one): which byte range of which input storage becomes each output storage, and
// where every tensor lands. TorchRewrite (torch_rewrite.h) carries it out.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/float_convert.h"

namespace ckpt {

struct PlannedStorage {
  int32_t source = -1;  // input storage index
  uint64_t begin = 0;   // byte range of the input storage
  uint64_t end = 0;
  // When >= 0: the storage holds this input tensor's elements gathered in row-major order
  // (a non-contiguous view laid out contiguously) instead of the byte range.
  int32_t gather_tensor = -1;
  uint64_t gather_bytes = 0;
  // When set: the range holds float32 values written as this 16-bit type.
  bool convert = false;
  kernels::Half to = kernels::Half::kBFloat16;

  uint64_t size() const {
    return gather_tensor >= 0 ? gather_bytes : convert ? (end - begin) / 2 : end - begin;
  }
};

struct RewritePlan {
  std::vector<PlannedStorage> storages;
  std::vector<int32_t> tensor_storage;  // per input tensor: output storage index
  std::vector<int64_t> tensor_offset;   // per input tensor: new storage offset (elements)
  std::vector<int32_t> bare_storage;    // per Model::bare_refs entry: output storage index
  // Empty when nothing is gathered; else per input tensor: its new stride when it is
  // gathered, else empty (stride unchanged).
  std::vector<std::vector<int64_t>> tensor_stride;
};

}  // namespace ckpt
