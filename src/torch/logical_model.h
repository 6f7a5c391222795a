// A checkpoint as the tensors it means, whatever container holds them: a folder of rank files
// (DeepSpeed ZeRO), of chunk items (torch.distributed.checkpoint), or one file. Each logical
// tensor has a name, dtype and full shape, and produces any range of its row-major elements
// as spans of the input files' bytes, without assembling the tensor in memory. Every
// container's reader builds one (checkpoint/opened_checkpoint.h opens any container to it); export
// writes it (engines/logical_export.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/byte_cursor.h"
#include "io/mapped_file.h"
#include "torch/dtype.h"

namespace ckpt {

// Receives consecutive spans of element bytes; each holds whole elements.
using SpanSink = std::function<void(Bytes)>;

struct LogicalTensor {
  std::string name;
  torch::DType dtype = torch::DType::kFloat32;   // the tensor's
  torch::DType stored = torch::DType::kFloat32;  // the pieces' (widened to dtype on export)
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  // Calls `sink` with the stored bytes of elements [first, first + count), in row-major order, in
  // spans that together hold exactly that range. Throws ckpt::Error on unreadable input.
  std::function<void(uint64_t first, uint64_t count, const SpanSink& sink)> read;
  // A strided view (a gather): read() takes only the whole range, (0, numel).
  bool whole = false;
  // Where the stored elements start when one input holds them: the index into the model's
  // inputs and the byte offset there (-1: pieces of several files). Writers read in this order,
  // and a run of small contiguous tensors (not `whole`) is read as one range.
  int32_t input = -1;
  uint64_t offset = 0;
  // Optimizer state, schedulers, RNG... (checkpoint/training_state.h): left out of an export unless
  // asked for. Set by the opener.
  bool training = false;
};

struct LogicalModel {
  std::string description;  // one line: what was read
  std::vector<LogicalTensor> tensors;
  // alias -> owner: other names of a tensor (tied weights), in the source's order; the owner is
  // the first name the source gives the tensor.
  std::vector<std::pair<std::string, std::string>> aliases;
  std::vector<const MappedFile*> inputs;  // outputs are refused if any changes meanwhile
  std::vector<std::string> warnings;
};

}  // namespace ckpt
