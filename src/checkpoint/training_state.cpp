#include "checkpoint/training_state.h"

#include <algorithm>
#include <filesystem>

#include "base/names.h"

namespace ckpt {

const std::vector<std::string>& OptimizerStateKeys() {
  static const std::vector<std::string> keys = {
      "optim",       "optimizer", "optimizers", "optimizer_states", "optimizer_state_dict",
      "optim_state", "opt_state"};
  return keys;
}

const std::vector<std::string>& DefaultDropKeys() {
  static const std::vector<std::string> keys = {
      "optimizer",      "optimizer_states", "optimizer_state_dict", "optim_state",
      "opt_state",      "lr_scheduler",     "lr_schedulers",        "scheduler",
      "schedulers",     "scaler",           "grad_scaler",          "amp",
      "amp_scaler",     "rng_state",        "rng_states",           "torch_rng_state",
      "cuda_rng_state", "numpy_rng_state",  "python_rng_state",     "random_state"};
  return keys;
}

bool IsTrainingOnlyFile(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  static const std::vector<std::string> kGlobs = {
      "*optim_states.pt", "optimizer.pt",  "optimizer.bin",  "optimizer.pth",
      "scheduler.pt",     "scheduler.pth", "rng_state*.pth", "scaler.pt"};
  return MatchesAnyGlob(kGlobs, name);
}

bool IsMasterWeightName(std::string_view name) {
  for (std::string_view key :
       {"single_partition_of_fp32_groups", "fp32_flat_groups", "fp32_groups"}) {
    size_t at = name.find(key);
    if (at == std::string_view::npos) continue;
    bool starts = at == 0 || name[at - 1] == '.';
    bool ends = at + key.size() == name.size() || name[at + key.size()] == '.';
    if (starts && ends) return true;
  }
  return false;
}

bool UnderKey(std::string_view name, std::string_view key) {
  return key.empty() || name == key || IsBelowKeyPath(name, key);
}

std::string ModelKey(const torch::Model& m) {
  // A key of the top-level dict itself: a flat state dict's names ("model.layers.0.weight",
  // "lm_head.weight" in Hugging Face's .bin files) only look like one.
  const pickle::Graph& g = m.graph;
  if (g.root == pickle::kNil || g.kind(g.root) != pickle::Kind::kDict) return "";
  const auto& p = g.pairs(g.root);
  for (const char* candidate : {"state_dict", "module", "model_state_dict", "model"}) {
    bool top_level = false;
    for (size_t i = 0; i + 1 < p.size(); i += 2) {
      pickle::Kind k = g.kind(p[i + 1]);
      if (g.kind(p[i]) == pickle::Kind::kStr && g.text(p[i]) == candidate &&
          (k == pickle::Kind::kDict || k == pickle::Kind::kObject)) {
        top_level = true;
      }
    }
    if (!top_level) continue;
    for (const torch::Tensor& t : m.tensors) {
      for (std::string_view n : t.names) {
        if (UnderKey(n, candidate)) return candidate;
      }
    }
  }
  return "";
}

namespace {

bool IsOptimizerStateDict(const pickle::Graph& g) {
  if (g.root == pickle::kNil || g.kind(g.root) != pickle::Kind::kDict) return false;
  bool state = false, groups = false;
  const auto& p = g.pairs(g.root);
  for (size_t i = 0; i + 1 < p.size(); i += 2) {
    if (g.kind(p[i]) != pickle::Kind::kStr) return false;
    std::string_view k = g.text(p[i]);
    state |= k == "state";
    groups |= k == "param_groups";
  }
  return state && groups && p.size() == 4;
}

}  // namespace

TrainingState::TrainingState(const std::string& path, const pickle::Graph* graph) {
  whole_file_ = IsTrainingOnlyFile(path) || (graph && IsOptimizerStateDict(*graph));
}

bool TrainingState::Contains(std::string_view name) const {
  if (whole_file_) return true;
  std::string_view top = name.substr(0, name.find('.'));
  auto listed = [&](const std::vector<std::string>& keys) {
    return std::find(keys.begin(), keys.end(), top) != keys.end();
  };
  return listed(DefaultDropKeys()) || listed(OptimizerStateKeys()) || IsMasterWeightName(name);
}

bool TrainingState::Contains(const torch::NameList& names) const {
  if (whole_file_) return true;
  for (std::string_view n : names) {
    if (Contains(n)) return true;
  }
  return false;
}

}  // namespace ckpt
