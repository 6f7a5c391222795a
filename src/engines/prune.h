// `ckptool prune`: a retention policy for a folder of checkpoints that cannot make the usual
// mistakes: steps are compared as numbers (step 900 < step 1000), the newest checkpoint and
// every checkpoint something points at (DeepSpeed `latest`, Megatron
// `latest_checkpointed_iteration.txt`, HF `best_model_checkpoint`, symlinks such as
// Lightning's `last.ckpt`) are always kept, incomplete-looking checkpoints are reported and
// left alone, and deletion first renames an entry to a hidden trash name so a crash never
// leaves a half-deleted checkpoint under a valid name.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ckpt {

struct PruneOptions {
  uint64_t keep_last = 0;         // must be >= 1
  uint64_t keep_every = 0;        // 0: off
  std::vector<std::string> keep;  // name globs always kept
  uint64_t strip_older = 0;       // 0: off; else strip kept checkpoints older than the newest M
  bool yes = false;               // false: dry run
  unsigned threads = 1;
  // The damage test of the checkpoints that would count: the structure of each (a cut file, a
  // missing shard or rank), and with `checksums` every byte against its CRC32 too.
  bool checksums = false;
};

struct PruneEntry {
  std::string name;  // entry in ROOT
  // Other entries that are the same checkpoint and go with it: NAME.ckz, the archive
  // `ckptool compress` made of it while the original was kept.
  std::vector<std::string> also;
  bool archive = false;  // the entry is a .ckz archive (compressed checkpoint)
  // Lightning's last.ckpt (last-vN.ckpt) written as a file: a copy of the newest state, the one
  // `fit(ckpt_path="last")` resumes from. Always kept, ranked with the newest, never stripped.
  bool latest_copy = false;
  uint64_t step = 0;
  uint64_t bytes = 0;
  bool keep = false;
  bool complete = true;
  // Fails verify (checkpoint/integrity.h): kept as evidence, never counted among the newest N,
  // never stripped. Only the checkpoints that could count are checked (from the newest until N
  // intact ones are found): the older ones go or stay by the other rules, whatever their bytes.
  bool damaged = false;
  std::string reason;  // why it is kept (or why it goes)
  bool stripped = false;
  uint64_t bytes_after = 0;  // after --strip-older
};

struct PruneResult {
  std::vector<PruneEntry> entries;  // oldest first
  uint64_t bytes_freed = 0;
  std::vector<std::string> notes;
};

PruneResult Prune(const std::string& root, const PruneOptions& options);

// Prune in two halves, for callers that decide completeness themselves (ckptool apply/watch
// also wait for the framework's marker and a settle time). `complete` replaces
// LooksComplete when given. PlanPrune touches nothing and returns no entries (instead of
// failing) when ROOT holds no checkpoints; ExecutePrune removes what earlier runs left in the
// trash, deletes every entry the plan does not keep, then strips (strip_older).
// `intact` replaces prune's own damage test (FindDamage: what verify reports, bar unsafe
// pickles) when given; it is asked only of the checkpoints that would count among the newest.
using CompletenessTest = std::function<bool(const std::string& path, std::string* why)>;
PruneResult PlanPrune(const std::string& root, const PruneOptions& options,
                      const CompletenessTest& complete = {}, const CompletenessTest& intact = {});
void ExecutePrune(const std::string& root, PruneResult& plan, const PruneOptions& options);

// prune's own test: every checkpoint file in it opens cleanly (and a folder holds at least
// one, with no half-written temp files).
bool LooksComplete(const std::string& path, std::string* why);

// Deletes dir/name (a file or a folder): renamed to a hidden trash name first, so a crash
// never leaves half of it under its name; then removed. Throws ckpt::Error.
void TrashEntry(const std::string& dir, const std::string& name);
// Is this entry name one TrashEntry left behind?
bool IsTrashName(const std::string& name);

// Lightning's name for its copy of the newest checkpoint: last.ckpt, last-v1.ckpt...
bool IsLastCheckpointName(const std::string& name);

// The training step a checkpoint's name carries, or -1 when it does not look like one.
// A compressed checkpoint (`global_step1000.ckz`, `epoch=3-step=900.ckpt.ckz`) carries the
// step of the name it was compressed from.
int64_t StepFromName(const std::string& name);

// "global_step1000" for "global_step1000.ckz" when that name carries a step; "" otherwise.
std::string ArchivedCheckpointName(const std::string& name);

}  // namespace ckpt
