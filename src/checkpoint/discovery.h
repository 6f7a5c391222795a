// Discovery: the paths a user gives -> the checkpoints they name, each with the kind of
// container that holds it, decided by content, here, once for every command.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/volume.h"

namespace ckpt {

// What one path holds. A new container format is a new value here, its test in ContainerOf,
// its reader, and a branch in OpenedCheckpoint (checkpoint/opened_checkpoint.h); the compiler then
// names every command that switches on the kind (-Wswitch).
enum class Container {
  kArchive,      // a .ckz archive (compress/archive.h) of any of the others
  kZero,         // a DeepSpeed ZeRO folder: the root holding `latest`, or a tag folder
  kDcp,          // a torch.distributed.checkpoint folder (.metadata and .distcp files)
  kModelFolder,  // any other folder: the checkpoint files in it
  kFile,         // any other file: a torch or safetensors file by its content, or none
};
// Throws when nothing is there.
Container ContainerOf(const std::string& path, const Volume& volume = Disk());

// One checkpoint a command was given, and what holds it.
struct Located {
  Container kind;
  std::string path;
  // What `path` is read from: an archive's volume (compress/archive_volume.h); null: the disk.
  std::shared_ptr<const Volume> volume;
};

// The checkpoints `inputs` name, in the order reports list them: archives, checkpoint files
// (folders walked as ExpandInputs walks them: a ZeRO folder's rank files too), ZeRO folders,
// then DCP folders. `skipped` as for ExpandInputs.
std::vector<Located> Locate(const std::vector<std::string>& inputs,
                            std::vector<std::string>* skipped = nullptr);
// The same for paths of `volume` (null: the disk), which each Located keeps.
std::vector<Located> Locate(std::shared_ptr<const Volume> volume,
                            const std::vector<std::string>& inputs,
                            std::vector<std::string>* skipped = nullptr);

// The one folder discovery every command uses. Files stay as given; a folder becomes every
// checkpoint file below it (by content, sorted, symlinks not followed). A
// torch.distributed.checkpoint folder (dcp/dcp_checkpoint.h) is one checkpoint, not files:
// its .distcp and .metadata files are never returned; the folder goes to `dcp_folders` (its
// other files, such as Megatron's common.pt, are returned as files). `skipped` receives
// folder entries that are not checkpoints.
std::vector<std::string> ExpandInputs(const std::vector<std::string>& inputs,
                                      std::vector<std::string>* skipped = nullptr,
                                      std::vector<std::string>* dcp_folders = nullptr,
                                      const Volume& volume = Disk());

// What a file holds, by its content: a torch file (zip or legacy), a safetensors file, or
// none of them (nullopt). Throws ckpt::Error when it cannot be read.
enum class FileKind { kTorch, kSafetensors };
std::optional<FileKind> FileKindOf(const std::string& path);

// The model's files in a folder (a Hugging Face model or checkpoint folder, a folder of
// shards): those an index (*.index.json with a weight_map) names, else the safetensors files,
// else the torch files; training-only files (optimizer.pt, rng_state.pth...) and
// training_args.bin only with `all`; links (Lightning's last.ckpt) never: they repeat a file.
// Sorted. Throws ckpt::Error when there are none.
std::vector<std::string> ModelFilesIn(const std::string& folder, bool all,
                                      const Volume& volume = Disk());

// Is `path` a model folder whose model files (ModelFilesIn) are all safetensors?
bool IsSafetensorsModelFolder(const std::string& path);

}  // namespace ckpt
