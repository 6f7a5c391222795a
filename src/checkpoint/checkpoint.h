// One checkpoint, whatever holds it: the interface every kind of container implements, so that
// a command asks a checkpoint to describe or verify itself, or to open its model, and never
// switches on its kind. (The model is bloaty's ObjectFile: each format implements it, the
// opener tries each in turn.)
//
// The kinds (checkpoint/discovery.h's Container, decided by content in ContainerOf):
//   file_checkpoint.cpp     a torch file (zip or legacy) or a safetensors file
//   archive_checkpoint.cpp  a .ckz archive: its index, then the checkpoints it holds, read in
//                           place (checkpoint/archive_view.h)
//   zero_folder.cpp         a DeepSpeed ZeRO folder (or universal checkpoint) as one model
//   dcp_folder.cpp          a torch.distributed.checkpoint folder
// Each registers in checkpoint.cpp: a line in CheckpointAt's switch and in SectionOf's (the
// compiler names a kind missing from either; docs/architecture.md: "Where to add things").
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/json_stream.h"
#include "checkpoint/discovery.h"
#include "checkpoint/verify.h"
#include "reports/inspect_report.h"
#include "torch/global_policy.h"

namespace ckpt {

class OpenedCheckpoint;
struct OpenOptions;

// Reports of checkpoint files another checkpoint's reading already made (a ZeRO folder parses
// its rank files), by lexically normal path: a file's description takes its report (and drops
// it) instead of parsing the file again.
class ReportCache {
 public:
  void Put(const std::string& path, FileReport report);
  std::optional<FileReport> Take(const std::string& path);

 private:
  std::unordered_map<std::string, FileReport> reports_;
};

struct DescribeOptions {
  size_t top = 20;  // rows in the text tables (JSON: every row)
  torch::Trust trust;
  unsigned threads = 1;
  // A checkpoint inside this one (an archive's) that could not be described: said here, and
  // the rest described. (One that fails as a whole throws.)
  std::function<void(const std::string&)> error;
  ReportCache* cache = nullptr;
};

class Checkpoint {
 public:
  virtual ~Checkpoint() = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // Where it is, and what reports call it (an archive's members: "<archive>: <path inside>").
  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  // What its files are read from: the disk, or an archive's volume (read in place).
  const Volume& volume() const { return OrDisk(volume_.get()); }
  void set_volume(std::shared_ptr<const Volume> volume) { volume_ = std::move(volume); }

  virtual Container kind() const = 0;

  // `inspect`: the text report, given to `print` (an archive gives its own and then each
  // held checkpoint's, one call each); the JSON object, written into `out`. Throw ckpt::Error
  // when the checkpoint cannot be read.
  virtual void DescribeText(const DescribeOptions& o,
                            const std::function<void(const std::string&)>& print) const = 0;
  virtual void DescribeJson(JsonStream& out, const DescribeOptions& o) const = 0;
  // Reading done before any checkpoint is described, that others' descriptions use (a ZeRO
  // folder fills `o.cache` with its rank files' reports). Never throws: a failure is thrown
  // by DescribeText.
  virtual void Prepare(const DescribeOptions& o);

  // `verify`: every check the kind carries (checkpoint/verify.h's VerifyOutcome). `checksums`
  // false: structure only, no data byte read. Throws ckpt::Error when it cannot be read.
  virtual VerifyOutcome Verify(unsigned threads, const torch::Trust& trust,
                               bool checksums) const = 0;

  // The logical model: the tensors it means, whatever holds them
  // (checkpoint/opened_checkpoint.h).
  std::unique_ptr<OpenedCheckpoint> OpenModel(const OpenOptions& o) const;

 protected:
  explicit Checkpoint(std::string path) : path_(path), name_(std::move(path)) {}

 private:
  std::string path_, name_;
  std::shared_ptr<const Volume> volume_;
};

// The implementation of `l.kind` for the checkpoint at `l.path` (nothing read yet: every
// method reads what it needs, and throws what it finds wrong).
std::unique_ptr<Checkpoint> CheckpointAt(const Located& l);

// The checkpoints `paths` name (discovery's Locate), in the order reports list them.
std::vector<std::unique_ptr<Checkpoint>> FindCheckpoints(const std::vector<std::string>& paths,
                                                         std::vector<std::string>* skipped = {});

// inspect --json lists each kind under a key of its own, in this order ("files" always, the
// others when there is something to list): the key of `kind`, the member that names a
// checkpoint that could not be read ("path", "folder"), and the order of the keys.
struct ReportSection {
  std::string_view key;
  std::string_view path_key;
  bool always = false;
};
const ReportSection& SectionOf(Container kind);
std::vector<const ReportSection*> ReportSections();

}  // namespace ckpt
