// Building safetensors headers: tensors packed contiguously from offset 0 in the order given,
// JSON header padded with spaces to a multiple of 8 (so the data buffer, and every tensor
// whose predecessors have sizes that are multiples of its element size, stays aligned),
// "__metadata__" first with {"format": "pt"} always present.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::safetensors {

// Views of the caller's name, dtype and shape (at 10^5+ tensors a copy of each is tens of
// MiB): they must outlive the call to LayOut.
struct OutTensor {
  std::string_view name;
  std::string_view dtype;  // "F32", "BF16"...
  std::span<const int64_t> shape;
  uint64_t size = 0;  // bytes
};

struct Layout {
  std::string header;             // 8-byte length + padded JSON
  std::vector<uint64_t> offsets;  // file offset of each tensor's data
  uint64_t total_size = 0;
};

Layout LayOut(const std::vector<OutTensor>& tensors, std::map<std::string, std::string> metadata);

// Element size in bits of a safetensors dtype string (0 when unknown).
uint32_t DTypeBits(std::string_view dtype);

}  // namespace ckpt::safetensors
