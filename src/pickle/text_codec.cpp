#include "pickle/text_codec.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "base/utf8.h"

namespace ckpt::pickle {

namespace {

// Two's complement negation of a little-endian byte string, in place.
void Negate(std::vector<uint8_t>& bytes) {
  unsigned carry = 1;
  for (uint8_t& b : bytes) {
    unsigned v = static_cast<uint8_t>(~b) + carry;
    b = static_cast<uint8_t>(v & 0xFF);
    carry = v >> 8;
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool DecimalToTwosComplement(std::string_view text, std::string& out) {
  bool negative = false;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty() || text.size() > 4096) return false;
  std::vector<uint8_t> mag;  // little-endian magnitude
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
    unsigned carry = static_cast<unsigned>(ch - '0');
    for (uint8_t& b : mag) {
      unsigned v = b * 10u + carry;
      b = static_cast<uint8_t>(v & 0xFF);
      carry = v >> 8;
    }
    while (carry) {
      mag.push_back(static_cast<uint8_t>(carry & 0xFF));
      carry >>= 8;
    }
  }
  mag.push_back(0);  // room for the sign bit
  if (negative) Negate(mag);
  // Trim redundant sign bytes.
  while (mag.size() > 1) {
    uint8_t last = mag.back(), prev = mag[mag.size() - 2];
    if ((last == 0 && !(prev & 0x80)) || (last == 0xFF && (prev & 0x80))) {
      mag.pop_back();
    } else {
      break;
    }
  }
  out.assign(mag.begin(), mag.end());
  return true;
}

std::string TwosComplementToDecimal(std::string_view le) {
  if (le.empty()) return "0";
  std::vector<uint8_t> mag(le.begin(), le.end());
  bool negative = mag.back() & 0x80;
  if (negative) Negate(mag);
  if (mag.size() > kMaxDecimalBytes) {
    while (mag.size() > 1 && mag.back() == 0) mag.pop_back();
    std::string hex = negative ? "-0x" : "0x";
    static constexpr char kHex[] = "0123456789abcdef";
    for (size_t i = mag.size(); i-- > 0;) {
      hex.push_back(kHex[mag[i] >> 4]);
      hex.push_back(kHex[mag[i] & 15]);
    }
    return hex;
  }
  std::string digits;
  while (std::any_of(mag.begin(), mag.end(), [](uint8_t b) { return b != 0; })) {
    unsigned rem = 0;
    for (size_t i = mag.size(); i-- > 0;) {
      unsigned v = (rem << 8) | mag[i];
      mag[i] = static_cast<uint8_t>(v / 10);
      rem = v % 10;
    }
    digits.push_back(static_cast<char>('0' + rem));
  }
  if (digits.empty()) digits = "0";
  if (negative) digits.push_back('-');
  std::reverse(digits.begin(), digits.end());
  return digits;
}

bool DecodeQuotedString(std::string_view s, std::string& out) {
  if (s.size() < 2 || (s.front() != '\'' && s.front() != '"') || s.back() != s.front()) {
    return false;
  }
  s = s.substr(1, s.size() - 2);
  out.clear();
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c != '\\') {
      out.push_back(c);
      continue;
    }
    if (++i >= s.size()) return false;
    char e = s[i];
    switch (e) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'x': {
        if (i + 2 >= s.size()) return false;
        int hi = HexValue(s[i + 1]), lo = HexValue(s[i + 2]);
        if (hi < 0 || lo < 0) return false;
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int v = 0, n = 0;
          while (n < 3 && i < s.size() && s[i] >= '0' && s[i] <= '7') {
            v = v * 8 + (s[i] - '0');
            ++i;
            ++n;
          }
          --i;
          out.push_back(static_cast<char>(v & 0xFF));
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return true;
}

bool DecodeRawUnicodeEscape(std::string_view s, std::string& out) {
  out.clear();
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c != '\\') {
      AppendUtf8(c, out);
      ++i;
      continue;
    }
    // A run of backslashes is kept; after an odd run, 'u' or 'U' starts an escape that
    // replaces the last backslash.
    size_t run = 0;
    while (i < s.size() && s[i] == '\\') {
      out.push_back('\\');
      ++i;
      ++run;
    }
    if (run % 2 == 0 || i >= s.size() || (s[i] != 'u' && s[i] != 'U')) continue;
    out.pop_back();
    size_t digits = s[i] == 'u' ? 4 : 8;
    ++i;
    uint32_t cp = 0;
    for (size_t k = 0; k < digits; ++k, ++i) {
      if (i >= s.size()) return false;  // truncated \uXXXX escape
      int h = HexValue(s[i]);
      if (h < 0) return false;
      cp = cp * 16 + static_cast<uint32_t>(h);
    }
    if (cp > 0x10FFFF) return false;  // \Uxxxxxxxx out of range
    AppendUtf8(cp, out);
  }
  return true;
}

std::string_view CString(std::string_view line) {
  return line.substr(0, line.find('\0'));
}

namespace {

// Py_ISSPACE: the C locale's whitespace.
bool PySpace(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

int DigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'z') return c - 'a' + 10;
  if (c >= 'A' && c <= 'Z') return c - 'A' + 10;
  return 99;
}

