#include "base/size_parse.h"

#include <gtest/gtest.h>

#include "base/error.h"

namespace ckpt {
namespace {

TEST(ParseSize, DecimalAndBinaryUnits) {
  EXPECT_EQ(ParseSize("5GB"), 5000000000u);
  EXPECT_EQ(ParseSize("5gb"), 5000000000u);
  EXPECT_EQ(ParseSize("500MiB"), 500u << 20);
  EXPECT_EQ(ParseSize("1.5KiB"), 1536u);
  EXPECT_EQ(ParseSize("100KB"), 100000u);
  EXPECT_EQ(ParseSize("1024B"), 1024u);
  EXPECT_THROW(ParseSize("1024"), Error);  // a unit is required
  EXPECT_THROW(ParseSize("5"), Error);
  EXPECT_EQ(ParseSize("2TiB"), 2ull << 40);
}

TEST(ParseSize, RejectsWhatIsNotASize) {
  for (const char* bad : {"", "GB", "5M", "5G", "5 GB", "-5GB", "5XB", "0", "0.1B"}) {
    EXPECT_THROW(ParseSize(bad), Error) << bad;
  }
}

}  // namespace
}  // namespace ckpt
