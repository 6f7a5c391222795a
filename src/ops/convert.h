// `ckptool convert`: float32 tensors to bfloat16 or float16, for torch checkpoints (which stay
// torch checkpoints) and safetensors files (which stay safetensors). Everything else in the
// file is untouched; tensors that share a storage are converted once and still alias, and
// only used spans are written (the shrink plan underneath).
#pragma once

#include "torch/global_policy.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/float_convert.h"
#include "torch/name_list.h"

namespace ckpt {

struct ConvertOptions {
  kernels::Half to = kernels::Half::kBFloat16;
  std::vector<std::string> keep;  // tensor-name globs that stay float32
  std::vector<std::string> only;  // when set, convert only names matching one of these
  bool keep_1d = false;           // 1-D tensors (norms, biases) stay float32
  unsigned threads = 1;
  bool allow_unsafe_globals = false;
  torch::Trust trust;  // modules whose calls are accepted (--trust)
  std::atomic<uint64_t>* bytes_done = nullptr;
};

struct ConvertResult {
  std::string path;
  std::string output;
  uint64_t before = 0;  // file sizes
  uint64_t after = 0;
  uint64_t storage_bytes = 0;  // tensor data in the output, each storage once
  uint64_t converted = 0;      // tensors converted
  uint64_t kept_float32 = 0;   // float32 tensors left as they were
  std::vector<std::string> warnings;
};

// Converts `path` into `output` (never the same file). Throws ckpt::Error.
ConvertResult ConvertFile(const std::string& path, const std::string& output,
                          const ConvertOptions& o);

// Does the tensor with these names and rank get converted under `o`?
bool SelectedForConversion(const torch::NameList& names, size_t rank, const ConvertOptions& o);

}  // namespace ckpt
