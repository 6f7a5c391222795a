#include "compress/planes.h"

#include <cstring>

#include "base/endian.h"
#include "base/error.h"

namespace ckpt::ckz {

namespace {

// Per transform: where its planes start in the plane buffer and how many elements of it
// the runs before the current one used.
struct Cursor {
  uint8_t* plane[8] = {};
  uint64_t plane_size = 0;
  uint64_t used = 0;
};

void Layout(const std::vector<Run>& runs, uint8_t* base, Cursor (&cursors)[kTransforms]) {
  uint64_t pos = 0;
  for (const PlaneShape& s : PlaneShapes(runs)) {
    Cursor& c = cursors[static_cast<int>(s.transform)];
    c.plane[s.plane] = base + pos;
    c.plane_size = s.size;
    pos += s.size;
  }
}

void Layout(const std::vector<Run>& runs, const std::vector<const uint8_t*>& planes,
            Cursor (&cursors)[kTransforms]) {
  std::vector<PlaneShape> shapes = PlaneShapes(runs);
  if (shapes.size() != planes.size())
    Fail("internal: {} planes for {}", planes.size(), shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    Cursor& c = cursors[static_cast<int>(shapes[i].transform)];
    c.plane[shapes[i].plane] = const_cast<uint8_t*>(planes[i]);
    c.plane_size = shapes[i].size;
  }
}

// The loops are written for the auto-vectorizer (planes.cpp is built with -O3): restrict
// pointers, one output per plane; with SSE2 they run at 8-20 GB/s.
void SplitBF16(const uint8_t* __restrict src, uint64_t n, uint8_t* __restrict e,
               uint8_t* __restrict sm) {
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t x = LoadLE<uint16_t>(src + 2 * i);
    e[i] = static_cast<uint8_t>(x >> 7);
    sm[i] = static_cast<uint8_t>(((x >> 8) & 0x80) | (x & 0x7f));
  }
}

void JoinBF16(const uint8_t* __restrict e, const uint8_t* __restrict sm, uint64_t n,
              uint8_t* __restrict dst) {
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t x = static_cast<uint16_t>(((sm[i] & 0x80) << 8) | (e[i] << 7) | (sm[i] & 0x7f));
    StoreLE<uint16_t>(dst + 2 * i, x);
  }
}

void SplitF32(const uint8_t* __restrict src, uint64_t n, uint8_t* __restrict e,
              uint8_t* __restrict sm, uint8_t* __restrict b1, uint8_t* __restrict b0) {
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t x = LoadLE<uint32_t>(src + 4 * i);
    e[i] = static_cast<uint8_t>(x >> 23);
    sm[i] = static_cast<uint8_t>(((x >> 24) & 0x80) | ((x >> 16) & 0x7f));
    b1[i] = static_cast<uint8_t>(x >> 8);
    b0[i] = static_cast<uint8_t>(x);
  }
}

void JoinF32(const uint8_t* __restrict e, const uint8_t* __restrict sm,
             const uint8_t* __restrict b1, const uint8_t* __restrict b0, uint64_t n,
             uint8_t* __restrict dst) {
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t x = (static_cast<uint32_t>(sm[i] & 0x80) << 24) | (static_cast<uint32_t>(e[i]) << 23) |
                 (static_cast<uint32_t>(sm[i] & 0x7f) << 16) | (static_cast<uint32_t>(b1[i]) << 8) |
                 b0[i];
    StoreLE<uint32_t>(dst + 4 * i, x);
  }
}

void SplitF16(const uint8_t* __restrict src, uint64_t n, uint8_t* __restrict hi,
              uint8_t* __restrict lo) {
  for (uint64_t i = 0; i < n; ++i) {
    hi[i] = src[2 * i + 1];
    lo[i] = src[2 * i];
  }
}

void JoinF16(const uint8_t* __restrict hi, const uint8_t* __restrict lo, uint64_t n,
             uint8_t* __restrict dst) {
  for (uint64_t i = 0; i < n; ++i) {
    dst[2 * i + 1] = hi[i];
    dst[2 * i] = lo[i];
  }
}

// f64: eight byte planes, most significant first (rare in checkpoints; not tuned).
void SplitF64(const uint8_t* src, uint64_t n, uint8_t* const* p) {
  for (uint64_t i = 0; i < n; ++i) {
    for (int b = 0; b < 8; ++b) p[b][i] = src[8 * i + (7 - b)];
  }
}

void JoinF64(uint8_t* const* p, uint64_t n, uint8_t* dst) {
  for (uint64_t i = 0; i < n; ++i) {
    for (int b = 0; b < 8; ++b) dst[8 * i + (7 - b)] = p[b][i];
  }
}

}  // namespace

void SplitPlanes(Bytes src, const std::vector<Run>& runs, uint8_t* dst) {
  Cursor cur[kTransforms];
  Layout(runs, dst, cur);
  uint64_t pos = 0;
  for (const Run& r : runs) {
    Cursor& c = cur[static_cast<int>(r.transform)];
    const uint8_t* in = src.data() + pos;
    uint64_t n = r.length / ElementBytes(r.transform);
    uint8_t* out[8];
    for (int p = 0; p < PlaneCount(r.transform); ++p) out[p] = c.plane[p] + c.used;
    switch (r.transform) {
      case Transform::kBytes:
        std::memcpy(out[0], in, n);
        break;
      case Transform::kBF16:
        SplitBF16(in, n, out[0], out[1]);
        break;
      case Transform::kF32:
        SplitF32(in, n, out[0], out[1], out[2], out[3]);
        break;
      case Transform::kF16:
        SplitF16(in, n, out[0], out[1]);
        break;
      case Transform::kF64:
        SplitF64(in, n, out);
        break;
    }
    c.used += n;
    pos += r.length;
  }
}

void JoinPlanes(const uint8_t* planes, const std::vector<Run>& runs, uint8_t* dst) {
  std::vector<const uint8_t*> starts;
  uint64_t pos = 0;
  for (const PlaneShape& s : PlaneShapes(runs)) {
    starts.push_back(planes + pos);
    pos += s.size;
  }
  JoinPlanes(starts, runs, dst);
}

void JoinPlanes(const std::vector<const uint8_t*>& planes, const std::vector<Run>& runs,
                uint8_t* dst) {
  Cursor cur[kTransforms];
  Layout(runs, planes, cur);
  uint64_t pos = 0;
  for (const Run& r : runs) {
    Cursor& c = cur[static_cast<int>(r.transform)];
    uint8_t* out = dst + pos;
    uint64_t n = r.length / ElementBytes(r.transform);
    uint8_t* in[8];
    for (int p = 0; p < PlaneCount(r.transform); ++p) in[p] = c.plane[p] + c.used;
    switch (r.transform) {
      case Transform::kBytes:
        std::memcpy(out, in[0], n);
        break;
      case Transform::kBF16:
        JoinBF16(in[0], in[1], n, out);
        break;
      case Transform::kF32:
        JoinF32(in[0], in[1], in[2], in[3], n, out);
        break;
      case Transform::kF16:
        JoinF16(in[0], in[1], n, out);
        break;
      case Transform::kF64:
        JoinF64(in, n, out);
        break;
    }
    c.used += n;
    pos += r.length;
  }
}

}  // namespace ckpt::ckz
