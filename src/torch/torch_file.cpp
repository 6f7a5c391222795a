#include "torch/torch_file.h"

namespace ckpt::torch {

void TorchFile::AddRegion(std::string_view label, uint64_t size) {
  if (size == 0) return;
  for (Region& r : regions) {  // a handful of labels
    if (r.label == label) {
      r.size += size;
      return;
    }
  }
  regions.push_back({size, std::string(label)});
}

}  // namespace ckpt::torch
