// Discovery: the paths a user gives -> the checkpoints they name, by content. One walk for
// every command.
#pragma once

#include <string>
#include <vector>

namespace ckpt {

// The one folder discovery every command uses. Files stay as given; a folder becomes every
// checkpoint file below it (by content, sorted, symlinks not followed). A
// torch.distributed.checkpoint folder (dcp/dcp_checkpoint.h) is one checkpoint, not files:
// its .distcp and .metadata files are never returned; the folder goes to `dcp_folders` (its
// other files, such as Megatron's common.pt, are returned as files). `skipped` receives
// folder entries that are not checkpoints.
std::vector<std::string> ExpandInputs(const std::vector<std::string>& inputs,
                                      std::vector<std::string>* skipped = nullptr,
                                      std::vector<std::string>* dcp_folders = nullptr);

// The model's files in a folder (a Hugging Face model or checkpoint folder, a folder of
// shards): those an index (*.index.json with a weight_map) names, else the safetensors files,
// else the torch files; training-only files (optimizer.pt, rng_state.pth...) and
// training_args.bin only with `all`; links (Lightning's last.ckpt) never: they repeat a file.
// Sorted. Throws ckpt::Error when there are none.
std::vector<std::string> ModelFilesIn(const std::string& folder, bool all);

}  // namespace ckpt
