#define ZSTD_STATIC_LINKING_ONLY
#include "compress/chunk_coder.h"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "base/error.h"
#include "compress/planes.h"
#include "io/crc32.h"

namespace ckpt::ckz {

namespace {

constexpr int kOtherLevelFast = 3;
constexpr int kLevelMax = 19;
constexpr int kProbeLevel = 1;
constexpr uint64_t kProbeBytes = 64 << 10;
// A plane is stored raw unless coding makes it smaller than this fraction of it.
constexpr double kKeepBelow = 0.95;
// A plane whose histogram promises no more than this is stored raw without trying.
constexpr double kTryBelow = 0.97;
// Planes smaller than this are stored raw: a frame's header would eat the gain.
constexpr uint64_t kMinCodedPlane = 64;

void CheckZstd(size_t rc, const char* what) {
  if (ZSTD_isError(rc)) Fail("zstd: {}: {}", what, ZSTD_getErrorName(rc));
}

}  // namespace

bool HuffmanAvailable() {
  static const bool available = [] {
    unsigned v = ZSTD_versionNumber();
    return v >= 10500 && v < 10600;
  }();
  return available;
}

double EntropyBytes(Bytes data) {
  if (data.empty()) return 0;
  uint32_t h[4][256] = {};
  auto count = [&](const uint8_t* p, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      ++h[0][p[i]];
      ++h[1][p[i + 1]];
      ++h[2][p[i + 2]];
      ++h[3][p[i + 3]];
    }
    for (; i < n; ++i) ++h[0][p[i]];
  };
  // Large planes: 16 blocks of 4 KiB spread over the plane are enough to tell a flat
  // histogram (mantissa bytes) from a skewed one, at a sixteenth of the cost.
  constexpr size_t kBlock = 4096, kBlocks = 16;
  size_t sampled = 0;
  if (data.size() <= 2 * kBlock * kBlocks) {
    count(data.data(), data.size());
    sampled = data.size();
  } else {
    size_t stride = (data.size() - kBlock) / (kBlocks - 1);
    for (size_t b = 0; b < kBlocks; ++b) count(data.data() + b * stride, kBlock);
    sampled = kBlock * kBlocks;
  }
  double bits = 0, total = static_cast<double>(sampled);
  for (int s = 0; s < 256; ++s) {
    uint32_t c = h[0][s] + h[1][s] + h[2][s] + h[3][s];
    if (c) bits += c * std::log2(total / c);
  }
  return bits / 8 * static_cast<double>(data.size()) / total;
}

struct ChunkCoder::Impl {
  Level level;
  ZSTD_CCtx* huf = nullptr;
  ZSTD_CCtx* lz = nullptr;
  ZSTD_DCtx* d = nullptr;
  std::vector<uint8_t> planes;                      // the split chunk
  std::vector<uint8_t> candidate;                   // a second coding of a plane (max)
  std::vector<uint8_t> whole;                       // the plain-zstd coding of the chunk
  std::vector<uint8_t> check;                       // the round-trip check's output
  std::vector<const uint8_t*> starts;               // where each plane is while decoding
  std::vector<ZSTD_Sequence> seqs;                  // block delimiters of a Huffman-coded plane
  std::vector<uint32_t> run_elements[kTransforms];  // per transform: elements of each run

  explicit Impl(Level l) : level(l) {
    huf = ZSTD_createCCtx();
    lz = ZSTD_createCCtx();
    d = ZSTD_createDCtx();
    if (!huf || !lz || !d) Fail("zstd: out of memory");
    if (HuffmanAvailable()) {
      CheckZstd(ZSTD_CCtx_setParameter(huf, ZSTD_c_compressionLevel, 1), "set level");
      CheckZstd(ZSTD_CCtx_setParameter(huf, ZSTD_c_literalCompressionMode, ZSTD_ps_enable),
                "set literal compression");
      CheckZstd(
          ZSTD_CCtx_setParameter(huf, ZSTD_c_blockDelimiters, ZSTD_sf_explicitBlockDelimiters),
          "set block delimiters");
    } else {
      CheckZstd(ZSTD_CCtx_setParameter(huf, ZSTD_c_compressionLevel, 1), "set level");
    }
    CheckZstd(ZSTD_CCtx_setParameter(huf, ZSTD_c_contentSizeFlag, 1), "set content size");
    CheckZstd(ZSTD_CCtx_setParameter(huf, ZSTD_c_checksumFlag, 0), "set checksum");
  }
  ~Impl() {
    ZSTD_freeCCtx(huf);
    ZSTD_freeCCtx(lz);
    ZSTD_freeDCtx(d);
  }

