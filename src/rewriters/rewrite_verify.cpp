// TorchRewrite::Verify: the written file, read back with the same reader, must hold the
// rewritten object graph (checked through its digest), the planned tensors (checked through a
// digest per tensor row, taken before the input's rows were freed) and the input's bytes
// (checked through CRCs).
#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "io/crc32.h"
#include "io/parallel_crc.h"
#include "io/range_stream.h"
#include "pickle/graph_digest.h"
#include "rewriters/torch_rewrite.h"

namespace ckpt {

namespace {

// Digest of what a reader sees of one tensor besides its bytes and storage.
pickle::GraphDigest RowDigest(const torch::NameList& names, torch::DType dtype,
                              std::span<const int64_t> shape, std::span<const int64_t> stride,
                              bool requires_grad, std::string_view kind) {
  std::string buf;
  auto put = [&buf](const void* p, size_t n) { buf.append(static_cast<const char*>(p), n); };
  auto put_u64 = [&put](uint64_t v) { put(&v, sizeof v); };
  put_u64(names.size());
  for (std::string_view n : names) {
    put_u64(n.size());
    put(n.data(), n.size());
  }
  put_u64(static_cast<uint64_t>(dtype));
  put_u64(shape.size());
  put(shape.data(), shape.size_bytes());
  put_u64(stride.size());
  put(stride.data(), stride.size_bytes());
  put_u64(requires_grad ? 1 : 0);
  put_u64(kind.size());
  put(kind.data(), kind.size());
  XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  return {h.low64, h.high64};
}

}  // namespace

void TorchRewrite::ReleaseTensorRows() {
  torch::Model& m = in_.torch->model;
  expected_.resize(m.tensors.size());
  names_.resize(m.tensors.size());
  for (size_t j = 0; j < m.tensors.size(); ++j) {
    torch::Tensor& x = m.tensors[j];
    ExpectedTensor& e = expected_[j];
    bool gathered = !plan_.tensor_stride.empty() && !plan_.tensor_stride[j].empty();
    std::span<const int64_t> stride =
        gathered ? std::span<const int64_t>(plan_.tensor_stride[j]) : x.stride;
    const PlannedStorage* os = x.storage >= 0 ? &plan_.storages[plan_.tensor_storage[j]] : nullptr;
    torch::DType dtype = x.dtype;
    if (os != nullptr && os->convert) {
      dtype = torch::DTypeOf(os->to);
    }
    e.row = RowDigest(x.names, dtype, x.shape, stride, x.requires_grad, x.kind);
    e.has_storage = os != nullptr;
    if (os != nullptr) {
      if (os->gather_tensor >= 0) {
        e.check_begin = true;
        e.byte_begin = 0;  // a gathered tensor starts its storage
      } else if (x.numel > 0) {
        e.check_begin = true;
        uint64_t scale = os->convert ? 2 : 1;
        e.begin_ok = x.byte_begin >= os->begin && (x.byte_begin - os->begin) % scale == 0;
        e.byte_begin = e.begin_ok ? (x.byte_begin - os->begin) / scale : 0;
      }
    }
    names_[j] = std::move(x.names);
    if (os != nullptr && os->gather_tensor == static_cast<int32_t>(j)) {
      gathered_.emplace(static_cast<int32_t>(j), std::move(x));
    }
  }
  std::vector<torch::Tensor>().swap(m.tensors);
}

void TorchRewrite::ReleaseInputRows() {
  torch::Model& m = in_.torch->model;
  gathered_.clear();
  std::vector<torch::Storage>().swap(m.storages);
  m.storage_index.Clear();
  in_.torch->archive.reset();  // the input's zip directory: only its records' bytes were needed
}

void TorchRewrite::Verify(const MappedFile& out, unsigned threads) const {
  torch::TorchFile o = torch::ReadTorchZip(out.bytes(), ReleasingPages(out));
  const torch::Model& b = o.model;
  if (!b.problems.empty()) Fail("{}: {}", b.problems[0].where, b.problems[0].what);
  if (pickle::DigestGraph(b.graph, b.graph.root) != digest_) {
    Fail("the written pickle reads back as a different object graph than was written");
  }
  o.model.graph.Release();  // what is left to check is in the tensor table
  if (expected_.size() != b.tensors.size()) {
    Fail("{} tensors written, {} expected", b.tensors.size(), expected_.size());
  }
  for (size_t j = 0; j < expected_.size(); ++j) {
    const ExpectedTensor& e = expected_[j];
    const torch::Tensor& y = b.tensors[j];
    std::string_view shown = name(j);
    if (RowDigest(y.names, y.dtype, y.shape, y.stride, y.requires_grad, y.kind) != e.row) {
      Fail("tensor '{}' changed", shown);
    }
    if (!e.has_storage) continue;
    if (y.storage < 0 || b.storages[y.storage].key != outputs_[plan_.tensor_storage[j]].key)
      Fail("tensor '{}' points at the wrong storage", shown);
    if (e.check_begin && (!e.begin_ok || y.byte_begin != e.byte_begin)) {
      Fail("tensor '{}' moved inside its storage", shown);
    }
  }
  // Every record's bytes hash to the CRC written for it, and those CRCs came from the input's
  // bytes (or the input's own CRC for records copied whole): the data is the input's data.
  // A record in checked_ was read back chunk by chunk as it was written and matched the CRC
  // its directory entry must hold; no write lands inside it afterwards, since every other
  // write goes to a header, descriptor or record the reader found where the plan put it and
  // the reader refuses records that share bytes. So its place and CRC are checked, not its
  // bytes again.
  const auto& entries = o.archive->entries();
  CrcChecks reread;
  size_t found = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const zip::Entry& e = entries[i];
    auto c = std::lower_bound(
        checked_.begin(), checked_.end(), e.data_offset,
        [](const CheckedRecord& r, uint64_t offset) { return r.data_offset < offset; });
    if (c != checked_.end() && c->data_offset == e.data_offset) {
      if (c->size != e.size || c->crc != e.crc32 || e.method != zip::Method::kStored) {
        Fail("record '{}' is not the one written at offset {}", e.name, e.data_offset);
      }
      ++found;
      continue;
    }
    reread.Add(e.data_offset, e.size, e.crc32, i);
  }
  if (found != checked_.size()) {
    Fail("{} records were written and read back, {} of them are in the new file's directory",
         checked_.size(), found);
  }
  reread.Run(out, threads, [&](size_t i) {
    Fail(
        "record '{}' does not match the input's checksum (is the input corrupt? run ckptool "
        "verify on it)",
        entries[i].name);
  });
}

}  // namespace ckpt
