// Export of a LogicalModel (torch/logical_model.h): safetensors (a folder of Hugging Face
// shards and index, or one .safetensors file) or, when `to` names a torch file (.pt, .pth,
// .bin, .ckpt), one torch.save-compatible state dict. Every tensor is read range by range
// from its pieces straight into its place in the output, converted on the way when asked:
// memory stays a few MiB per thread whatever the model's size.
#pragma once

#include <string>

#include "engines/export.h"
#include "torch/logical_model.h"
#include "writers/tensor_source.h"

namespace ckpt {

// Does `to` name a torch file rather than a safetensors folder or file?
bool IsTorchOutputPath(const std::string& to);

// `t` as a tensor to write (writers/tensor_source.h) as `out`, read range by range from its pieces;
// `t` must outlive it.
TensorSource LogicalSource(const LogicalTensor& t, torch::DType out);

// `--dtype` converts every floating-point tensor (16 or 32 bits) to the given 16-bit type;
// other dtypes are written as they are.
ExportResult ExportLogical(const LogicalModel& model, const std::string& to,
                           const ExportOptions& options);

}  // namespace ckpt
