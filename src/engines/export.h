// `ckptool export`: the model a checkpoint holds, whatever the container (a torch file, a
// safetensors file, a model folder or the files of one, a DeepSpeed ZeRO folder, a
// torch.distributed.checkpoint folder, a .ckz archive of any: checkpoint/opened_checkpoint.h), as
// safetensors (a folder of shards and index, or one file) or one torch file. One engine for
// all: the same selection, dtype rule, tied-name rule and writers.
//
// Only tensors leave: whatever the source pickle imports is left behind, so export is also
// the safe way to hand a model on. Names are key paths relative to the selected sub-object
// (state_dict, module, model... auto-detected, or --select). Strided views are written
// contiguously. Identical views (tied weights) are written once under their first name in the
// source's order; each other name is recorded in __metadata__ as alias -> kept, as
// safetensors' save_model does. With a shard size, tensors are split in order into
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json, as Hugging Face does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/float_convert.h"

namespace ckpt {

struct ShardTeam;  // writers/safetensors_output.h

struct ExportOptions {
  std::string select;               // key path of the sub-object; empty: auto-detect
  bool all = false;                 // everything: training state and training-only files too
  bool dry_run = false;             // plan only: the result counts what would be written
  std::optional<kernels::Half> to;  // store floating-point tensors as this half type
  uint64_t max_shard_size = 0;      // 0: a single file
  unsigned threads = 1;
  // DeepSpeed ZeRO checkpoints (deepspeed/zero_checkpoint.h):
  std::string tag;              // the tag folder; empty: what `latest` names
  bool exclude_frozen = false;  // leave frozen parameters out
  // --strip-prefix: removed from the start of every exported name that has it, in the order
  // given, each as often as it repeats ("module." of DDP and DeepSpeed wrappers, "_orig_mod."
  // of torch.compile). Two names that become one are an error.
  std::vector<std::string> strip_prefixes;
  // --config-from: folders (or single files) whose config.json, generation_config.json and
  // tokenizer files go into an exported folder, before the sources' own. Needs a folder output.
  std::vector<std::string> config_from;
  // Safetensors shards written by the ranks of an MPI job together; null: by this process.
  const ShardTeam* team = nullptr;
};

struct ExportResult {
  std::string source;              // what was read: the path given, or the folder's description
  std::string selected;            // the key path exported ("" = the whole object)
  std::vector<std::string> files;  // written files, index last
  uint64_t tensors = 0;            // tensors written
  uint64_t aliases = 0;            // names recorded as aliases
  uint64_t bytes = 0;              // tensor bytes written
  // .ckz sources (read in place, compress/archive_volume.h): their plain bytes (headers,
  // pickles, json) and their tensor bytes, decoded from the archive's chunks when read.
  uint64_t archive_plain_bytes = 0;
  uint64_t archive_backed_bytes = 0;
  std::vector<std::string> warnings;
};

ExportResult Export(const std::vector<std::string>& sources, const std::string& to,
                    const ExportOptions& options);

}  // namespace ckpt
