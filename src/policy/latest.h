// `ckptool latest ROOT`: the newest checkpoint under ROOT to resume from. Checkpoints are the
// entries prune recognises by the step in their names, newest step first; the first that is
// complete (policy/completeness.h: its framework's marker written, nothing open for writing;
// no settle time: training is not running when one resumes) and verifies (checkpoint/integrity.h:
// nothing of what verify checks is damaged) is the answer. A compressed checkpoint (NAME.ckz)
// is passed over: a trainer cannot resume from it until it is decompressed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt::policy {

struct Skipped {
  std::string name;  // entry in ROOT
  int64_t step = -1;
  std::string reason;
};

struct LatestResult {
  std::string path;  // ROOT/NAME; empty when no checkpoint qualifies
  std::string name;  // NAME
  int64_t step = -1;
  std::vector<Skipped> skipped;  // newer than the answer (or all of them), newest first
  size_t candidates = 0;         // checkpoints recognised under ROOT
};

// Throws ckpt::Error when ROOT is not a folder. `checksums` false: structure only (sizes,
// headers, ranks, chunks, shards, a manifest's names and sizes), no data byte read.
LatestResult FindLatest(const std::string& root, unsigned threads, bool checksums = true);

}  // namespace ckpt::policy
