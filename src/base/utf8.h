// UTF-8 as ckptool meets it in files: one set of rules for validating it, and a way to make
// any text from a file safe to print.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ckpt {

// Length (1-4) of the well-formed UTF-8 sequence at s[i], with its code point in *cp; 0 if
// the bytes there are not one (stray continuation bytes, truncated sequences, overlong
// forms, surrogates and values above U+10FFFF are not well formed).
size_t Utf8SequenceAt(std::string_view s, size_t i, uint32_t* cp);

bool ValidUtf8(std::string_view s);

// Appends code point cp as UTF-8.
void AppendUtf8(uint32_t cp, std::string& out);

// Text from a file (tensor names, globals, record names) made safe for a terminal and for
// one-line messages: bytes that are not UTF-8 become U+FFFD, control characters become
// visible escapes ("\n", "\t", "\x1b", "\u009b"), so a hostile name can neither break a
// line nor send escape sequences to the terminal.
std::string Printable(std::string_view s);

}  // namespace ckpt
