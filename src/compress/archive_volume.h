// What a .ckz archive holds, read in place: a Volume (io/volume.h) whose tree is the one the
// archive restores to, under a root path of the caller's choosing, and whose files are
// MappedFile members (io/mapped_file.h). Opening a member decodes its plain bytes -- every
// byte outside the typed tensor ranges: zip headers, pickles, safetensors headers, json,
// tokenizers -- into a file in memory (memfd; the last few opened are kept, so that discovery
// and the reader that follows decode them once); each tensor byte a Window reads is decoded
// from the archive's chunks at that moment, its chunk's CRC32 checked. Nothing is written
// anywhere; memory is the plain bytes of the open (and last few) members, a few decoded chunks
// per thread and the windows being read.
// Links are followed inside the archive only: one that leaves it (an absolute target, or
// more ".." than folders) leads nowhere.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "compress/archive.h"
#include "io/volume.h"

namespace ckpt::ckz {

class ArchiveVolume : public Volume {
 public:
  // Opens `archive` (its index and chunk extents checked); what it holds appears at `root`.
  // `threads` decode a member's plain bytes. Throws ckpt::Error naming the archive.
  static std::unique_ptr<ArchiveVolume> Open(const std::string& archive, std::string root,
                                             unsigned threads);
  ~ArchiveVolume() override;  // drops this thread's decoded chunks of it

  const std::string& root() const { return root_; }
  // Of all its files: the plain bytes, and the tensor bytes read from the chunks as needed.
  uint64_t plain_bytes() const { return plain_bytes_; }
  uint64_t tensor_bytes() const { return tensor_bytes_; }

  MappedFile Open(const std::string& path) const override;
  NodeType TypeOf(const std::string& path) const override;
  NodeType LinkTypeOf(const std::string& path) const override;
  std::vector<Node> List(const std::string& path) const override;

 private:
  ArchiveVolume() = default;
  // The entry `path` names (links followed: all, or all but the last), or -1.
  int64_t Find(const std::string& path, bool follow_last) const;
  // The memory file holding entry `i`'s plain bytes, made now or kept from before (the cache
  // owns it). Call with images_mutex_ held.
  int ImageOf(size_t i) const;
  // What entry `i` is (-1: kMissing).
  NodeType TypeAt(int64_t i) const;
  // `path` made relative to root_ ("" for the root), or false when it is not below it.
  bool Inside(const std::string& path, std::string& rel) const;

  std::shared_ptr<const Archive> archive_;
  uint64_t id_ = 0;  // this volume's key in the threads' decode caches
  std::string root_;
  unsigned threads_ = 1;
  std::map<std::string, size_t> entries_;  // path below the root ("" the root) -> entry
  std::map<std::string, std::vector<std::string>> children_;  // folder -> names, sorted
  uint64_t plain_bytes_ = 0;
  uint64_t tensor_bytes_ = 0;
  static constexpr size_t kImages = 4;
  mutable std::mutex images_mutex_;
  mutable std::vector<std::pair<size_t, int>> images_;  // entry, memfd; the latest last
};

}  // namespace ckpt::ckz
