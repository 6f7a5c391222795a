// A tree of files to read: the disk, or what a .ckz archive holds (compress/archive_volume.h),
// whose files are opened as MappedFiles that decode their bytes as they are read. Readers
// that take a Volume open, list and test paths only through it, so an archive's checkpoints
// are read in place by the same code that reads them on disk, with nothing written anywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/mapped_file.h"

namespace ckpt {

enum class NodeType { kMissing, kFile, kFolder, kSymlink, kOther };

// One entry of a folder: its path (the folder's path / its name) and what it is, a link not
// followed (kSymlink).
struct Node {
  std::string path;
  NodeType type = NodeType::kMissing;
};

class Volume {
 public:
  virtual ~Volume() = default;

  // The file at `path` (links followed). Throws ckpt::Error("<path>: <reason>").
  virtual MappedFile Open(const std::string& path) const = 0;
  // What is at `path`: links followed (a dangling one is kMissing), or not (kSymlink).
  virtual NodeType TypeOf(const std::string& path) const = 0;
  virtual NodeType LinkTypeOf(const std::string& path) const = 0;
  // The entries of the folder `path`, sorted by name. Throws ckpt::Error("<path>: cannot list
  // folder: <reason>") when it is no folder or cannot be read.
  virtual std::vector<Node> List(const std::string& path) const = 0;

  // The whole file at `path` as text, through Read (every byte, a member's too). Throws when
  // it cannot be opened or is larger than `limit`.
  std::string ReadText(const std::string& path, uint64_t limit) const;

  bool Exists(const std::string& path) const { return TypeOf(path) != NodeType::kMissing; }
  bool IsFile(const std::string& path) const { return TypeOf(path) == NodeType::kFile; }
  bool IsFolder(const std::string& path) const { return TypeOf(path) == NodeType::kFolder; }

  // Every entry below `folder`, depth first in name order, links not followed; `descend`
  // says whether to enter a folder (all are entered when it is empty). Throws as List does
  // (the disk lists a folder it may not read as empty).
  void Walk(const std::string& folder, const std::function<void(const Node&)>& visit,
            const std::function<bool(const Node&)>& descend = {}) const;
};

// The file system, through std::filesystem and MappedFile::Open.
const Volume& Disk();
// `volume`, or the disk where there is none.
inline const Volume& OrDisk(const Volume* volume) {
  return volume ? *volume : Disk();
}

}  // namespace ckpt
