// When a checkpoint is complete: apply and watch never touch one that is still being written.
//
// A checkpoint (an entry of ROOT that prune recognises by the step in its name) is complete
// when all of these hold:
//   1. its framework's marker is there (the policy's `layout`, or detected per entry):
//        DeepSpeed    ROOT/latest names this tag or one with a higher step (DeepSpeed writes
//                     it after every rank has saved)
//        HF Trainer   checkpoint-N/trainer_state.json (the Trainer writes it last)
//        Megatron     ROOT/latest_checkpointed_iteration.txt holds N or more (iter_N)
//        DCP          every folder holding .distcp files also holds .metadata (or
//                     __<rank>.metadata), which the coordinator writes after all data
//        Lightning    a .ckpt file: no marker; it must be closed (below)
//        plain        no marker
//   2. no file in it is open for writing by a process we can see (/proc/<pid>/fd);
//   3. nothing in it changed for the settle time: every file's modification time is that old,
//      and (watch) its sizes, times and inodes stayed the same across our own observations
//      for that long, so a clock that disagrees with the file server cannot cut it short;
//   4. it opens cleanly, as prune requires (every torch file parses; no temp files).
// The expensive check (4) runs only when 1-3 hold and is remembered until the files change.
// A checkpoint whose files are exactly as the ledger recorded them after its last step needs
// only 1 and 2 (it was complete then; the settle time is not restarted by our own rewrites).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "policy/fingerprint.h"
#include "policy/policy.h"

namespace ckpt::policy {

// Files some process holds open for writing, by inode, on device `dev`: inode -> "pid N (comm)".
std::map<ino_t, std::string> FilesOpenForWriting(dev_t dev);

class Completeness {
 public:
  struct Options {
    Layout layout = Layout::kAuto;
    double settle_seconds = 30;
    bool observe = false;  // watch: also require stability across our own observations
    // Paths (relative to ROOT) inside a checkpoint that are the policy's outputs, not part of
    // it (they are left out of its fingerprint).
    std::function<std::vector<std::string>(const std::string& name)> outputs_inside;
    // The files as the ledger recorded them after the last step (null when none): a checkpoint
    // still exactly so (same sizes, times and inodes) was complete then and is now; our own
    // rewrites do not restart its settle time, and it is not parsed again.
    std::function<const Fingerprint*(const std::string& name)> recorded;
    // Was a step of ours running on it when a run was killed? It was complete when the step
    // began and only we changed it since: the settle time does not apply (1, 2 and 4 do).
    std::function<bool(const std::string& name)> interrupted;
  };

  Completeness(std::string root, const Options& options);

  // Starts a pass: markers and open files are read again.
  void BeginPass();

  // prune's CompletenessTest: is ROOT/<name> complete? `why` says what it waits for. One whose
  // framework marker is written and that has settled is complete even when a file in it does
  // not open: that is damage, for the integrity check to report.
  bool Complete(const std::string& path, std::string* why);

  // The layout(s) seen for an entry in this pass ("deepspeed", "hf-trainer+dcp"...).
  std::string LayoutOf(const std::string& name) const;
  // The stat fingerprint taken in this pass (null when the entry was not examined).
  const Fingerprint* StatOf(const std::string& name) const;
  // Seconds until a checkpoint waiting only for the settle time may be ready; empty when none
  // waits for time alone.
  std::optional<double> NextSettle() const { return next_settle_; }

 private:
  std::string MarkerMissing(const std::string& name, bool folder, int64_t step,
                            std::string* layout) const;

  struct Seen {
    Fingerprint stat;
    std::chrono::steady_clock::time_point since;
  };
  struct Parsed {
    Fingerprint stat;
    bool ok = false;
    std::string why;
  };

  std::string root_;
  Options o_;
  dev_t dev_ = 0;
  std::string latest_;    // DeepSpeed: what ROOT/latest names ("" when absent)
  std::string megatron_;  // what latest_checkpointed_iteration.txt says ("" when absent)
  bool have_latest_ = false;
  bool have_megatron_ = false;
  std::map<ino_t, std::string> writers_;
  std::map<std::string, Fingerprint> stats_;    // this pass
  std::map<std::string, std::string> layouts_;  // this pass
  std::map<std::string, Seen> seen_;            // across passes (watch)
  std::map<std::string, Parsed> parsed_;        // across passes
  std::optional<double> next_settle_;
};

}  // namespace ckpt::policy
