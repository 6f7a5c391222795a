#include "compress/layout.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "base/error.h"
#include "file/checkpoint_file.h"
#include "safetensors/safetensors_file.h"
#include "torch/torch_file.h"

namespace ckpt::ckz {

namespace {

std::optional<Transform> TransformOf(torch::DType d) {
  switch (d) {
    case torch::DType::kBFloat16:
      return Transform::kBF16;
    case torch::DType::kFloat32:
    case torch::DType::kComplex64:
      return Transform::kF32;
    case torch::DType::kFloat16:
    case torch::DType::kComplex32:
      return Transform::kF16;
    case torch::DType::kFloat64:
    case torch::DType::kComplex128:
      return Transform::kF64;
    default:
      return std::nullopt;
  }
}

// Sorted, inside the file, whole elements, without overlaps (a later range that overlaps an
// earlier one is dropped: its bytes stay plain).
std::vector<TypedRange> Normalize(std::vector<TypedRange> ranges, uint64_t file_size) {
  std::sort(ranges.begin(), ranges.end(),
            [](const TypedRange& a, const TypedRange& b) { return a.offset < b.offset; });
  std::vector<TypedRange> out;
  uint64_t end = 0;
  for (TypedRange r : ranges) {
    if (r.offset > file_size || r.length > file_size - r.offset) continue;
    r.length -= r.length % ElementBytes(r.transform);
    if (r.length == 0 || r.offset < end) continue;
    // Touching ranges stay apart: each tensor's exponents get their own Huffman blocks.
    out.push_back(r);
    end = r.offset + r.length;
  }
  return out;
}

void AnalyzeTorch(torch::TorchFile tf, uint64_t file_size, FileLayout& out) {
  torch::Model& m = tf.model;
  // The tensor table is all this needs: the parsed pickle and the zip directory (each as big
  // as the table at 10^5 tensors) are freed before the tensor list grows.
  m.graph = pickle::Graph();
  tf.archive.reset();
  // An UntypedStorage takes the dtype its views agree on.
  std::vector<std::optional<torch::DType>> view_dtype(m.storages.size());
  std::vector<bool> mixed(m.storages.size(), false);
  for (const torch::Tensor& t : m.tensors) {
    if (t.storage < 0 || static_cast<size_t>(t.storage) >= m.storages.size()) continue;
    auto& d = view_dtype[static_cast<size_t>(t.storage)];
    if (d && *d != t.dtype) mixed[static_cast<size_t>(t.storage)] = true;
    d = t.dtype;
  }
  for (size_t i = 0; i < m.storages.size(); ++i) {
    const torch::Storage& s = m.storages[i];
    if (!s.present || s.compressed || s.nbytes == 0) continue;
    torch::DType d = s.dtype;
    if (d == torch::DType::kUntyped) {
      if (!view_dtype[i] || mixed[i]) continue;
      d = *view_dtype[i];
    }
    std::optional<Transform> t = TransformOf(d);
    if (t) out.ranges.push_back({s.data_offset, s.nbytes, *t});
  }
  out.tensors.reserve(m.tensors.size());
  for (torch::Tensor& t : m.tensors) {
    if (t.storage < 0 || static_cast<size_t>(t.storage) >= m.storages.size()) continue;
    const torch::Storage& s = m.storages[static_cast<size_t>(t.storage)];
    if (!s.present || s.compressed) continue;
    TensorInfo info;
    info.name = t.names.empty() ? std::string() : std::move(t.names.front());
    info.dtype = std::string(torch::Name(t.dtype));
    info.shape = std::move(t.shape);
    info.begin = s.data_offset + std::min(t.byte_begin, s.nbytes);
    info.end = s.data_offset + std::min(std::max(t.byte_end, t.byte_begin), s.nbytes);
    if (info.end > file_size) continue;
    out.tensors.push_back(std::move(info));
  }
}

}  // namespace

FileLayout AnalyzeFile(Bytes file, const DoneWith& done_with) {
  FileLayout out;
  try {
    std::optional<Format> format = DetectFormat(file);
    if (!format) return out;
    switch (*format) {
      case Format::kTorchZip:
      case Format::kTorchLegacy: {
        torch::ReadOptions read;
        read.done_with = done_with;
        torch::TorchFile tf = *format == Format::kTorchZip ? torch::ReadTorchZip(file, read)
                                                           : torch::ReadTorchLegacy(file, read);
        out.format =
            *format == Format::kTorchZip ? FileFormat::kTorchZip : FileFormat::kTorchLegacy;
        AnalyzeTorch(std::move(tf), file.size(), out);
        break;
      }
      case Format::kSafetensors: {
        safetensors::File st = safetensors::Parse(file);
        out.format = FileFormat::kSafetensors;
        for (const safetensors::TensorEntry& e : st.tensors) {
          uint64_t begin = st.data_offset + e.begin, end = st.data_offset + e.end;
          if (end > file.size() || begin > end) continue;
          std::optional<torch::DType> d = torch::FromSafetensors(e.dtype);
          std::optional<Transform> t = d ? TransformOf(*d) : std::nullopt;
          if (t) out.ranges.push_back({begin, end - begin, *t});
          out.tensors.push_back(
              {e.name, d ? std::string(torch::Name(*d)) : e.dtype, e.shape, begin, end});
        }
        break;
      }
    }
  } catch (const std::exception&) {
    // Not readable as a checkpoint: all of it is plain bytes.
    return FileLayout{};
  }
  out.ranges = Normalize(std::move(out.ranges), file.size());
  return out;
}

FileLayout AnalyzeItems(Bytes file, const std::vector<ItemSpan>& items, const DoneWith& done_with) {
  FileLayout out;
  // Items are small (10^5 in a file): what the ones read so far span is handed back a MiB
  // at a time, not item by item (a page may hold several).
  constexpr uint64_t kReleaseStep = uint64_t{1} << 20;
  uint64_t read_from = UINT64_MAX, read_to = 0;
  for (const ItemSpan& item : items) {
    if (item.offset > file.size() || item.length > file.size() - item.offset) continue;
    FileLayout one = AnalyzeFile(Slice(file, item.offset, item.length));
    read_from = std::min(read_from, item.offset);
    read_to = std::max(read_to, item.offset + item.length);
    if (done_with && read_to - read_from >= kReleaseStep) {
      done_with(read_from, read_to - read_from);
      read_from = UINT64_MAX;
      read_to = 0;
    }
    if (one.format != FileFormat::kTorchZip && one.format != FileFormat::kTorchLegacy) continue;
    out.format = FileFormat::kDcpData;
    for (TypedRange r : one.ranges) {
      r.offset += item.offset;
      out.ranges.push_back(r);
    }
    for (TensorInfo& t : one.tensors) {
      t.name = t.name.empty() ? item.name : item.name + "." + t.name;
      t.begin += item.offset;
      t.end += item.offset;
      out.tensors.push_back(std::move(t));
    }
  }
  out.ranges = Normalize(std::move(out.ranges), file.size());
  return out;
}

std::vector<ChunkSpan> PlanChunks(uint64_t size, const std::vector<TypedRange>& ranges,
                                  uint64_t min_chunk, uint64_t max_chunk) {
  std::vector<ChunkSpan> chunks;
  uint64_t start = 0;
  auto close = [&](uint64_t at) {
    if (at > start) chunks.push_back({start, static_cast<uint32_t>(at - start)});
    start = at;
  };
  // Adds [a, b) of elements of `es` bytes (counted from a) to the chunks.
  auto add = [&](uint64_t a, uint64_t b, uint64_t es) {
    while (a < b) {
      uint64_t used = a - start;
      uint64_t room = max_chunk - used;
      if (b - a <= room) return;  // fits: the chunk goes on
      if (used >= min_chunk) {
        close(a);  // the next piece starts a chunk of its own
        continue;
      }
      uint64_t take = room - room % es;
      if (take == 0) {
        close(a);
        continue;
      }
      a += take;
      close(a);
    }
  };
  uint64_t pos = 0;
  for (const TypedRange& r : ranges) {
    add(pos, r.offset, 1);
    add(r.offset, r.offset + r.length, ElementBytes(r.transform));
    pos = r.offset + r.length;
  }
  add(pos, size, 1);
  close(size);
  return chunks;
}

}  // namespace ckpt::ckz
