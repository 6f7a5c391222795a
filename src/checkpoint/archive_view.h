// A .ckz archive seen as the checkpoint it holds, under the original's name: read in place
// through its volume (compress/archive_volume.h), at "<archive>/<name>" -- a path no file on
// disk can have, the archive being a file -- so that the readers, given the volume, open the
// held files as they would the originals, every tensor byte decoded from the archive when it
// is read (export, verify, inspect, open); or, for the rewriting commands (convert, strip),
// which read their input's bytes directly, the original restored bit for bit in a temp folder
// removed whatever happens.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/discovery.h"
#include "compress/archive_volume.h"
#include "io/folders.h"

namespace ckpt {

class ArchiveView {
 public:
  // Opens `archive` in place, `threads` decoding. Throws ckpt::Error naming the archive.
  static std::unique_ptr<ArchiveView> Open(const std::string& archive, unsigned threads);
  // The original restored whole (RestoreArchive) in a new temp folder inside `parent` (a
  // ckptool temp name: a run killed outright leaves nothing a later run does not remove).
  static std::unique_ptr<ArchiveView> Restore(const std::string& archive, const std::string& parent,
                                              unsigned threads);
  // The held file or folder, under its original name.
  const std::string& root() const { return root_; }
  // A path below root() as the archive names it ("model.pt", "run/rank0.pt").
  std::string Relative(const std::string& path) const;
  // What root() is read from: the archive's volume (Open), or the disk (Restore).
  const Volume& volume() const { return OrDisk(volume_.get()); }
  // Open only: the archive's volume.
  const ckz::ArchiveVolume& archive_volume() const { return *volume_; }
  // `text` (an error message) with the prefix of every path in it below root()'s folder
  // replaced by `prefix` ("model.pt.ckz: " gives "model.pt.ckz: model.pt"; "" leaves the path
  // inside).
  std::string Rename(std::string text, const std::string& prefix) const;
  // The checkpoints held, as discovery finds them in what the archive restores to
  // (checkpoint/discovery.h's Locate: files, a ZeRO folder, DCP folders). An archive of a file
  // that is no checkpoint holds none.
  std::vector<Located> Checkpoints() const;

 private:
  ArchiveView() = default;
  TempFolder folder_;                                 // Restore: what it restored into
  std::string root_;                                  // the held file or folder
  std::shared_ptr<const ckz::ArchiveVolume> volume_;  // Open
};

}  // namespace ckpt
