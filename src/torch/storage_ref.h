// Decoding torch's persistent ids: ('storage', <StorageClass>, key, location, numel[, view]).
#pragma once

#include <optional>
#include <string>

#include "pickle/graph.h"
#include "torch/dtype.h"

namespace ckpt::torch {

struct StorageRef {
  std::string key;
  DType dtype = DType::kUntyped;
  std::string location;
  uint64_t numel = 0;
  // Legacy view metadata (view_key, offset, size), in elements.
  bool is_view = false;
  std::string view_key;
  uint64_t view_offset = 0;
  uint64_t view_size = 0;
};

// Returns the decoded reference, or throws ckpt::Error saying what is malformed.
StorageRef DecodeStorageRef(const pickle::Graph& g, pickle::NodeId persid);

}  // namespace ckpt::torch
