#include "compress/archive_volume.h"

#include <sys/mman.h>
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

  // Frees what the cache holds of archive `id` (workers' caches go with their threads; the
  // thread that opened a volume -- a long-running watch, say -- drops its own when it goes).
  void Drop(uint64_t id) {
    std::erase_if(slots_, [id](const Slot& s) { return s.archive == id; });
    if (slots_.empty()) coder_.reset();
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
  ArchiveFile(std::shared_ptr<const Archive> archive, uint64_t id, size_t entry)
      : archive_(std::move(archive)), id_(id), entry_(entry) {}

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
};

// Bytes of entry `e` outside its tensor ranges.
uint64_t PlainBytes(const Index& index, const Entry& e) {
  uint64_t plain = 0;
  for (uint64_t k = e.first_chunk; k < e.first_chunk + e.chunk_count; ++k) {
    const Chunk& c = index.chunks[k];
    for (const Run& r : RunsOf(e.ranges, c.offset, c.length))
      if (r.transform == Transform::kBytes) plain += r.length;
  }
  return plain;
}

// Writes the plain bytes of entry `i` into the file `fd` (of the entry's size, zero elsewhere).
// Only chunks holding plain bytes are decoded (and checked); tensor-only chunks are skipped.
void WritePlainBytes(const Archive& a, size_t i, int fd, unsigned threads) {
  const Index& index = a.index();
  const Entry& e = index.entries[i];
  DecodeLoop loop;
  loop.wanted = [&](size_t k) {
    const Chunk& c = index.chunks[k];
    for (const Run& r : RunsOf(e.ranges, c.offset, c.length))
      if (r.transform == Transform::kBytes) return true;
    return false;
  };
  loop.use = [&](size_t k, Bytes bytes) {  // chunks tile the file: workers write apart
    const Chunk& c = index.chunks[k];
    uint64_t at = 0;
    for (const Run& r : RunsOf(e.ranges, c.offset, c.length)) {
      if (r.transform == Transform::kBytes)
        WriteFullyAt(fd, bytes.subspan(at, r.length), c.offset + at, e.path, "write failed");
      at += r.length;
    }
  };
  DecodeChunks(a, static_cast<size_t>(e.first_chunk), e.chunk_count, threads, loop);
}

std::string Parent(const std::string& rel) {
  size_t slash = rel.rfind('/');
  return slash == std::string::npos ? std::string() : rel.substr(0, slash);
}

}  // namespace

std::unique_ptr<ArchiveVolume> ArchiveVolume::Open(const std::string& archive, std::string root,
                                                   unsigned threads) {
  std::unique_ptr<ArchiveVolume> v(new ArchiveVolume());
  v->archive_ = std::make_shared<const Archive>(Archive::Open(archive));
  v->id_ = next_archive_id++;
  v->root_ = fs::path(root).lexically_normal().string();
  while (v->root_.size() > 1 && v->root_.ends_with('/')) v->root_.pop_back();
  v->threads_ = std::max(1u, threads);
  const Index& index = v->archive_->index();
  for (size_t i = 0; i < index.entries.size(); ++i) {
    const Entry& e = index.entries[i];
    std::string rel = index.kind == ArchiveKind::kFile ? std::string() : e.path;
    if (!v->entries_.emplace(rel, i).second) Fail("{}: {} is in the index twice", archive, rel);
    if (!rel.empty()) v->children_[Parent(rel)].push_back(rel.substr(rel.rfind('/') + 1));
    if (e.type != EntryType::kFile) continue;
    uint64_t plain = PlainBytes(index, e);
    v->plain_bytes_ += plain;
    v->tensor_bytes_ += e.size - plain;
  }
  for (auto& [folder, names] : v->children_) std::sort(names.begin(), names.end());
  return v;
}

bool ArchiveVolume::Inside(const std::string& path, std::string& rel) const {
  std::string p = fs::path(path).lexically_normal().string();
  while (p.size() > 1 && p.ends_with('/')) p.pop_back();
  if (p == root_) {
    rel.clear();
    return true;
  }
  if (!p.starts_with(root_ + "/")) return false;
  rel = p.substr(root_.size() + 1);
  return true;
}

