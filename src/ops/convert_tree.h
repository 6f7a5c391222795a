// What `ckptool convert` does with the paths it is given:
//   a file   -> converted to -o FILE, or into --output-dir;
//   a folder -> every checkpoint at its top level is converted into --output-dir (default
//               <folder>/bf16 or <folder>/fp16); every other file (config.json, tokenizer
//               files...) is copied; index files (*.index.json with a weight_map) are
//               rewritten with the new metadata.total_size.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ckpt {

// An input file and where its result goes.
struct PathPair {
  std::string input;
  std::string output;
};

struct ConvertTree {
  std::vector<PathPair> checkpoints;
  std::vector<PathPair> copies;
  std::vector<PathPair> indexes;
};

ConvertTree PlanConvertTree(const std::vector<std::string>& paths, const std::string& output_dir,
                            const std::string& output_file, const std::string& dtype_name);

// Copies `job.input` to `job.output` atomically.
void CopyFile(const PathPair& job);

// Rewrites an index: same content, metadata.total_size = the sum of `storage_bytes` over the
// shard files its weight_map names (by file name). Returns the new total.
uint64_t RewriteIndex(const PathPair& job, const std::map<std::string, uint64_t>& storage_bytes);

}  // namespace ckpt