  // Huffman-coded literals in a zstd frame (or zstd -1 where that API is not available).
  // `runs` (bytes of the plane per tensor run) cut the plane into literals-only blocks, each
  // with its own Huffman table or the previous one reused when zstd finds that cheaper: one
  // block per tensor, so tensors with different exponent ranges do not share a table.
  // Small tensors are merged up to kMinBlock; a block is at most zstd's 128 KiB.
  size_t Huffman(const uint8_t* src, size_t n, uint8_t* dst, size_t cap,
                 const std::vector<uint32_t>& runs) {
    if (!HuffmanAvailable()) {
      size_t rc = ZSTD_compress2(huf, dst, cap, src, n);
      CheckZstd(rc, "compression");
      return rc;
    }
    constexpr uint32_t kMaxBlock = 128 << 10, kMinBlock = 2 << 10;
    seqs.clear();
    auto flush = [&](uint32_t len) {
      while (len > 0) {
        uint32_t b = std::min(len, kMaxBlock);
        seqs.push_back(ZSTD_Sequence{0, b, 0, 0});
        len -= b;
      }
    };
    uint32_t pending = 0;
    uint64_t covered = 0;
    for (uint32_t r : runs) {
      pending += r;
      covered += r;
      if (pending >= kMinBlock) {
        flush(pending);
        pending = 0;
      }
    }
    if (covered != n) Fail("internal: plane runs cover {} of {} bytes", covered, n);
    if (pending) {
      // A short tail joins the block before it when that stays within the limit.
      if (!seqs.empty() && seqs.back().litLength + pending <= kMaxBlock) {
        seqs.back().litLength += pending;
      } else {
        flush(pending);
      }
    }
    size_t rc = ZSTD_compressSequences(huf, dst, cap, seqs.data(), seqs.size(), src, n);
    CheckZstd(rc, "Huffman coding");
    return rc;
  }

  size_t Lz(const uint8_t* src, size_t n, uint8_t* dst, size_t cap, int lvl) {
    size_t rc = ZSTD_compressCCtx(lz, dst, cap, src, n, lvl);
    CheckZstd(rc, "compression");
    return rc;
  }

  int OtherLevel() const { return level == Level::kMax ? kLevelMax : kOtherLevelFast; }

  // Codes one plane into out[pos...] (room for ZSTD_compressBound(n)); returns its record.
  Plane CodePlane(const uint8_t* src, size_t n, bool bytes_plane, uint8_t* dst,
                  const std::vector<uint32_t>& plane_runs) {
    Plane p;
    p.method = Method::kRaw;
    p.stored = static_cast<uint32_t>(n);
    size_t best = n;
    if (n >= kMinCodedPlane) {
      size_t cap = ZSTD_compressBound(n);
      if (bytes_plane) {
        size_t z = Lz(src, n, dst, cap, OtherLevel());
        if (z < best) {
          best = z;
          p.method = Method::kLz;
        }
      } else if (EntropyBytes({src, n}) < kTryBelow * static_cast<double>(n)) {
        size_t h = Huffman(src, n, dst, cap, plane_runs);
        if (h < best) {
          best = h;
          p.method = Method::kHuffman;
        }
        if (level == Level::kMax) {
          candidate.resize(cap);
          size_t z = Lz(src, n, candidate.data(), cap, kLevelMax);
          if (z < best) {
            best = z;
            p.method = Method::kLz;
            std::memcpy(dst, candidate.data(), z);
          }
        }
      }
    }
    if (p.method != Method::kRaw &&
        static_cast<double>(best) >= kKeepBelow * static_cast<double>(n)) {
      p.method = Method::kRaw;
      best = n;
    }
    if (p.method == Method::kRaw) std::memcpy(dst, src, n);
    p.stored = static_cast<uint32_t>(best);
    return p;
  }

