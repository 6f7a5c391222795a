// A .ckz archive's files as they were: restored to disk or streamed, every chunk decoded and
// its CRC32 checked before its bytes are written, and each whole file's CRC32 checked before
// it is put in place; or every chunk decoded and checked without writing (verify). The
// decompress job (engines/compress.h) and the archive view (checkpoint/archive_view.h) both restore
// through here.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "compress/archive.h"
#include "torch/model.h"

namespace ckpt {

struct RestoreOptions {
  unsigned threads = 1;
  bool force = false;                           // replace an existing destination
  std::atomic<uint64_t>* bytes_done = nullptr;  // progress: bytes restored
};

// Restores the archive's file or folder at `dest`: a file through a temp file, a folder
// through a temp folder, renamed into place only when every checksum matched (mode without
// set-ID bits, mtime set). Refuses an existing `dest` unless `o.force`. Throws ckpt::Error
// naming the archive (and the damaged file) or the destination.
void RestoreArchive(const ckz::Archive& a, const std::string& dest, const RestoreOptions& o);

// Writes a one-file archive's file to `fd`, each chunk checked before it is written, the whole
// file's checksum at the end (what was written stays written: a stream cannot take it back).
void StreamArchive(const ckz::Archive& a, int fd, const RestoreOptions& o);

// verify: decodes every chunk in parallel and checks every checksum; one problem per bad
// chunk (naming the file and tensors it holds) and per file whose checksum fails.
struct ArchiveVerifyResult {
  std::vector<torch::Problem> problems;
  uint64_t chunks = 0;
  uint64_t bytes = 0;  // original bytes decoded and checked
};
ArchiveVerifyResult VerifyArchive(const ckz::Archive& a, unsigned threads);

// The name an archive restores to by default: its own without `.ckz`; "" when it has no such
// suffix.
std::string DefaultRestoredName(const std::string& archive);

}  // namespace ckpt
