#include "writers/element_convert.h"

#include <cstring>
#include <optional>
#include <vector>

#include "base/error.h"
#include "writers/piece_writer.h"

namespace ckpt {

namespace {

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

bool Widens(DType from) {
  switch (from) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kBFloat16:
    case DType::kFloat16:
    case DType::kInt64:
    case DType::kInt32:
    case DType::kInt16:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return true;
    default:
      return false;
  }
}

}  // namespace

void ToFloat32(DType from, const uint8_t* src, float* dst, size_t n) {
  const uint32_t size = torch::ElementSize(from);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = src + i * size;
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

bool CanConvert(DType from, DType to) {
  if (from == to) return true;
  if (to == DType::kFloat32) return Widens(from);
  // One rounding only: float64 would round twice on its way through float32.
  return torch::HalfOf(to) && Widens(from) && from != DType::kFloat64;
}

uint32_t WriteConverted(AtomicOutput& out, uint64_t dst, Bytes src, DType from, DType to,
                        kernels::ConversionLoss* loss) {
  if (from == to) return WritePiece(out, dst, src, std::nullopt, nullptr);
  if (!CanConvert(from, to)) Fail("cannot convert {} to {}", torch::Name(from), torch::Name(to));
  if (from != DType::kFloat32) {
    thread_local std::vector<float> wide;
    size_t n = src.size() / torch::ElementSize(from);
    wide.resize(n);
    ToFloat32(from, src.data(), wide.data(), n);
    src = Bytes(reinterpret_cast<const uint8_t*>(wide.data()), n * 4);
  }
  return WritePiece(out, dst, src, torch::HalfOf(to), nullptr, 0, loss);
}

}  // namespace ckpt