  // Is plain zstd of the whole chunk worth trying, given the typed coding's ratio?
  bool WholeWorthTrying(Bytes src, uint64_t typed_stored) {
    if (level == Level::kMax) return true;
    size_t n = std::min<size_t>(src.size(), kProbeBytes);
    whole.resize(ZSTD_compressBound(n));
    size_t z = Lz(src.data(), n, whole.data(), whole.size(), kProbeLevel);
    double probe = static_cast<double>(z) / static_cast<double>(n);
    double typed = static_cast<double>(typed_stored) / static_cast<double>(src.size());
    return probe < typed * 1.02;
  }
};

ChunkCoder::ChunkCoder(Level level) : impl_(new Impl(level)) {}
ChunkCoder::~ChunkCoder() {
  delete impl_;
}

void ChunkCoder::Encode(Bytes src, const std::vector<Run>& runs, Chunk& chunk, std::string& out,
                        bool check) {
  Impl& m = *impl_;
  chunk.length = static_cast<uint32_t>(src.size());
  chunk.crc = Crc32(0, src);
  bool typed = false;
  for (const Run& r : runs) typed |= r.transform != Transform::kBytes;
  std::vector<PlaneShape> shapes =
      typed ? PlaneShapes(runs) : std::vector<PlaneShape>{{Transform::kBytes, 0, chunk.length}};
  const uint8_t* planes = src.data();
  if (typed) {
    m.planes.resize(src.size());
    SplitPlanes(src, runs, m.planes.data());
    planes = m.planes.data();
  }
  // Lay out: header, then each plane coded in place (room for its zstd bound).
  size_t header = ChunkHeaderSize(shapes.size());
  size_t bound = header;
  for (const PlaneShape& s : shapes) bound += ZSTD_compressBound(s.size);
  out.resize(bound);
  uint8_t* base = reinterpret_cast<uint8_t*>(out.data());
  chunk.coding = typed ? Coding::kTyped : Coding::kWhole;
  chunk.planes.clear();
  for (auto& b : m.run_elements) b.clear();
  for (const Run& r : runs) {
    m.run_elements[static_cast<int>(r.transform)].push_back(r.length / ElementBytes(r.transform));
  }
  size_t pos = header, in = 0;
  for (const PlaneShape& s : shapes) {
    std::vector<uint32_t>& blocks = m.run_elements[static_cast<int>(s.transform)];
    if (!typed) blocks = {s.size};
    chunk.planes.push_back(
        m.CodePlane(planes + in, s.size, s.transform == Transform::kBytes, base + pos, blocks));
    pos += chunk.planes.back().stored;
    in += s.size;
  }
  // The plain-zstd fallback: the chunk as one bytes plane, if that is smaller.
  if (typed && m.WholeWorthTrying(src, pos)) {
    Plane p = Plane{};
    m.whole.resize(ZSTD_compressBound(src.size()));
    size_t z = m.Lz(src.data(), src.size(), m.whole.data(), m.whole.size(), m.OtherLevel());
    size_t whole_header = ChunkHeaderSize(1);
    if (whole_header + z < pos &&
        static_cast<double>(z) < kKeepBelow * static_cast<double>(src.size())) {
      p.method = Method::kLz;
      p.stored = static_cast<uint32_t>(z);
      chunk.coding = Coding::kWhole;
      chunk.planes = {p};
      std::memcpy(base + whole_header, m.whole.data(), z);
      pos = whole_header + z;
    }
  }
  std::string h = ChunkHeader(chunk);
  std::memcpy(base, h.data(), h.size());
  out.resize(pos);
  if (!check) return;
  // Round trip: the header reads back and every coded plane decodes to the bytes it was made
  // from. Raw planes are those bytes; the plane split is a bijection (its tests, and the CRC
  // that decompress and verify check after joining, cover it).
  WithContext("internal error: the chunk just encoded does not decode to its input", [&] {
    Bytes stored = AsBytes(out);
    CheckChunkHeader(stored, chunk);
    const uint8_t* from = chunk.coding == Coding::kWhole ? src.data() : planes;
    size_t at = ChunkHeaderSize(chunk.planes.size()), from_at = 0;
    for (size_t i = 0; i < chunk.planes.size(); ++i) {
      const Plane& p = chunk.planes[i];
      size_t n = chunk.coding == Coding::kWhole ? chunk.length : shapes[i].size;
      if (p.method != Method::kRaw) {
        m.check.resize(n);
        size_t got = ZSTD_decompressDCtx(m.d, m.check.data(), n, stored.data() + at, p.stored);
        if (ZSTD_isError(got)) Fail("plane {}: {}", i, ZSTD_getErrorName(got));
        if (got != n || std::memcmp(m.check.data(), from + from_at, n) != 0)
          Fail("plane {} differs", i);
      }
      at += p.stored;
      from_at += n;
    }
    if (at != stored.size()) Fail("planes hold {} of {} bytes", at, stored.size());
  });
}

