// DeepSpeed ZeRO checkpoints (stages 1, 2 and 3) read as one model, without loading anything:
// the consolidated state dict DeepSpeed's own zero_to_fp32.py would build, as logical tensors
// whose elements are pieces of the rank files (deepspeed/utils/zero_to_fp32.py,
// runtime/engine.py, runtime/zero/stage_1_and_2.py and stage3.py):
//
//   <root>/latest                       the tag (text), unless one is given
//   <root>/<tag>/mp_rank_00_model_states.pt                      stages 1/2 (rank 0 writes it)
//   <root>/<tag>/zero_pp_rank_<r>_mp_rank_00_model_states.pt     stage 3, one per rank
//   <root>/<tag>/[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt  one per rank
//   rank files are taken in digit-aware order (rank 10 after rank 9).
//
// Model states: module (16-bit params for stages 1/2, placeholders for stage 3; buffers),
// buffer_names, param_shapes (a list of OrderedDict name -> Size, one per group / sub-group),
// frozen_param_shapes and frozen_param_fragments (stage >= 2), shared_params {alias: owner}.
// Optimizer states: optimizer_state_dict with zero_stage, partition_count and, per group,
// single_partition_of_fp32_groups (stages 1/2: this rank's piece of the group's flat fp32
// buffer) or fp32_flat_groups (stage 3: this rank's flat partition of each sub-group).
//
// Stages 1/2: a group's flat buffer is the ranks' pieces joined in rank order; params are
// consecutive ranges of it in param_shapes order (a 0-d shape is one element); the consumed
// length, rounded up to a multiple of 2 x world size, must equal the buffer's, rounded alike.
// Stage 3: every param is padded to ps = ceil(numel / world size) per rank; rank r's piece of
// a param sits at the same offset of its joined sub-groups; the param is the pieces joined,
// cut to numel; offsets x world size must add up to the ranks' total.
// Buffers are module[name] for name in buffer_names, floating ones made float32 (DeepSpeed's
// `v.float() if v.is_floating_point() else v`: integer buffers keep their type);
// frozen params stay 16-bit (stage 2: the first model file's fragments; stage 3: every rank's
// fragment joined, cut to numel); aliases name their owner. Order: buffers, frozen, trainable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/names.h"
#include "file/checkpoint_file.h"
#include "io/volume.h"
#include "torch/dtype.h"
#include "torch/logical_model.h"

