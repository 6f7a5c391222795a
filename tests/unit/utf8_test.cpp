#include "base/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace ckpt {
namespace {

TEST(Utf8, ValidatesByTheStandardRules) {
  EXPECT_TRUE(ValidUtf8(""));
  EXPECT_TRUE(ValidUtf8("plain ascii"));
  EXPECT_TRUE(ValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_FALSE(ValidUtf8("\x80"));                                      // stray continuation
  EXPECT_FALSE(ValidUtf8("\xc3"));                                      // truncated
  EXPECT_FALSE(ValidUtf8("\xe2\x82"));                                  // truncated
  EXPECT_FALSE(ValidUtf8("\xc0\xaf"));                                  // overlong '/'
  EXPECT_FALSE(ValidUtf8("\xe0\x80\xaf"));                              // overlong '/'
  EXPECT_FALSE(ValidUtf8("\xed\xa0\x80"));                              // surrogate U+D800
  EXPECT_FALSE(ValidUtf8("\xf4\x90\x80\x80"));                          // above U+10FFFF
  EXPECT_FALSE(ValidUtf8("\xff"));
}

TEST(Utf8, PrintableKeepsTextAndDefusesTheRest) {
  EXPECT_EQ(Printable("layers.0.weight"), "layers.0.weight");
  EXPECT_EQ(Printable("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(Printable("a\nb\tc\r"), "a\\nb\\tc\\r");
  EXPECT_EQ(Printable("\x1b[31mred"), "\\x1b[31mred");  // no terminal escapes
  EXPECT_EQ(Printable(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(Printable("\x7f"), "\\x7f");
  EXPECT_EQ(Printable(std::string("\xc2\x9b") + "2J"), "\\u009b2J");     // C1 CSI
  EXPECT_EQ(Printable("bad\xff\xfe!"), "bad\xef\xbf\xbd\xef\xbf\xbd!");  // each bad byte: U+FFFD
  EXPECT_EQ(Printable("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");
}

}  // namespace
}  // namespace ckpt
