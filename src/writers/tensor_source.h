// A tensor to write, as every output writer (safetensors, torch) takes it: its name, dtype
// and shape, and a callback that produces any byte range of its row-major contents.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/range_stream.h"
#include "torch/dtype.h"

namespace ckpt {

class AtomicOutput;

struct TensorSource {
  std::string name;
  torch::DType dtype = torch::DType::kFloat32;  // as written
  std::vector<int64_t> shape;
  uint64_t size = 0;  // bytes written
  // Writes output bytes [offset, offset + length) of the tensor at file position `dst` and
  // returns their CRC32. A source that can only produce its bytes in one go (a strided
  // gather) sets `whole`; it is then called once, with (0, size).
  bool whole = false;
  std::function<uint32_t(AtomicOutput& out, uint64_t dst, uint64_t offset, uint64_t length)> write;
  // Where its bytes are read, as a rank (input file, then offset); unset: the order of the
  // list given to the writer. Inputs decoded as they are read (a .ckz archive's members) are
  // read in this order, so a chunk decoded for one tensor serves the next.
  uint64_t read_order = kUnordered;
  static constexpr uint64_t kUnordered = ~0ull;
  // When its bytes are one range of one input file (a contiguous tensor): that range, so that
  // a run of small tensors can read the range covering theirs in one go.
  const MappedFile* input = nullptr;
  FileRange input_range{};
};

// Refuses an empty list, two tensors of one name, and an alias (alias -> kept name) that is
// also a tensor's name.
void RequireDistinctNames(const std::vector<TensorSource>& tensors,
                          const std::map<std::string, std::string>& aliases);

}  // namespace ckpt
