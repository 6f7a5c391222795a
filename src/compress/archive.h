// Reading a .ckz archive (format.h): the trailer and index are read and fully validated when
// it is opened; chunks are then decoded one at a time, at random, by any number of threads
// (each with its own ChunkCoder). Every error names the archive, and the file and tensor a
// damaged chunk belongs to.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/byte_cursor.h"
#include "compress/chunk_coder.h"
#include "compress/format.h"
#include "io/mapped_file.h"
#include "io/volume.h"

namespace ckpt::ckz {

// Does the file start with the .ckz magic number? What an archive is, is decided by content
// (these two) everywhere; the suffix only names archives (PATH -> PATH.ckz and back).
bool LooksLikeArchive(Bytes head);
// A regular file (never a FIFO or device: nothing is opened that could block) whose head is
// LooksLikeArchive.
bool IsArchiveFile(const std::string& path, const Volume& volume = Disk());

inline constexpr std::string_view kArchiveSuffix = ".ckz";
// "x.pt" for "x.pt.ckz"; "" when `name` has no stem before the suffix.
std::string WithoutArchiveSuffix(std::string_view name);

class Archive {
 public:
  // Maps and validates `path`. Throws ckpt::Error("<path>: <what>").
  static Archive Open(const std::string& path);
  // The same over bytes in memory (tests, fuzzing); `name` is used in messages.
  static Archive FromBytes(Bytes bytes, std::string name);

  const std::string& name() const { return name_; }
  const Index& index() const { return index_; }
  Bytes bytes() const { return bytes_; }
  const MappedFile& map() const { return map_; }
  uint64_t index_frame_bytes() const { return index_frame_; }

  // The chunk's stored bytes (header and planes).
  Bytes ChunkBytes(size_t k) const;
  std::vector<Run> ChunkRuns(size_t k) const;
  // "path/in/archive: chunk 12 (bytes 12582912-13631487, tensor 'layers.3.w')".
  std::string DescribeChunk(size_t k) const;
  // Decodes chunk k into dst (its length); throws naming the archive, file and tensor.
  void DecodeChunk(ChunkCoder& coder, size_t k, uint8_t* dst) const;
  // The same, returning what is wrong ("" when the chunk is good) instead of throwing.
  std::string TryDecodeChunk(ChunkCoder& coder, size_t k, uint8_t* dst) const;

 private:
  void Load();

  std::string name_;
  MappedFile map_;
  Bytes bytes_;
  Index index_;
  uint64_t index_frame_ = 0;
};

// The one parallel decode loop: chunks[k] for k in `chunks` (all of them when empty), on
// `threads` workers, each with its own coder and buffer. `use(k, bytes)` gets chunk k decoded
// and checked (on the worker; `bytes` is valid until it returns). A bad chunk throws (the
// loop stops), or, with `on_error`, is handed to it ("" never) and the loop goes on.
// `wanted(k)`, when given, skips chunks it returns false for.
struct DecodeLoop {
  std::function<void(size_t k, Bytes bytes)> use;
  std::function<void(size_t k, const std::string& error)> on_error;
  std::function<bool(size_t k)> wanted;
};
void DecodeChunks(const Archive& a, size_t first, size_t count, unsigned threads,
                  const DecodeLoop& loop);

}  // namespace ckpt::ckz