void ChunkCoder::Decode(Bytes stored, const Chunk& chunk, const std::vector<Run>& runs,
                        uint8_t* dst) {
  Impl& m = *impl_;
  CheckChunkHeader(stored, chunk);
  std::vector<PlaneShape> shapes =
      chunk.coding == Coding::kTyped
          ? PlaneShapes(runs)
          : std::vector<PlaneShape>{{Transform::kBytes, 0, chunk.length}};
  if (shapes.size() != chunk.planes.size()) Fail("chunk planes do not match its runs");
  bool direct = shapes.size() == 1 && shapes[0].transform == Transform::kBytes;
  uint8_t* planes = dst;
  if (!direct) {
    m.planes.resize(chunk.length);
    planes = m.planes.data();
  }
  std::vector<const uint8_t*>& starts = m.starts;
  starts.clear();
  uint64_t pos = ChunkHeaderSize(shapes.size()), out = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Plane& p = chunk.planes[i];
    uint32_t n = shapes[i].size;
    if (p.stored > stored.size() - std::min<uint64_t>(pos, stored.size()))
      Fail("plane {} runs past the chunk", i);
    const uint8_t* src = stored.data() + pos;
    if (p.method == Method::kRaw) {
      if (p.stored != n) Fail("raw plane {} holds {} bytes, not {}", i, p.stored, n);
      // Joined from where it is stored; copied only when it is the chunk itself.
      if (direct) std::memcpy(planes + out, src, n);
      starts.push_back(src);
    } else {
      starts.push_back(planes + out);
      unsigned long long content = ZSTD_getFrameContentSize(src, p.stored);
      if (content != n) Fail("plane {}: the zstd frame does not hold {} bytes", i, n);
      size_t frame = ZSTD_findFrameCompressedSize(src, p.stored);
      if (ZSTD_isError(frame) || frame != p.stored) Fail("plane {}: damaged zstd frame", i);
      size_t got = ZSTD_decompressDCtx(m.d, planes + out, n, src, p.stored);
      if (ZSTD_isError(got)) Fail("plane {}: {}", i, ZSTD_getErrorName(got));
      if (got != n) Fail("plane {}: decoded {} bytes, not {}", i, got, n);
    }
    pos += p.stored;
    out += n;
  }
  if (pos != stored.size()) Fail("chunk holds {} bytes, its planes {}", stored.size(), pos);
  if (!direct) JoinPlanes(starts, runs, dst);
  if (Crc32(0, {dst, chunk.length}) != chunk.crc) Fail("checksum mismatch");
}

}  // namespace ckpt::ckz