namespace ckpt::deepspeed {

// `count` elements of a rank file's tensor data starting at byte `offset` of file `file`, or
// (file kZeros) `count` zero elements: a padding of a layout being planned.
struct Piece {
  static constexpr size_t kZeros = SIZE_MAX;
  size_t file = 0;
  uint64_t offset = 0;
  uint64_t count = 0;
};

struct ZeroTensor {
  enum class Kind { kBuffer, kFrozen, kTrainable };
  std::string name;
  Kind kind = Kind::kTrainable;
  torch::DType stored = torch::DType::kFloat32;  // the dtype of the pieces
  torch::DType dtype = torch::DType::kFloat32;   // what zero_to_fp32 returns
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  std::vector<Piece> pieces;  // in order; their counts add up to numel
};

// Where a frozen parameter's fragment lies in a stage-3 model states file.
struct Fragment {
  uint64_t offset = 0;
  uint64_t numel = 0;
  torch::DType dtype = torch::DType::kFloat32;
};
// A model states file's frozen_param_fragments, by name: each fragment, or why it is not one.
struct FrozenFragment {
  Fragment where;
  std::string error;  // non-empty: not a contiguous tensor (the message)
};
using FrozenFragments = std::unordered_map<std::string, FrozenFragment>;

struct ZeroCheckpoint {
  std::string folder;              // <root>/<tag>
  const Volume* volume = &Disk();  // what its files are read from (outlives it)
  std::string tag;
  // A universal checkpoint (zero/<param>/fp32.pt; ds_to_universal.py, ckptool reshard): files
  // are the model states files, then each trainable parameter's fp32.pt; world_size is the
  // saving run's.
  bool universal = false;
  int stage = 0;
  int world_size = 0;
  std::vector<std::unique_ptr<CheckpointFile>> files;  // model states files, then optimizer files
  size_t model_files = 0;
  std::vector<ZeroTensor> tensors;
  std::vector<std::pair<std::string, std::string>> aliases;  // alias -> owner, as shared_params
  uint64_t optimizer_bytes = 0;  // what the optimizer files take on disk
  // Model states files after the first (stage 3: one per rank) are read one at a time and
  // their parsed pickles dropped once what consolidation takes from them is out: each holds
  // every parameter's name and shape, so 10^5 parameters on 64 ranks would otherwise be held
  // at once. Per file index: its frozen parameters' fragments.
  std::vector<FrozenFragments> fragments;
  // Every file's unsafe pickle globals, found as it is opened: "<path>: the pickle <what>".
  std::vector<std::string> findings;
};

// A DeepSpeed root (holding `latest` or `latest_universal`), a tag folder (holding
// *_optim_states.pt) or a universal checkpoint folder?
bool LooksLikeZeroCheckpoint(const std::string& path, const Volume& volume = Disk());
// A universal checkpoint folder: zero/optimizer_state.pt and model states files, no rank files.
bool LooksLikeUniversalCheckpoint(const std::string& path, const Volume& volume = Disk());

// Reads the ZeRO checkpoint at `path` (a root with `latest`, or a tag folder; `tag` picks one
// under the root). Throws ckpt::Error naming the folder or file and the reason, including
// for the checkpoints zero_to_fp32 refuses (no zero_stage: BF16_Optimizer; tensor parallel;
// MoE expert files; universal checkpoints).
// `on_file`, when given, sees each rank file as soon as it is read, while its parsed pickle is
// still there (inspect describes each file from it instead of reading it a second time).
using OnRankFile = std::function<void(const CheckpointFile&)>;
// Its files are read from `volume` (an archive's, read in place: compress/archive_volume.h).
ZeroCheckpoint OpenZeroCheckpoint(const std::string& path, const std::string& tag = "",
                                  const OnRankFile& on_file = {}, const Volume& volume = Disk());

// The consolidation alone, from files already read: z.files holds z.model_files model states
// files, then the optimizer files, each with its torch model (the fuzz target and tests give
// them from memory). Fills stage, world_size, tensors and aliases.
void Consolidate(ZeroCheckpoint& z);

// The universal consolidation alone, from files already read: z.files holds z.model_files model
// states files (the first parsed), z.stage is set; `fp32_file(name)` adds trainable parameter
// `name`'s zero/<name>/fp32.pt to z.files (read) and returns its index, or fails. Fills
// world_size, tensors and aliases. OpenZeroCheckpoint reads the files from the folder; the fuzz
// target gives them from memory.
using Fp32FileOf = std::function<size_t(const std::string& name)>;
void ConsolidateUniversal(ZeroCheckpoint& z, const Fp32FileOf& fp32_file);

// The optimizer's per-element state of every trainable parameter, consolidated as its fp32
// weights are (what a universal checkpoint's zero/<name>/<key>.pt holds): each key the optimizer
// keeps per group as a buffer laid out like the fp32 partition (exp_avg and exp_avg_sq for Adam,
// momentum_buffer for SGD, whatever the optimizer keeps), and each group's step. Reads the
// optimizer files' pickles again: `z` must be as OpenZeroCheckpoint left it.
struct ZeroOptimizerState {
  struct Param {
    size_t tensor = 0;                       // index into z.tensors (a trainable one)
    int group = 0;                           // its group (stages 1/2) or sub-group (stage 3)
    std::vector<std::vector<Piece>> pieces;  // per key, like ZeroTensor::pieces
  };
  std::vector<std::string> keys;     // in the order the first group's state holds them
  std::vector<torch::DType> dtypes;  // per key
  std::vector<Param> params;         // param_shapes order
  // Per group: the node of its `step` in the graph of z.files[step_file] (kNil: none).
  std::vector<pickle::NodeId> steps;
  size_t step_file = 0;
};
ZeroOptimizerState ConsolidateOptimizerState(const ZeroCheckpoint& z);

// The consolidated model as logical tensors whose spans are pieces of the rank files (which
// `z` keeps mapped: it must outlive the model), aliases as shared_params names them; frozen
// parameters left out when asked (zero_logical_model.cpp).
LogicalModel ZeroLogicalModel(const ZeroCheckpoint& z, bool exclude_frozen);
// One tensor of `z` (or one made like them: pieces of z's files) as a logical tensor; `z` and
// `t` must outlive it.
LogicalTensor ZeroLogicalTensor(const ZeroCheckpoint& z, const ZeroTensor& t);

using ckpt::DigitAwareLess;  // base/names.h

}  // namespace ckpt::deepspeed
