// Torch dtypes: names, element sizes, the legacy storage class that carries each, and the
// safetensors spelling.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kernels/float_convert.h"

namespace ckpt::torch {

enum class DType : uint8_t {
  kFloat64,
  kFloat32,
  kFloat16,
  kBFloat16,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
  kComplex128,
  kComplex64,
  kComplex32,
  kQInt8,
  kQInt32,
  kQUInt8,
  kQUInt4x2,
  kQUInt2x4,
  kFloat8E5M2,
  kFloat8E4M3FN,
  kFloat8E5M2FNUZ,
  kFloat8E4M3FNUZ,
  kFloat8E8M0FNU,
  kUInt16,
  kUInt32,
  kUInt64,
  kBits8,
  kBits16,
  kBits1x8,
  kBits2x4,
  kBits4x2,
  kFloat4E2M1FNX2,  // two float4_e2m1 values per byte
  kUntyped,         // torch.UntypedStorage: bytes
};

struct DTypeInfo {
  DType dtype;
  std::string_view name;           // torch name without "torch.": "float32"
  uint32_t element_size;           // bytes per element
  std::string_view storage_class;  // "FloatStorage", or "" when saved as UntypedStorage
  std::string_view safetensors;    // "F32", or "" when safetensors has no such dtype
};

// The torch dtype of a half type, and the half type of a dtype (nullopt for any other).
DType DTypeOf(kernels::Half h);
std::optional<kernels::Half> HalfOf(DType d);

const DTypeInfo& Info(DType dtype);
inline std::string_view Name(DType d) {
  return Info(d).name;
}
inline uint32_t ElementSize(DType d) {
  return Info(d).element_size;
}

// "FloatStorage" -> kFloat32, "UntypedStorage" -> kUntyped. Matches torch's find_class,
// which treats any name ending in "Storage" as a storage type.
std::optional<DType> FromStorageClass(std::string_view name);
// "float32" (a torch.<name> global, as in _rebuild_tensor_v3's dtype argument).
std::optional<DType> FromName(std::string_view name);
// "F32", "BF16"...
std::optional<DType> FromSafetensors(std::string_view name);
bool IsFloatingPoint(DType d);

// The shape a safetensors header records for a torch tensor, and back: safetensors counts
// the F4 values of float4_e2m1fn_x2 (two per byte), so the last dimension doubles. Other
// dtypes keep their shape. TorchShape of an F4 shape whose last dimension is odd: nullopt.
std::vector<int64_t> SafetensorsShape(DType d, const std::vector<int64_t>& shape);
std::optional<std::vector<int64_t>> TorchShape(DType d, const std::vector<int64_t>& shape);

}  // namespace ckpt::torch
