#include "pickle/text_codec.h"

#include <algorithm>
#include <cstdint>
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
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'v': out.push_back('\v'); break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
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

void DecodeRawUnicodeEscape(std::string_view s, std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\\' && i + 1 < s.size() && (s[i + 1] == 'u' || s[i + 1] == 'U')) {
      size_t digits = s[i + 1] == 'u' ? 4 : 8;
      if (i + 2 + digits <= s.size()) {
        uint32_t cp = 0;
        bool ok = true;
        for (size_t k = 0; k < digits; ++k) {
          int h = HexValue(s[i + 2 + k]);
          if (h < 0) ok = false;
          cp = cp * 16 + static_cast<uint32_t>(std::max(h, 0));
        }
        if (ok && cp <= 0x10FFFF) {
          AppendUtf8(cp, out);
          i += 1 + digits;
          continue;
        }
      }
    }
    AppendUtf8(c, out);
  }
}

}  // namespace ckpt::pickle
