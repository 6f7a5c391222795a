// Reading the checkpoints inside a .ckz archive in place, without restoring their tensors.
//
// A skeleton is the archive's folder tree (or its one file) recreated with every file sparse:
// only its plain bytes -- everything outside the typed tensor ranges: zip headers, pickles,
// safetensors headers, json, tokenizers -- are decoded and written; tensor ranges stay holes.
// Each skeleton file is registered as backed (io/mapped_file.h), so the usual readers open it
// as they would the original, and every tensor byte read through MappedFile::Window is
// decoded from the archive's chunks at that moment, its chunk's CRC32 checked. Disk use is
// the plain bytes; memory is a decoded chunk per thread and the windows being read.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "compress/archive.h"
#include "io/mapped_file.h"

namespace ckpt::ckz {

class Skeleton {
 public:
  // Recreates `archive` at `dest` (which must not exist) with `threads` decoding threads.
  // Throws ckpt::Error naming the archive (and the file and tensors of a damaged chunk).
  static std::unique_ptr<Skeleton> Build(const std::string& archive, const std::string& dest,
                                         unsigned threads);
  ~Skeleton();  // unregisters the backed files (the caller removes `dest`)
  Skeleton(const Skeleton&) = delete;
  Skeleton& operator=(const Skeleton&) = delete;

  const std::string& path() const { return dest_; }
  // Bytes written to disk: the plain bytes of every file.
  uint64_t plain_bytes() const { return plain_bytes_; }
  // Bytes of tensors left as holes, served from the archive.
  uint64_t backed_bytes() const { return backed_bytes_; }

 private:
  Skeleton() = default;

  std::string dest_;
  std::vector<MappedFile::BackedId> registered_;
  uint64_t plain_bytes_ = 0;
  uint64_t backed_bytes_ = 0;
};

}  // namespace ckpt::ckz
