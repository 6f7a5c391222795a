#include "torch/dtype.h"

#include <array>

namespace ckpt::torch {

namespace {

constexpr std::array<DTypeInfo, 33> kTable = {{
    {DType::kFloat64, "float64", 8, "DoubleStorage", "F64"},
    {DType::kFloat32, "float32", 4, "FloatStorage", "F32"},
    {DType::kFloat16, "float16", 2, "HalfStorage", "F16"},
    {DType::kBFloat16, "bfloat16", 2, "BFloat16Storage", "BF16"},
    {DType::kInt64, "int64", 8, "LongStorage", "I64"},
    {DType::kInt32, "int32", 4, "IntStorage", "I32"},
    {DType::kInt16, "int16", 2, "ShortStorage", "I16"},
    {DType::kInt8, "int8", 1, "CharStorage", "I8"},
    {DType::kUInt8, "uint8", 1, "ByteStorage", "U8"},
    {DType::kBool, "bool", 1, "BoolStorage", "BOOL"},
    {DType::kComplex128, "complex128", 16, "ComplexDoubleStorage", ""},
    {DType::kComplex64, "complex64", 8, "ComplexFloatStorage", "C64"},
    {DType::kComplex32, "complex32", 4, "", ""},
    {DType::kQInt8, "qint8", 1, "QInt8Storage", ""},
    {DType::kQInt32, "qint32", 4, "QInt32Storage", ""},
    {DType::kQUInt8, "quint8", 1, "QUInt8Storage", ""},
    {DType::kQUInt4x2, "quint4x2", 1, "QUInt4x2Storage", ""},
    {DType::kQUInt2x4, "quint2x4", 1, "QUInt2x4Storage", ""},
    {DType::kFloat8E5M2, "float8_e5m2", 1, "", "F8_E5M2"},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1, "", "F8_E4M3"},
    {DType::kFloat8E5M2FNUZ, "float8_e5m2fnuz", 1, "", "F8_E5M2FNUZ"},
    {DType::kFloat8E4M3FNUZ, "float8_e4m3fnuz", 1, "", "F8_E4M3FNUZ"},
    {DType::kFloat8E8M0FNU, "float8_e8m0fnu", 1, "", "F8_E8M0"},
    {DType::kUInt16, "uint16", 2, "", "U16"},
    {DType::kUInt32, "uint32", 4, "", "U32"},
    {DType::kUInt64, "uint64", 8, "", "U64"},
    {DType::kBits8, "bits8", 1, "", ""},
    {DType::kBits16, "bits16", 2, "", ""},
    {DType::kBits1x8, "bits1x8", 1, "", ""},
    {DType::kBits2x4, "bits2x4", 1, "", ""},
    {DType::kBits4x2, "bits4x2", 1, "", ""},
    {DType::kFloat4E2M1FNX2, "float4_e2m1fn_x2", 1, "", "F4"},
    {DType::kUntyped, "uint8", 1, "UntypedStorage", ""},
}};

}  // namespace

const DTypeInfo& Info(DType dtype) {
  return kTable[static_cast<size_t>(dtype)];
}

std::optional<DType> FromStorageClass(std::string_view name) {
  if (name == "TypedStorage" || name == "_LegacyStorage") return std::nullopt;
  for (const DTypeInfo& i : kTable) {
    if (!i.storage_class.empty() && i.storage_class == name) return i.dtype;
  }
  return std::nullopt;
}

std::optional<DType> FromName(std::string_view name) {
  // Aliases torch also exposes as globals.
  if (name == "float") return DType::kFloat32;
  if (name == "double") return DType::kFloat64;
  if (name == "half") return DType::kFloat16;
  if (name == "long") return DType::kInt64;
  if (name == "int") return DType::kInt32;
  if (name == "short") return DType::kInt16;
  if (name == "cfloat") return DType::kComplex64;
  if (name == "cdouble") return DType::kComplex128;
  if (name == "chalf") return DType::kComplex32;
  for (const DTypeInfo& i : kTable) {
    if (i.dtype != DType::kUntyped && i.name == name) return i.dtype;
  }
  return std::nullopt;
}

std::optional<DType> FromSafetensors(std::string_view name) {
  for (const DTypeInfo& i : kTable) {
    if (!i.safetensors.empty() && i.safetensors == name) return i.dtype;
  }
  return std::nullopt;
}

bool IsFloatingPoint(DType d) {
  switch (d) {
    case DType::kFloat64:
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8E5M2:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E8M0FNU:
    case DType::kFloat4E2M1FNX2:
      return true;
    default:
      return false;
  }
}

std::vector<int64_t> SafetensorsShape(DType d, const std::vector<int64_t>& shape) {
  std::vector<int64_t> out = shape;
  if (d == DType::kFloat4E2M1FNX2 && !out.empty()) out.back() *= 2;
  return out;
}

std::optional<std::vector<int64_t>> TorchShape(DType d, const std::vector<int64_t>& shape) {
  std::vector<int64_t> out = shape;
  if (d == DType::kFloat4E2M1FNX2) {
    if (out.empty() || out.back() % 2) return std::nullopt;
    out.back() /= 2;
  }
  return out;
}

DType DTypeOf(kernels::Half h) {
  return h == kernels::Half::kBFloat16 ? DType::kBFloat16 : DType::kFloat16;
}

std::optional<kernels::Half> HalfOf(DType d) {
  if (d == DType::kBFloat16) return kernels::Half::kBFloat16;
  if (d == DType::kFloat16) return kernels::Half::kFloat16;
  return std::nullopt;
}

}  // namespace ckpt::torch
