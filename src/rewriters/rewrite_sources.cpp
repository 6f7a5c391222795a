// TorchRewrite's write strategies, one per byte source: a stored input record (copied, or
// converted to 16 bits), a gathered non-contiguous tensor, a deflated input record.
#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>

#include "base/error.h"
#include "io/atomic_output.h"
#include "io/crc32.h"
#include "io/parallel_crc.h"
#include "rewriters/torch_rewrite.h"
#include "torch/tensor_bytes.h"
#include "writers/piece_writer.h"

namespace ckpt {

uint32_t TorchRewrite::WriteStored(size_t storage, uint64_t off, uint64_t len, bool whole_record,
                                   AtomicOutput& out, uint64_t dst) {
  const PlannedStorage& s = plan_.storages[storage];
  uint64_t src_offset = 0;
  if (!SourceIsStored(s, &src_offset)) Fail("internal: storage {} is not stored", storage);
  if (whole_record) {
    out.CopyFrom(in_.map, src_offset + off, dst + off, len);
    return 0;
  }
  uint64_t scale = s.convert ? 2 : 1, overflow = 0;
  uint32_t crc = WriteRange(out, dst + off, in_.map, src_offset + off * scale, len * scale,
                            s.convert ? std::optional(s.to) : std::nullopt, &overflow);
  AddOverflow(storage, overflow);
  return crc;
}

uint32_t TorchRewrite::WriteGathered(const PlannedStorage& s, AtomicOutput& out,
                                     uint64_t dst) const {
  uint32_t crc = 0;
  uint64_t written = 0;
  StreamTensorBytes(in_.map, *in_.torch, gathered_.at(s.gather_tensor), [&](Bytes piece) {
    crc = Crc32(crc, piece);
    out.Write(dst + written, piece);
    written += piece.size();
  });
  if (written != s.size()) Fail("internal: gathered {} bytes, planned {}", written, s.size());
  return crc;
}

uint32_t TorchRewrite::WriteInflated(size_t storage, AtomicOutput& out, uint64_t dst,
                                     const WriteProgress& progress) {
  // Keeps the planned range of the inflated stream, in whole elements: a float32 split across
  // two inflated chunks is carried over to the next.
  const PlannedStorage& s = plan_.storages[storage];
  const torch::Storage& src = in_.torch->model.storages[s.source];
  if (src.entry < 0) Fail("internal: no record for storage '{}'", src.key);
  const zip::Entry* e = &in_.torch->archive->entries()[src.entry];
  uint64_t pos = 0, written = 0;
  uint32_t crc = 0;
  std::string carry;
  zip::StreamRecord(in_.map.bytes(), *e, [&](Bytes chunk) {
    uint64_t lo = std::max(pos, s.begin), hi = std::min(pos + chunk.size(), s.end);
    pos += chunk.size();
    if (lo >= hi) return;
    carry.append(AsText(chunk.subspan(lo - (pos - chunk.size()), hi - lo)));
    size_t usable = s.convert ? carry.size() / 4 * 4 : carry.size();
    uint32_t part_crc =
        WritePiece(storage, AsBytes(std::string_view(carry).substr(0, usable)), out, dst + written);
    uint64_t out_len = s.convert ? usable / 2 : usable;
    crc = written ? Crc32Combine(crc, part_crc, out_len) : part_crc;
    written += out_len;
    carry.erase(0, usable);
    if (progress.bytes_done) *progress.bytes_done += usable;
  });
  return crc;
}

uint32_t TorchRewrite::WritePiece(size_t storage, Bytes src, AtomicOutput& out, uint64_t dst) {
  const PlannedStorage& s = plan_.storages[storage];
  uint64_t overflow = 0;
  uint32_t crc =
      ckpt::WritePiece(out, dst, src, s.convert ? std::optional(s.to) : std::nullopt, &overflow);
  AddOverflow(storage, overflow);
  return crc;
}

void TorchRewrite::AddOverflow(size_t storage, uint64_t overflow) {
  if (overflow == 0) return;
  std::lock_guard<std::mutex> lock(overflow_mutex_);
  overflow_[storage] += overflow;
}

}  // namespace ckpt
