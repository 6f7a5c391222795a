// `ckptool export <DeepSpeed ZeRO checkpoint>`: the consolidated model zero_to_fp32.py would
// build (deepspeed/zero_checkpoint.h), written as safetensors straight from the rank files:
// each tensor's pieces are copied (or converted) into their place in the output, a few MiB
// per thread at a time, so memory does not grow with the model.
#pragma once

#include <string>

#include "deepspeed/zero_checkpoint.h"
#include "ops/export.h"
#include "torch/logical_model.h"

namespace ckpt {

// The consolidated model as logical tensors whose spans are pieces of the rank files (which
// `z` keeps mapped: it must outlive the model).
LogicalModel ZeroLogicalModel(const deepspeed::ZeroCheckpoint& z, bool exclude_frozen);

ExportResult ExportZero(const std::string& path, const std::string& to,
                        const ExportOptions& options);

}  // namespace ckpt
