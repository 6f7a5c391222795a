// `ckptool compress` / `decompress`, and inspect / verify of .ckz archives (compress/format.h).
//
// compress: a file becomes FILE.ckz, a folder DIR.ckz holding every file, folder and symlink
// below it with its relative path, mode and mtime. Files are read through the map, analysed
// by the checkpoint readers (compress/layout.h), cut into chunks that are coded in parallel
// (compress/chunk_coder.h) and appended in order to a temp file that reserves an upper bound
// of the archive's size; the footer index follows; the temp file is cut to size, fsynced and
// renamed into place. One chunk in 16 is decoded again right after it is coded
// (a coder fault shows at once, at a sixteenth of a full decode's cost). With --rm the written
// archive is read back from disk and every chunk decoded and checked before the originals go.
//
// decompress: every chunk is decoded and its CRC32 checked before its bytes are written; a
// file is written to a temp file (a folder to a temp folder) and renamed into place only when
// every chunk and the whole file's CRC32 matched, mode and mtime set. -c streams a one-file
// archive to stdout (each chunk checked before it is written).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/archive_restore.h"
#include "compress/archive.h"
#include "compress/chunk_coder.h"

namespace ckpt {

struct CompressOptions {
  ckz::Level level = ckz::Level::kFast;
  unsigned threads = 1;
  std::string output;         // -o; default PATH.ckz
  bool to_stdout = false;     // -c
  bool force = false;         // -f: replace an existing output
  bool remove_input = false;  // --rm
  bool dry_run = false;       // code everything, write nothing: `after` is the archive's exact size
  // --allow-damaged: archive a checkpoint that fails verify, its damage kept byte for byte (so
  // verify of the archive and of what it restores still shows it). Otherwise it is refused.
  bool allow_damaged = false;
  std::atomic<uint64_t>* bytes_done = nullptr;  // progress: input bytes coded
};

using ckz::CodingStats;

struct CompressResult {
  std::string input;
  std::string output;   // "-" for stdout
  uint64_t before = 0;  // bytes of all files
  uint64_t after = 0;   // archive bytes
  uint64_t files = 0;
  uint64_t chunks = 0;
  uint64_t tensors = 0;
  uint64_t whole_chunks = 0;  // chunks where plain zstd won
  CodingStats by_transform[ckz::kTransforms];
  std::vector<std::string> warnings;  // entries skipped (sockets, devices...)
  bool removed = false;               // --rm removed the input
};

CompressResult CompressPath(const std::string& path, const CompressOptions& o);

struct DecompressOptions {
  unsigned threads = 1;
  std::string output;
  bool to_stdout = false;
  bool force = false;
  bool remove_input = false;
  bool dry_run = false;  // decode and check every chunk, write nothing
  std::atomic<uint64_t>* bytes_done = nullptr;
};

struct DecompressResult {
  std::string input;
  std::string output;
  uint64_t archive_bytes = 0;
  uint64_t restored_bytes = 0;
  uint64_t files = 0;
  bool removed = false;
};

DecompressResult DecompressArchive(const std::string& path, const DecompressOptions& o);

// The output a compress of `path` writes by default (decompress: DefaultRestoredName).
std::string DefaultArchiveName(const std::string& path);

}  // namespace ckpt
