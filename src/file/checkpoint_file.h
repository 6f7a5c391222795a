// One checkpoint file, opened by its content (not its name): a torch zip, a legacy torch
// file or a safetensors file, with the parsed result of whichever reader applies. The
// folder formats (dcp/, deepspeed/) and the archive (compress/) open their files through it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "io/volume.h"
#include "safetensors/safetensors_file.h"
#include "torch/torch_file.h"

namespace ckpt {

enum class Format { kTorchZip, kTorchLegacy, kSafetensors };

const char* FormatName(Format f);  // "torch-zip", "torch-legacy", "safetensors"

// Recognises a checkpoint by its bytes, not its name.
std::optional<Format> DetectFormat(Bytes file);

// A file that DetectFormat does not recognise, whose name says it is a checkpoint file
// (.safetensors; .pt, .pth, .bin, .ckpt) and whose bytes are what is left of one cut short:
// nothing at all, a safetensors header longer than the file, fewer bytes than any torch file
// has. Returns why it is damaged, or "" when it is not what it looks like (a foreign file).
// Discovery keeps such files so that verify and every writer see the damage.
std::string CutCheckpointReason(const std::string& name, Bytes file);

struct CheckpointFile {
  std::string path;
  MappedFile map;
  Format format = Format::kTorchZip;
  std::optional<torch::TorchFile> torch;  // torch formats
  std::optional<safetensors::File> st;    // safetensors
};

// Maps and parses `path`. Throws ckpt::Error("<path>: <what>") when it cannot.
CheckpointFile OpenCheckpoint(const std::string& path, const torch::ReadOptions& options = {});
// The same read from `volume` (an archive's, read in place: compress/archive_volume.h).
CheckpointFile OpenCheckpoint(const Volume& volume, const std::string& path,
                              const torch::ReadOptions& options = {});

// `options` with done_with set to drop those pages of `map` from the resident set.
torch::ReadOptions ReleasingPages(const MappedFile& map, torch::ReadOptions options = {});

}  // namespace ckpt
