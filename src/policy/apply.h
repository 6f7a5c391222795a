// `ckptool apply` and `ckptool watch`: a policy (policy/policy.h) run over the checkpoints of
// a folder, each step done once per checkpoint and recorded in the ledger (policy/ledger.h).
//
// One pass:
//   1. plan retention with prune's own planner (PlanPrune), completeness decided by
//      policy/completeness.h: the newest complete checkpoint, the newest N, multiples of K,
//      keep globs and whatever latest / best / a symlink points at are kept; checkpoints that
//      are not complete yet are kept and not counted;
//   2. forget ledger entries whose checkpoint is gone (the trainer deleted it);
//   3. delete what retention does not keep: the checkpoint's outputs outside it first, then
//      the checkpoint (renamed to a trash name, then removed, as prune does), then the ledger;
//   4. for each complete checkpoint kept, oldest first, the steps it still needs, in order
//      shrink, convert, export, verify (then strip and compress once it is older than the
//      newest N): the ledger is written before a step starts and after it ends.
// A checkpoint that fails verify (checkpoint/integrity.h; recorded in the ledger at its files) is
// reported, kept, not counted by retention, and no step runs on it.
// Each step calls the op the command of the same name runs (ShrinkFile, StripFile / StripDcp,
// PlanConvertTree + ConvertFile, Export, Verify / VerifyDcp / OpenZeroCheckpoint).
//
// Stopping: when *stop becomes true the current step is finished and the pass returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/policy.h"

namespace ckpt {

// One thing apply did, would do, or waits for.
struct ApplyEvent {
  // "delete", "step", "wait", "failed", "damaged", "skip", "gone", "changed", "resume", "note"
  std::string kind;
  std::string checkpoint;  // entry name in ROOT ("" for the root)
  std::string step;        // step name, or "retention"
  std::string message;
  bool dry_run = false;
  uint64_t before = 0;  // bytes, when the action has sizes
  uint64_t after = 0;
  nlohmann::ordered_json details = nlohmann::ordered_json::object();
};

struct ApplyOptions {
  bool dry_run = false;
  // Retention deletes only with --yes or `delete = true` in [retention]; otherwise it says
  // what it would delete.
  bool yes = false;
  bool retry_failed = false;  // run steps again that failed on unchanged files
  unsigned threads = 1;
  double settle_seconds = 30;
  bool observe = false;                     // watch: completeness also needs our own observations
  const std::atomic<bool>* stop = nullptr;  // finish the current step, then return
  std::function<void(const ApplyEvent&)> log;
  // Checkpoints (entry names in ROOT) a trainer still needs, left as they are this pass:
  // retention keeps them and no step runs on them (HF's best checkpoint until training ends).
  std::vector<std::string> hold;
};

struct PassResult {
  size_t steps_run = 0;
  size_t deleted = 0;
  size_t not_confirmed = 0;  // retention would delete, but no --yes nor `delete = true`
  size_t failures = 0;       // failed now, or failed earlier and not retried
  size_t waiting = 0;        // checkpoints not complete yet
  size_t damaged = 0;        // checkpoints that fail verify (also counted in failures)
  uint64_t bytes_freed = 0;  // retention + in-place steps (dry run: what would be)
  bool stopped = false;
  std::optional<double> next_settle;  // seconds until a settling checkpoint may be ready
};

class Applier {
 public:
  // Takes the lock on ROOT (RootLock) and reads the ledger. Throws ckpt::Error.
  Applier(std::string root, policy::Policy policy, ApplyOptions options);
  ~Applier();
  Applier(const Applier&) = delete;
  Applier& operator=(const Applier&) = delete;

  PassResult RunPass();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ckpt
