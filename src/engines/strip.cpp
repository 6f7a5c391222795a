#include "engines/strip.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "base/error.h"
#include "base/names.h"
#include "checkpoint/discovery.h"
#include "checkpoint/training_state.h"
#include "deepspeed/zero_checkpoint.h"
#include "file/checkpoint_file.h"
#include "io/file_copy.h"
#include "io/mapped_file.h"
#include "io/temp_files.h"
#include "pickle/path_walker.h"
#include "rewriters/rewritable.h"
#include "rewriters/shrink_plan.h"
#include "rewriters/torch_rewrite.h"

namespace ckpt {

namespace fs = std::filesystem;
using pickle::NodeId;
using pickle::PathWalker;

namespace {

// ZeRO-3 keeps only placeholders in its model states files: the optimizer states files hold
// the one copy of the trainable weights (fp32 partitions), so they are not training-only.
// A folder that cannot be read as a ZeRO checkpoint keeps them too.
bool OptimizerFilesHoldTheWeights(const std::string& folder) {
  if (!deepspeed::LooksLikeZeroCheckpoint(folder)) return false;
  try {
    return deepspeed::OpenZeroCheckpoint(folder).stage == 3;
  } catch (const Error&) {
    return true;
  }
}

}  // namespace

std::vector<std::string> TrainingOnlyFiles(const std::string& folder) {
  std::vector<std::string> out;
  std::map<std::string, bool> holds_weights;  // folder -> OptimizerFilesHoldTheWeights
  for (const auto& e : fs::recursive_directory_iterator(folder)) {
    if (!e.is_regular_file() || e.is_symlink() || !IsTrainingOnlyFile(e.path().string())) continue;
    if (e.path().filename().string().ends_with("optim_states.pt")) {
      std::string parent = e.path().parent_path().string();
      auto [it, fresh] = holds_weights.try_emplace(parent, false);
      if (fresh) it->second = OptimizerFilesHoldTheWeights(parent);
      if (it->second) continue;
    }
    out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

StripTargets CollectStripTargets(const std::vector<std::string>& paths) {
  StripTargets t;
  for (const std::string& p : paths) {
    if (fs::is_directory(p)) {
      std::vector<std::string> training = TrainingOnlyFiles(p);
      t.training_files.insert(t.training_files.end(), training.begin(), training.end());
      for (const std::string& f : ExpandInputs({p}, nullptr, &t.dcp_folders)) {
        // The model's safetensors files (Hugging Face) have nothing to strip.
        if (IsTrainingOnlyFile(f) || f.ends_with(".safetensors")) continue;
        t.files.push_back(f);
      }
    } else {
      t.files.push_back(p);
    }
  }
  // Files beside a torch.distributed.checkpoint folder's items (Megatron's common.pt) are
  // part of it: its strip copies them as they are. Folders compared by canonical path, each
  // computed once.
  std::set<std::string> dcp_canonical;
  for (const std::string& d : t.dcp_folders) {
    std::error_code ec;
    dcp_canonical.insert(fs::weakly_canonical(d, ec).string());
  }
  std::erase_if(t.files, [&](const std::string& f) {
    std::error_code ec;
    fs::path parent = fs::path(f).parent_path();
    return dcp_canonical.count(fs::weakly_canonical(parent.empty() ? "." : parent, ec).string()) >
           0;
  });
  return t;
}

size_t CopyRestOfFolder(const std::string& source, const std::string& into,
                        const std::vector<std::string>& written,
                        const std::vector<std::string>& left_out) {
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(source, ec);
  std::set<fs::path> skip;
  for (const auto* list : {&written, &left_out}) {
    for (const std::string& p : *list) skip.insert(fs::weakly_canonical(p, ec));
  }
  size_t copied = 0;
  for (auto it = fs::recursive_directory_iterator(base); it != fs::recursive_directory_iterator();
       ++it) {
    const fs::path& p = it->path();
    const fs::path to = fs::path(into) / p.lexically_relative(base);
    if (skip.count(p) || IsTempFileName(p.filename().string())) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink(ec)) {
      fs::create_directories(to.parent_path());
      fs::copy_symlink(p, to);
    } else if (it->is_directory(ec)) {
      fs::create_directories(to);
    } else if (it->is_regular_file(ec)) {
      fs::create_directories(to.parent_path());
      CopyFileAtomically(MappedFile::Open(p.string()), to.string());
      ++copied;
    }  // sockets, fifos, devices: not part of a checkpoint
  }
  return copied;
}

namespace {

bool IsTensorCall(const pickle::Graph& g, NodeId n) {
  NodeId fn = g.CalledGlobal(n);
  if (fn == pickle::kNil) return false;
  std::string_view m = g.global_module(fn);
  return m == "torch._utils" || m == "torch._tensor";
}

// Could a --keep glob match some key path below `path`?
bool CanKeepBelow(const StripOptions& o, const std::string& path) {
  for (const std::string& k : o.keep) {
    if (GlobCanMatchBelow(k, path)) return true;
  }
  return false;
}

// Does some key path below the walker's path match a --keep glob? Probes below a node (a
// PathWalker::Probe) only where a keep glob can still match, and stops at the first match.
class KeepProbe final : private PathWalker::Client {
 public:
  KeepProbe(const pickle::Graph& g, const StripOptions& o, PathWalker& w) : g_(g), o_(o), w_(w) {}

  bool KeepsSomethingBelow(NodeId n) { return CanKeepBelow(o_, w_.path()) && w_.Probe(n, *this); }

 private:
  void Node(NodeId n, bool) override {
    if (IsTensorCall(g_, n)) return;
    auto judge = [this](size_t) {
      if (MatchesAnyGlob(o_.keep, w_.path())) {
        w_.Stop();
        return false;
      }
      return CanKeepBelow(o_, w_.path());
    };
    w_.Entries(n, judge);
    w_.Items(n, judge);
    w_.States(n, PathWalker::StateParts::kAtObjectPath);
  }

  const pickle::Graph& g_;
  const StripOptions& o_;
  PathWalker& w_;
};

// Removes matching dict entries (and object attributes) from the graph. A dict reachable by
// several paths is one dict (torch.load returns one object), so an entry goes only when some
// path wants it dropped and no path protects it: the graph is first walked by every path
// (a PathWalker, within its PathBudget) to judge each entry, then the entries judged dropped
// are removed.
class Dropper final : private PathWalker::Client {
 public:
  Dropper(pickle::Graph& g, const StripOptions& o)
      : g_(g), o_(o), walker_(g), keep_probe_(g, o, walker_) {}

  std::vector<std::string> Run() {
    walker_.Run(g_.root, *this);
    std::vector<std::string> dropped;
    for (const auto& [entry, path_index] : wanted_order_) {
      if (protected_.count(entry)) continue;
      dropped.push_back(wanted_paths_[path_index]);
      dropped_entries_[entry >> 32].push_back(static_cast<uint32_t>(entry));
    }
    for (auto& [node, pair_indexes] : dropped_entries_) {
      std::sort(pair_indexes.begin(), pair_indexes.end());
      std::span<const NodeId> pairs = g_.pairs(static_cast<NodeId>(node));
      std::vector<NodeId> kept;
      size_t next = 0;
      for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
        if (next < pair_indexes.size() && pair_indexes[next] == i) {
          ++next;
          continue;
        }
        kept.push_back(pairs[i]);
        kept.push_back(pairs[i + 1]);
      }
      g_.SetPairs(static_cast<NodeId>(node), kept);
    }
    return dropped;
  }

 private:
  // The default drops are top-level keys: paths one key long, however many BUILD states
  // lead to the dict that holds them (the attributes of a top-level object are top-level).
  bool WantsDrop(const std::string& path, uint32_t key_depth) const {
    return o_.drop.empty()
               ? key_depth == 1 && std::find(DefaultDropKeys().begin(), DefaultDropKeys().end(),
                                             path) != DefaultDropKeys().end()
               : MatchesAnyGlob(o_.drop, path);
  }

  void Node(NodeId n, bool) override {
    if (IsTensorCall(g_, n)) return;
    // The default drops are top-level keys: nothing below them needs walking.
    bool descend = !o_.drop.empty();
    // Below an entry this path drops, nothing more is reached through this path.
    walker_.Entries(n, [&](size_t i) { return !Judge(n, i) && descend; });
    if (descend) walker_.Items(n);
    walker_.States(n, PathWalker::StateParts::kAtObjectPath);
  }

  // Entry `i` of `n` (its key pairs[i]), the walker's path ending in its key: is it kept,
  // wanted dropped, or neither? Returns whether this path drops it.
  bool Judge(NodeId n, size_t i) {
    const std::string& path = walker_.path();
    uint64_t entry = (uint64_t{n} << 32) | i;
    bool keep = MatchesAnyGlob(o_.keep, path);
    bool drop = !keep && WantsDrop(path, walker_.key_depth());
    if (drop && keep_probe_.KeepsSomethingBelow(g_.pairs(n)[i + 1])) {
      drop = false;  // it stays; what below it is not kept goes
      keep = true;
    }
    if (keep) protected_.insert(entry);
    if (drop && wanted_seen_.insert(entry).second) {
      wanted_order_.emplace_back(entry, wanted_paths_.size());
      wanted_paths_.push_back(path);
    }
    return drop;
  }

  pickle::Graph& g_;
  const StripOptions& o_;
  PathWalker walker_;
  KeepProbe keep_probe_;
  // Entries are (node << 32 | pair index).
  std::unordered_set<uint64_t> protected_;
  std::unordered_set<uint64_t> wanted_seen_;
  std::vector<std::pair<uint64_t, size_t>> wanted_order_;  // entry, first path wanting it
  std::vector<std::string> wanted_paths_;
  std::map<uint64_t, std::vector<uint32_t>> dropped_entries_;  // node -> pair indexes
};

// Rebuilds the tensor table of a mutated graph, keeping where each storage's bytes are
// (looked up by key in what the old rows said: their keys and 16 bytes each).
void RebuildTensorTable(torch::TorchFile& tf) {
  torch::Model& m = tf.model;
  struct Located {
    uint64_t data_offset;
    int32_t entry;
    bool present;
    bool compressed;
  };
  std::vector<std::string> keys;
  std::vector<Located> located;
  keys.reserve(m.storages.size());
  located.reserve(m.storages.size());
  for (torch::Storage& s : m.storages) {
    keys.push_back(std::move(s.key));
    located.push_back({s.data_offset, s.entry, s.present, s.compressed});
  }
  NameIndex by_key = std::move(m.storage_index);  // indexes the old rows, so `keys` too
  m.storages.clear();
  m.tensors.clear();
  m.problems.clear();
  m.notes.clear();
  m.bare_refs.clear();
  torch::BuildTensorTable(m, tf.container == torch::Container::kLegacy);
  auto key_of = [&keys](uint32_t k) -> std::string_view { return keys[k]; };
  for (torch::Storage& s : m.storages) {
    uint32_t i = by_key.Find(s.key, key_of);
    if (i == NameIndex::kNone) Fail("internal: storage '{}' is not one of the input's", s.key);
    s.present = located[i].present;
    s.data_offset = located[i].data_offset;
    s.compressed = located[i].compressed;
    s.entry = located[i].entry;
  }
}

}  // namespace

std::vector<std::string> StripGraph(pickle::Graph& g, const StripOptions& options) {
  return Dropper(g, options).Run();
}

StripResult StripFile(const std::string& path, const StripOptions& o) {
  StripResult r;
  r.path = path;
  r.output = o.output.empty() ? path : o.output;
  CheckpointFile f = OpenCheckpoint(path);
  r.before = r.after = f.map.size();
  if (!f.torch) {
    // The model weights of a Hugging Face checkpoint: kept as they are (copied to -o).
    r.note = "safetensors files hold only tensors: nothing to strip";
    if (!o.dry_run && r.output != path) CopyFileAtomically(f.map, r.output);
    return r;
  }
  CheckRewritable(f, o.allow_unsafe_globals, o.trust, o.threads);
  torch::TorchFile& tf = *f.torch;
  {
    // Storage bytes and every name that reaches them, before; what went is credited to the
    // dropped entries, and these tables are freed before the rewrite (they hold every name).
    std::map<std::string, std::pair<uint64_t, std::vector<std::string>>> before;
    for (const torch::Tensor& t : tf.model.tensors) {
      if (t.storage < 0) continue;
      auto& [bytes, names] = before[tf.model.storages[t.storage].key];
      bytes = tf.model.storages[t.storage].nbytes;
      names.insert(names.end(), t.names.begin(), t.names.end());
    }
    std::vector<std::string> dropped =
        WithContext(path, [&] { return StripGraph(tf.model.graph, o); });
    for (const std::string& d : dropped) r.dropped.push_back({d, 0});
    if (dropped.empty()) {
      if (r.output != path && !o.dry_run) CopyFileAtomically(f.map, r.output);
      return r;
    }
    RebuildTensorTable(tf);
    std::set<std::string> after;
    for (const torch::Storage& s : tf.model.storages) after.insert(s.key);
    // A storage that went is credited to a dropped entry one of its names lies under (found by
    // looking the name's dotted prefixes up: linear in names, however many entries went).
    std::unordered_map<std::string_view, size_t> dropped_at;
    for (size_t i = 0; i < r.dropped.size(); ++i) dropped_at.emplace(r.dropped[i].path, i);
    for (const auto& [key, info] : before) {
      if (after.count(key)) continue;
      size_t credited = SIZE_MAX;
      for (const std::string& name : info.second) {
        for (std::string_view prefix = name; credited == SIZE_MAX && !prefix.empty();) {
          auto it = dropped_at.find(prefix);
          if (it != dropped_at.end()) credited = std::min(credited, it->second);
          size_t dot = prefix.rfind('.');
          if (dot == std::string_view::npos) break;
          prefix = prefix.substr(0, dot);
        }
      }
      if (credited != SIZE_MAX) r.dropped[credited].bytes += info.first;
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

void WriteObjectOf(const std::string& input, const std::string& output,
                   const std::function<void(pickle::Graph&)>& edit, unsigned threads) {
  CheckpointFile f = OpenCheckpoint(input);
  if (!f.torch) Fail("{}: not a torch file", input);
  torch::TorchFile& tf = *f.torch;
  WithContext(input, [&] { edit(tf.model.graph); });
  RebuildTensorTable(tf);
  ShrinkPlan plan = PlanShrink(tf);
  TorchRewrite rewrite(f, std::move(plan.rewrite));
  rewrite.Write(output, threads);
}

}  // namespace ckpt
