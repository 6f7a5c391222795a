#include "ops/zero_export.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "base/error.h"
#include "deepspeed/zero_checkpoint.h"
#include "io/atomic_output.h"
#include "io/crc32.h"
#include "io/parallel_crc.h"
#include "ops/piece_writer.h"
#include "ops/safetensors_output.h"
#include "torch/global_policy.h"

namespace ckpt {

namespace {

using deepspeed::Piece;
using deepspeed::ZeroTensor;
using torch::DType;

// float16 -> float32, exact.
float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while (!(mant & 0x400));
    bits = sign | ((112 - e) << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// n elements of `from` as float32, the way torch's .float() makes them.
void ToFloat32(DType from, const uint8_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = src + i * torch::ElementSize(from);
    switch (from) {
      case DType::kFloat32:
        dst[i] = Load<float>(p);
        break;
      case DType::kFloat64:
        dst[i] = static_cast<float>(Load<double>(p));
        break;
      case DType::kBFloat16: {
        uint32_t bits = static_cast<uint32_t>(Load<uint16_t>(p)) << 16;
        std::memcpy(&dst[i], &bits, 4);
        break;
      }
      case DType::kFloat16:
        dst[i] = HalfToFloat(Load<uint16_t>(p));
        break;
      case DType::kInt64:
        dst[i] = static_cast<float>(Load<int64_t>(p));
        break;
      case DType::kInt32:
        dst[i] = static_cast<float>(Load<int32_t>(p));
        break;
      case DType::kInt16:
        dst[i] = static_cast<float>(Load<int16_t>(p));
        break;
      case DType::kInt8:
        dst[i] = static_cast<float>(Load<int8_t>(p));
        break;
      case DType::kUInt8:
        dst[i] = static_cast<float>(*p);
        break;
      case DType::kBool:
        dst[i] = *p ? 1.0f : 0.0f;
        break;
      default:
        Fail("cannot convert {} to float32", torch::Name(from));
    }
  }
}

// Converts and writes a tensor's elements [first, first + count) (stored as `t.stored`, written
// as `out_dtype`) at `dst`; returns the CRC32 of the bytes written.
uint32_t WriteElements(const deepspeed::ZeroCheckpoint& z, const ZeroTensor& t,
                       const std::vector<uint64_t>& starts, DType out_dtype, uint64_t first,
                       uint64_t count, AtomicOutput& out, uint64_t dst) {
  constexpr size_t kChunk = 256 << 10;  // elements per step: small, flat memory per thread
  thread_local std::vector<float> wide;
  const uint64_t in_size = torch::ElementSize(t.stored);
  std::optional<kernels::Half> narrow;
  if (out_dtype == DType::kBFloat16) narrow = kernels::Half::kBFloat16;
  if (out_dtype == DType::kFloat16) narrow = kernels::Half::kFloat16;
  uint32_t crc = 0;
  uint64_t written = 0;
  auto it = std::upper_bound(starts.begin(), starts.end(), first);
  size_t k = it == starts.begin() ? 0 : static_cast<size_t>(it - starts.begin()) - 1;
  for (uint64_t pos = first, end = first + count; pos < end; ++k) {
    if (k >= t.pieces.size()) Fail("internal: tensor '{}' has too few pieces", t.name);
    const Piece& p = t.pieces[k];
    uint64_t lo = pos - starts[k], hi = std::min(p.count, end - starts[k]);
    const MappedFile& map = z.files[p.file]->map;
    for (uint64_t e = lo; e < hi;) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, hi - e));
      MappedFile::Window w(map, p.offset + e * in_size, n * in_size);
      // Stored as is, or made float32 first, then (WritePiece) narrowed to 16 bits if asked.
      Bytes src = w.bytes();
      if (t.stored != out_dtype && t.stored != DType::kFloat32) {
        wide.resize(n);
        ToFloat32(t.stored, src.data(), wide.data(), n);
        src = Bytes(reinterpret_cast<const uint8_t*>(wide.data()), n * 4);
      }
      std::optional<kernels::Half> to = t.stored == out_dtype ? std::nullopt : narrow;
      uint64_t length = to ? src.size() / 2 : src.size();
      uint32_t c = WritePiece(out, dst + written, src, to, nullptr);
      crc = written ? Crc32Combine(crc, c, length) : c;
      written += length;
      e += n;
    }
    pos = starts[k] + hi;
  }
  return crc;
}

}  // namespace

ExportResult ExportZero(const std::string& path, const std::string& to, const ExportOptions& o) {
  deepspeed::ZeroCheckpoint z = deepspeed::OpenZeroCheckpoint(path, o.tag);
  ExportResult r;
  r.selected = fmt::format("DeepSpeed ZeRO stage {} checkpoint '{}', {} ranks", z.stage, z.tag,
                           z.world_size);
  for (const auto& f : z.files) {
    for (const torch::UnsafeFinding& u : torch::FindUnsafe(f->torch->model.graph)) {
      r.warnings.push_back(
          fmt::format("{}: the pickle {} (never run; left behind by export)", f->path, u.what));
    }
  }
  // Per tensor: where each piece starts, in elements.
  std::vector<std::vector<uint64_t>> starts;
  starts.reserve(z.tensors.size());  // the writers keep references into it
  std::vector<SafetensorsSource> outputs;
  std::set<std::string> written_names;
  for (const ZeroTensor& t : z.tensors) {
    if (o.exclude_frozen && t.kind == ZeroTensor::Kind::kFrozen) continue;
    DType out_dtype = t.dtype;
    if (o.to && torch::IsFloatingPoint(out_dtype)) {
      out_dtype = *o.to == kernels::Half::kBFloat16 ? DType::kBFloat16 : DType::kFloat16;
    }
    std::string_view st = torch::Info(out_dtype).safetensors;
    if (st.empty())
      Fail("tensor '{}': safetensors has no {} dtype", t.name, torch::Name(out_dtype));
    std::vector<uint64_t> s;
    uint64_t at = 0;
    for (const Piece& p : t.pieces) {
      s.push_back(at);
      at += p.count;
    }
    if (at != t.numel)
      Fail("internal: tensor '{}' pieces hold {} of {} elements", t.name, at, t.numel);
    starts.push_back(std::move(s));
    const std::vector<uint64_t>& piece_starts = starts.back();
    uint64_t out_size = torch::ElementSize(out_dtype);
    SafetensorsSource src{t.name, std::string(st), t.shape, t.numel * out_size, false, nullptr};
    src.write = [&z, &t, &piece_starts, out_dtype, out_size](AtomicOutput& out, uint64_t dst,
                                                             uint64_t off, uint64_t len) {
      return WriteElements(z, t, piece_starts, out_dtype, off / out_size, len / out_size, out, dst);
    };
    outputs.push_back(std::move(src));
    written_names.insert(t.name);
  }
  std::map<std::string, std::string> aliases;
  for (const auto& [alias, owner] : z.aliases) {
    if (written_names.count(owner)) aliases[alias] = owner;
  }
  SafetensorsModelOptions so;
  so.max_shard_size = o.max_shard_size;
  so.threads = o.threads;
  for (const auto& f : z.files) so.inputs.push_back(&f->map);
  r.tensors = outputs.size();
  r.aliases = aliases.size();
  SafetensorsModel written = WriteSafetensorsModel(to, std::move(outputs), aliases, so);
  r.files = written.files;
  r.bytes = written.bytes;
  return r;
}

}  // namespace ckpt
