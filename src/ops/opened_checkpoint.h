// One checkpoint, whatever holds it, opened to the tensors it means: a torch file (zip or
// legacy), a safetensors file, a model folder (Hugging Face, sharded or not), a
// torch.distributed.checkpoint folder, a DeepSpeed ZeRO folder, or a .ckz archive of any of
// them. The kind of container is decided here, once; the Python package's open() and load()
// read through it. Nothing in a pickle is imported or called.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dcp/dcp_checkpoint.h"
#include "deepspeed/zero_checkpoint.h"
#include "file/checkpoint_file.h"
#include "ops/archive_view.h"
#include "torch/logical_model.h"

namespace ckpt {

// Where one logical tensor's elements are, beside its read().
struct TensorPlace {
  // A real file (not an archive's skeleton) that holds the elements in row-major order at
  // `offset`: a reader may map them instead of copying. Empty otherwise.
  std::string file;
  uint64_t offset = 0;
  // A torch file's tensor: index into files and into that file's tensor table; else -1.
  int32_t source = -1;
  int32_t torch_tensor = -1;
};

struct OpenOptions {
  unsigned threads = 0;  // decoding an archive (0: the machine's cores)
  std::string tag;       // DeepSpeed: the tag folder under a root (default: `latest`)
};

class OpenedCheckpoint {
 public:
  // Opens `path`. Throws ckpt::Error naming the path and what is wrong.
  static std::unique_ptr<OpenedCheckpoint> Open(const std::string& path, const OpenOptions& o);

  OpenedCheckpoint(const OpenedCheckpoint&) = delete;
  OpenedCheckpoint& operator=(const OpenedCheckpoint&) = delete;
  ~OpenedCheckpoint();

  const std::string& path() const { return path_; }
  // "torch-zip", "torch-legacy", "safetensors", "model-folder", "dcp", "zero".
  const std::string& kind() const { return kind_; }
  bool archived() const { return archive_ != nullptr; }
  const LogicalModel& model() const { return model_; }
  const std::vector<TensorPlace>& places() const { return places_; }
  // Every name in source order: each tensor's, then the aliases (other names of a tensor).
  std::vector<std::string> Names() const;
  // Index into model().tensors of `name` (an alias gives its owner's); -1 when absent.
  int64_t Find(const std::string& name) const;
  // The safetensors files' __metadata__ (merged), or empty.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The files read whole (torch and safetensors files, a model folder's shards); the folder
  // formats keep their own.
  const std::vector<std::unique_ptr<CheckpointFile>>& files() const { return files_; }
  // The held path under an archive (its skeleton), else path().
  const std::string& opened_path() const { return opened_; }

 private:
  OpenedCheckpoint() = default;
  void OpenFiles(const std::vector<std::string>& paths);
  void AddTorchTensors(size_t source);
  void AddSafetensorsTensors(size_t source);
  void Index();

  std::string path_, opened_, kind_;
  std::unique_ptr<ArchiveView> archive_;  // destroyed last: the files below map its skeleton
  std::vector<std::unique_ptr<CheckpointFile>> files_;
  std::unique_ptr<deepspeed::ZeroCheckpoint> zero_;
  std::unique_ptr<dcp::Checkpoint> dcp_;
  LogicalModel model_;
  std::vector<TensorPlace> places_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, int64_t, std::less<>> index_;
};

}  // namespace ckpt
