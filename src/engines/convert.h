// `ckptool convert`: float32 tensors of the model to bfloat16 or float16, for torch
// checkpoints (which stay torch checkpoints) and safetensors files (which stay safetensors).
// Everything else in the file is untouched; tensors that share a storage are converted once
// and still alias, and only used spans are written (the shrink plan underneath).
//
// What stays as it is, unless asked for:
//   - training state (training_state.h: optimizer moments and counters, schedulers, scalers,
//     RNG state, and files that hold only those): --include-optimizer converts it too;
//   - DeepSpeed's fp32 master weights (ZeRO partitions): never;
//   - a tensor the conversion would change rather than round (kernels/conversion_loss.h:
//     values that would overflow, mostly underflow, or whole numbers that would change):
//     --lossy converts it too.
// The result lists each kept tensor and why, and what lost precision.
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
  std::vector<std::string> keep;   // tensor-name globs that stay float32
  std::vector<std::string> only;   // when set, convert only names matching one of these
  bool keep_1d = false;            // 1-D tensors (norms, biases) stay float32
  bool include_optimizer = false;  // convert training state too (never fp32 master weights)
  bool lossy = false;              // convert tensors whose values conversion would change, too
  bool dry_run = false;            // measure and plan; write nothing (`after` is exact)
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
  uint64_t kept_training = 0;  // of those, training state (not asked for)
  // Float32 tensors kept because converting would change them, and why ("optimizer.state.0.step:
  // it holds whole numbers and 1 of them would change in bfloat16").
  std::vector<std::string> kept;
  // Tensors converted although values changed beyond rounding (--lossy), or training state
  // converted (--include-optimizer) that lost values to zero or subnormals.
  std::vector<std::string> lost_precision;
  std::vector<std::string> warnings;
};

// Converts `path` into `output` (never the same file). Throws ckpt::Error.
ConvertResult ConvertFile(const std::string& path, const std::string& output,
                          const ConvertOptions& o);

// Does the tensor with these names and rank get converted under `o`?
bool SelectedForConversion(const torch::NameList& names, size_t rank, const ConvertOptions& o);

}  // namespace ckpt
