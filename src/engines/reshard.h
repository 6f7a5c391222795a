// `ckptool reshard CKPT --to universal`: a DeepSpeed ZeRO checkpoint (stages 1, 2, 3) as the
// universal checkpoint DeepSpeed loads on any number of ranks ("checkpoint": {"load_universal":
// true}), the layout deepspeed/checkpoint/ds_to_universal.py (DeepSpeed 0.19) writes:
//
//   OUT/mp_rank_00_model_states.pt                  stages 1/2: copied as it is
//   OUT/zero_pp_rank_<r>_mp_rank_00_model_states.pt stage 3: every rank's, copied
//   OUT/zero/optimizer_state.pt                     rank 0's optimizer state without its
//                                                   partitions, and `param_groups`
//   OUT/zero/<param>/fp32.pt                        the fp32 master weights, whole
//   OUT/zero/<param>/<key>.pt                       each per-element optimizer state (exp_avg,
//                                                   exp_avg_sq, momentum_buffer...)
//   OUT/zero/<param>/step.pt                        stages 1/2: the group's step
//   dirname(OUT)/latest_universal                   basename(OUT)
//
// Stages 1/2 write {'cat_dim': 0, 'param': T} with T in the parameter's shape; stage 3 the
// 1-D tensor itself, as ds_to_universal does. The optimizer state keys are the checkpoint's own
// (not Adam's alone). Every tensor is gathered from the rank files' pieces straight into its
// file, parameters side by side; the folder is built beside OUT and renamed into place.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ckpt {

// The ranks of an MPI job writing one universal checkpoint: every rank reads the checkpoint,
// rank 0 checks it and prepares the folder, each rank writes its share of the parameters
// (balanced by bytes), rank 0 puts the folder into place once every rank has written its
// share. cli/reshard_command.cpp ties these to cluster/steps.h; unset: one process.
struct ReshardTeam {
  int rank = 0;
  int size = 1;
  std::function<void(const std::string& view, const std::string& summary)> agree;
  std::function<std::string(const std::string& value)> decide;   // rank 0's, to every rank
  std::function<std::string(const std::string& error)> confirm;  // rank 0: the first error
};

struct ReshardOptions {
  // universal: the universal checkpoint's folder; empty: <root>/<tag>_universal.
  // zero: the DeepSpeed root to write (<tag>/ and `latest`); empty: the source root's name
  // with "-<M>ranks" before its extension, beside it.
  std::string output;
  std::string tag;  // the tag folder under a root; empty: what `latest` names
  unsigned threads = 1;
  bool force = false;  // replace an existing output (and latest_universal)
  int world_size = 0;  // zero: the number of ranks to write rank files for
  ReshardTeam team;
};

struct ReshardResult {
  std::string source;  // the tag folder read
  std::string output;
  std::string latest_universal;  // universal: the file written beside the output
  std::string tag;               // zero: the tag folder written (and `latest` names)
  int stage = 0;
  int world_size = 0;     // of the run that saved the checkpoint
  int to_world_size = 0;  // zero: of the rank files written
  uint64_t parameters = 0;
  std::vector<std::string> keys;  // per-element optimizer state keys
  uint64_t files = 0;
  uint64_t bytes = 0;  // of every file written
};

ReshardResult ReshardToUniversal(const std::string& checkpoint, const ReshardOptions& options);

// `ckptool reshard CKPT --to zero --world-size M` (reshard_zero.cpp): the checkpoint's rank files
// for M ranks, as DeepSpeed writes them when M ranks save (deepspeed/zero_rank_plan.h), so that
// `load_checkpoint` on M ranks (Lightning's DeepSpeedStrategy too) resumes it without a
// universal checkpoint:
//
//   OUT/latest                                           the tag
//   OUT/<tag>/mp_rank_00_model_states.pt                 stages 1/2: dp_world_size M
//   OUT/<tag>/zero_pp_rank_<r>_mp_rank_00_model_states.pt   stage 3, r < M
//   OUT/<tag>/[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt  r < M
//   OUT/zero_to_*.py                                     the source root's recovery scripts
//
// Rank files are written side by side (and spread over an MPI team), each gathered from the
// source's pieces straight into its file; the folder is built beside OUT and renamed into place.
ReshardResult ReshardToZero(const std::string& checkpoint, const ReshardOptions& options);

}  // namespace ckpt
