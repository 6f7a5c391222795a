// torch.distributed.checkpoint (DCP) folders, as FSDP/FSDP2, torchtitan, Lightning's FSDP
// strategy and Megatron-Core's `torch_dist` format write them, read as one model without
// loading anything (torch/distributed/checkpoint/{metadata,filesystem,default_planner}.py):
//
//   <folder>/.metadata          pickle of Metadata(state_dict_metadata, planner_data,
//                               storage_data, storage_meta, version), or any object whose
//                               state holds state_dict_metadata (Megatron's MCoreMetadata);
//                               writers without collectives leave __<rank>.metadata files,
//                               read together as one.
//   <folder>/__<rank>_<n>.distcp  items written one after another; each item is a complete
//                               torch.save archive of one tensor chunk (or of a non-tensor
//                               value, BYTE_IO), possibly through stream transforms
//                               ("stream.zstd/1": zstd-compressed).
//   Megatron also writes common.pt and metadata.json beside them (plain files).
//
// state_dict_metadata[fqn] is TensorStorageMetadata(properties, size, chunks =
// [ChunkStorageMetadata(offsets, sizes)]) or BytesStorageMetadata(); TensorProperties pickles
// its state as (dtype, layout, requires_grad, memory_format, pin_memory). storage_data maps
// MetadataIndex(fqn, offset, index) to _StorageInfo(relative_path, offset, length[,
// transform_descriptors]); items are found by (fqn, chunk offsets). The older module paths
// (torch.distributed._shard.checkpoint...) read the same: only field names matter.
//
// Every chunk's item is read and checked against its metadata (dtype, shape, inside its file,
// inside its storage); the chunks of a tensor must tile it exactly. What is wrong becomes a
// Problem naming the tensor, the item and the file, so inspect can still describe a damaged
// folder and verify can list every problem; export and strip refuse a folder with any.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/mapped_file.h"
#include "io/volume.h"
#include "pickle/graph.h"
#include "torch/dtype.h"
#include "torch/global_policy.h"
#include "torch/logical_model.h"
#include "torch/model.h"

