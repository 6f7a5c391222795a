// One checkpoint, whatever holds it, opened to the tensors it means: a torch file (zip or
// legacy), a safetensors file, a model folder (Hugging Face, sharded or not), a
// torch.distributed.checkpoint folder, a DeepSpeed ZeRO folder, or a .ckz archive of any of
// them. The kind of container is decided here, once: export writes what it opens, and the
// Python package's open() and load() read through it. Nothing in a pickle is imported or
// called.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "checkpoint/archive_view.h"
#include "checkpoint/discovery.h"
#include "dcp/dcp_checkpoint.h"
#include "deepspeed/zero_checkpoint.h"
#include "file/checkpoint_file.h"
#include "torch/logical_model.h"

namespace ckpt {

struct OpenOptions {
  unsigned threads = 0;         // decoding an archive (0: the machine's cores)
  std::string tag;              // DeepSpeed: the tag folder under a root (default: `latest`)
  bool exclude_frozen = false;  // DeepSpeed: leave frozen parameters out
  bool all_files = false;       // a model folder's training-only files too (ModelFilesIn)
};

// A tensor the model holds but no reader here can stream (a quantized, sparse or nested
// tensor, or one without data): open() leaves it out with a warning; export refuses it when
// it is asked for.
struct UnreadableTensor {
  std::vector<std::string> names;  // in the source's order
  std::string why;                 // "is qtensor", "has no data"
  bool training = false;
};

class OpenedCheckpoint {
 public:
  // Opens `path`. Throws ckpt::Error naming the path and what is wrong.
  static std::unique_ptr<OpenedCheckpoint> Open(const std::string& path, const OpenOptions& o);
  // Several paths as one model: files, model folders, or .ckz archives of them, the shards of
  // one model (a name in two of them is refused). One path opens as Open(path) does.
  static std::unique_ptr<OpenedCheckpoint> Open(const std::vector<std::string>& paths,
                                                const OpenOptions& o);
  // The checkpoint at `path` of `volume` (one an archive holds: Checkpoint::OpenModel).
  static std::unique_ptr<OpenedCheckpoint> Open(const std::string& path, const OpenOptions& o,
                                                const Volume& volume);

  OpenedCheckpoint(const OpenedCheckpoint&) = delete;
  OpenedCheckpoint& operator=(const OpenedCheckpoint&) = delete;
  ~OpenedCheckpoint();

  const std::string& path() const { return path_; }
  // "torch-zip", "torch-legacy", "safetensors", "model-folder", "dcp", "zero".
  const std::string& kind() const { return kind_; }
  bool archived() const { return !archives_.empty(); }
  const std::vector<std::unique_ptr<ArchiveView>>& archives() const { return archives_; }
  const LogicalModel& model() const { return model_; }
  // The model, moved out for a consumer that takes the tensors over (export); their reads
  // stay valid while this lives. Afterwards model() is empty and Find() finds nothing.
  LogicalModel TakeModel();
  // The model's key path in a training checkpoint ("state_dict", "module", "model"...): what
  // export writes by default; "" when the whole object is the model (less its training state).
  const std::string& model_key() const { return model_key_; }
  const std::vector<UnreadableTensor>& unreadable() const { return unreadable_; }
  // What the pickles import or call that is not plain data ("model.pt: the pickle imports
  // os.system"): never run.
  const std::vector<std::string>& unsafe() const { return unsafe_; }
  // Everything worth telling a reader: unsafe() (never run), the model's warnings, and the
  // tensors left out as unreadable.
  std::vector<std::string> Warnings() const;
  // Frees what only describing needed (the pickle graphs; the tensor tables and maps stay):
  // a writer that follows keeps its peak memory to its own.
  void ReleaseParsed();
  // The real file (not an archive's member) that holds `t`'s elements whole and in
  // row-major order at t.offset, so that a reader may map them instead of copying; null for
  // pieces of a folder format, strided views and anything in an archive.
  const std::string* DirectFile(const LogicalTensor& t) const;
  // Every name in source order: each tensor's, then the aliases (other names of a tensor).
  std::vector<std::string> Names() const;
  // Index into model().tensors of `name` (an alias gives its owner's); -1 when absent.
  int64_t Find(const std::string& name) const;
  // The safetensors files' __metadata__ (merged), or empty.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The files read whole (torch and safetensors files, a model folder's shards); the folder
  // formats keep their own.
  const std::vector<std::unique_ptr<CheckpointFile>>& files() const { return files_; }
  // The held path under an archive ("<archive>/<name>"), else path().
  const std::string& opened_path() const { return opened_; }
  // Each path given, as it was opened (an archive: the path it holds, read from its volume).
  struct Source {
    std::string path;
    const Volume* volume;
  };
  const std::vector<Source>& sources() const { return sources_; }

 private:
  OpenedCheckpoint() = default;
  // Refuses the ZeRO-only options for another kind.
  void CheckZeroOptions(const OpenOptions& o) const;
  void OpenOne(const std::string& at, Container kind, const OpenOptions& o, const Volume& volume);
  void OpenDcp(const std::string& at, const Volume& volume);
  // Each file with what it is read from.
  void OpenFiles(const std::vector<std::pair<std::string, const Volume*>>& paths);
  void AddTorchTensors(size_t source);
  void AddSafetensorsTensors(size_t source);
  void Index() const;
  void BuildIndex() const;

  std::string path_, opened_, kind_, model_key_;
  // Destroyed last: the files below are read from their volumes.
  std::vector<std::unique_ptr<ArchiveView>> archives_;
  std::vector<std::unique_ptr<CheckpointFile>> files_;
  std::unique_ptr<deepspeed::ZeroCheckpoint> zero_;
  std::unique_ptr<dcp::Checkpoint> dcp_;
  LogicalModel model_;
  std::vector<UnreadableTensor> unreadable_;
  std::vector<Source> sources_;
  std::vector<std::string> unsafe_;
  std::map<std::string, std::string> metadata_;
  // Every name -> its tensor; views of model_'s strings.
  // Built by the first Find() or Names() (at once when several files are opened: a name in
  // two of them is refused then).
  mutable std::unordered_map<std::string_view, int64_t> index_;
  mutable std::once_flag indexed_;
};

}  // namespace ckpt
