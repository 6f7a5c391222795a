#include "compress/format.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "base/checked.h"
#include "base/error.h"
#include "io/crc32.h"

namespace ckpt::ckz {

namespace {

constexpr size_t kMaxPath = 4096;
constexpr size_t kMaxTensorName = 1 << 16;
constexpr size_t kMaxRank = 64;
constexpr size_t kMaxPlanes = 17;  // bytes 1 + bf16 2 + f32 4 + f16 2 + f64 8
constexpr uint64_t kMaxFileSize = 1ull << 62;
// Smallest encodings, to bound counts by the bytes that could hold them.
constexpr uint64_t kMinEntryBytes = 1 + 4 + 8 + 4;
constexpr uint64_t kMinChunkEntryBytes = 8 + 4 + 8 + 4 + 4 + 1 + 1;
constexpr uint64_t kRangeBytes = 8 + 8 + 1;
constexpr uint64_t kMinTensorBytes = 4 + 1 + 1 + 8 + 8;
constexpr uint64_t kPlaneBytes = 1 + 4;

// What a zstd frame of `n` bytes can take at most (ZSTD_compressBound plus slack), so a
// lying stored size is refused before anything is decoded.
uint64_t FrameBound(uint64_t n) {
  return n + n / 128 + 1024;
}

std::string ReadString(ByteCursor& c, uint64_t max, const char* what) {
  uint32_t n = c.ReadLE<uint32_t>();
  if (n > max) Fail("{} of {} bytes (at most {})", what, n, max);
  return std::string(c.ReadText(n));
}

void AppendString(std::string& out, std::string_view s) {
  AppendLE<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

void AppendChunkBody(std::string& out, const Chunk& c) {
  AppendLE<uint32_t>(out, c.file);
  AppendLE<uint64_t>(out, c.offset);
  AppendLE<uint32_t>(out, c.length);
  AppendLE<uint32_t>(out, c.crc);
  out.push_back(static_cast<char>(c.coding));
  out.push_back(static_cast<char>(c.planes.size()));
  for (const Plane& p : c.planes) {
    out.push_back(static_cast<char>(p.method));
    AppendLE<uint32_t>(out, p.stored);
  }
}

Chunk ReadChunkBody(ByteCursor& c) {
  Chunk k;
  k.file = c.ReadLE<uint32_t>();
  k.offset = c.ReadLE<uint64_t>();
  k.length = c.ReadLE<uint32_t>();
  k.crc = c.ReadLE<uint32_t>();
  uint8_t coding = c.ReadU8();
  if (coding > 1) Fail("unknown chunk coding {}", coding);
  k.coding = static_cast<Coding>(coding);
  uint8_t planes = c.ReadU8();
  if (planes == 0 || planes > kMaxPlanes) Fail("{} planes in a chunk", planes);
  k.planes.resize(planes);
  for (Plane& p : k.planes) {
    uint8_t m = c.ReadU8();
    if (m > 2) Fail("unknown plane method {}", m);
    p.method = static_cast<Method>(m);
    p.stored = c.ReadLE<uint32_t>();
  }
  return k;
}

}  // namespace

uint32_t ElementBytes(Transform t) {
  switch (t) {
    case Transform::kBytes:
      return 1;
    case Transform::kBF16:
    case Transform::kF16:
      return 2;
    case Transform::kF32:
      return 4;
    case Transform::kF64:
      return 8;
  }
  return 1;
}

int PlaneCount(Transform t) {
  return t == Transform::kBytes ? 1 : static_cast<int>(ElementBytes(t));
}

const char* TransformName(Transform t) {
  switch (t) {
    case Transform::kBytes:
      return "bytes";
    case Transform::kBF16:
      return "bf16";
    case Transform::kF32:
      return "f32";
    case Transform::kF16:
      return "f16";
    case Transform::kF64:
      return "f64";
  }
  return "?";
}

const char* MethodName(Method m) {
  switch (m) {
    case Method::kRaw:
      return "raw";
    case Method::kHuffman:
      return "huffman";
    case Method::kLz:
      return "zstd";
  }
  return "?";
}

const char* FileFormatName(FileFormat f) {
  switch (f) {
    case FileFormat::kOther:
      return "other";
    case FileFormat::kTorchZip:
      return "torch-zip";
    case FileFormat::kTorchLegacy:
      return "torch-legacy";
    case FileFormat::kSafetensors:
      return "safetensors";
    case FileFormat::kDcpData:
      return "dcp-data";
  }
  return "?";
}

uint64_t ChunkHeaderSize(size_t planes) {
  return 4 + 4 + 8 + 4 + 4 + 1 + 1 + kPlaneBytes * planes;
}

uint64_t Chunk::stored_bytes() const {
  uint64_t n = ChunkHeaderSize(planes.size());
  for (const Plane& p : planes) n += p.stored;
  return n;
}

std::vector<Run> RunsOf(const std::vector<TypedRange>& ranges, uint64_t offset, uint64_t length) {
  std::vector<Run> runs;
  // Runs of one transform stay apart when they touch (two tensors): the coder starts a new
  // Huffman block at each run boundary. Plain-byte runs merge.
  auto add = [&](uint64_t n, Transform t) {
    if (n == 0) return;
    if (!runs.empty() && runs.back().transform == t && t == Transform::kBytes) {
      runs.back().length += static_cast<uint32_t>(n);
    } else {
      runs.push_back({static_cast<uint32_t>(n), t});
    }
  };
  uint64_t end = offset + length;
  auto it =
      std::upper_bound(ranges.begin(), ranges.end(), offset,
                       [](uint64_t off, const TypedRange& r) { return off < r.offset + r.length; });
  uint64_t pos = offset;
  for (; it != ranges.end() && it->offset < end; ++it) {
    uint64_t a = std::max(pos, it->offset);
    uint64_t b = std::min(end, it->offset + it->length);
    uint32_t es = ElementBytes(it->transform);
    if ((a - it->offset) % es != 0 || (b - it->offset) % es != 0) {
      Fail("chunk [{}, {}) cuts an element of the {} range at {}", offset, end,
           TransformName(it->transform), it->offset);
    }
    add(a - pos, Transform::kBytes);
    add(b - a, it->transform);
    pos = b;
  }
  add(end - pos, Transform::kBytes);
  return runs;
}

std::vector<PlaneShape> PlaneShapes(const std::vector<Run>& runs) {
  uint64_t totals[kTransforms] = {};
  for (const Run& r : runs) totals[static_cast<int>(r.transform)] += r.length;
  std::vector<PlaneShape> shapes;
  for (int t = 0; t < kTransforms; ++t) {
    if (totals[t] == 0) continue;
    Transform tr = static_cast<Transform>(t);
    uint32_t n = static_cast<uint32_t>(totals[t] / ElementBytes(tr));
    for (int p = 0; p < PlaneCount(tr); ++p) shapes.push_back({tr, p, n});
  }
  return shapes;
}

std::string ChunkHeader(const Chunk& c) {
  std::string out;
  AppendLE<uint32_t>(out, kChunkMagic);
  AppendChunkBody(out, c);
  return out;
}

std::string FileHeader() {
  std::string out(kMagic, sizeof kMagic);
  AppendLE<uint16_t>(out, kVersion);
  AppendLE<uint16_t>(out, 0);
  AppendLE<uint32_t>(out, 0);
  return out;
}

std::string SerializeIndex(const Index& index) {
  std::string out;
  AppendLE<uint32_t>(out, kIndexMagic);
  out.push_back(static_cast<char>(index.kind));
  out.push_back(static_cast<char>(index.level));
  AppendLE<uint32_t>(out, static_cast<uint32_t>(index.entries.size()));
  AppendLE<uint64_t>(out, index.chunks.size());
  for (const Entry& e : index.entries) {
    out.push_back(static_cast<char>(e.type));
    AppendLE<uint32_t>(out, e.mode);
    AppendLE<int64_t>(out, e.mtime_ns);
    AppendString(out, e.path);
    if (e.type == EntryType::kSymlink) AppendString(out, e.target);
    if (e.type != EntryType::kFile) continue;
    AppendLE<uint64_t>(out, e.size);
    AppendLE<uint32_t>(out, e.crc);
    out.push_back(static_cast<char>(e.format));
    AppendLE<uint64_t>(out, e.first_chunk);
    AppendLE<uint64_t>(out, e.chunk_count);
    AppendLE<uint32_t>(out, static_cast<uint32_t>(e.ranges.size()));
    for (const TypedRange& r : e.ranges) {
      AppendLE<uint64_t>(out, r.offset);
      AppendLE<uint64_t>(out, r.length);
      out.push_back(static_cast<char>(r.transform));
    }
    AppendLE<uint32_t>(out, static_cast<uint32_t>(e.tensors.size()));
    for (const TensorInfo& t : e.tensors) {
      AppendString(out, t.name);
      out.push_back(static_cast<char>(t.dtype.size()));
      out.append(t.dtype);
      out.push_back(static_cast<char>(t.shape.size()));
      for (int64_t d : t.shape) AppendLE<int64_t>(out, d);
      AppendLE<uint64_t>(out, t.begin);
      AppendLE<uint64_t>(out, t.end);
    }
  }
  for (const Chunk& c : index.chunks) {
    AppendLE<uint64_t>(out, c.archive_offset);
    AppendChunkBody(out, c);
  }
  return out;
}

std::string Trailer(uint64_t index_offset, uint64_t index_frame, uint64_t index_raw,
                    uint32_t index_crc) {
  std::string out(kTrailerMagic, sizeof kTrailerMagic);
  AppendLE<uint64_t>(out, index_offset);
  AppendLE<uint64_t>(out, index_frame);
  AppendLE<uint64_t>(out, index_raw);
  AppendLE<uint32_t>(out, index_crc);
  AppendLE<uint32_t>(out, Crc32(0, AsBytes(out)));
  return out;
}

void CheckFileHeader(Bytes archive) {
  if (archive.size() < sizeof kMagic || std::memcmp(archive.data(), kMagic, sizeof kMagic) != 0)
    Fail("not a ckptool archive (.ckz): wrong magic number");
  if (archive.size() < kHeaderSize + kTrailerSize)
    Fail("truncated: {} bytes, a .ckz archive has at least {}", archive.size(),
         kHeaderSize + kTrailerSize);
  ByteCursor c(archive.subspan(sizeof kMagic, kHeaderSize - sizeof kMagic), sizeof kMagic);
  uint16_t version = c.ReadLE<uint16_t>();
  if (version != kVersion)
    Fail("archive format version {}; this ckptool reads version {} (a newer ckptool made it?)",
         version, kVersion);
  uint16_t flags = c.ReadLE<uint16_t>();
  uint32_t reserved = c.ReadLE<uint32_t>();
  if (flags != 0 || reserved != 0)
    Fail("header flags {:#x}/{:#x} are not defined", flags, reserved);
}

TrailerInfo ParseTrailer(Bytes archive) {
  if (archive.size() < kHeaderSize + kTrailerSize) Fail("truncated: no room for the index");
  Bytes t = archive.subspan(archive.size() - kTrailerSize);
  if (std::memcmp(t.data(), kTrailerMagic, sizeof kTrailerMagic) != 0)
    Fail("truncated or damaged: the index trailer is missing at the end of the archive");
  if (Crc32(0, t.first(kTrailerSize - 4)) != LoadLE<uint32_t>(t.data() + kTrailerSize - 4))
    Fail("the index trailer is damaged (checksum mismatch)");
  ByteCursor c(t.subspan(sizeof kTrailerMagic), archive.size() - kTrailerSize + 8);
  TrailerInfo info;
  info.index_offset = c.ReadLE<uint64_t>();
  info.index_frame = c.ReadLE<uint64_t>();
  info.index_raw = c.ReadLE<uint64_t>();
  info.index_crc = c.ReadLE<uint32_t>();
  uint64_t index_end = archive.size() - kTrailerSize;
  if (info.index_offset < kHeaderSize || info.index_offset > index_end ||
      info.index_frame != index_end - info.index_offset) {
    Fail("the index trailer points outside the archive (index at {}, {} bytes, archive {} bytes)",
         info.index_offset, info.index_frame, archive.size());
  }
  if (info.index_raw > kMaxIndexBytes || info.index_raw > info.index_frame * 1024 + (1 << 20))
    Fail("the index claims {} bytes decoded from a {}-byte frame", info.index_raw,
         info.index_frame);
  return info;
}

bool IsSafeRelativePath(std::string_view path) {
  if (path.empty()) return true;
  if (path.size() > kMaxPath || path.front() == '/') return false;
  if (path.find('\0') != std::string_view::npos) return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    std::string_view part = path.substr(start, slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = slash + 1;
  }
  return true;
}

Index ParseIndex(Bytes raw, uint64_t archive_size, uint64_t index_offset) {
  ByteCursor c(raw);
  Index index;
  if (c.ReadLE<uint32_t>() != kIndexMagic) Fail("index: wrong magic number");
  uint8_t kind = c.ReadU8();
  if (kind > 1) Fail("index: unknown archive kind {}", kind);
  index.kind = static_cast<ArchiveKind>(kind);
  index.level = c.ReadU8();
  uint32_t entries = c.ReadLE<uint32_t>();
  uint64_t chunks = c.ReadLE<uint64_t>();
  if (entries > c.remaining() / kMinEntryBytes) Fail("index: {} entries cannot fit", entries);
  if (chunks > c.remaining() / kMinChunkEntryBytes) Fail("index: {} chunks cannot fit", chunks);
  if (index.kind == ArchiveKind::kFile && entries != 1)
    Fail("index: a one-file archive with {} entries", entries);
  index.entries.reserve(entries);
  std::unordered_set<std::string> folders, paths;
  uint64_t next_chunk = 0;
  for (uint32_t i = 0; i < entries; ++i) {
    Entry e;
    uint8_t type = c.ReadU8();
    if (type > 2) Fail("index: entry {}: unknown type {}", i, type);
    e.type = static_cast<EntryType>(type);
    e.mode = c.ReadLE<uint32_t>();
    if (e.mode > 07777) Fail("index: entry {}: mode {:o}", i, e.mode);
    e.mtime_ns = c.ReadLE<int64_t>();
    e.path = ReadString(c, kMaxPath, "path");
    std::string where = fmt::format("index: entry '{}'", e.path);
    if (!IsSafeRelativePath(e.path)) Fail("{}: unsafe path", where);
    if (!paths.insert(e.path).second) Fail("{}: listed twice", where);
    if (index.kind == ArchiveKind::kFile) {
      if (e.type != EntryType::kFile || e.path.empty() || e.path.find('/') != std::string::npos)
        Fail("{}: a one-file archive must hold one plain file name", where);
    } else if (i == 0) {
      if (!e.path.empty() || e.type != EntryType::kFolder)
        Fail("index: a folder archive must start with its folder");
    } else {
      size_t slash = e.path.rfind('/');
      std::string parent = slash == std::string::npos ? "" : e.path.substr(0, slash);
      if (e.path.empty() || !folders.count(parent))
        Fail("{}: its folder is not listed before it", where);
    }
    if (e.type == EntryType::kFolder) folders.insert(e.path);
    if (e.type == EntryType::kSymlink) {
      e.target = ReadString(c, kMaxPath, "symlink target");
      if (e.target.empty() || e.target.find('\0') != std::string::npos)
        Fail("{}: bad symlink target", where);
    }
    if (e.type == EntryType::kFile) {
      e.size = c.ReadLE<uint64_t>();
      if (e.size > kMaxFileSize) Fail("{}: size {}", where, e.size);
      e.crc = c.ReadLE<uint32_t>();
      uint8_t format = c.ReadU8();
      // What the file was found to be: informative only (the bytes and ranges say how to
      // decode it), so a code a later writer adds reads as "other".
      e.format = format > 4 ? FileFormat::kOther : static_cast<FileFormat>(format);
      e.first_chunk = c.ReadLE<uint64_t>();
      e.chunk_count = c.ReadLE<uint64_t>();
      if (e.first_chunk != next_chunk || e.chunk_count > chunks - next_chunk)
        Fail("{}: chunks {}+{} out of order or out of range", where, e.first_chunk, e.chunk_count);
      if ((e.size == 0) != (e.chunk_count == 0) || e.chunk_count > e.size ||
          (e.size + kMaxChunkAccepted - 1) / kMaxChunkAccepted > e.chunk_count)
        Fail("{}: {} chunks cannot hold {} bytes", where, e.chunk_count, e.size);
      next_chunk += e.chunk_count;
      uint32_t ranges = c.ReadLE<uint32_t>();
      if (ranges > c.remaining() / kRangeBytes)
        Fail("{}: {} typed ranges cannot fit", where, ranges);
      e.ranges.reserve(ranges);
      uint64_t prev_end = 0;
      for (uint32_t r = 0; r < ranges; ++r) {
        TypedRange tr;
        tr.offset = c.ReadLE<uint64_t>();
        tr.length = c.ReadLE<uint64_t>();
        uint8_t t = c.ReadU8();
        if (t == 0 || t >= kTransforms) Fail("{}: typed range {}: transform {}", where, r, t);
        tr.transform = static_cast<Transform>(t);
        if (tr.length == 0 || tr.offset < prev_end || tr.length > e.size ||
            tr.offset > e.size - tr.length || tr.length % ElementBytes(tr.transform) != 0)
          Fail("{}: typed range {} [{}, +{}) is out of order, outside the file or cuts an element",
               where, r, tr.offset, tr.length);
        prev_end = tr.offset + tr.length;
        e.ranges.push_back(tr);
      }
      uint32_t tensors = c.ReadLE<uint32_t>();
      if (tensors > c.remaining() / kMinTensorBytes)
        Fail("{}: {} tensors cannot fit", where, tensors);
      e.tensors.reserve(tensors);
      for (uint32_t k = 0; k < tensors; ++k) {
        TensorInfo t;
        t.name = ReadString(c, kMaxTensorName, "tensor name");
        t.dtype = std::string(c.ReadText(c.ReadU8()));
        uint8_t rank = c.ReadU8();
        if (rank > kMaxRank) Fail("{}: tensor '{}' of rank {}", where, t.name, rank);
        for (uint8_t d = 0; d < rank; ++d) {
          int64_t dim = c.ReadLE<int64_t>();
          if (dim < 0) Fail("{}: tensor '{}' has a negative dimension", where, t.name);
          t.shape.push_back(dim);
        }
        t.begin = c.ReadLE<uint64_t>();
        t.end = c.ReadLE<uint64_t>();
        if (t.begin > t.end || t.end > e.size)
          Fail("{}: tensor '{}' bytes [{}, {}) outside the file", where, t.name, t.begin, t.end);
        e.tensors.push_back(std::move(t));
      }
    }
    index.entries.push_back(std::move(e));
  }
  if (next_chunk != chunks) Fail("index: {} chunks listed, the files use {}", chunks, next_chunk);
  index.chunks.reserve(chunks);
  uint64_t pos = kHeaderSize;
  size_t file = 0;
  uint64_t file_pos = 0;
  for (uint64_t k = 0; k < chunks; ++k) {
    uint64_t archive_offset = c.ReadLE<uint64_t>();
    Chunk ch = ReadChunkBody(c);
    ch.archive_offset = archive_offset;
    while (file < index.entries.size() &&
           (index.entries[file].type != EntryType::kFile ||
            k >= index.entries[file].first_chunk + index.entries[file].chunk_count)) {
      ++file;
      file_pos = 0;
    }
    if (file >= index.entries.size() || ch.file != file)
      Fail("index: chunk {} names file {}, it belongs to entry {}", k, ch.file, file);
    const Entry& e = index.entries[file];
    if (ch.offset != file_pos || ch.length == 0 || ch.length > kMaxChunkAccepted ||
        ch.length > e.size - file_pos)
      Fail("index: '{}': chunk {} [{}, +{}) does not continue the file at {}", e.path, k, ch.offset,
           ch.length, file_pos);
    file_pos += ch.length;
    if (k + 1 == e.first_chunk + e.chunk_count && file_pos != e.size)
      Fail("index: '{}': its chunks cover {} of {} bytes", e.path, file_pos, e.size);
    std::vector<PlaneShape> shapes;
    if (ch.coding == Coding::kWhole) {
      shapes.push_back({Transform::kBytes, 0, ch.length});
    } else {
      shapes = PlaneShapes(WithContext(fmt::format("index: '{}'", e.path),
                                       [&] { return RunsOf(e.ranges, ch.offset, ch.length); }));
    }
    if (shapes.size() != ch.planes.size())
      Fail("index: '{}': chunk {} has {} planes, its runs make {}", e.path, k, ch.planes.size(),
           shapes.size());
    for (size_t p = 0; p < shapes.size(); ++p) {
      const Plane& pl = ch.planes[p];
      bool ok = pl.method == Method::kRaw
                    ? pl.stored == shapes[p].size
                    : pl.stored > 0 && pl.stored <= FrameBound(shapes[p].size);
      if (!ok)
        Fail("index: '{}': chunk {} plane {} stores {} bytes for {}", e.path, k, p, pl.stored,
             shapes[p].size);
    }
    if (ch.archive_offset != pos)
      Fail("index: chunk {} at {}, the chunk before it ends at {}", k, ch.archive_offset, pos);
    pos = CheckedAdd(pos, ch.stored_bytes());
    if (pos > index_offset)
      Fail("index: chunk {} runs past the payload ({} > {})", k, pos, index_offset);
    index.chunks.push_back(std::move(ch));
  }
  if (pos != index_offset)
    Fail("index: the chunks end at {}, the index starts at {}", pos, index_offset);
  if (!c.done()) Fail("index: {} bytes after its end", c.remaining());
  (void)archive_size;
  return index;
}

void CheckChunkHeader(Bytes bytes, const Chunk& expected) {
  std::string want = ChunkHeader(expected);
  if (bytes.size() < want.size() || std::memcmp(bytes.data(), want.data(), want.size()) != 0)
    Fail("chunk header does not match the index");
}

}  // namespace ckpt::ckz
