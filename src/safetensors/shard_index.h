// Hugging Face's index of a sharded checkpoint (model.safetensors.index.json,
// pytorch_model.bin.index.json): {"metadata": {"total_size": N}, "weight_map": {tensor:
// shard file}} (huggingface_hub serialization/_base.py).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/volume.h"

namespace ckpt::safetensors {

// The shard file names `path`'s weight_map names, sorted, each once; empty when the file is
// no such index (not JSON, no weight_map object).
std::vector<std::string> WeightMapFiles(const std::string& path, const Volume& volume = Disk());

// The whole weight_map, shard file -> the tensor names mapped to it (in the index's order);
// empty when the file is no such index.
std::map<std::string, std::vector<std::string>> WeightMap(const std::string& path,
                                                          const Volume& volume = Disk());

}  // namespace ckpt::safetensors