namespace ckpt::dcp {

// One storage_data entry: where an item's bytes are.
struct StorageEntry {
  std::string fqn;
  std::vector<int64_t> offsets;  // chunk offsets (empty for BYTE_IO)
  std::string path;              // relative_path
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<std::string> transforms;  // transform_descriptors
  pickle::NodeId info = pickle::kNil;   // the _StorageInfo object (strip rewrites its offset)
};

struct ChunkMeta {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

struct EntryMeta {
  std::string fqn;
  bool bytes = false;  // BytesStorageMetadata: a torch.save'd non-tensor value
  torch::DType dtype = torch::DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<ChunkMeta> chunks;
};

// What the metadata pickle says.
struct Metadata {
  pickle::Graph graph;
  std::string class_name;  // "torch.distributed.checkpoint.metadata.Metadata"...
  std::vector<EntryMeta> entries;
  std::vector<StorageEntry> storage;
  torch::PickleScan scan;
};

// Reads a metadata pickle. Throws ckpt::Error when it is not one (names the field).
Metadata ParseMetadata(Bytes pickle);

// The attribute dict of a metadata object (its last BUILD state that is a dict, or the dict of
// a (dict, slots) state), or the node itself when it is a plain dict; kNil when none.
pickle::NodeId StateDict(const pickle::Graph& g, pickle::NodeId n);
// Field `name` of an object or dict; kNil when absent.
pickle::NodeId Field(const pickle::Graph& g, pickle::NodeId obj, std::string_view name);

// A file of the folder.
struct DataFile {
  std::string name;                 // relative path
  std::unique_ptr<MappedFile> map;  // null when missing (or given from memory)
  Bytes bytes;
  uint64_t items = 0;
  uint64_t item_bytes = 0;
};

// An item read: the archive (decompressed when transformed) and what it holds.
struct Item {
  size_t entry = 0;   // index into Metadata::storage
  int32_t file = -1;  // index into files; -1 when the file is missing
  bool readable = false;
  Bytes archive;                             // the torch.save archive
  const MappedFile* map = nullptr;           // that archive's mapping, when it is one
  uint64_t archive_offset = 0;               // where `archive` starts in `map`
  std::unique_ptr<MappedFile> decompressed;  // a large decompressed item, in a temp file
  std::vector<uint8_t> inflated;             // a small one, in memory
  // Tensor items: the chunk's elements.
  torch::DType dtype = torch::DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  uint64_t data = 0;  // offset in `archive` of element (0, ..., 0)
  // BYTE_IO items: the object's imports and findings.
  torch::PickleScan scan;
  uint64_t tensor_bytes = 0;
};

struct Chunk {
  ChunkMeta meta;
  int32_t item = -1;  // -1: no storage_data entry for it
};

struct Tensor {
  std::string fqn;
  torch::DType dtype = torch::DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  std::vector<Chunk> chunks;
  bool complete = false;  // every chunk readable and the chunks tile the tensor
  // Cells of the grid every chunk boundary cuts the tensor into: cuts[d] are the boundaries
  // along dim d, cell_chunk the chunk covering each cell (row-major).
  std::vector<std::vector<int64_t>> cuts;
  std::vector<int32_t> cell_chunk;
};

struct Object {
  std::string fqn;
  int32_t item = -1;
};

struct Checkpoint {
  std::string folder;
  std::vector<std::string> metadata_files;
  uint64_t metadata_bytes = 0;
  Metadata meta;
  std::vector<DataFile> files;
  std::vector<Item> items;  // one per storage entry
  std::vector<Tensor> tensors;
  std::vector<Object> objects;
  std::vector<torch::Problem> problems;
  uint64_t in_memory_budget = 64 << 20;  // decompressed items held in memory, at most
  torch::Trust trust;                    // what the objects' pickles are judged with
};

// Drops the pages of items' archives, read through their files' mappings, from the resident
// set, so reading every item of a folder keeps memory flat. MappedFile::Release takes only
// the whole pages inside an item; the ones it shares with its neighbours (small items lie
// several to a page, and most items' first and last pages are shared) go with the rest of
// their file's every kItemsPerSweep items read from it (a page read again later is mapped
// again from the page cache).
class ItemPages {
 public:
  explicit ItemPages(const Checkpoint& c)
      : c_(c), reads_(std::make_unique<std::atomic<uint64_t>[]>(c.files.size())) {}
  // After `item`'s archive was read (on any thread).
  void Read(const Item& item);

 private:
  static constexpr uint64_t kItemsPerSweep = 1024;
  const Checkpoint& c_;
  std::unique_ptr<std::atomic<uint64_t>[]> reads_;  // per file
};

// A folder holding .metadata (or __<rank>.metadata) and .distcp files?
bool LooksLikeDcpCheckpoint(const std::string& path, const Volume& volume = Disk());
// A file that only makes sense as part of such a folder (*.distcp, .metadata)?
bool IsDcpPart(const std::string& path);

// The folder's metadata (.metadata, or the __<rank>.metadata files merged) alone, without
// opening its data files. Throws ckpt::Error (naming the folder) when it is unreadable.
Metadata ReadFolderMetadata(const std::string& folder, const Volume& volume = Disk());

// Reads the folder. Throws ckpt::Error (naming the folder) when the metadata is unreadable;
// every other problem is recorded in problems. The objects' pickles are judged with `trust`.
// Its files are read from `volume` (an archive's, read in place: compress/archive_volume.h).
Checkpoint OpenDcp(const std::string& folder, const torch::Trust& trust = {},
                   const Volume& volume = Disk());

// The same from memory (fuzzing, tests): `files` maps relative paths to their bytes.
Checkpoint ReadDcp(Bytes metadata, const std::map<std::string, Bytes>& files);

// The tensors as logical tensors (torch/logical_model.h) whose spans come from the items;
// tensors not `complete` are left out. `c` must outlive the model.
LogicalModel DcpLogicalModel(const Checkpoint& c);

}  // namespace ckpt::dcp
