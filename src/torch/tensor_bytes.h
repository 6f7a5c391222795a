// A tensor's elements in row-major order, streamed from a mapped torch checkpoint: views
// that are contiguous are sliced straight from the map, strided ones are gathered through a
// small buffer. Memory use does not grow with the tensor.
#pragma once

#include <functional>

#include "io/mapped_file.h"
#include "torch/torch_file.h"

namespace ckpt {

bool IsContiguous(const torch::Tensor& t);

// Calls sink with consecutive pieces of the tensor's bytes (numel x element size in all).
void StreamTensorBytes(const MappedFile& map, const torch::TorchFile& tf, const torch::Tensor& t,
                       const std::function<void(Bytes)>& sink);

}  // namespace ckpt
