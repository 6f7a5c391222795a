// `ckptool inspect`: a report that accounts for every byte of a checkpoint file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "file/checkpoint_file.h"
#include "torch/global_policy.h"

namespace ckpt {

struct TensorRow {
  std::string name;
  std::string dtype;
  std::string kind;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  std::string storage;  // storage key; empty when the tensor has no storage
  uint64_t offset = 0;  // storage offset in elements
  uint64_t bytes = 0;   // numel x element size
  bool requires_grad = false;
};

struct StorageRow {
  std::string key;
  std::string dtype;
  std::string location;
  uint64_t bytes = 0;       // as the pickle declares
  uint64_t used_bytes = 0;  // union of its views' byte ranges
  uint32_t views = 0;       // distinct tensors over it
  bool compressed = false;
};

struct Rollup {
  std::string key;
  uint64_t tensors = 0;
  uint64_t tensor_bytes = 0;
  uint64_t storages = 0;
  uint64_t storage_bytes = 0;
  uint64_t used_bytes = 0;
};

// An imported global or an attribute read through getattr (see torch::ScanPickle).
struct GlobalRow {
  std::string name;  // Python 3 spelling: "builtins.set", "pkg.Color.RED (getattr)"
  std::string raw;   // as in the stream: "__builtin__.set", "pkg.Color.RED"
  torch::GlobalClass cls = torch::GlobalClass::kOther;
  bool getattr = false;
  torch::Verdict verdict = torch::Verdict::kReferenced;
};

// A finding on a call (see torch::ScanPickle): a global on no allowlist called, a computed
// object called, or an unsafe attribute read; unsafe imports are GlobalRows.
struct UnsafeCallRow {
  uint64_t pickle_offset = 0;
  std::string what;
};

struct FileReport {
  std::string path;
  Format format = Format::kTorchZip;
  int pickle_protocol = -1;
  uint64_t file_bytes = 0;
  uint64_t storage_bytes = 0;     // sum of storage sizes
  uint64_t used_bytes = 0;        // bytes of storages some view uses
  uint64_t wasted_bytes = 0;      // storage_bytes - used_bytes
  uint64_t tensor_bytes = 0;      // sum over distinct tensors of numel x element size
  uint64_t distinct_tensors = 0;  // tensors counted once however many names they have
  uint64_t metadata_bytes = 0;    // everything in the file that is not storage data
  // Labelled byte ranges of the file; their sizes add up to file_bytes exactly.
  std::vector<std::pair<std::string, uint64_t>> byte_map;
  // One row per name (a tensor reachable twice is listed twice); with a row limit, only the
  // largest rows (ties in file order), while tensor_names counts them all.
  std::vector<TensorRow> tensors;
  uint64_t tensor_names = 0;
  // Every storage's row when every row is kept (JSON); the text report needs only the counts.
  std::vector<StorageRow> storages;
  uint64_t storage_count = 0;
  uint64_t shared_storages = 0;  // storages more than one view reaches
  std::vector<Rollup> by_dtype;
  std::vector<Rollup> by_key;
  std::vector<GlobalRow> globals;
  std::vector<UnsafeCallRow> unsafe_calls;
  std::vector<torch::Problem> problems;
  std::vector<std::string> notes;
  std::map<std::string, std::string> metadata;  // safetensors __metadata__
};

// keep_rows: how many tensor rows to keep (the largest); the text report lists only the top
// few, and at 10^5 tensors a row per name would cost as much memory as the model.
FileReport BuildReport(const CheckpointFile& file, size_t keep_rows = SIZE_MAX,
                       const torch::Trust& trust = {});
// The same, freeing the file's parsed pickle once the globals are read from it, before the
// rows are made: a report of every row (--json) then peaks no higher than reading did.
FileReport BuildReport(CheckpointFile&& file, size_t keep_rows = SIZE_MAX,
                       const torch::Trust& trust = {});

}  // namespace ckpt
