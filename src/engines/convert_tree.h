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

// Throws ckpt::Error for an output of another format than its input (convert keeps a file's
// format; export changes it) and, unless `force`, for an output that exists.
ConvertTree PlanConvertTree(const std::vector<std::string>& paths, const std::string& output_dir,
                            const std::string& output_file, const std::string& dtype_name,
                            bool force = false);

// Copies `job.input` to `job.output` atomically. A Hugging Face config.json gets the new dtype
// ("torch_dtype" and "dtype": "bfloat16" or "float16") when `dtype_name` is given.
void CopyFile(const PathPair& job, const std::string& dtype_name = "");

// Why a folder holds nothing convert takes, when it can tell (a DeepSpeed folder holding
// tag folders: name the tag folder); "" otherwise.
std::string WhyNothingToConvert(const std::string& folder, const std::string& dtype_name);

// Rewrites an index: same content, metadata.total_size = the sum of `storage_bytes` over the
// shard files its weight_map names (by file name). Returns the new total.
uint64_t RewriteIndex(const PathPair& job, const std::map<std::string, uint64_t>& storage_bytes);

}  // namespace ckpt
