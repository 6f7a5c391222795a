// Rewriting a torch checkpoint from a plan of output storages: the writer every
// transform shares (shrink today; convert and strip build on the same plan).
//
// Data flows one way: the plan says which byte range of which input storage becomes each
// output storage and where every tensor lands; Prepare() rewrites the object graph
// accordingly, serialises the pickle and lays the zip out (so the exact output size is
// known before writing); Write() fills the records in parallel into a temp file, verifies
// it, and only then renames it over the destination.
#pragma once

#include <atomic>
#include <mutex>
#include <cstdint>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "kernels/float_convert.h"
#include "ops/checkpoint_file.h"
#include "zip/zip_writer.h"

namespace ckpt {

struct OutStorage {
  int32_t source = -1;      // input storage index
  uint64_t begin = 0;       // byte range of the input storage
  uint64_t end = 0;
  // When >= 0: the storage holds this input tensor's elements gathered in row-major order
  // (a non-contiguous view laid out contiguously) instead of the byte range.
  int32_t gather_tensor = -1;
  uint64_t gather_bytes = 0;
  // When set: the range holds float32 values written as this 16-bit type.
  bool convert = false;
  kernels::Half to = kernels::Half::kBFloat16;

  uint64_t size() const {
    return gather_tensor >= 0 ? gather_bytes : convert ? (end - begin) / 2 : end - begin;
  }
  std::string key;          // assigned when the pickle is written ("0", "1"... in first-use order)
  pickle::NodeId persid = pickle::kNil;
  pickle::NodeId key_node = pickle::kNil;
};

struct RewritePlan {
  std::vector<OutStorage> storages;
  std::vector<int32_t> tensor_storage;  // per input tensor: output storage index
  std::vector<int64_t> tensor_offset;   // per input tensor: new storage offset (elements)
  std::vector<int32_t> bare_storage;    // per Model::bare_refs entry: output storage index
  // Per input tensor: its new stride when it is gathered, else empty (stride unchanged).
  std::vector<std::vector<int64_t>> tensor_stride;
};

struct WriteStats {
  std::atomic<uint64_t>* bytes_done = nullptr;  // progress counter, may be null
};

class TorchRewrite {
 public:
  // Rewrites `input`'s graph in place and lays out the output. Throws ckpt::Error.
  TorchRewrite(CheckpointFile& input, RewritePlan plan);

  uint64_t output_size() const { return zip_.total_size(); }
  const RewritePlan& plan() const { return plan_; }
  // After Write(): per output storage, finite values that overflowed to infinity.
  const std::vector<uint64_t>& overflow() const { return overflow_; }

  // Writes, verifies and atomically installs the output at `final_path` (which may be the
  // input's own path). `mode_from` supplies the permissions to keep.
  void Write(const std::string& final_path, unsigned threads, const WriteStats& stats = {});

 private:
  struct Record {
    std::string data;        // small records: their bytes
    int32_t storage = -1;    // storage records: index into plan_.storages
  };

  void RewriteGraph();
  void SerializePickle();
  void LayOut();
  // Where the bytes of output storage i come from.
  bool SourceIsStored(const OutStorage& s, uint64_t* file_offset) const;
  // Writes the gathered elements of output storage `s` at `dst`; returns their CRC32.
  uint32_t WriteGathered(const OutStorage& s, class AtomicOutput& out, uint64_t dst) const;
  // Writes input bytes `src` (a piece of output storage `s`) at `dst`, converted when the
  // storage is; returns the CRC32 of what was written.
  uint32_t WritePiece(size_t storage, Bytes src, class AtomicOutput& out, uint64_t dst);
  void Verify(const MappedFile& out, unsigned threads) const;

  CheckpointFile& in_;
  RewritePlan plan_;
  std::string pickle_;
  std::vector<Record> records_;
  zip::ZipPlan zip_;
  std::vector<uint64_t> overflow_;
  std::mutex overflow_mutex_;
};

// Refuses files whose rewrite could lose something (structural problems, tensor forms not
// fully understood) or launder something (code-execution globals, unless allowed).
void CheckRewritable(const CheckpointFile& f, bool allow_unsafe_globals);

// Copies the input unchanged to `dest`, atomically, keeping its mode.
void CopyUnchanged(const CheckpointFile& f, const std::string& dest);

}  // namespace ckpt
