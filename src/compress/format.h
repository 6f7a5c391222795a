// The .ckz archive: lossless, tensor-aware, checksummed, random access through a footer index.
//
// Layout, version 1. Every integer is little-endian; sizes are in bytes.
//
//   header    16 bytes  magic "\x89CKZ\r\n\x1a\n", u16 version (1), u16 flags (0), u32 0
//   payload   the chunks, back to back in index order, no gaps (chunk-major: all planes of
//             one chunk together), each a chunk header followed by its planes' bytes
//   index     one zstd frame holding the index (below)
//   trailer   40 bytes  magic "CKZINDEX", u64 index offset, u64 index frame size,
//             u64 index size once decoded, u32 CRC32 of the index frame,
//             u32 CRC32 of the 36 trailer bytes before it
//
// A chunk is a piece of one file's original bytes, 1 byte to 4 MiB (the writer makes
// 256 KiB to 1 MiB, cut at tensor and element boundaries). Chunk header and index entry:
//
//   u32 magic "CKZc" (chunk header only; the index entry has u64 archive offset instead)
//   u32 file      index of the file record it belongs to
//   u64 offset    of its first byte in that file
//   u32 length    original bytes
//   u32 crc32     CRC32 (zip polynomial) of the original bytes
//   u8  coding    0 typed: the file's typed ranges (below) cut the chunk into runs, each run
//                   transformed by its dtype; bytes outside every range form the bytes plane
//                 1 whole: all of the chunk is one bytes plane (the plain-zstd fallback)
//   u8  planes    how many planes follow; must equal what the runs imply
//   per plane:    u8 method (0 raw, 1 Huffman-coded literals in a zstd frame, 2 zstd LZ
//                 frame), u32 stored size
//
// Planes come in transform order: the bytes plane first (when the chunk has such bytes), then
// the planes of each dtype transform present, in the order of the Transform enum. A plane
// holds one byte per element of every run of its transform, runs in file order:
//   bf16: [exponent (bits 14..7)] [sign << 7 | mantissa (bits 6..0)]
//   f32:  [exponent (bits 30..23)] [sign << 7 | mantissa bits 22..16] [bits 15..8] [bits 7..0]
//   f16:  [high byte] [low byte]
//   f64:  [byte 7] [byte 6] ... [byte 0]
// A plane's decoded size is implied (elements, or bytes for the bytes plane); a frame must
// decode to exactly that, a raw plane must be exactly that.
//
// The index (decoded):
//   "CKZI", u8 kind (0 one file, 1 folder), u8 level (0 fast, 1 max), u32 entries,
//   u64 chunks, then the entries, then one index entry per chunk (as above).
//   entry: u8 type (0 file, 1 folder, 2 symlink), u32 mode (permission bits),
//          i64 mtime (ns since 1970), u32 + path: UTF-8, relative, '/'-separated, no "." or
//          ".." component; "" is the archived folder itself; a one-file archive holds the
//          file's name. A symlink adds u32 + its target. A file adds:
//          u64 size, u32 crc32 of all its bytes, u8 format (0 other, 1 torch zip, 2 torch
//          legacy, 3 safetensors, 4 torch.distributed.checkpoint data file: torch.save
//          archives one after another), u64 first chunk, u64 chunk count,
//          u32 typed ranges, each u64 offset, u64 length, u8 transform (sorted, disjoint,
//          whole elements; bytes outside them are plain bytes),
//          u32 tensors, each u32 + name, u8 + dtype name, u8 rank, i64 per dimension,
//          u64 begin, u64 end (byte range in the file; for naming and inspect).
//   A file's chunks are consecutive in the index, in offset order, and tile [0, size).
//
// Every field is checked when the index is read (ParseIndex): sizes against what exists,
// counts against the bytes that could hold them, paths, chunk tiling, plane counts. A reader
// that trusts nothing else still cannot be made to write a wrong byte: every chunk's CRC32 is
// checked after decoding and before its bytes leave the decoder, and each file's CRC32 once
// all its chunks are done.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/byte_cursor.h"

