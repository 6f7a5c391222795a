// What the DeepSpeed fuzz targets (fuzz_zero.cpp, fuzz_ucp.cpp) ask of every tensor they map:
// its pieces lie inside their files (or are zeros: a planned padding, when allowed) and add up
// to its elements. Anything else aborts: a reader bug the fuzzer reports.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "base/byte_cursor.h"
#include "deepspeed/zero_checkpoint.h"
#include "torch/dtype.h"

namespace ckpt::fuzz {

inline void CheckPieces(const std::vector<deepspeed::Piece>& pieces, uint64_t numel,
                        torch::DType dtype, const std::vector<Bytes>& inputs,
                        bool zeros_allowed = false) {
  uint64_t count = 0;
  for (const deepspeed::Piece& p : pieces) {
    count += p.count;
    if (zeros_allowed && p.file == deepspeed::Piece::kZeros) continue;
    uint64_t bytes = p.count * torch::ElementSize(dtype);
    if (p.file >= inputs.size() || p.offset > inputs[p.file].size() ||
        bytes > inputs[p.file].size() - p.offset) {
      std::abort();  // a piece outside its file
    }
  }
  if (count != numel) std::abort();  // pieces that do not add up
}

}  // namespace ckpt::fuzz
