// What a checkpoint is, file by file, so that a change is seen: size, modification time,
// inode and status-change time of every file, and a content hash (CRC-32) of each torch
// file's pickle (the data.pkl record: every tensor's dtype, shape and place is in it) or,
// for any other file, of its first and last MiB.
//
// Two fingerprints are the same checkpoint when they hold the same files and each has the
// same size and modification time and either the same inode and status-change time (nothing
// touched it) or the same hash (it was copied or moved back with its time kept). A rewrite
// that kept the size and forged the time is caught by the hash, as far as the pickle or the
// file's ends show it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ckpt::policy {

struct FileState {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t inode = 0;
  std::string hash;  // "pickle:<crc32>" or "ends:<crc32>"; "" until hashed
};

// Path relative to ROOT -> state.
using Fingerprint = std::map<std::string, FileState>;

// Every regular file of ROOT/name (the file itself, or all files below the folder; symlinks
// are not followed), leaving out paths at or below `exclude` (relative to ROOT: outputs
// the policy writes inside a checkpoint folder). Nothing is read. A file that vanishes while
// the folder is walked is left out (the trainer deleted it).
Fingerprint StatCheckpoint(const std::string& root, const std::string& name,
                           const std::vector<std::string>& exclude);

// Fills in every missing hash. Hashes of `known` are reused for files whose size, times and
// inode match. A file that cannot be read keeps an empty hash.
void HashFiles(const std::string& root, Fingerprint& fp, const Fingerprint* known = nullptr);

// Is `now` the checkpoint `recorded` describes? Hashes `now` where the stat alone cannot tell.
// `what` receives the first difference.
bool SameCheckpoint(const std::string& root, Fingerprint& now, const Fingerprint& recorded,
                    std::string* what);

// Stat-only comparison (sizes, times, inodes): did anything change at all?
bool SameStat(const Fingerprint& a, const Fingerprint& b);

int64_t NewestMtimeNs(const Fingerprint& fp);
uint64_t TotalBytes(const Fingerprint& fp);

nlohmann::ordered_json ToJson(const Fingerprint& fp);
// Throws ckpt::Error when `j` is not a fingerprint.
Fingerprint FingerprintFromJson(const nlohmann::json& j);

}  // namespace ckpt::policy
