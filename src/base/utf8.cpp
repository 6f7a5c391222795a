#include "base/utf8.h"

#include <fmt/format.h>

namespace ckpt {

size_t Utf8SequenceAt(std::string_view s, size_t i, uint32_t* cp) {
  auto byte = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  uint8_t c = byte(0);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  uint32_t v = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (byte(k) & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

bool ValidUtf8(std::string_view s) {
  uint32_t cp = 0;
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8SequenceAt(s, i, &cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | ((cp >> 18) & 0x07)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  uint32_t cp = 0;
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8SequenceAt(s, i, &cp);
    if (n == 0) {
      AppendUtf8(0xFFFD, out);
      ++i;
      continue;
    }
    if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", cp);
    } else if (cp >= 0x80 && cp < 0xA0) {
      out += fmt::format("\\u{:04x}", cp);
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

}  // namespace ckpt
