// Encoding and decoding of one chunk: the plane transform, then each plane entropy-coded.
//
// Planes of floating-point elements go through zstd's Huffman literal coder: a zstd frame
// made by ZSTD_compressSequences with no sequences is a frame of literals-only blocks, each
// with its own Huffman table, written at 1.2-1.8 GB/s per core and read by the ordinary
// ZSTD_decompressDCtx at 2.7-4 GB/s (measured with Debian's libzstd 1.5.4). Exponent planes
// shrink 2.8-3.1x that way against ~2.6x for zstd -1 at a quarter of the speed; mantissa
// planes barely shrink, so a plane whose byte histogram promises less than 3% is stored raw
// without trying, and a plane that does not come out below 95% of its size is stored raw.
// ZSTD_compressSequences is an experimental API (ZSTD_STATIC_LINKING_ONLY): it is used only
// with the libzstd 1.5 series it was measured on, and replaced by zstd level 1 elsewhere.
//
// --level max also tries LZ (zstd -19) on every plane that shrinks and keeps the smaller
// (zero-heavy optimizer states gain a few percent).
//
// Bytes that are not tensor elements (pickles, zip headers, json) form one plane coded by
// zstd (level 3, or 19 with --level max).
//
// Never worse than plain zstd on a chunk: with --level max every chunk is also coded by plain
// zstd -19 and the smaller kept. With --level fast, plain zstd -3 of the chunk is tried when
// zstd -1 on a 64 KiB sample of it comes within 2% of the plane coding's ratio (repeated
// rows, constant or zero-heavy tensors: data with LZ structure); otherwise it is not (zstd
// would cost three times the plane coding's time for data where it loses by 10-30%).
//
// Encode can decode every coded plane again and compare it with the bytes it was made from
// (compress does so for a sample of chunks: a coder that misbehaves shows at once); the
// chunk's CRC of its original bytes is checked by every decode, after the planes are joined.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/byte_cursor.h"
#include "compress/format.h"

namespace ckpt::ckz {

enum class Level : uint8_t { kFast = 0, kMax = 1 };

// What coding did to some bytes: how many went in, how many plane bytes they became.
struct CodingStats {
  uint64_t original = 0;  // bytes of input
  uint64_t stored = 0;    // plane bytes they became
};

// Is zstd's Huffman literal coder reachable here (the libzstd 1.5 series)?
bool HuffmanAvailable();

// One per thread: zstd contexts and buffers, reused from chunk to chunk (a few MiB).
class ChunkCoder {
 public:
  explicit ChunkCoder(Level level = Level::kFast);
  ~ChunkCoder();
  ChunkCoder(const ChunkCoder&) = delete;
  ChunkCoder& operator=(const ChunkCoder&) = delete;

  // Encodes `src`, whose typed runs are `runs`, into `out` (chunk header, then planes).
  // chunk.file and chunk.offset are the caller's; length, crc, coding and planes are set.
  // With `check`, every coded plane is decoded again and compared (throws on a difference).
  void Encode(Bytes src, const std::vector<Run>& runs, Chunk& chunk, std::string& out,
              bool check = true);

  // Decodes a chunk's stored bytes (header + planes) into dst (chunk.length bytes), checking
  // the header against the index entry and the CRC of the result. `runs` are the chunk's
  // runs for typed coding (ignored for whole). Throws ckpt::Error on any mismatch.
  void Decode(Bytes stored, const Chunk& chunk, const std::vector<Run>& runs, uint8_t* dst);

 private:
  struct Impl;
  Impl* impl_;
};

// Bytes of the bytes-plane estimate: what an order-0 entropy coder needs for `data`.
double EntropyBytes(Bytes data);

}  // namespace ckpt::ckz
