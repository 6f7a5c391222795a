#include "ops/verify.h"

#include <zlib.h>

#include <atomic>
#include <mutex>

#include "io/crc32.h"
#include "io/parallel.h"
#include "torch/global_policy.h"

namespace ckpt {

namespace {

// Stored records are cut into pieces hashed in parallel and combined with crc32_combine;
// deflated ones are inflated and hashed as a stream.
constexpr uint64_t kPiece = 16ull << 20;

struct Piece {
  size_t entry;
  uint64_t offset;  // within the record data
  uint64_t size;
};

void CheckCrcs(const CheckpointFile& f, unsigned threads, VerifyResult& out) {
  const zip::Archive& a = *f.torch->archive;
  Bytes file = f.map.bytes();
  const auto& entries = a.entries();
  std::vector<Piece> pieces;
  for (size_t i = 0; i < entries.size(); ++i) {
    const zip::Entry& e = entries[i];
    if (e.method != zip::Method::kStored) {
      pieces.push_back({i, 0, e.compressed_size});
      continue;
    }
    uint64_t off = 0;
    do {
      uint64_t n = std::min(kPiece, e.size - off);
      pieces.push_back({i, off, n});
      off += n;
    } while (off < e.size);
  }
  std::vector<uint32_t> crcs(pieces.size(), 0);
  std::mutex mutex;
  std::vector<torch::Problem> errors;
  ParallelFor(pieces.size(), threads, [&](size_t i) {
    const Piece& p = pieces[i];
    const zip::Entry& e = entries[p.entry];
    try {
      if (e.method == zip::Method::kStored) {
        crcs[i] = Crc32(0, file.subspan(e.data_offset + p.offset, p.size));
        f.map.Release(e.data_offset + p.offset, p.size);
      } else {
        uint32_t crc = 0;
        zip::StreamRecord(file, e, [&](Bytes chunk) { crc = Crc32(crc, chunk); });
        crcs[i] = crc;
      }
    } catch (const Error& err) {
      std::lock_guard<std::mutex> lock(mutex);
      errors.push_back({e.name, err.what()});
    }
  });
  // Combine pieces record by record, in order.
  size_t i = 0;
  for (size_t idx = 0; idx < entries.size(); ++idx) {
    const zip::Entry& e = entries[idx];
    uint32_t crc = 0;
    bool first = true;
    for (; i < pieces.size() && pieces[i].entry == idx; ++i) {
      crc = first ? crcs[i]
                  : static_cast<uint32_t>(crc32_combine(crc, crcs[i], static_cast<z_off_t>(pieces[i].size)));
      first = false;
    }
    out.records_checked++;
    out.bytes_checked += e.size;
    if (crc != e.crc32) {
      out.problems.push_back(
          {e.name, fmt::format("CRC32 mismatch: directory says {:08x}, data hashes to {:08x}",
                               e.crc32, crc)});
    }
  }
  out.problems.insert(out.problems.end(), errors.begin(), errors.end());
}

void CheckGlobals(const torch::Model& m, VerifyResult& out) {
  for (pickle::NodeId id = 0; id < m.graph.nodes.size(); ++id) {
    if (m.graph.kind(id) != pickle::Kind::kGlobal) continue;
    if (torch::ClassifyGlobal(m.graph.global_module(id), m.graph.global_name(id)) ==
        torch::GlobalClass::kUnsafe) {
      out.problems.push_back(
          {fmt::format("pickle offset {}", m.graph.at(id).stream_offset),
           fmt::format("imports {}, which can run code or reach the system when unpickled",
                       m.graph.GlobalText(id))});
    }
  }
}

}  // namespace

VerifyResult Verify(const CheckpointFile& f, unsigned threads) {
  VerifyResult out;
  if (f.torch) {
    out.problems = f.torch->model.problems;
    CheckGlobals(f.torch->model, out);
    if (f.torch->archive) CheckCrcs(f, threads, out);
  }
  // safetensors structure is fully checked by its reader; reaching here means it passed.
  return out;
}

}  // namespace ckpt
