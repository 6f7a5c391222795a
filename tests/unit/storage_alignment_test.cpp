// The .storage_alignment record (torch >= 2.6) is checked when a file is opened, so verify
// and the rewriters agree on it.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"
#include "torch/torch_file.h"

namespace ckpt::torch {
namespace {

TorchFile WithAlignment(const std::string& value) {
  std::string pickle = std::string("\x80\x02}q\0.", 6);
  return ReadTorchZip(test::B(test::BuildZip(
      {{"ck/data.pkl", pickle}, {"ck/.storage_alignment", value}, {"ck/version", "3\n"}})));
}

TEST(StorageAlignment, PowersOfTwoAreKept) {
  for (auto [text, value] :
       {std::pair{"64", 64u}, {"4096\n", 4096u}, {"1", 1u}, {"32768", 32768u}}) {
    TorchFile tf = WithAlignment(text);
    EXPECT_TRUE(tf.model.problems.empty()) << text;
    EXPECT_TRUE(tf.model.notes.empty()) << text;
    EXPECT_EQ(tf.storage_alignment, value) << text;
  }
}

TEST(StorageAlignment, WhatTorchCannotReadIsAProblem) {
  for (const char* text : {"abc", "", "0", "-64", "64x", "99999999999999999999999"}) {
    TorchFile tf = WithAlignment(text);
    ASSERT_EQ(tf.model.problems.size(), 1u) << text;
    EXPECT_NE(tf.model.problems[0].what.find("is not a positive number"), std::string::npos)
        << text;
    EXPECT_EQ(tf.model.problems[0].where, "ck/.storage_alignment");
  }
}

TEST(StorageAlignment, WhatCkptoolCannotRewriteIsANote) {
  for (const char* text : {"48", "65536"}) {
    TorchFile tf = WithAlignment(text);
    EXPECT_TRUE(tf.model.problems.empty()) << text;
    ASSERT_EQ(tf.model.notes.size(), 1u) << text;
    EXPECT_NE(tf.model.notes[0].find("cannot rewrite"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace ckpt::torch
