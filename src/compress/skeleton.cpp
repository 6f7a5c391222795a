#include "compress/skeleton.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "compress/pipeline.h"
#include "io/positioned_io.h"

namespace ckpt::ckz {

namespace {

namespace fs = std::filesystem;

[[noreturn]] void FailErrno(const std::string& path, const char* what) {
  Fail("{}: {}: {}", path, what, std::strerror(errno));
}

// Each thread keeps the last few chunks it decoded: windows over small tensors come one
// after the other from the same chunk, and a tensor split across files (a DCP tensor sharded
// on its second dimension) is read row by row from each in turn; either way a chunk is then
// decoded once per thread, not once per window.
class DecodeCache {
 public:
  // The decoded bytes of chunk k of `archive` (identified by `id`).
  const uint8_t* Get(const Archive& archive, uint64_t id, size_t k) {
    ++clock_;
    for (Slot& s : slots_) {
      if (s.archive == id && s.chunk == k) {
        s.used = clock_;
        return s.bytes.data();
      }
    }
    const uint32_t length = archive.index().chunks[k].length;
    Slot* slot = nullptr;
    if (slots_.size() < kSlots) {
      slots_.reserve(kSlots);
      slot = &slots_.emplace_back();
    } else {
      slot = &*std::min_element(slots_.begin(), slots_.end(),
                                [](const Slot& a, const Slot& b) { return a.used < b.used; });
    }
    if (slot->bytes.size() < length) slot->bytes.resize(length);
    slot->archive = 0;  // empty until decoded and checked
    archive.DecodeChunk(Coder(), k, slot->bytes.data());
    slot->archive = id;
    slot->chunk = k;
    slot->used = clock_;
    return slot->bytes.data();
  }

  ChunkCoder& Coder() {
    if (!coder_) coder_ = std::make_unique<ChunkCoder>();
    return *coder_;
  }

  // Frees what the cache holds (workers' caches go with their threads; the thread that made a
  // skeleton -- a long-running watch, say -- drops its own when the skeleton goes).
  void Clear() {
    slots_ = {};
    coder_.reset();
  }

 private:
  static constexpr size_t kSlots = 8;  // 8 MiB per thread at the writer's 1 MiB chunks
  struct Slot {
    uint64_t archive = 0;  // ArchiveFile id (0: empty)
    size_t chunk = 0;
    uint64_t used = 0;
    std::vector<uint8_t> bytes;
  };
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
  std::unique_ptr<ChunkCoder> coder_;
};
thread_local DecodeCache cache;

std::atomic<uint64_t> next_archive_id{1};

// One file of the archive as a ByteSource: bytes decoded from its chunks, each checked.
class ArchiveFile : public ByteSource {
 public:
  ArchiveFile(std::shared_ptr<const Archive> archive, uint64_t id, size_t entry, std::string path)
      : archive_(std::move(archive)), id_(id), entry_(entry), path_(std::move(path)) {}

  void Materialize(uint64_t offset, uint64_t size) const override {
    int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) FailErrno(path_, "cannot open");
    try {
      std::vector<uint8_t> piece;
      for (uint64_t at = offset, end = offset + size; at < end;) {
        uint64_t n = std::min<uint64_t>(end - at, 4u << 20);
        piece.resize(n);
        Read(at, piece.data(), n);
        WriteFullyAt(fd, {piece.data(), n}, at, path_, "write failed");
        at += n;
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) FailErrno(path_, "write failed");
  }

  void Read(uint64_t offset, uint8_t* dst, uint64_t size) const override {
    const Index& index = archive_->index();
    const Entry& e = index.entries[entry_];
    if (offset > e.size || size > e.size - offset)
      Fail("{}: {}: bytes {}-{} are past the file's end", archive_->name(), e.path, offset,
           offset + size);
    const auto first = index.chunks.begin() + static_cast<ptrdiff_t>(e.first_chunk);
    const auto last = first + static_cast<ptrdiff_t>(e.chunk_count);
    // The first chunk that ends after `offset` (a file's chunks tile it in order).
    auto it = std::upper_bound(first, last, offset, [](uint64_t off, const Chunk& c) {
      return off < c.offset + c.length;
    });
    const uint64_t end = offset + size;
    for (; it != last && it->offset < end; ++it) {
      const Chunk& c = *it;
      size_t k = static_cast<size_t>(it - index.chunks.begin());
      uint64_t lo = std::max(offset, c.offset), hi = std::min(end, c.offset + c.length);
      if (lo == c.offset && hi == c.offset + c.length) {  // the whole chunk: decode in place
        archive_->DecodeChunk(cache.Coder(), k, dst + (lo - offset));
        continue;
      }
      const uint8_t* chunk = cache.Get(*archive_, id_, k);
      std::memcpy(dst + (lo - offset), chunk + (lo - c.offset), hi - lo);
    }
  }

