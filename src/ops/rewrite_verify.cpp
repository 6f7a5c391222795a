// TorchRewrite::Verify: the written file, read back with the same reader, must hold the
// rewritten object graph (checked through its digest), the planned tensors and the input's
// bytes (checked through CRCs).
#include <fmt/format.h>

#include "base/error.h"
#include "io/crc32.h"
#include "io/parallel_crc.h"
#include "ops/torch_rewrite.h"
#include "pickle/graph_digest.h"

namespace ckpt {

void TorchRewrite::Verify(const MappedFile& out, unsigned threads) const {
  torch::TorchFile o = torch::ReadTorchZip(out.bytes());
  const torch::Model& a = in_.torch->model;
  const torch::Model& b = o.model;
  if (!b.problems.empty()) Fail("{}: {}", b.problems[0].where, b.problems[0].what);
  if (pickle::DigestGraph(b.graph, b.graph.root) != digest_) {
    Fail("the written pickle reads back as a different object graph than was written");
  }
  o.model.graph.Release();  // what is left to check is in the tensor table
  if (a.tensors.size() != b.tensors.size()) {
    Fail("{} tensors written, {} expected", b.tensors.size(), a.tensors.size());
  }
  for (size_t j = 0; j < a.tensors.size(); ++j) {
    const torch::Tensor& x = a.tensors[j];
    const torch::Tensor& y = b.tensors[j];
    const std::vector<int64_t>& stride =
        plan_.tensor_stride.empty() || plan_.tensor_stride[j].empty() ? x.stride
                                                                      : plan_.tensor_stride[j];
    const PlannedStorage* os = x.storage >= 0 ? &plan_.storages[plan_.tensor_storage[j]] : nullptr;
    torch::DType dtype = x.dtype;
    if (os != nullptr && os->convert) {
      dtype = os->to == kernels::Half::kBFloat16 ? torch::DType::kBFloat16 : torch::DType::kFloat16;
    }
    if (x.names != y.names || dtype != y.dtype || x.shape != y.shape || stride != y.stride ||
        x.requires_grad != y.requires_grad || x.kind != y.kind) {
      Fail("tensor '{}' changed", x.names.empty() ? "" : x.names[0]);
    }
    if (x.storage < 0) continue;
    const PlannedStorage& s = plan_.storages[plan_.tensor_storage[j]];
    if (b.storages[y.storage].key != outputs_[plan_.tensor_storage[j]].key)
      Fail("tensor '{}' points at the wrong storage", x.names[0]);
    if (s.gather_tensor >= 0) {
      if (y.byte_begin != 0) Fail("gathered tensor '{}' does not start its storage", x.names[0]);
    } else if (s.convert) {
      if (x.numel > 0 && y.byte_begin * 2 + s.begin != x.byte_begin) {
        Fail("tensor '{}' moved inside its storage", x.names[0]);
      }
    } else if (x.numel > 0 && y.byte_begin + s.begin != x.byte_begin) {
      Fail("tensor '{}' moved inside its storage", x.names[0]);
    }
  }
  // Every record's bytes hash to the CRC written for it, and those CRCs came from the input's
  // bytes (or the input's own CRC for records copied whole): the data is the input's data.
  const auto& entries = o.archive->entries();
  std::vector<uint64_t> sizes;
  for (const zip::Entry& e : entries) sizes.push_back(e.size);
  std::vector<uint32_t> crcs =
      ParallelCrc(sizes, threads, kCrcPiece, [&](size_t i, uint64_t off, uint64_t len) {
        MappedFile::Window window(out, entries[i].data_offset + off, len);
        return Crc32(0, window.bytes());
      });
  for (size_t i = 0; i < entries.size(); ++i) {
    if (crcs[i] != entries[i].crc32) {
      Fail(
          "record '{}' does not match the input's checksum (is the input corrupt? run "
          "ckptool verify on it)",
          entries[i].name);
    }
  }
}

}  // namespace ckpt
