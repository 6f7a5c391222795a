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

// Where the bytes of a file restored only in part come from: a .ckz archive's checkpoint
// opened in place is a sparse "skeleton" file holding its plain bytes (zip headers, pickles,
// json), and its tensor bytes are decoded from the archive's chunks when a Window asks.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Fills dst with the file's bytes [offset, offset + size); throws ckpt::Error on damage.
  virtual void Read(uint64_t offset, uint8_t* dst, uint64_t size) const = 0;
  // Writes those bytes into the file on disk, so that mappings of it show them.
  virtual void Materialize(uint64_t offset, uint64_t size) const = 0;
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

  // Files opened at `path` from now on (the same file: device and inode) read through
  // `source`: Window serves their bytes from it, bytes() shows only what the file holds on
  // disk, and their stamp is `origin`'s (the archive the bytes come from), so a writer that
  // requires its inputs unchanged checks the archive. Until UnregisterBacked(the id returned),
  // which must come before the file is removed (another file could get its inode).
  using BackedId = std::pair<uint64_t, uint64_t>;  // device, inode
  static BackedId RegisterBacked(const std::string& path, std::shared_ptr<const ByteSource> source,
                                 Stamp origin);
  static void UnregisterBacked(BackedId id);
  // Is this file read through a ByteSource? Then only Window and Read see every byte.
  bool backed() const { return source_ != nullptr; }
  // Copies [offset, offset + size) into dst (from the map, or the ByteSource of a backed
  // file). Throws when the range is outside the file.
  void Read(uint64_t offset, uint8_t* dst, uint64_t size) const;
  // Of a backed file: writes [offset, offset + size) into the file on disk, so that bytes()
  // shows it from then on (for reads too scattered for windows). Elsewhere: nothing to do.
  void Materialize(uint64_t offset, uint64_t size) const;

  // A piece of the file being streamed through, read with pread into a buffer this thread
  // reuses (faster than first touches of mapped pages, and no page of the mapping joins the
  // resident set); of a backed file, read from its ByteSource into such a buffer. The bytes
  // are valid while the window lives. (A MappedFile without a descriptor maps the piece in
  // one call and drops it from the resident set when the window goes.)
  class Window {
   public:
    Window(const MappedFile& f, uint64_t offset, uint64_t size);
    ~Window();
    Window(const Window&) = delete;
    Window& operator=(const Window&) = delete;
    Bytes bytes() const { return bytes_; }

    // Of a backed file: a buffer taken from this thread's spares (fresh pages for every
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
