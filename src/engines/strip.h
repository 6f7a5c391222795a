// `ckptool strip`: remove training-only entries (optimizer and scheduler state, grad scaler,
// RNG state...) from a checkpoint's object by key path; storages nothing references any more
// disappear, the rest is written as shrink writes it (used spans only, aliasing kept).
#pragma once

#include "checkpoint/training_state.h"
#include "torch/global_policy.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ckpt {

namespace pickle {
class Graph;
}

struct StripOptions {
  std::vector<std::string> drop;  // key-path globs; empty: the known training-only entries
  std::vector<std::string> keep;  // key-path globs that are never dropped
  bool dry_run = false;
  std::string output;  // empty: in place
  unsigned threads = 1;
  bool allow_unsafe_globals = false;
  torch::Trust trust;  // modules whose calls are accepted (--trust)
};

struct DroppedEntry {
  std::string path;
  uint64_t bytes = 0;  // storage bytes that went with it
};

struct StripResult {
  std::string path;
  std::string output;
  uint64_t before = 0;
  uint64_t after = 0;
  std::vector<DroppedEntry> dropped;
  bool rewritten = false;
  std::string note;  // why nothing was written although something could go
};

StripResult StripFile(const std::string& path, const StripOptions& options);

// Writes to `output` (a new file) the object `edit` leaves in the graph of the torch file
// `input`: `edit` may change entries and the root (a part of the object becomes the file); the
// storages the result still refers to are written as shrink writes them. For files made from
// part of another (a universal checkpoint's optimizer_state.pt and step.pt).
void WriteObjectOf(const std::string& input, const std::string& output,
                   const std::function<void(pickle::Graph&)>& edit, unsigned threads);

// The object part of StripFile: removes from `g` the dict entries (and object attributes)
// `options.drop` and `options.keep` say go; returns their key paths in the order StripFile
// reports them.
std::vector<std::string> StripGraph(pickle::Graph& g, const StripOptions& options);

// Files in a checkpoint folder that only training needs (training_state.h), recursively,
// sorted; a ZeRO-3 folder's optimizer files hold the only copy of its weights and stay.
std::vector<std::string> TrainingOnlyFiles(const std::string& folder);

// What strip works on for the paths it is given: files as given; below folders, every
// checkpoint file but the training-only ones, each torch.distributed.checkpoint folder as one
// (files beside its items, such as Megatron's common.pt, are part of it), and the folders'
// training-only files (deleted only on request).
struct StripTargets {
  std::vector<std::string> files;
  std::vector<std::string> dcp_folders;
  std::vector<std::string> training_files;
};
StripTargets CollectStripTargets(const std::vector<std::string>& paths);

// `strip FOLDER -o OUT` writes a copy of FOLDER: its checkpoint files stripped, its
// training-only files left out, everything else as it is. This copies that everything else
// into `into` (files, links as links, subfolders): all of `source` but `written` (the files
// and torch.distributed.checkpoint folders strip writes itself), `left_out` and temp files.
// Returns the number of files copied.
size_t CopyRestOfFolder(const std::string& source, const std::string& into,
                        const std::vector<std::string>& written,
                        const std::vector<std::string>& left_out);

}  // namespace ckpt
