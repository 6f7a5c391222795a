// The legacy format's magic number in the spelling of every pickle protocol torch.save can
// be given (bytes as torch 1.13 writes them with pickle_protocol=N).
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"
#include "torch/torch_file.h"

namespace ckpt::torch {
namespace {

const std::string kMagicLong1 = std::string("\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 12);

TEST(LegacyMagic, RecognisedInEveryProtocol) {
  const std::string frame = std::string("\x95\x0d\0\0\0\0\0\0\0", 9);
  const std::string protocol1 = "L119547037146038801333356L\n.";
  const std::string protocol2 = "\x80\x02" + kMagicLong1 + ".";
  const std::string protocol4 = "\x80\x04" + frame + kMagicLong1 + ".";
  const std::string protocol5 = "\x80\x05" + frame + kMagicLong1 + ".";
  for (const std::string& magic : {protocol1, protocol2, protocol4, protocol5}) {
    // What follows (the next pickle) does not matter for recognition.
    EXPECT_TRUE(LooksLikeTorchLegacy(test::B(magic + "\x80\x02M\xe9\x03."))) << magic;
  }
}

TEST(LegacyMagic, OtherPicklesAreNot) {
  const std::string frame = std::string("\x95\x0d\0\0\0\0\0\0\0", 9);
  std::string other_long = kMagicLong1;
  other_long[2] ^= 1;
  for (const std::string& bytes :
       {std::string("L119547037146038801333357L\n."), "\x80\x02" + other_long + ".",
        "\x80\x05" + frame + other_long + ".", std::string("\x80\x02}q\0.", 6),
        std::string("L1195470371460388"),
        std::string("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f"), std::string("PK\x03\x04"),
        std::string()}) {
    EXPECT_FALSE(LooksLikeTorchLegacy(test::B(bytes))) << bytes;
  }
}

}  // namespace
}  // namespace ckpt::torch