 private:
  std::shared_ptr<const Archive> archive_;
  uint64_t id_;
  size_t entry_;
  std::string path_;  // the skeleton file
};

// Writes the plain bytes of file entry `i` into `path` (created sparse, at its full size).
// Only chunks holding plain bytes are decoded (and checked); tensor-only chunks are skipped.
uint64_t WritePlainBytes(const Archive& a, size_t i, const std::string& path, unsigned threads) {
  const Index& index = a.index();
  const Entry& e = index.entries[i];
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) FailErrno(path, "cannot create");
  std::atomic<uint64_t> plain{0};
  try {
    if (::ftruncate(fd, static_cast<off_t>(e.size)) != 0) FailErrno(path, "cannot set the size");
    DecodeLoop loop;
    loop.wanted = [&](size_t k) {  // chunks holding plain bytes only (tensors stay backed)
      const Chunk& c = index.chunks[k];
      for (const Run& r : RunsOf(e.ranges, c.offset, c.length))
        if (r.transform == Transform::kBytes) return true;
      return false;
    };
    loop.use = [&](size_t k, Bytes bytes) {
      const Chunk& c = index.chunks[k];
      uint64_t at = 0;
      for (const Run& r : RunsOf(e.ranges, c.offset, c.length)) {
        if (r.transform == Transform::kBytes) {
          WriteFullyAt(fd, bytes.subspan(at, r.length), c.offset + at, path, "write failed");
          plain += r.length;
        }
        at += r.length;
      }
    };
    DecodeChunks(a, static_cast<size_t>(e.first_chunk), e.chunk_count, threads, loop);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) FailErrno(path, "write failed");
  return plain;
}

}  // namespace

std::unique_ptr<Skeleton> Skeleton::Build(const std::string& archive, const std::string& dest,
                                          unsigned threads) {
  auto a = std::make_shared<const Archive>(Archive::Open(archive));
  const Index& index = a->index();
  const uint64_t id = next_archive_id++;
  threads = std::max(1u, threads);
  std::unique_ptr<Skeleton> s(new Skeleton());
  s->dest_ = dest;
  s->registered_.reserve(index.entries.size());  // push_back cannot throw once registered
  auto at = [&](const Entry& e) {
    return index.kind == ArchiveKind::kFile || e.path.empty() ? dest : dest + "/" + e.path;
  };
  for (const Entry& e : index.entries) {  // folders come before what they hold
    if (e.type == EntryType::kFolder && ::mkdir(at(e).c_str(), 0700) != 0)
      FailErrno(at(e), "cannot create the folder");
  }
  for (size_t i = 0; i < index.entries.size(); ++i) {
    const Entry& e = index.entries[i];
    if (e.type == EntryType::kSymlink) {
      if (::symlink(e.target.c_str(), at(e).c_str()) != 0)
        FailErrno(at(e), "cannot create the symlink");
      continue;
    }
    if (e.type != EntryType::kFile) continue;
    uint64_t plain = WritePlainBytes(*a, i, at(e), threads);
    s->plain_bytes_ += plain;
    s->backed_bytes_ += e.size - plain;
    if (plain == e.size) continue;  // all of it on disk: an ordinary file
    s->registered_.push_back(MappedFile::RegisterBacked(
        at(e), std::make_shared<ArchiveFile>(a, id, i, at(e)), a->map().stamp()));
  }
  if (a->map().stamp().ChangedOnDisk())
    Fail("{}: the archive changed while it was being read", archive);
  return s;
}

Skeleton::~Skeleton() {
  for (const MappedFile::BackedId& id : registered_) MappedFile::UnregisterBacked(id);
  cache.Clear();
}

}  // namespace ckpt::ckz
