// Rewriting a torch checkpoint from a RewritePlan (rewrite_plan.h): the writer shrink, strip
// and convert share.
//
// Data flows one way: the constructor rewrites the object graph as the plan says, serialises
// the pickle and lays the zip out, so the exact output size is known before writing; Write()
// fills the records in parallel into a temp file (one strategy per byte source, in
// rewrite_sources.cpp), verifies what it wrote (rewrite_verify.cpp), and only then renames it
// over the destination.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "file/checkpoint_file.h"
#include "io/mapped_file.h"
#include "pickle/graph.h"
#include "pickle/graph_digest.h"
#include "rewriters/rewrite_plan.h"
#include "zip/zip_writer.h"

namespace ckpt {

class AtomicOutput;

struct WriteProgress {
  std::atomic<uint64_t>* bytes_done = nullptr;  // input bytes done, may be null
};

class TorchRewrite {
 public:
  // Rewrites `input`'s graph, serialises it and lays out the output. The graph is consumed:
  // once serialised it is replaced by its digest (the read-back is checked against that), so
  // a file of 10^5 tensors is never held as two graphs at once. Throws ckpt::Error.
  TorchRewrite(CheckpointFile& input, RewritePlan plan);

  uint64_t output_size() const { return output_size_; }
  const RewritePlan& plan() const { return plan_; }
  // Does the new pickle refer to planned storage i (so the output holds a record for it)?
  bool written(size_t storage) const { return !outputs_[storage].key.empty(); }
  // After Write(): per planned storage, finite values that overflowed to infinity.
  const std::vector<uint64_t>& overflow() const { return overflow_; }
  // Input tensor j's first name (the input's tensor rows are freed once the graph is
  // rewritten).
  std::string_view name(size_t j) const {
    const torch::NameList& n = names_.empty() ? in_.torch->model.tensors[j].names : names_[j];
    return n.empty() ? std::string_view() : n.front();
  }

  // Writes, verifies and atomically installs the output at `final_path` (which may be the
  // input's own path), with the input's permissions. Once the bytes are written, the input's
  // tensor and storage rows and its zip directory are freed, leaving the model empty (what the
  // read-back must show is kept as a digest per tensor), so the written file's model is never
  // held beside the input's.
  void Write(const std::string& final_path, unsigned threads, const WriteProgress& progress = {});

 private:
  // Writer state of one planned storage: its record key ("0", "1"... in first-use order,
  // assigned when the pickle is written) and its nodes in the rewritten graph.
  struct StorageOutput {
    std::string key;
    pickle::NodeId persid = pickle::kNil;
    pickle::NodeId key_node = pickle::kNil;
  };
  struct Record {
    std::string data;      // small records: their bytes
    int32_t storage = -1;  // storage records: index into plan_.storages
  };

  void RewriteGraph();
  void SerializePickle();
  void LayOut();
  // Input file offset of the planned storage's first byte, when its record is stored.
  bool SourceIsStored(const PlannedStorage& s, uint64_t* file_offset) const;

  // Write strategies, one per byte source; each returns the CRC32 of what it wrote at `dst`.
  // Bytes [off, off+len) (output coordinates) of a stored source; `whole_record` copies them
  // with the kernel and trusts the input record's CRC (returns 0).
  uint32_t WriteStored(size_t storage, uint64_t off, uint64_t len, bool whole_record,
                       AtomicOutput& out, uint64_t dst);
  // A gathered (materialized) tensor.
  uint32_t WriteGathered(const PlannedStorage& s, AtomicOutput& out, uint64_t dst) const;
  // The planned range of a deflated source record, inflated as a stream.
  uint32_t WriteInflated(size_t storage, AtomicOutput& out, uint64_t dst,
                         const WriteProgress& progress);
  // Input bytes `src` of planned storage `storage` at `dst`, converted when it is.
  uint32_t WritePiece(size_t storage, Bytes src, AtomicOutput& out, uint64_t dst);
  void AddOverflow(size_t storage, uint64_t overflow);

  // What the read-back of input tensor j must show: a digest of its names, dtype, shape,
  // stride, requires_grad and kind as planned, and where its first byte lands.
  struct ExpectedTensor {
    pickle::GraphDigest row;
    uint64_t byte_begin = 0;
    bool has_storage = false;
    bool check_begin = false;  // numel > 0 or gathered
    bool begin_ok = true;      // the plan puts the first byte at a whole offset
  };
  // Once the graph is rewritten: computes expected_, moves the names out and frees the
  // input's tensor rows (but those of gathered tensors, which Write still reads), so the
  // table is not held while the pickle is serialised.
  void ReleaseTensorRows();
  // Once the bytes are written: frees the input's storage rows and zip directory.
  void ReleaseInputRows();
  // Re-reads the written file and checks it against expected_ and the plan.
  void Verify(const MappedFile& out, unsigned threads) const;

  // A record whose bytes were read back and checked as they were written
  // (AtomicOutput::CheckedWrites): Verify checks its place and CRC in the written directory
  // instead of reading it again.
  struct CheckedRecord {
    uint64_t data_offset = 0;
    uint64_t size = 0;
    uint32_t crc = 0;
  };

  CheckpointFile& in_;
  RewritePlan plan_;
  std::vector<StorageOutput> outputs_;
  std::string pickle_;
  pickle::GraphDigest digest_;  // of the rewritten graph, which is freed once serialised
  std::vector<ExpectedTensor> expected_;
  std::vector<torch::NameList> names_;  // the input tensors' names, once their rows are freed
  std::unordered_map<int32_t, torch::Tensor> gathered_;  // rows of gathered tensors, by index
  std::vector<Record> records_;
  std::vector<CheckedRecord> checked_;  // by data_offset
  zip::ZipPlan zip_;                    // freed once the file is written
  uint64_t output_size_ = 0;
  std::vector<uint64_t> overflow_;
  std::mutex overflow_mutex_;
};

}  // namespace ckpt
