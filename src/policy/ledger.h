// The ledger: ROOT/.ckptool/state.json, what apply and watch have done to each checkpoint, so
// that a second run does nothing and an interrupted run resumes. Rewritten atomically (temp
// file, fsync, rename, fsync of the folder) before and after every step.
//
//   {
//     "format": "ckptool-ledger", "version": 1, "updated": "2025-01-02T03:04:05.678Z",
//     "checkpoints": {
//       "<entry name in ROOT>": {
//         "step": 1000, "layout": "hf-trainer",
//         "files": {"<path relative to ROOT>": {"size": 1, "mtime_ns": 2, "ctime_ns": 3,
//                                               "inode": 4, "hash": "pickle:1a2b3c4d"}},
//         "steps": {"shrink": {"options": {...}, "at": "...", "before": 10, "after": 8,
//                              "note": "..."}, ...},
//         "running": {"step": "strip", "options": {...}, "at": "..."},   // while a step runs
//         "failed": {"step": "verify", "options": {...}, "at": "...", "error": "..."},
//         "checked": {"at": "...", "damage": ""},   // verified at "files"; "" is intact
//         "outputs": ["checkpoint-1000/bf16", "export/epoch=3-step=1000"]
//       }
//     },
//     "removed": [{"name": "...", "step": 900, "bytes": 123, "at": "...", "reason": "..."}]
//   }
//
// "files" is the checkpoint as the last finished step left it (policy outputs inside it are
// not part of it). When the files on disk differ and no step was running, someone else
// changed the checkpoint and every step runs again; when a step was running, that step (and
// the ones after it) run again and the ones before stay done. The ops are atomic per file and
// give the same bytes when run again, so either way the end state is the one an uninterrupted
// run leaves. "removed" keeps the last 1000 retention deletions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/fingerprint.h"

namespace ckpt::policy {

struct StepRecord {
  nlohmann::ordered_json options;
  std::string at;  // UTC, ISO 8601
  uint64_t before = 0;
  uint64_t after = 0;
  std::string note;
};

struct FailedRecord {
  std::string step;
  nlohmann::ordered_json options;
  std::string at;
  std::string error;
};

// What verify found in the checkpoint's bytes ("files" as they are): no step runs on a damaged
// checkpoint, and retention does not count it.
struct IntegrityRecord {
  std::string at;
  std::string damage;  // empty: intact
};

struct CheckpointRecord {
  int64_t step = -1;
  std::string layout;
  Fingerprint files;
  std::map<std::string, StepRecord> steps;
  std::optional<StepRecord> running;  // options and start time
  std::string running_step;
  std::optional<FailedRecord> failed;
  std::optional<IntegrityRecord> checked;  // cleared whenever "files" changes under us
  std::vector<std::string> outputs;        // relative to ROOT
};

struct RemovedRecord {
  std::string name;
  int64_t step = -1;
  uint64_t bytes = 0;
  std::string at;
  std::string reason;
};

class Ledger {
 public:
  // Reads ROOT/.ckptool/state.json (an empty ledger when there is none). Throws ckpt::Error
  // naming the file when it is not a ledger this version reads.
  static Ledger Load(const std::string& root);

  // Writes it atomically, creating ROOT/.ckptool when needed.
  void Save();

  const std::string& path() const { return path_; }
  std::map<std::string, CheckpointRecord>& checkpoints() { return checkpoints_; }
  std::vector<RemovedRecord>& removed() { return removed_; }

  nlohmann::ordered_json ToJson() const;

 private:
  std::string root_;
  std::string path_;
  std::map<std::string, CheckpointRecord> checkpoints_;
  std::vector<RemovedRecord> removed_;
};

// The current time as the ledger writes it: "2025-01-02T03:04:05.678Z".
std::string UtcNow();

// The folder holding the ledger (and the lock): ROOT/.ckptool.
std::string LedgerDir(const std::string& root);

// An exclusive lock on ROOT for apply and watch (flock on ROOT/.ckptool/lock), held while
// the object lives. Throws ckpt::Error naming the process that holds it.
class RootLock {
 public:
  explicit RootLock(const std::string& root);
  ~RootLock();
  RootLock(const RootLock&) = delete;
  RootLock& operator=(const RootLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace ckpt::policy