namespace ckpt::ckz {

inline constexpr char kMagic[8] = {'\x89', 'C', 'K', 'Z', '\r', '\n', '\x1a', '\n'};
inline constexpr uint16_t kVersion = 1;
inline constexpr uint64_t kHeaderSize = 16;
inline constexpr uint64_t kTrailerSize = 40;
inline constexpr char kTrailerMagic[8] = {'C', 'K', 'Z', 'I', 'N', 'D', 'E', 'X'};
inline constexpr uint32_t kChunkMagic = 0x634b5a43;  // "CKZc"
inline constexpr uint32_t kIndexMagic = 0x495a4b43;  // "CKZI"

// Chunk sizes the writer aims for, and the most a reader accepts.
inline constexpr uint64_t kMinChunk = 256 << 10;
inline constexpr uint64_t kMaxChunk = 1 << 20;
inline constexpr uint64_t kMaxChunkAccepted = 4 << 20;
// The decoded index may be at most this large (and at most 1024x its frame plus 1 MiB).
inline constexpr uint64_t kMaxIndexBytes = 4ull << 30;

enum class Transform : uint8_t { kBytes = 0, kBF16 = 1, kF32 = 2, kF16 = 3, kF64 = 4 };
inline constexpr int kTransforms = 5;

uint32_t ElementBytes(Transform t);  // 1 for kBytes
int PlaneCount(Transform t);         // 1 for kBytes
const char* TransformName(Transform t);

enum class Method : uint8_t { kRaw = 0, kHuffman = 1, kLz = 2 };
const char* MethodName(Method m);

enum class Coding : uint8_t { kTyped = 0, kWhole = 1 };

enum class EntryType : uint8_t { kFile = 0, kFolder = 1, kSymlink = 2 };

enum class FileFormat : uint8_t {
  kOther = 0,
  kTorchZip = 1,
  kTorchLegacy = 2,
  kSafetensors = 3,
  kDcpData = 4,  // a .distcp file: items at the offsets its folder's metadata gives
};
const char* FileFormatName(FileFormat f);

struct Plane {
  Method method = Method::kRaw;
  uint32_t stored = 0;
};

struct Chunk {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
  uint32_t crc = 0;
  Coding coding = Coding::kTyped;
  std::vector<Plane> planes;
  uint64_t archive_offset = 0;  // of its chunk header (index only)

  uint64_t stored_bytes() const;  // header + planes
};

struct TypedRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  Transform transform = Transform::kBF16;
};

struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Entry {
  EntryType type = EntryType::kFile;
  uint32_t mode = 0644;
  int64_t mtime_ns = 0;
  std::string path;
  std::string target;  // symlink
  // Regular files.
  uint64_t size = 0;
  uint32_t crc = 0;
  FileFormat format = FileFormat::kOther;
  uint64_t first_chunk = 0;
  uint64_t chunk_count = 0;
  std::vector<TypedRange> ranges;
  std::vector<TensorInfo> tensors;
};

enum class ArchiveKind : uint8_t { kFile = 0, kFolder = 1 };

struct Index {
  ArchiveKind kind = ArchiveKind::kFile;
  uint8_t level = 0;
  std::vector<Entry> entries;
  std::vector<Chunk> chunks;
};

// A run of one transform inside a chunk (derived from the file's typed ranges).
struct Run {
  uint32_t length = 0;
  Transform transform = Transform::kBytes;
};

// The runs of a typed chunk [offset, offset+length) of a file with these ranges; throws when a
// range cuts an element in two. `ranges` must be sorted and disjoint.
std::vector<Run> RunsOf(const std::vector<TypedRange>& ranges, uint64_t offset, uint64_t length);

// The planes a list of runs implies: (transform, plane number, decoded size), in order.
struct PlaneShape {
  Transform transform;
  int plane;
  uint32_t size;
};
std::vector<PlaneShape> PlaneShapes(const std::vector<Run>& runs);

// Serialization. The chunk header is what precedes a chunk's planes in the payload.
std::string ChunkHeader(const Chunk& c);
uint64_t ChunkHeaderSize(size_t planes);
std::string FileHeader();
std::string SerializeIndex(const Index& index);  // decoded form
std::string Trailer(uint64_t index_offset, uint64_t index_frame, uint64_t index_raw,
                    uint32_t index_crc);

struct TrailerInfo {
  uint64_t index_offset = 0;
  uint64_t index_frame = 0;
  uint64_t index_raw = 0;
  uint32_t index_crc = 0;
};

// Reading; each throws ckpt::Error saying what is wrong (the caller adds the archive name).
void CheckFileHeader(Bytes archive);
TrailerInfo ParseTrailer(Bytes archive);
// Parses and validates a decoded index against an archive of `archive_size` bytes whose
// index frame starts at `index_offset`.
Index ParseIndex(Bytes raw, uint64_t archive_size, uint64_t index_offset);
// Parses the chunk header at the start of `bytes` and checks it matches the index entry.
void CheckChunkHeader(Bytes bytes, const Chunk& expected);

// A path from an archive is safe to create below a folder: relative, '/'-separated, no
// empty, "." or ".." component, no NUL. "" (the folder itself) is allowed.
bool IsSafeRelativePath(std::string_view path);

}  // namespace ckpt::ckz
