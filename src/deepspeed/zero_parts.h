// What the DeepSpeed readers share (internal to src/deepspeed/: zero_checkpoint.cpp reads ZeRO
// rank files, universal_checkpoint.cpp universal checkpoints, zero_optimizer_state.cpp lays out
// the optimizer state): values read out of a rank file's pickle, a rank file with its tensors,
// flat runs of partitions, and the model states every reader takes buffers, frozen parameters,
// parameter shapes and aliases from.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/error.h"
#include "deepspeed/zero_checkpoint.h"
#include "torch/tensor_bytes.h"

namespace ckpt::deepspeed::detail {

using pickle::Graph;
using pickle::Kind;
using pickle::kNil;
using pickle::NodeId;

// ---- values read out of a pickle graph ----

// A dict, or an object built with SETITEMS (OrderedDict): the value under a string key.
NodeId Lookup(const Graph& g, NodeId node, std::string_view key);

// Absent (kNil) or None.
bool IsNone(const Graph& g, NodeId n);

// A list or tuple (or an object built with APPENDS): its elements.
std::span<const NodeId> Elements(const Graph& g, NodeId node, const std::string& what);

// String-keyed entries of a dict or OrderedDict, in order.
std::vector<std::pair<std::string, NodeId>> Entries(const Graph& g, NodeId node,
                                                    const std::string& what);

// An int; Fail naming `what` otherwise.
int64_t IntOf(const Graph& g, NodeId n, const std::string& what);

// torch.Size((...)), or a plain tuple or list of ints.
std::vector<int64_t> ShapeOf(const Graph& g, NodeId n, const std::string& what);

// Elements of a shape (a 0-d shape is one); Fail on overflow.
uint64_t NumelOf(const std::vector<int64_t>& shape);

// ZeroStageEnum: a plain int, ZeroStageEnum(2) (Python <= 3.10) or getattr(ZeroStageEnum,
// 'gradients') (Python >= 3.11).
int StageOf(const Graph& g, NodeId n, const std::string& what);

// ---- one rank file ----

// A rank file (model states or optimizer states) read, with its tensors by rebuild call.
struct RankFile {
  const CheckpointFile* file = nullptr;
  size_t index = 0;
  std::unordered_map<NodeId, size_t> tensor_of;  // rebuild call -> tensor

  const Graph& graph() const { return file->torch->model.graph; }
  NodeId root() const { return graph().root; }

  // The data of the tensor at `node`: where its elements start, how many, which dtype.
  using Data = Fragment;
  Data TensorData(NodeId node, const std::string& what) const {
    auto it = tensor_of.find(node);
    if (it == tensor_of.end()) Fail("{}: {} is not a tensor", file->path, what);
    const torch::Tensor& t = file->torch->model.tensors[it->second];
    if (t.numel == 0) return {0, 0, t.dtype};
    if (t.storage < 0 || !IsContiguous(t))
      Fail("{}: {} is not a contiguous tensor", file->path, what);
    const torch::Storage& s = file->torch->model.storages[t.storage];
    if (!s.present || s.compressed)
      Fail("{}: {}: its storage record is compressed or missing", file->path, what);
    return {s.data_offset + t.byte_begin, t.numel, t.dtype};
  }
};

// The rank file `f` (z.files[index]); Fail when it is no torch file or its reader found
// problems.
RankFile Index(const CheckpointFile& f, size_t index);

// A model states file's frozen_param_fragments (none when it has none).
FrozenFragments FrozenFragmentsOf(const RankFile& rf);

// A flat run of elements spread over consecutive pieces (a group's ranks, a rank's
// sub-groups): the pieces covering elements [begin, end).
struct FlatRun {
  std::vector<Piece> parts;
  std::vector<uint64_t> starts;  // element offset of each part
  uint64_t total = 0;

  void Add(Piece p) {
    starts.push_back(total);
    total += p.count;
    parts.push_back(p);
  }
  void Cut(uint64_t begin, uint64_t end, uint64_t element_size, std::vector<Piece>& out) const {
    auto it = std::upper_bound(starts.begin(), starts.end(), begin);
    size_t k = it == starts.begin() ? 0 : static_cast<size_t>(it - starts.begin()) - 1;
    for (; k < parts.size() && begin < end; ++k) {
      uint64_t lo = std::max(begin, starts[k]), hi = std::min(end, starts[k] + parts[k].count);
      if (lo >= hi) continue;
      out.push_back({parts[k].file, parts[k].offset + (lo - starts[k]) * element_size, hi - lo});
      begin = hi;
    }
  }
};

// One optimizer file's fp32 partitions: per group (stages 1/2) or sub-group (stage 3), where
// this rank's flat piece lies.
std::vector<Piece> Fp32Partitions(const RankFile& rf, int stage);

// A dict keyed by integers (an optimizer's `state`): the value under `key`.
NodeId LookupInt(const Graph& g, NodeId node, int64_t key);

// The optimizer's `state` dict in an optimizer file: base_optimizer_state.state (stages 1/2),
// optimizer_state_dict.state (stage 3).
NodeId OptimizerStateOf(const RankFile& rf, int stage);

using ShapeGroups = std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>>;

// The first model states file's param_shapes: per group, each trainable parameter's name and
// shape, in flat order.
ShapeGroups ParamShapes(const RankFile& m0);

// DeepSpeed >= 0.19.7 (stages 1 and 2, zero_optimization.parameter_alignment): elements of
// padding after each parameter in its group's flat partition, per group.
std::vector<std::vector<uint64_t>> AlignmentPaddings(const RankFile& optim, NodeId osd);

// Per trainable parameter (param_shapes order): the pieces of one per-element buffer that hold
// it, given each rank's flat partition of it per group (stages 1/2) or sub-group (stage 3).
// Stages 1/2: a group's buffer is the ranks' pieces joined; parameters are consecutive ranges
// with their alignment paddings between. Stage 3: each parameter takes ceil(numel / world)
// elements at the same offset of every rank's joined sub-groups. `group_of` (optional) gets
// each parameter's group or sub-group.
std::vector<std::vector<Piece>> LayOutTrainable(const ZeroCheckpoint& z,
                                                const ShapeGroups& shape_groups,
                                                const std::vector<std::vector<uint64_t>>& paddings,
                                                const std::vector<std::vector<Piece>>& partitions,
                                                uint64_t element_size, std::vector<int>* group_of);

// The buffers and frozen parameters the model states files hold (zero_to_fp32's order: buffers,
// then frozen parameters), appended to z.tensors. `ranks` starts with the model states files.
void AddBuffersAndFrozen(ZeroCheckpoint& z, const std::vector<RankFile>& ranks);

// shared_params: each alias of a tensor that is there, by its owner's name.
void AddAliases(ZeroCheckpoint& z, const RankFile& m0);

// The names of the files in `folder` ending with `suffix`, in digit-aware order (rank 10 after 9).
std::vector<std::string> Matching(const std::string& folder, std::string_view suffix,
                                  const Volume& volume = Disk());

// One file of the checkpoint, read from z.volume, with what its pickle would import or call noted
// in z.findings, and shown to `on_file`.
std::unique_ptr<CheckpointFile> OpenRankFile(ZeroCheckpoint& z, const std::string& path,
                                             const OnRankFile& on_file);

// Reads the universal checkpoint in z.folder (universal_checkpoint.cpp).
void OpenUniversal(ZeroCheckpoint& z, const OnRankFile& on_file);

}  // namespace ckpt::deepspeed::detail