// Minimal two's complement of a little-endian magnitude.
std::string TwosComplement(std::vector<uint8_t> mag, bool negative) {
  mag.push_back(0);  // room for the sign bit
  if (negative) Negate(mag);
  while (mag.size() > 1) {
    uint8_t last = mag.back(), prev = mag[mag.size() - 2];
    if ((last == 0 && !(prev & 0x80)) || (last == 0xFF && (prev & 0x80))) {
      mag.pop_back();
    } else {
      break;
    }
  }
  return std::string(mag.begin(), mag.end());
}

constexpr size_t kMaxStrDigits = 4300;      // sys.int_info.default_max_str_digits
constexpr size_t kMaxPow2Digits = 1 << 16;  // ours: hex/octal/binary literals of 64K digits

}  // namespace

bool PyLongFromString(std::string_view s, int base, std::string& le) {
  size_t i = 0;
  while (i < s.size() && PySpace(s[i])) ++i;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  auto at = [&](size_t k) { return k < s.size() ? s[k] : '\0'; };
  bool zero_only = false;  // "old" octal (0777) is invalid unless the value is zero
  if (base == 0) {
    char p = at(i + 1);
    if (at(i) != '0') {
      base = 10;
    } else if (p == 'x' || p == 'X') {
      base = 16;
    } else if (p == 'o' || p == 'O') {
      base = 8;
    } else if (p == 'b' || p == 'B') {
      base = 2;
    } else {
      base = 10;
      zero_only = true;
    }
    if (base != 10) {
      i += 2;
      if (at(i) == '_') ++i;  // one underscore after the prefix
    }
  }
  if (at(i) == '_') return false;
  std::vector<uint8_t> mag;  // little-endian magnitude
  size_t digits = 0;
  char prev = '\0';
  for (; i < s.size() && (DigitValue(s[i]) < base || s[i] == '_'); ++i) {
    if (s[i] == '_') {
      if (prev == '_') return false;
      prev = '_';
      continue;
    }
    prev = s[i];
    if (++digits > (base == 10 ? kMaxStrDigits : kMaxPow2Digits)) return false;
    unsigned carry = static_cast<unsigned>(DigitValue(s[i]));
    for (uint8_t& b : mag) {
      unsigned v = b * static_cast<unsigned>(base) + carry;
      b = static_cast<uint8_t>(v & 0xFF);
      carry = v >> 8;
    }
    while (carry) {
      mag.push_back(static_cast<uint8_t>(carry & 0xFF));
      carry >>= 8;
    }
  }
  if (digits == 0 || prev == '_') return false;
  if (zero_only && !mag.empty()) return false;
  while (i < s.size() && PySpace(s[i])) ++i;
  if (i != s.size()) return false;
  le = TwosComplement(std::move(mag), negative);
  return true;
}

bool CStrtol(std::string_view text, int64_t& value) {
  std::string c(CString(text));
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(c.c_str(), &end, 0);
  // Nothing to convert leaves `end` at the start: accepted (as 0) only when the line starts
  // with a NUL, as load_int checks *end against '\n' and '\0'.
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  value = v;
  return true;
}

bool PyStringToDouble(std::string_view s, double& value) {
  s = CString(s);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  auto lower = [&](size_t k) {
    return k < s.size() ? static_cast<char>(std::tolower(static_cast<unsigned char>(s[k]))) : '\0';
  };
  auto word = [&](size_t k, std::string_view w) {
    for (size_t n = 0; n < w.size(); ++n) {
      if (lower(k + n) != w[n]) return false;
    }
    return true;
  };
  if (word(i, "inf")) {
    size_t end = word(i, "infinity") ? i + 8 : i + 3;
    if (end != s.size()) return false;
    value = negative ? -HUGE_VAL : HUGE_VAL;
    return true;
  }
  if (word(i, "nan")) {
    if (i + 3 != s.size()) return false;
    value = negative ? -std::nan("") : std::nan("");
    return true;
  }
  auto is_digit = [&](size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '9'; };
  size_t mantissa_digits = 0;
  while (is_digit(i)) ++i, ++mantissa_digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (is_digit(i)) ++i, ++mantissa_digits;
  }
  if (mantissa_digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t k = i + 1;
    if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
    if (is_digit(k)) {
      while (is_digit(k)) ++k;
      i = k;
    }
  }
  if (i != s.size()) return false;
  std::string c(s);
  errno = 0;
  double v = std::strtod(c.c_str(), nullptr);
  if (errno == ERANGE && std::fabs(v) >= 1.0) return false;  // OverflowError
  value = v;
  return true;
}

bool ValidUtf8SurrogatePass(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    size_t n = Utf8SequenceAt(s, i, &cp);
    if (n == 0) {
      // An encoded surrogate: ED A0-BF 80-BF.
      if (i + 2 < s.size() && static_cast<uint8_t>(s[i]) == 0xED &&
          (static_cast<uint8_t>(s[i + 1]) & 0xE0) == 0xA0 &&
          (static_cast<uint8_t>(s[i + 2]) & 0xC0) == 0x80) {
        n = 3;
      } else {
        return false;
      }
    }
    i += n;
  }
  return true;
}

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace ckpt::pickle
