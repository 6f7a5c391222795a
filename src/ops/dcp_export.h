// `ckptool export <torch.distributed.checkpoint folder>`: full tensors assembled from their
// chunks straight into their place in the output (ops/logical_export.h), never a whole tensor
// in memory. Names are fqns relative to the selected prefix: --select, else the first of
// state_dict, module, model_state_dict, model that holds tensors, else every fqn but the
// optimizer state (top keys strip drops by default).
#pragma once

#include <string>

#include "ops/export.h"

namespace ckpt {

ExportResult ExportDcp(const std::string& folder, const std::string& to,
                       const ExportOptions& options);

}  // namespace ckpt
