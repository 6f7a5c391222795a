#include "ops/strip.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "base/error.h"
#include "base/names.h"
#include "io/file_copy.h"
#include "ops/checkpoint_file.h"
#include "ops/rewritable.h"
#include "ops/shrink_plan.h"
#include "ops/torch_rewrite.h"
#include "pickle/path_budget.h"

namespace ckpt {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::NodeId;

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
  std::string name = fs::path(path).filename().string();
  static const std::vector<std::string> kGlobs = {
      "*optim_states.pt", "optimizer.pt",  "optimizer.bin",  "optimizer.pth",
      "scheduler.pt",     "scheduler.pth", "rng_state*.pth", "scaler.pt"};
  return MatchesAnyGlob(kGlobs, name);
}

std::vector<std::string> TrainingOnlyFiles(const std::string& folder) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(folder)) {
    if (e.is_regular_file() && !e.is_symlink() && IsTrainingOnlyFile(e.path().string())) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// A --keep glob protects a path when it matches it or names something below it.
bool Protected(const std::vector<std::string>& keep, const std::string& path) {
  if (MatchesAnyGlob(keep, path)) return true;
  for (const std::string& k : keep) {
    if (IsBelowKeyPath(k, path)) return true;
  }
  return false;
}

bool IsTensorCall(const pickle::Graph& g, NodeId n) {
  NodeId fn = g.CalledGlobal(n);
  if (fn == pickle::kNil) return false;
  std::string_view m = g.global_module(fn);
  return m == "torch._utils" || m == "torch._tensor";
}

// Removes matching dict entries (and object attributes) from the graph, depth first, by
// every path (a shared dict is matched under each of its paths), within a PathBudget.
class Dropper {
 public:
  Dropper(pickle::Graph& g, const StripOptions& o)
      : g_(g), o_(o), on_path_(g.nodes.size(), false), seen_(g.nodes.size(), false) {}

  std::vector<std::string> Run() {
    std::string path;
    Visit(g_.root, path, 0);
    return dropped_;
  }

 private:
  bool ShouldDrop(const std::string& path, uint32_t depth) const {
    bool wanted = o_.drop.empty()
                      ? depth == 0 && std::find(DefaultDropKeys().begin(), DefaultDropKeys().end(),
                                                path) != DefaultDropKeys().end()
                      : MatchesAnyGlob(o_.drop, path);
    return wanted && !Protected(o_.keep, path);
  }

  void Visit(NodeId n, std::string& path, uint32_t depth) {
    if (n == pickle::kNil || !g_.has_compound(n) || on_path_[n] || IsTensorCall(g_, n)) {
      budget_.Step();
      return;
    }
    bool outer = budget_.Enter(seen_[n]);
    seen_[n] = true;
    VisitNode(n, path, depth);
    budget_.Leave(outer);
  }

  void VisitNode(NodeId n, std::string& path, uint32_t depth) {
    if (depth > 4096) Fail("object graph nested deeper than 4096 levels");
    on_path_[n] = true;
    size_t base = path.size();
    auto join = [&](const std::string& part) {
      budget_.Step();
      budget_.PathBytes(part.size());
      path.resize(base);
      if (!path.empty()) path.push_back('.');
      path += part;
    };
    auto& pairs = g_.mutable_compound(n).pairs;
    std::vector<NodeId> kept;
    for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
      join(g_.KeyText(pairs[i]));
      if (ShouldDrop(path, depth)) {
        dropped_.push_back(path);
        continue;
      }
      kept.push_back(pairs[i]);
      kept.push_back(pairs[i + 1]);
    }
    pairs = kept;
    // The default drops are top-level keys: nothing below them needs walking.
    bool descend = !o_.drop.empty();
    for (size_t i = 0; descend && i + 1 < kept.size(); i += 2) {
      join(g_.KeyText(kept[i]));
      Visit(kept[i + 1], path, depth + 1);
    }
    const auto items = g_.compound(n).items;
    for (size_t i = 0; descend && i < items.size(); ++i) {
      join(std::to_string(i));
      Visit(items[i], path, depth + 1);
    }
    path.resize(base);
    if (g_.kind(n) == Kind::kObject) {
      for (NodeId s : std::vector<NodeId>(g_.compound(n).states)) {
        if (g_.kind(s) == Kind::kTuple) {
          for (NodeId part : std::vector<NodeId>(g_.items(s))) Visit(part, path, depth);
        } else {
          Visit(s, path, depth);
        }
      }
    }
    path.resize(base);
    on_path_[n] = false;
  }

  pickle::Graph& g_;
  const StripOptions& o_;
  std::vector<bool> on_path_;
  std::vector<bool> seen_;  // walked by some path already
  pickle::PathBudget budget_;
  std::vector<std::string> dropped_;
};

