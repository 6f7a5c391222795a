// A ZeRO checkpoint's rank files for another data-parallel world size, planned from its own
// files with DeepSpeed's partitioning rules (0.19: runtime/zero/stage_1_and_2.py, stage3.py,
// utils/tensor_fragment.py), so that `load_checkpoint` on M ranks reads them as it reads the
// files M ranks save:
//
// Stages 1/2, per parameter group: the flat buffer is the parameters in param_shapes order,
// each followed by its param_alignment_paddings, rounded up to a multiple of 2 x M; rank r holds
// elements [r*P, (r+1)*P) of it, P = the buffer / M. group_paddings[r] is what of that range
// lies past the parameters; single_partition_of_fp32_groups holds the partition without it,
// the optimizer's per-element state (base_optimizer_state.state.<group>.<key>) the whole
// partition; param_slice_mappings names each parameter the partition holds a piece of, with
// fragment_address(numel, start) of that piece; partition_count is M.
// Stage 3, per sub-group: every parameter is cut into pieces of ceil(numel / M) elements (the
// last padded with zeros) and rank r's flat partition is its piece of each, joined;
// fp32_flat_groups and the per-element state hold it, frozen_param_fragments the same cut of
// the frozen parameters; partition_count is M.
// The model states files' dp_world_size is M (stages 1/2: the one file; stage 3: one per rank).
// Stage 3's shared_params is rank 0's on rank 0 and empty on the others, as DeepSpeed saves it.
// Everything else (loss scaler, steps, param_groups, client state) is rank 0's, as it is.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "deepspeed/zero_checkpoint.h"
#include "pickle/graph.h"

namespace ckpt::deepspeed {

// One file to write: its name in the tag folder, its pickle (a copy of the source's rank 0 file
// with what depends on the rank replaced), and every tensor that pickle holds: the node of its
// rebuild call and its elements (pieces of z's files; zeros for paddings).
struct PlannedRankFile {
  std::string name;
  pickle::Graph graph;
  std::vector<std::pair<pickle::NodeId, ZeroTensor>> tensors;
};

// Refuses what cannot be laid out for `world` ranks: a universal checkpoint, round-robin
// gradient ordering (stages 1/2: the flat order depends on the world size), stage-3 sub-groups
// that sub_group_size splits, and source partitions that do not follow the rules above (what
// DeepSpeed version wrote them?).
void CheckRepartition(const ZeroCheckpoint& z, const ZeroOptimizerState& os, int world);

// Rank `rank`'s files for `world` ranks: its optimizer states file, then (stage 3) its model
// states file. `z` and `os` must outlive the plan (its tensors are pieces of z's files).
std::vector<PlannedRankFile> PlanRankFiles(const ZeroCheckpoint& z, const ZeroOptimizerState& os,
                                           int world, int rank);

// A model states pickle's dp_world_size set to `world` (stages 1/2 write the source's one model
// states file with this alone changed).
void SetWorldSize(pickle::Graph& g, int world);

}  // namespace ckpt::deepspeed
