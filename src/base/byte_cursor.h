// A bounds-checked cursor over a byte span: the only way parsers read untrusted bytes.
// Every read checks the remaining length first and throws ckpt::Error when it is short,
// so a lying length field can never make us read (or allocate) past the data we have.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "base/endian.h"
#include "base/error.h"

namespace ckpt {

using Bytes = std::span<const uint8_t>;

inline Bytes AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

inline std::string_view AsText(Bytes b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// Returns data[offset, offset+size) or throws "region out of bounds".
inline Bytes Slice(Bytes data, uint64_t offset, uint64_t size) {
  if (offset > data.size() || size > data.size() - offset) {
    Fail("region [{}, {}+{}) is outside the {} bytes available", offset, offset, size, data.size());
  }
  return data.subspan(offset, size);
}

class ByteCursor {
 public:
  explicit ByteCursor(Bytes data, uint64_t base_offset = 0) : data_(data), base_(base_offset) {}

  uint64_t pos() const { return pos_; }
  // Offset of the cursor in the enclosing file, for error messages.
  uint64_t file_pos() const { return base_ + pos_; }
  uint64_t remaining() const { return data_.size() - pos_; }
  bool done() const { return pos_ == data_.size(); }
  Bytes rest() const { return data_.subspan(pos_); }

  Bytes Read(uint64_t n) {
    if (n > remaining()) {
      Fail("unexpected end of data at offset {}: need {} bytes, {} left", file_pos(), n,
           remaining());
    }
    Bytes out = data_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  std::string_view ReadText(uint64_t n) { return AsText(Read(n)); }

  template <typename T>
  T ReadLE() {
    return LoadLE<T>(Read(sizeof(T)).data());
  }
  template <typename T>
  T ReadBE() {
    return LoadBE<T>(Read(sizeof(T)).data());
  }
  uint8_t ReadU8() { return Read(1)[0]; }

  // Reads up to and including '\n'; returns the line without it.
  std::string_view ReadLine() {
    for (uint64_t i = pos_; i < data_.size(); ++i) {
      if (data_[i] == '\n') {
        std::string_view line = AsText(data_.subspan(pos_, i - pos_));
        pos_ = i + 1;
        return line;
      }
    }
    Fail("unexpected end of data at offset {}: unterminated line", file_pos());
  }

  void Skip(uint64_t n) { Read(n); }

 private:
  Bytes data_;
  uint64_t base_ = 0;
  uint64_t pos_ = 0;
};

}  // namespace ckpt
