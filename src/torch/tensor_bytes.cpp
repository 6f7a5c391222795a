#include "torch/tensor_bytes.h"

#include <string>

#include "base/error.h"
#include "io/range_stream.h"

namespace ckpt {

namespace {

constexpr size_t kChunk = 4u << 20;

}  // namespace

bool IsContiguous(const torch::Tensor& t) {
  int64_t expected = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] != 1 && t.stride[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

void StreamTensorBytes(const MappedFile& map, const torch::TorchFile& tf, const torch::Tensor& t,
                       const std::function<void(Bytes)>& sink) {
  const std::string name(t.names.empty() ? "<root>" : t.names[0]);
  if (t.storage < 0) Fail("tensor '{}' has no storage to read", name);
  const torch::Storage& s = tf.model.storages[t.storage];
  if (!s.present || s.compressed) {
    Fail("tensor '{}': its storage record is {}", name, s.present ? "compressed" : "missing");
  }
  if (t.numel == 0) return;
  uint64_t es = torch::ElementSize(t.dtype);
  uint64_t base = s.data_offset;  // storage byte 0 in the file
  if (IsContiguous(t)) {
    uint64_t begin = base + t.byte_begin, size = t.numel * es;
    StreamRange(map, begin, size, [&sink](uint64_t, Bytes b) { sink(b); });
    return;
  }
  // Strided: walk the index space row by row (the last dimension is the row), over the bytes
  // the view can reach, read at random (MappedFile::Reach: a disk file's mapping; an archive
  // member's reach decoded into memory while it is read).
  const uint64_t from = base + t.byte_begin;
  MappedFile::Reach reach(map, from, t.byte_end - t.byte_begin);
  Bytes file = reach.bytes();
  const uint64_t shift = from;
  size_t nd = t.shape.size();
  uint64_t inner = static_cast<uint64_t>(t.shape[nd - 1]);
  uint64_t inner_stride = static_cast<uint64_t>(t.stride[nd - 1]);
  std::vector<int64_t> index(nd, 0);
  std::string buf;
  buf.reserve(kChunk + inner * es);
  auto append = [&](uint64_t at, uint64_t n) { buf.append(AsText(Slice(file, at - shift, n))); };
  uint64_t first = t.byte_begin / es;  // element offset of index (0, ..., 0), incl. view base
  for (uint64_t row = 0; row < t.numel / inner; ++row) {
    uint64_t elem = first;
    for (size_t d = 0; d + 1 < nd; ++d) elem += static_cast<uint64_t>(index[d] * t.stride[d]);
    if (inner_stride == 1) {
      append(base + elem * es, inner * es);
    } else {
      for (uint64_t k = 0; k < inner; ++k) {
        append(base + (elem + k * inner_stride) * es, es);
      }
    }
    for (size_t d = nd - 1; d-- > 0;) {  // next index of the outer dimensions
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
    if (buf.size() >= kChunk) {
      sink(AsBytes(buf));
      buf.clear();
    }
  }
  if (!buf.empty()) sink(AsBytes(buf));
}

}  // namespace ckpt
