#include "compress/archive.h"

#include <filesystem>

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "base/error.h"
#include "compress/pipeline.h"
#include "io/crc32.h"

namespace ckpt::ckz {

bool LooksLikeArchive(Bytes head) {
  return head.size() >= sizeof kMagic && std::memcmp(head.data(), kMagic, sizeof kMagic) == 0;
}

std::string WithoutArchiveSuffix(std::string_view name) {
  if (name.size() <= kArchiveSuffix.size() || !name.ends_with(kArchiveSuffix)) return "";
  return std::string(name.substr(0, name.size() - kArchiveSuffix.size()));
}

void DecodeChunks(const Archive& a, size_t first, size_t count, unsigned threads,
                  const DecodeLoop& loop) {
  threads = std::max(1u, threads);
  std::vector<std::unique_ptr<ChunkCoder>> coders(threads);
  std::vector<std::vector<uint8_t>> buffers(threads);
  ParallelWorkers(count, threads, [&](size_t j, unsigned w) {
    size_t k = first + j;
    if (loop.wanted && !loop.wanted(k)) return;
    if (!coders[w]) coders[w] = std::make_unique<ChunkCoder>();
    const Chunk& c = a.index().chunks[k];
    buffers[w].resize(c.length);
    if (loop.on_error) {
      std::string error = a.TryDecodeChunk(*coders[w], k, buffers[w].data());
      if (!error.empty()) {
        loop.on_error(k, error);
        return;
      }
    } else {
      a.DecodeChunk(*coders[w], k, buffers[w].data());
    }
    if (loop.use) loop.use(k, Bytes(buffers[w].data(), c.length));
  });
}

bool IsArchiveFile(const std::string& path, const Volume& volume) {
  if (!volume.IsFile(path)) return false;  // never open a FIFO
  try {
    MappedFile m = volume.Open(path);
    return LooksLikeArchive(m.bytes());
  } catch (const Error&) {
    return false;
  }
}

Archive Archive::Open(const std::string& path) {
  Archive a;
  a.name_ = path;
  a.map_ = MappedFile::Open(path);
  a.bytes_ = a.map_.bytes();
  WithContext(path, [&] { a.Load(); });
  return a;
}

Archive Archive::FromBytes(Bytes bytes, std::string name) {
  Archive a;
  a.name_ = std::move(name);
  a.bytes_ = bytes;
  WithContext(a.name_, [&] { a.Load(); });
  return a;
}

void Archive::Load() {
  CheckFileHeader(bytes_);
  TrailerInfo t = ParseTrailer(bytes_);
  Bytes frame = bytes_.subspan(t.index_offset, t.index_frame);
  if (Crc32(0, frame) != t.index_crc) Fail("the index is damaged (checksum mismatch)");
  unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (content != t.index_raw) Fail("the index frame does not hold {} bytes", t.index_raw);
  std::string raw(t.index_raw, '\0');
  size_t got = ZSTD_decompress(raw.data(), raw.size(), frame.data(), frame.size());
  if (ZSTD_isError(got) || got != raw.size()) Fail("the index does not decode");
  index_ = ParseIndex(AsBytes(raw), bytes_.size(), t.index_offset);
  index_frame_ = t.index_frame;
}

Bytes Archive::ChunkBytes(size_t k) const {
  const Chunk& c = index_.chunks.at(k);
  return Slice(bytes_, c.archive_offset, c.stored_bytes());
}

std::vector<Run> Archive::ChunkRuns(size_t k) const {
  const Chunk& c = index_.chunks.at(k);
  if (c.coding == Coding::kWhole) return {{c.length, Transform::kBytes}};
  return RunsOf(index_.entries.at(c.file).ranges, c.offset, c.length);
}

std::string Archive::DescribeChunk(size_t k) const {
  const Chunk& c = index_.chunks.at(k);
  const Entry& e = index_.entries.at(c.file);
  uint64_t end = c.offset + c.length;
  std::vector<std::string> names;
  size_t more = 0;
  for (const TensorInfo& t : e.tensors) {
    if (t.end <= c.offset || t.begin >= end || t.begin == t.end) continue;
    if (names.size() < 3) {
      names.push_back("'" + t.name + "'");
    } else {
      ++more;
    }
  }
  std::string what;
  if (!names.empty()) {
    what = names.size() == 1 && more == 0 ? ", tensor " : ", tensors ";
    for (size_t i = 0; i < names.size(); ++i) what += (i ? ", " : "") + names[i];
    if (more) what += fmt::format(" and {} more", more);
  }
  std::string path = e.path.empty() ? "." : e.path;
  return fmt::format("{}: chunk {} (bytes {}-{}{})", path, k, c.offset, end - 1, what);
}

std::string Archive::TryDecodeChunk(ChunkCoder& coder, size_t k, uint8_t* dst) const {
  const Chunk& c = index_.chunks.at(k);
  // Read through a window of the file (pread into a buffer this thread reuses): memory
  // stays flat however large the archive.
  bool mapped = map_.bytes().data() == bytes_.data() && bytes_.data() != nullptr;
  std::string error;
  try {
    Bytes stored = ChunkBytes(k);
    std::optional<MappedFile::Window> window;
    if (mapped) {
      window.emplace(map_, c.archive_offset, c.stored_bytes());
      stored = window->bytes();
    }
    coder.Decode(stored, c, ChunkRuns(k), dst);
  } catch (const Error& e) {
    error = e.what();
  }
  return error;
}

void Archive::DecodeChunk(ChunkCoder& coder, size_t k, uint8_t* dst) const {
  std::string error = TryDecodeChunk(coder, k, dst);
  if (!error.empty()) Fail("{}: {}: {}: the archive is damaged", name_, DescribeChunk(k), error);
}

}  // namespace ckpt::ckz
