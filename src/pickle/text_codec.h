// Decoders for protocol-0 text payloads (STRING, UNICODE, INT, LONG, FLOAT, PUT, GET), each
// accepting exactly what CPython's C unpickler accepts (Modules/_pickle.c load_int, load_long,
// load_float, load_string, load_unicode, load_get, load_put and the functions they call:
// strtol, PyLong_FromString, PyOS_string_to_double, PyBytes_DecodeEscape,
// PyUnicode_DecodeRawUnicodeEscape). The C unpickler hands those functions the line as a C
// string, so text after an embedded NUL is never seen: callers pass CString(line).
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

// Python's raw-unicode-escape (PyUnicode_DecodeRawUnicodeEscape): bytes are Latin-1 except
// \uXXXX and \UXXXXXXXX after an odd run of backslashes -> UTF-8. False where CPython raises
// (a truncated escape, a code point above U+10FFFF).
bool DecodeRawUnicodeEscape(std::string_view text, std::string& out);

// The text a C function sees of `line`: up to its first NUL.
std::string_view CString(std::string_view line);

// PyLong_FromString(text, NULL, base) for base 0 (Python literal rules: 0x/0o/0b prefixes,
// no leading zeros) or 10: leading and trailing whitespace, one sign, single underscores
// between digits, at most 4300 decimal digits (sys.int_info.default_max_str_digits). The
// value as minimal two's complement little-endian bytes (as LONG1 carries it); false where
// CPython raises.
bool PyLongFromString(std::string_view text, int base, std::string& le);

// What load_int gets from C's strtol(text, &end, 0) when it succeeds: the whole text (up to
// a NUL) is a C integer literal that fits in a long. False when load_int falls back to
// PyLong_FromString.
bool CStrtol(std::string_view text, int64_t& value);

// PyOS_string_to_double(text, &end, OverflowError) followed by load_float's check that the
// whole text was used: Python's float syntax without whitespace or underscores, inf/nan
// spelled out; false on malformed text and on overflow (underflow gives 0).
bool PyStringToDouble(std::string_view text, double& value);

// Well-formed UTF-8 as PyUnicode_DecodeUTF8 with "surrogatepass" accepts it: encoded
// surrogates (U+D800-DFFF) allowed (BINUNICODE and friends).
bool ValidUtf8SurrogatePass(std::string_view s);

// Every byte below 0x80 (PyUnicode_DecodeASCII, "strict": INST names, PERSID).
bool IsAscii(std::string_view s);

}  // namespace ckpt::pickle
