// Decoders for protocol-0 text payloads (STRING, UNICODE, long integers).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ckpt::pickle {

// "-123456789012345678901234567890" -> minimal two's complement little-endian bytes, as
// LONG1 would carry it. Returns false on malformed input or more than 4096 digits.
bool DecimalToTwosComplement(std::string_view text, std::string& out);

// Inverse, for display: little-endian two's complement bytes -> decimal text. Decimal
// conversion takes time quadratic in the length, so (like Python's int_max_str_digits)
// integers longer than kMaxDecimalBytes are written in hex ("0x1f...", "-0x...") instead.
inline constexpr size_t kMaxDecimalBytes = 32;  // up to 2^255: 77 digits
std::string TwosComplementToDecimal(std::string_view le);

// A Python repr'd str literal ('abc' or "abc" with backslash escapes) -> its bytes.
bool DecodeQuotedString(std::string_view literal, std::string& out);

// Python's raw-unicode-escape: bytes are Latin-1 except \uXXXX and \UXXXXXXXX -> UTF-8.
void DecodeRawUnicodeEscape(std::string_view text, std::string& out);

}  // namespace ckpt::pickle
