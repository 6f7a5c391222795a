// Read-only memory map of an input file. Parsers get its bytes as a span and never a path,
// so tests can hand them bytes from memory (see ByteCursor).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "base/byte_cursor.h"

namespace ckpt {

// Where the bytes of a file not on disk come from: a .ckz archive's member
// (compress/archive_volume.h) holds its plain bytes (zip headers, pickles, json) in memory,
// and its tensor bytes are decoded from the archive's chunks when a Window, Read or Reach
// asks.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Fills dst with the file's bytes [offset, offset + size); throws ckpt::Error on damage.
  virtual void Read(uint64_t offset, uint8_t* dst, uint64_t size) const = 0;
};

class MappedFile {
 public:
  // Throws ckpt::Error("<path>: <reason>") when the file cannot be opened or mapped.
  static MappedFile Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  Bytes bytes() const { return {data_, size_}; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  mode_t mode() const { return mode_; }
  uid_t uid() const { return uid_; }
  gid_t gid() const { return gid_; }

  // What the file was when it was opened: its size, modification time and inode. Another
  // process that writes, truncates or replaces it changes at least one of them.
  struct Stamp {
    std::string path;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    ino_t inode = 0;
    // True if the file at `path` is no longer the one stamped, as it was.
    bool ChangedOnDisk() const;
  };
  const Stamp& stamp() const { return stamp_; }

  // A file that is not on disk (a .ckz archive's member): `image`, a descriptor of a file in
  // memory (memfd) `size` bytes long holding its plain bytes, the rest left zero, is mapped
  // (the descriptor stays the caller's); every byte a Window, Read or Reach shows comes from
  // `source` (none: all of it is plain). bytes() shows the plain bytes only: the structure a
  // parser reads; data is read through Window, Read and Reach, as any reader does to keep its
  // memory flat. It has no descriptor of its own (fd() is -1: nothing can be copied from it by
  // the kernel), and its stamp is `origin`: a writer that requires its inputs unchanged checks
  // the archive; its mode is `mode` (what a copy of it is given), its owner the process's.
  static MappedFile Member(std::string path, uint64_t size, mode_t mode, Stamp origin,
                           std::shared_ptr<const ByteSource> source, int image);
  // Copies [offset, offset + size) into dst. Throws when the range is outside the file.
  void Read(uint64_t offset, uint8_t* dst, uint64_t size) const;

  // Bytes [offset, offset + size) to read at random (the rows of a strided view): the
  // mapping's own, or a member's, read into a buffer while this lives.
  class Reach;

  // A piece of the file being streamed through, read with pread into a buffer this thread
  // reuses (faster than first touches of mapped pages, and no page of the mapping joins the
  // resident set); of a member, read from its ByteSource into such a buffer. The bytes
  // are valid while the window lives. (A MappedFile without a descriptor maps the piece in
  // one call and drops it from the resident set when the window goes.)
  class Window {
   public:
    Window(const MappedFile& f, uint64_t offset, uint64_t size);
    ~Window();
    Window(const Window&) = delete;
    Window& operator=(const Window&) = delete;
    Bytes bytes() const { return bytes_; }

    // What a window reads into: a buffer taken from this thread's spares (fresh pages for every
    // window would cost a page fault per 4 KiB read) and given back when the window goes.
    struct Buffer {
      std::unique_ptr<uint8_t[]> data;
      uint64_t capacity = 0;
    };

   private:
    const MappedFile& f_;
    uint64_t offset_;
    uint64_t size_;
    Bytes bytes_;
    Buffer buffer_;
    bool borrowed_ = false;  // bytes of this thread's Prefetched range
  };

  // While one lives on a thread, that thread's Windows of this file inside
  // [offset, offset + size) show bytes read here in one go: a run of tiny tensors costs one
  // pread instead of one per tensor. Windows must not outlive it.
  class Prefetched {
   public:
    Prefetched(const MappedFile& f, uint64_t offset, uint64_t size);
    ~Prefetched();
    Prefetched(const Prefetched&) = delete;
    Prefetched& operator=(const Prefetched&) = delete;

   private:
    friend class Window;
    const MappedFile& f_;
    uint64_t offset_;
    Window window_;
    Prefetched* outer_;
  };

  class Reach {
   public:
    Reach(const MappedFile& f, uint64_t offset, uint64_t size);
    Bytes bytes() const { return bytes_; }

   private:
    std::unique_ptr<Window> window_;
    Bytes bytes_;
  };

  // Tells the kernel we will read [offset, offset+size) front to back.
  void AdviseSequential(uint64_t offset, uint64_t size) const;
  // Maps [offset, offset+size) in one call instead of one page fault per few pages
  // (MADV_POPULATE_READ, Linux >= 5.14; a no-op elsewhere). Call before reading a piece.
  void Populate(uint64_t offset, uint64_t size) const;
  // Drops mapped pages of [offset, offset+size) from our resident set (page cache stays),
  // so streaming through a huge file keeps RSS flat.
  void Release(uint64_t offset, uint64_t size) const;

 private:
  void Reset();

  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
  Stamp stamp_;
  mode_t mode_ = 0;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  std::shared_ptr<const ByteSource> source_;
};

}  // namespace ckpt
