// Building safetensors headers: tensors packed contiguously from offset 0 in the order given,
// JSON header padded with spaces to a multiple of 8 (so the data buffer, and every tensor
// whose predecessors have sizes that are multiples of its element size, stays aligned),
// "__metadata__" first with {"format": "pt"} always present.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ckpt::safetensors {

struct OutTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16"...
  std::vector<int64_t> shape;
  uint64_t size = 0;  // bytes
};

struct Layout {
  std::string header;             // 8-byte length + padded JSON
  std::vector<uint64_t> offsets;  // file offset of each tensor's data
  uint64_t total_size = 0;
};

Layout LayOut(const std::vector<OutTensor>& tensors, std::map<std::string, std::string> metadata);

// Element size in bits of a safetensors dtype string (0 when unknown).
uint32_t DTypeBits(const std::string& dtype);

}  // namespace ckpt::safetensors
