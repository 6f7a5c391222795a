// Opening any supported checkpoint: format detection by content, folder expansion, and
// the parsed result of whichever reader applies.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "safetensors/safetensors_file.h"
#include "torch/torch_file.h"

namespace ckpt {

enum class Format { kTorchZip, kTorchLegacy, kSafetensors };

const char* FormatName(Format f);  // "torch-zip", "torch-legacy", "safetensors"

// Recognises a checkpoint by its bytes, not its name.
std::optional<Format> DetectFormat(Bytes file);

struct CheckpointFile {
  std::string path;
  MappedFile map;
  Format format = Format::kTorchZip;
  std::optional<torch::TorchFile> torch;  // torch formats
  std::optional<safetensors::File> st;    // safetensors
};

// Maps and parses `path`. Throws ckpt::Error("<path>: <what>") when it cannot.
CheckpointFile OpenCheckpoint(const std::string& path, const torch::ReadOptions& options = {});

// `options` with done_with set to drop those pages of `map` from the resident set.
torch::ReadOptions ReleasingPages(const MappedFile& map, torch::ReadOptions options = {});

// The one folder discovery every command uses. Files stay as given; a folder becomes every
// checkpoint file below it (by content, sorted, symlinks not followed). A
// torch.distributed.checkpoint folder (dcp/dcp_checkpoint.h) is one checkpoint, not files:
// its .distcp and .metadata files are never returned; the folder goes to `dcp_folders` (its
// other files, such as Megatron's common.pt, are returned as files). `skipped` receives
// folder entries that are not checkpoints.
std::vector<std::string> ExpandInputs(const std::vector<std::string>& inputs,
                                      std::vector<std::string>* skipped = nullptr,
                                      std::vector<std::string>* dcp_folders = nullptr);

}  // namespace ckpt