int64_t ArchiveVolume::Find(const std::string& path, bool follow_last) const {
  std::string rel;
  if (!Inside(path, rel)) return -1;
  const Index& index = archive_->index();
  // Resolve component by component, a link's target in its place (at most 40 of them).
  std::vector<std::string> todo;
  for (const auto& part : fs::path(rel)) todo.push_back(part.string());
  std::reverse(todo.begin(), todo.end());
  std::string at;  // resolved so far ("" the root)
  int hops = 0;
  while (!todo.empty()) {
    std::string part = std::move(todo.back());
    todo.pop_back();
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (at.empty()) return -1;  // out of the archive
      at = Parent(at);
      continue;
    }
    std::string next = at.empty() ? part : at + "/" + part;
    auto it = entries_.find(next);
    if (it == entries_.end()) return -1;
    const Entry& e = index.entries[it->second];
    if (e.type == EntryType::kSymlink && (follow_last || !todo.empty())) {
      if (++hops > 40 || e.target.empty() || e.target[0] == '/') return -1;
      std::vector<std::string> target;
      for (const auto& t : fs::path(e.target)) target.push_back(t.string());
      todo.insert(todo.end(), target.rbegin(), target.rend());
      continue;  // `at` stays the link's folder
    }
    if (!todo.empty() && e.type != EntryType::kFolder) return -1;
    at = std::move(next);
  }
  auto it = entries_.find(at);
  return it == entries_.end() ? -1 : static_cast<int64_t>(it->second);
}

MappedFile ArchiveVolume::Open(const std::string& path) const {
  int64_t i = Find(path, true);
  if (i < 0) Fail("{}: cannot open: No such file or directory", path);
  const Entry& e = archive_->index().entries[static_cast<size_t>(i)];
  if (e.type != EntryType::kFile) Fail("{}: not a regular file", path);
  bool all_plain = PlainBytes(archive_->index(), e) == e.size;
  std::shared_ptr<const ByteSource> source;
  if (!all_plain) source = std::make_shared<ArchiveFile>(archive_, id_, static_cast<size_t>(i));
  std::lock_guard<std::mutex> lock(images_mutex_);
  MappedFile f =
      MappedFile::Member(path, e.size, static_cast<mode_t>(e.mode), archive_->map().stamp(),
                         std::move(source), ImageOf(static_cast<size_t>(i)));
  if (archive_->map().stamp().ChangedOnDisk())
    Fail("{}: the archive changed while it was being read", archive_->name());
  return f;
}

NodeType ArchiveVolume::TypeAt(int64_t i) const {
  if (i < 0) return NodeType::kMissing;
  switch (archive_->index().entries[static_cast<size_t>(i)].type) {
    case EntryType::kFile:
      return NodeType::kFile;
    case EntryType::kFolder:
      return NodeType::kFolder;
    case EntryType::kSymlink:
      return NodeType::kSymlink;
  }
  return NodeType::kOther;
}

// Find follows every link it can, and finds nothing where one leads nowhere.
NodeType ArchiveVolume::TypeOf(const std::string& path) const {
  return TypeAt(Find(path, true));
}

NodeType ArchiveVolume::LinkTypeOf(const std::string& path) const {
  return TypeAt(Find(path, false));
}

std::vector<Node> ArchiveVolume::List(const std::string& path) const {
  int64_t i = Find(path, true);
  if (i < 0 || archive_->index().entries[static_cast<size_t>(i)].type != EntryType::kFolder)
    Fail("{}: cannot list folder: Not a directory", path);
  const std::string& rel = archive_->index().entries[static_cast<size_t>(i)].path;
  std::vector<Node> out;
  auto it = children_.find(archive_->index().kind == ArchiveKind::kFile ? std::string() : rel);
  if (it == children_.end()) return out;
  std::string base = path;
  while (base.size() > 1 && base.ends_with('/')) base.pop_back();
  for (const std::string& name : it->second) {
    std::string child = base + "/" + name;
    out.push_back({child, LinkTypeOf(child)});
  }
  return out;
}

int ArchiveVolume::ImageOf(size_t i) const {
  auto it =
      std::find_if(images_.begin(), images_.end(), [i](const auto& m) { return m.first == i; });
  if (it != images_.end()) {
    std::rotate(it, it + 1, images_.end());  // the latest last
    return images_.back().second;
  }
  const Entry& e = archive_->index().entries[i];
  int fd = ::memfd_create("ckptool-member", MFD_CLOEXEC);
  if (fd < 0)
    Fail("{}: {}: cannot make a file in memory: {}", archive_->name(), e.path,
         std::strerror(errno));
  try {
    if (::ftruncate(fd, static_cast<off_t>(e.size)) != 0)
      Fail("{}: {}: cannot size a file in memory: {}", archive_->name(), e.path,
           std::strerror(errno));
    WritePlainBytes(*archive_, i, fd, threads_);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (images_.size() == kImages) {  // a mapping keeps its image alive: the descriptor can go
    ::close(images_.front().second);
    images_.erase(images_.begin());
  }
  images_.emplace_back(i, fd);
  return fd;
}

ArchiveVolume::~ArchiveVolume() {
  for (const auto& [entry, fd] : images_) ::close(fd);
  cache.Drop(id_);
}

}  // namespace ckpt::ckz