// Rebuilds the tensor table of a mutated graph, keeping where each storage's bytes are.
void RebuildTensorTable(torch::TorchFile& tf) {
  std::map<std::string, torch::Storage> located;
  for (const torch::Storage& s : tf.model.storages) located[s.key] = s;
  torch::Model& m = tf.model;
  m.storages.clear();
  m.storage_index.clear();
  m.tensors.clear();
  m.problems.clear();
  m.notes.clear();
  m.bare_refs.clear();
  torch::BuildTensorTable(m, tf.container == torch::Container::kLegacy);
  for (torch::Storage& s : m.storages) {
    const torch::Storage& old = located.at(s.key);
    s.present = old.present;
    s.data_offset = old.data_offset;
    s.compressed = old.compressed;
    s.record = old.record;
  }
}

bool Under(const std::string& name, const std::string& path) {
  return name == path || IsBelowKeyPath(name, path);
}

}  // namespace

StripResult StripFile(const std::string& path, const StripOptions& o) {
  StripResult r;
  r.path = path;
  r.output = o.output.empty() ? path : o.output;
  CheckpointFile f = OpenCheckpoint(path);
  r.before = r.after = f.map.size();
  if (!f.torch) Fail("{}: safetensors files hold only tensors; nothing to strip", path);
  CheckRewritable(f, o.allow_unsafe_globals);
  torch::TorchFile& tf = *f.torch;
  // Storage bytes and the names that reach them, before.
  std::map<std::string, std::pair<uint64_t, std::string>> before;
  for (const torch::Tensor& t : tf.model.tensors) {
    if (t.storage >= 0 && !before.count(tf.model.storages[t.storage].key)) {
      before[tf.model.storages[t.storage].key] = {tf.model.storages[t.storage].nbytes, t.names[0]};
    }
  }
  std::vector<std::string> dropped =
      WithContext(path, [&] { return Dropper(tf.model.graph, o).Run(); });
  for (const std::string& d : dropped) r.dropped.push_back({d, 0});
  if (dropped.empty()) {
    if (r.output != path && !o.dry_run) CopyFileAtomically(f.map, r.output);
    return r;
  }
  RebuildTensorTable(tf);
  std::set<std::string> after;
  for (const torch::Storage& s : tf.model.storages) after.insert(s.key);
  for (const auto& [key, info] : before) {
    if (after.count(key)) continue;
    for (DroppedEntry& d : r.dropped) {
      if (Under(info.second, d.path)) {
        d.bytes += info.first;
        break;
      }
    }
  }
  ShrinkPlan plan = PlanShrink(tf);
  TorchRewrite rewrite(f, std::move(plan.rewrite));
  if (rewrite.output_size() >= r.before) {
    // Never a bigger file: what goes is smaller than what rewriting the rest costs.
    r.note =
        fmt::format("without it the file would take {} bytes, not fewer than its {}; left as it is",
                    rewrite.output_size(), r.before);
    if (!o.dry_run && r.output != path) CopyFileAtomically(f.map, r.output);
    return r;
  }
  r.after = rewrite.output_size();
  if (o.dry_run) return r;
  rewrite.Write(r.output, o.threads);
  r.rewritten = true;
  return r;
}

}  // namespace ckpt
