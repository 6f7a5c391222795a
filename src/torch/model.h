// What a torch checkpoint holds, independent of its container: the pickled object graph,
// the storages it refers to and the tensors (views) over them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/name_index.h"
#include "pickle/graph.h"
#include "torch/dims.h"
#include "torch/dtype.h"
#include "torch/name_list.h"

namespace ckpt::torch {

struct Storage {
  std::string key;                // record name under data/ (zip) or the legacy key
  DType dtype = DType::kUntyped;  // of the storage class (kUntyped for UntypedStorage)
  uint64_t numel = 0;             // elements as pickled (bytes for UntypedStorage)
  uint64_t nbytes = 0;            // numel * element size: what the record must hold
  std::string location;           // "cpu", "cuda:0"...
  // Where the bytes are (filled in by the container reader).
  bool present = false;      // a record / data block exists
  uint64_t data_offset = 0;  // file offset of byte 0 (stored zip records and legacy files)
  bool compressed = false;   // deflated zip record: data_offset is not usable for mmap
  int32_t entry = -1;        // zip: index of its record in the archive's entries
  // Referenced directly (a bare storage object in the pickle), so all of it is in use.
  bool used_whole = false;
  pickle::NodeId first_ref = pickle::kNil;  // a persistent-id node that names this storage
};

// One row per tensor: a file of 10^5 tensors holds 10^5 of them, twice while a rewrite is
// verified, so names and dimensions are kept compact (name_list.h, dims.h).
struct Tensor {
  NameList names;         // one per path from the root (see tensor_table.cpp)
  uint32_t top_size = 0;  // names[0]'s first top_size bytes are its top key (top_key())
  std::string kind;       // "tensor", "parameter", "qtensor", "sparse.values", "meta"...
  DType dtype = DType::kFloat32;
  Dims shape;
  Dims stride;
  int64_t offset = 0;    // storage_offset, in elements of dtype
  int32_t storage = -1;  // index into Model::storages; -1 if it has none
  bool requires_grad = false;
  uint64_t numel = 0;
  // Bytes of the storage this view can reach: [byte_begin, byte_end); empty if numel == 0.
  uint64_t byte_begin = 0;
  uint64_t byte_end = 0;
  pickle::NodeId node = pickle::kNil;  // the rebuild call in the graph (identity)
  // The argument tuple whose items 0 and 1 are the storage and the storage offset.
  pickle::NodeId args = pickle::kNil;

  // The top-level key of the first path, up to its first dot: "model", "optimizer"...; for a
  // flat state dict ("encoder.0.weight") its first component, "encoder", as for safetensors.
  std::string_view top_key() const {
    if (names.empty()) return "";
    std::string_view key = names.front().substr(0, top_size);
    return key.substr(0, key.find('.'));
  }
};

struct Problem {
  std::string where;  // record, tensor name or pickle offset
  std::string what;
  // What would run code when loaded (a pickle finding), not damage: a file can be intact and
  // unsafe. Commands that refuse damaged inputs (checkpoint/integrity.h) look at damage alone.
  bool unsafe = false;
};

struct Model {
  pickle::Graph graph;
  std::vector<Storage> storages;
  std::vector<Tensor> tensors;
  std::vector<Problem> problems;   // structural problems: verify fails on any
  std::vector<std::string> notes;  // things recognised only partly (unknown rebuild forms)
  // Persistent ids that refer to a storage outside any tensor (a bare storage object).
  std::vector<std::pair<pickle::NodeId, int32_t>> bare_refs;

  NameIndex storage_index;  // key -> index into storages

  int32_t FindStorage(std::string_view key) const;  // -1 when absent
  // Adds storages[i] to storage_index; the index of a storage of that key already there
  // (then nothing is added), else i.
  int32_t IndexStorage(int32_t i);
};

// Fills storages, tensors, problems and notes from model.graph. `legacy` selects the
// 6-element persistent ids of the non-zip format.
void BuildTensorTable(Model& model, bool legacy);

}  // namespace ckpt::torch
