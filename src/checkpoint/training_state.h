// What in a checkpoint is training state rather than the model: optimizer state, schedulers,
// grad scalers, RNG state, and the files that hold only those. One definition for every
// command: `strip` removes it by default, `convert` and `export` leave it alone by default.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "pickle/graph.h"
#include "torch/model.h"
#include "torch/name_list.h"

namespace ckpt {

// Top-level keys of training state: plain training dicts, PyTorch Lightning .ckpt, DeepSpeed
// model states ("optimizer", "lr_scheduler", "optimizer_states", "rng_state"...).
const std::vector<std::string>& DefaultDropKeys();
// Top-level keys of optimizer state in the flat fqns of sharded checkpoints (DCP: torchtitan,
// FSDP, Megatron, Lightning): what strip drops from them by default.
const std::vector<std::string>& OptimizerStateKeys();

// Files that hold only training state: DeepSpeed *optim_states.pt, Hugging Face Trainer
// optimizer.pt / scheduler.pt / rng_state*.pth / scaler.pt.
bool IsTrainingOnlyFile(const std::string& path);

// DeepSpeed's fp32 master copies of the weights (ZeRO optimizer partitions): never converted.
bool IsMasterWeightName(std::string_view name);

// The key path of the model in a training checkpoint: the first of state_dict, module,
// model_state_dict and model that is a key of the top-level dict and holds tensors; "" when
// none is (a bare state dict, whose names may well start with "model.": the whole object is
// the model, less its training state).
std::string ModelKey(const torch::Model& model);
bool UnderKey(std::string_view name, std::string_view key);  // "" holds every name

// Which tensors of one file are training state.
class TrainingState {
 public:
  // `graph`: the file's pickle (a bare optimizer state_dict, {"state", "param_groups"}, is
  // training state as a whole, as in Hugging Face's optimizer.pt).
  TrainingState(const std::string& path, const pickle::Graph* graph);

  bool whole_file() const { return whole_file_; }
  // A tensor by its names (any of them under a training-state key counts).
  bool Contains(const torch::NameList& names) const;
  bool Contains(std::string_view name) const;

 private:
  bool whole_file_ = false;
};

}  // namespace ckpt
