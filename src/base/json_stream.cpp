#include "base/json_stream.h"

#include <fmt/format.h>

#include "base/error.h"

namespace ckpt {

namespace {

std::string Dump(const nlohmann::ordered_json& v) {
  return v.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

JsonStream::~JsonStream() {
  try {
    Flush();
  } catch (...) {
    // A sink that fails while unwinding: what it failed on is already being reported.
  }
}

void JsonStream::Put(std::string_view text) {
  buf_.append(text);
  if (buf_.size() >= kFlushBytes) Flush();
}

void JsonStream::PutString(std::string_view text) {
  bool plain = true;
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    plain = plain && u >= 0x20 && u < 0x7f && c != '"' && c != '\\';
  }
  if (!plain) {
    Put(Dump(std::string(text)));
    return;
  }
  buf_.push_back('"');
  buf_.append(text);
  buf_.push_back('"');
  if (buf_.size() >= kFlushBytes) Flush();
}

void JsonStream::PutInt(int64_t v) {
  Put(fmt::format_int(v).c_str());
}

void JsonStream::PutUint(uint64_t v) {
  Put(fmt::format_int(v).c_str());
}

void JsonStream::Value(const std::vector<int64_t>& list) {
  BeginArray();
  for (int64_t v : list) Value(v);
  End();
}

void JsonStream::Flush() {
  if (buf_.empty()) return;
  sink_(buf_);
  buf_.clear();
}

void JsonStream::Indent(size_t levels) {
  buf_.append(levels, ' ');
}

void JsonStream::BeforeValue() {
  if (frames_.empty()) return;
  Frame& f = frames_.back();
  if (f.object) {
    if (!after_key_) Fail("internal: a JSON object member without a key");
    after_key_ = false;
    return;
  }
  Put(f.children++ == 0 ? "[\n" : ",\n");
  Indent(frames_.size());
}

void JsonStream::Key(std::string_view key) {
  if (frames_.empty() || !frames_.back().object || after_key_)
    Fail("internal: a JSON key outside an object");
  Frame& f = frames_.back();
  Put(f.children++ == 0 ? "{\n" : ",\n");
  Indent(frames_.size());
  PutString(key);
  Put(": ");
  after_key_ = true;
}

void JsonStream::Value(const nlohmann::ordered_json& value) {
  BeforeValue();
  std::string text = Dump(value);
  // dump() indents from column 0; this value starts `depth` levels in. Strings in JSON text
  // never hold a raw newline, so every newline is a line break of the layout.
  size_t levels = frames_.size();
  if (levels == 0 || text.find('\n') == std::string::npos) {
    Put(text);
    return;
  }
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (char c : text) {
    out.push_back(c);
    if (c == '\n') out.append(levels, ' ');
  }
  Put(out);
}

void JsonStream::BeginObject() {
  BeforeValue();
  frames_.push_back({true, 0});
}

void JsonStream::BeginArray() {
  BeforeValue();
  frames_.push_back({false, 0});
}

void JsonStream::End() {
  if (frames_.empty() || after_key_) Fail("internal: JSON End without an open object or array");
  Frame f = frames_.back();
  frames_.pop_back();
  if (f.children == 0) {
    Put(f.object ? "{}" : "[]");
  } else {
    Put("\n");
    Indent(frames_.size());
    Put(f.object ? "}" : "]");
  }
}

}  // namespace ckpt
