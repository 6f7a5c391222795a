// A .ckz archive seen as the checkpoint it holds, in a temp folder under the original's name:
// its skeleton (compress/skeleton.h), so that any reader opens the held files as it would the
// originals, every tensor byte decoded from the archive when it is read (export, verify,
// inspect, open); or, for the rewriting commands (convert, strip), which read their input's
// bytes directly, the original restored bit for bit. Either is removed whatever happens.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/discovery.h"
#include "compress/skeleton.h"
#include "io/folders.h"

namespace ckpt {

class ArchiveView {
 public:
  // Builds the skeleton of `archive` in a new temp folder inside `parent` (a ckptool temp
  // name: a run killed outright leaves nothing a later run does not remove). Throws
  // ckpt::Error naming the archive.
  static std::unique_ptr<ArchiveView> Open(const std::string& archive, const std::string& parent,
                                           unsigned threads);
  // The same with the original restored whole (DecompressArchive) instead of a skeleton.
  static std::unique_ptr<ArchiveView> Restore(const std::string& archive, const std::string& parent,
                                              unsigned threads);
  // The held file or folder, under its original name.
  const std::string& root() const { return root_; }
  // A path below root() as the archive names it ("model.pt", "run/rank0.pt").
  std::string Relative(const std::string& path) const;
  // Open only: the skeleton.
  const ckz::Skeleton& skeleton() const { return *skeleton_; }
  // `text` (an error message) with the temp folder's prefix of every path in it replaced by
  // `prefix` ("model.pt.ckz: " gives "model.pt.ckz: model.pt"; "" leaves the path inside).
  std::string Rename(std::string text, const std::string& prefix) const;
  // The checkpoints held, as discovery finds them in what the archive restores to
  // (checkpoint/discovery.h's Locate: files, a ZeRO folder, DCP folders). An archive of a file
  // that is no checkpoint holds none.
  std::vector<Located> Checkpoints() const;

 private:
  ArchiveView() = default;
  // A new temp folder in `parent` and the name the held path gets in it.
  static std::unique_ptr<ArchiveView> Prepare(const std::string& archive,
                                              const std::string& parent);

  TempFolder folder_;                        // removed last: the skeleton unregisters first
  std::string root_;                         // the held file or folder
  std::unique_ptr<ckz::Skeleton> skeleton_;  // destroyed before folder_
};

// The folder for read-only commands' skeletons: the system's temp folder.
std::string ReadOnlyTempParent();

}  // namespace ckpt
