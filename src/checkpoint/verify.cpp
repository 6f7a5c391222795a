#include "checkpoint/verify.h"

#include <atomic>
#include <mutex>

#include "io/crc32.h"
#include "io/parallel_crc.h"
#include "io/range_stream.h"
#include "torch/global_policy.h"

namespace ckpt {

namespace {

// Stored records are hashed from the file, close small ones a run at a time
// (Crc32OfRanges); deflated ones, and stored ones the directory places outside the file, are
// hashed one by one so that each failure is reported against its record.

}  // namespace

void CheckRecordCrcs(const CheckpointFile& f, unsigned threads, VerifyResult& out) {
  const zip::Archive& a = *f.torch->archive;
  Bytes file = f.map.bytes();
  const auto& entries = a.entries();
  std::vector<uint64_t> sizes(entries.size(), 0);
  std::vector<FileRange> stored;
  std::vector<size_t> stored_entry;
  for (size_t i = 0; i < entries.size(); ++i) {
    const zip::Entry& e = entries[i];
    if (e.method == zip::Method::kStored && e.data_offset <= file.size() &&
        e.size <= file.size() - e.data_offset) {
      stored.push_back({e.data_offset, e.size});
      stored_entry.push_back(i);
    } else {
      sizes[i] = e.method == zip::Method::kStored ? e.size : WholeRange(e.size);
    }
  }
  std::mutex mutex;
  std::vector<torch::Problem> errors;
  std::vector<uint32_t> crcs =
      ParallelCrc(sizes, threads, kCrcPiece, [&](size_t i, uint64_t off, uint64_t len) {
        const zip::Entry& e = entries[i];
        try {
          if (e.method == zip::Method::kStored) {
            return Crc32OfRange(f.map, e.data_offset + off, len);
          }
          uint32_t crc = 0;
          zip::StreamRecord(file, e, [&](Bytes chunk) { crc = Crc32(crc, chunk); });
          return crc;
        } catch (const InputChanged&) {
          throw;
        } catch (const Error& err) {
          std::lock_guard<std::mutex> lock(mutex);
          errors.push_back({e.name, err.what()});
          return e.crc32;
        }
      });
  std::vector<uint32_t> stored_crcs = Crc32OfRanges(f.map, stored, threads);
  for (size_t k = 0; k < stored.size(); ++k) crcs[stored_entry[k]] = stored_crcs[k];
  for (size_t i = 0; i < entries.size(); ++i) {
    const zip::Entry& e = entries[i];
    out.records_checked++;
    out.bytes_checked += e.size;
    if (crcs[i] != e.crc32) {
      out.problems.push_back(
          {e.name, fmt::format("CRC32 mismatch: directory says {:08x}, data hashes to {:08x}",
                               e.crc32, crcs[i])});
    }
  }
  out.problems.insert(out.problems.end(), errors.begin(), errors.end());
}

namespace {

// What can run code is a problem (torch::ScanPickle's findings); what only
// torch.load(weights_only=True) refuses is a note.
void CheckGlobals(const torch::Model& m, const torch::Trust& trust, VerifyResult& out) {
  torch::PickleScan scan = torch::ScanPickle(m.graph, trust);
  for (const torch::UnsafeFinding& u : scan.findings) {
    out.problems.push_back({fmt::format("pickle offset {}", m.graph.at(u.node).stream_offset),
                            torch::ExplainFinding(u), true});
  }
  std::string refused;
  for (const torch::ImportedName& n : scan.names) {
    if (n.cls != torch::GlobalClass::kOther || n.verdict == torch::Verdict::kUnsafe) continue;
    refused += refused.empty() ? n.name : ", " + n.name;
  }
  if (!refused.empty()) {
    out.notes.push_back("torch.load(weights_only=True) refuses it: it imports " + refused);
  }
}

}  // namespace

VerifyResult Verify(const CheckpointFile& f, unsigned threads, const torch::Trust& trust,
                    bool checksums) {
  VerifyResult out;
  if (f.torch) {
    out.problems = f.torch->model.problems;
    CheckGlobals(f.torch->model, trust, out);
    if (f.torch->archive && checksums) CheckRecordCrcs(f, threads, out);
  }
  // safetensors structure is fully checked by its reader; reaching here means it passed.
  return out;
}

}  // namespace ckpt
