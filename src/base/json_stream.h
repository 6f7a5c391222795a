// JSON written a value at a time, as text identical to nlohmann's dump(1) of the whole
// document (one space of indent per level, `"key": value`, `[]` and `{}` when empty; invalid
// UTF-8 replaced). A report of 10^5 tensors is written row by row, each row a small json
// value, instead of being built whole as a tree (~3 KiB a row) and then dumped.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace ckpt {

class JsonStream {
 public:
  // Text goes to `sink` in pieces of about kFlushBytes (and at Flush()).
  using Sink = std::function<void(std::string_view)>;
  explicit JsonStream(Sink sink) : sink_(std::move(sink)) {}
  ~JsonStream();
  JsonStream(const JsonStream&) = delete;
  JsonStream& operator=(const JsonStream&) = delete;

  void BeginObject();
  void BeginArray();
  void End();  // closes the innermost object or array
  // Inside an object: the next value's key.
  void Key(std::string_view key);
  // A whole value (object members: after Key; array elements: as is). Text, integers, bools,
  // null and integer lists are written directly; anything else goes through a json value.
  void Value(const nlohmann::ordered_json& value);
  template <typename T>
  requires std::is_convertible_v<const T&, std::string_view>
  void Value(const T& text) {
    BeforeValue();
    PutString(std::string_view(text));
  }
  template <std::integral T>
  void Value(T v) {
    BeforeValue();
    if constexpr (std::is_same_v<T, bool>) {
      Put(v ? "true" : "false");
    } else if constexpr (std::is_signed_v<T>) {
      PutInt(static_cast<int64_t>(v));
    } else {
      PutUint(static_cast<uint64_t>(v));
    }
  }
  void Value(std::nullptr_t) {
    BeforeValue();
    Put("null");
  }
  void Value(const std::vector<int64_t>& list);

  // Shorthands inside an object.
  template <typename T>
  void Member(std::string_view key, const T& value) {
    Key(key);
    Value(value);
  }
  void Member(std::string_view key, const nlohmann::ordered_json& value) {
    Key(key);
    Value(value);
  }
  void BeginObject(std::string_view key) {
    Key(key);
    BeginObject();
  }
  void BeginArray(std::string_view key) {
    Key(key);
    BeginArray();
  }

  // How many objects and arrays are open (the indent of the next line's closing bracket).
  size_t depth() const { return frames_.size(); }
  void Flush();

  static constexpr size_t kFlushBytes = size_t{1} << 16;

 private:
  struct Frame {
    bool object = false;
    uint64_t children = 0;
  };
  // Before a value: the separator and indent an array element needs (object members had
  // theirs written by Key).
  void BeforeValue();
  void Put(std::string_view text);
  // A JSON string as dump() writes it: plain printable ASCII as is, the rest through nlohmann
  // (escapes, invalid UTF-8 replaced).
  void PutString(std::string_view text);
  void PutInt(int64_t v);
  void PutUint(uint64_t v);
  void Indent(size_t levels);

  Sink sink_;
  std::string buf_;
  std::vector<Frame> frames_;
  bool after_key_ = false;
};

}  // namespace ckpt
