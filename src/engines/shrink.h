// `ckptool shrink`: rewrite torch checkpoints keeping only the storage bytes some tensor
// can reach (see shrink_plan.h), safely (see torch_rewrite.h).
#pragma once

#include "torch/global_policy.h"

#include <atomic>
#include <cstdint>
#include <string>

namespace ckpt {

struct ShrinkOptions {
  bool dry_run = false;
  std::string output;  // empty: replace the file in place
  unsigned threads = 1;
  bool allow_unsafe_globals = false;
  torch::Trust trust;                           // modules whose calls are accepted (--trust)
  bool materialize = false;                     // lay lone non-contiguous views out contiguously
  std::atomic<uint64_t>* bytes_done = nullptr;  // progress, may be null
};

struct ShrinkResult {
  std::string path;
  std::string output;      // where the result is (the input itself when in place)
  uint64_t before = 0;     // file size
  uint64_t after = 0;      // output file size (exact, also for --dry-run)
  bool rewritten = false;  // a new file was written
  std::string note;        // why not, when it was not
};

ShrinkResult ShrinkFile(const std::string& path, const ShrinkOptions& options);

// Does `path` hold something shrink rewrites (a torch file, zip or legacy, by its content)?
// What a folder is searched for (--checkpoint_dir, the policy's shrink step): safetensors files
// hold no views, and other files no checkpoint. Throws ckpt::Error when it cannot be read.
bool Shrinkable(const std::string& path);

}  // namespace ckpt
