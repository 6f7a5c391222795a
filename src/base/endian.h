// Endian-explicit loads and stores over raw bytes. File fields may be unaligned, so every
// access goes through memcpy; never cast file bytes to an integer pointer.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace ckpt {

template <typename T>
inline T ByteSwap(T v) {
  static_assert(std::is_integral_v<T>);
  if constexpr (sizeof(T) == 1) {
    return v;
  } else if constexpr (sizeof(T) == 2) {
    return static_cast<T>(__builtin_bswap16(static_cast<uint16_t>(v)));
  } else if constexpr (sizeof(T) == 4) {
    return static_cast<T>(__builtin_bswap32(static_cast<uint32_t>(v)));
  } else {
    return static_cast<T>(__builtin_bswap64(static_cast<uint64_t>(v)));
  }
}

template <typename T>
inline T LoadLE(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = ByteSwap(v);
  return v;
}

template <typename T>
inline T LoadBE(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::little) v = ByteSwap(v);
  return v;
}

template <typename T>
inline void StoreLE(void* p, T v) {
  if constexpr (std::endian::native == std::endian::big) v = ByteSwap(v);
  std::memcpy(p, &v, sizeof v);
}

template <typename T>
inline void AppendLE(std::string& out, T v) {
  char buf[sizeof(T)];
  StoreLE(buf, v);
  out.append(buf, sizeof buf);
}

}  // namespace ckpt
