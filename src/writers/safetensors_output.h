// The one verified safetensors writer, the twin of TorchRewrite: export (torch files, DeepSpeed
// ZeRO and torch.distributed.checkpoint folders) feeds it tensors as sources
// (writers/tensor_source.h). It lays the file out, writes the tensors in parallel pieces into a
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
#include "writers/tensor_source.h"

namespace ckpt {

// Shards written by several processes (the ranks of an MPI job): every process plans the
// same shards, writes and verifies its own into temp files, and then puts into place the
// shards below the first that failed anywhere (all of them when none did): what a single
// process, which stops at its first failure, leaves. One process writes the index, once
// every shard of every process is in place.
struct ShardVerdict {
  size_t commit_below = 0;  // shards with a lower index go into place
  std::string error;        // the error to report ("" on processes that do not report)
};
struct ShardTeam {
  // Called once on every process with the plan, before anything is written; returns the
  // shards this process writes, in order.
  std::function<std::vector<size_t>(const std::vector<std::string>& names,
                                    const std::vector<uint64_t>& bytes)>
      plan;
  // Called once on every process when its shards are written and verified: `error` is ""
  // or the error of its first shard that failed (`shard`; it writes none after it).
  std::function<ShardVerdict(size_t shard, const std::string& error)> written;
  // Called once on every process after it put its shards into place (`error`: "" or why
  // one could not be). Returns "" when every process's are in place, else an error.
  std::function<std::string(const std::string& error)> committed;
  bool writes_index = true;
};

struct SafetensorsModelOptions {
  uint64_t max_shard_size = 0;  // 0: one file
  unsigned threads = 1;
  std::vector<const MappedFile*> inputs;  // refused at commit if any changed meanwhile
  const ShardTeam* team = nullptr;        // null: this process writes every shard
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
