// safetensors reader (huggingface/safetensors, README "Format"; safetensors/src/tensor.rs).
//   u64 little-endian N | N bytes of UTF-8 JSON header | data buffer
//   header: {"name": {"dtype": "F16", "shape": [..], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"str": "str"}}   offsets are relative to the data buffer.
// Checks, as the reference reader does: N <= 100,000,000 and inside the file; UTF-8 JSON
// object; no duplicate names; known dtypes; tensors sorted by offset are contiguous from 0
// (no holes, no overlaps); each tensor's byte size matches dtype x shape; the buffer ends
// exactly at the end of the file.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/byte_cursor.h"

namespace ckpt::safetensors {

inline constexpr uint64_t kMaxHeaderSize = 100'000'000;

struct TensorEntry {
  std::string name;
  std::string dtype;        // as in the file: "F32", "BF16"...
  std::string torch_dtype;  // torch name: "float32"... (the lower-cased dtype if torch lacks it)
  uint32_t bits = 0;        // bits per element
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the data buffer
  uint64_t end = 0;
};

struct File {
  uint64_t header_size = 0;          // N
  uint64_t data_offset = 0;          // 8 + N
  std::vector<TensorEntry> tensors;  // in file (offset) order
  std::map<std::string, std::string> metadata;
};

// Throws ckpt::Error naming the tensor or field at fault.
File Parse(Bytes file);

// What Parse is made of, for readers that need no table of every entry (the read-back check
// of a written file at 10^5+ tensors): ParseEach parses and checks the header, handing each
// entry (checked on its own) to `each` in header order, and returns the rest; CheckTiling
// sorts spans into file order (ties by name) and checks that they tile the data buffer of
// `data_size` bytes exactly, naming tensors through name_of(id).
struct Header {
  uint64_t header_size = 0;
  uint64_t data_offset = 0;
  std::map<std::string, std::string> metadata;
};
Header ParseEach(Bytes file, const std::function<void(TensorEntry&&)>& each);
struct Span {
  uint64_t begin = 0;
  uint64_t end = 0;
  size_t id = 0;
};
void CheckTiling(std::vector<Span>& spans, uint64_t data_size,
                 const std::function<std::string_view(size_t)>& name_of);

// Cheap content sniff: a plausible header length followed by '{' (after optional spaces).
bool LooksLikeSafetensors(Bytes file);

}  // namespace ckpt::safetensors
