// The one verified safetensors writer, the twin of TorchRewrite: export (torch files, DeepSpeed
// ZeRO and torch.distributed.checkpoint folders) feeds it tensors as sources
// (ops/tensor_source.h). It lays the file out, writes the tensors in parallel pieces into a
// temp file, fsyncs, re-reads it and checks every tensor's bytes against the
// CRCs of what was written, and only then renames it into place. A model too large for one
// file is split into shards named and indexed as Hugging Face does.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "ops/tensor_source.h"

namespace ckpt {

struct SafetensorsModelOptions {
  uint64_t max_shard_size = 0;  // 0: one file
  unsigned threads = 1;
  std::vector<const MappedFile*> inputs;  // refused at commit if any changed meanwhile
};

struct SafetensorsModel {
  std::vector<std::string> files;  // written files, index last
  uint64_t bytes = 0;              // tensor bytes written
};

// Writes `tensors` to `to`: a folder (model.safetensors, or model-0000i-of-0000n.safetensors
// shards + model.safetensors.index.json) or a .safetensors file path. `aliases` (alias ->
// kept name) go into the __metadata__ of the shard holding the kept tensor.
SafetensorsModel WriteSafetensorsModel(const std::string& to, std::vector<TensorSource> tensors,
                                       const std::map<std::string, std::string>& aliases,
                                       const SafetensorsModelOptions& options);

}  // namespace ckpt
