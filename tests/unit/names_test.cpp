#include "base/names.h"

#include <gtest/gtest.h>

namespace ckpt {
namespace {

TEST(Names, GlobsMatchWholeNamesAcrossDots) {
  EXPECT_TRUE(MatchesAnyGlob({"*.bias", "*norm*"}, "layers.0.attn.bias"));
  EXPECT_TRUE(MatchesAnyGlob({"*.bias", "*norm*"}, "final_norm.weight"));
  EXPECT_FALSE(MatchesAnyGlob({"*.bias", "*norm*"}, "layers.0.attn.weight"));
  EXPECT_FALSE(MatchesAnyGlob({}, "anything"));
  EXPECT_TRUE(MatchesAnyGlob({"zero*pt"}, "zero_pp_rank_0_mp_rank_00_optim_states.pt"));
}

TEST(Names, KeyPathsNestByDots) {
  EXPECT_TRUE(IsBelowKeyPath("optimizer.state.0", "optimizer"));
  EXPECT_TRUE(IsBelowKeyPath("optimizer.state.0", "optimizer.state"));
  EXPECT_FALSE(IsBelowKeyPath("optimizer", "optimizer"));
  EXPECT_FALSE(IsBelowKeyPath("optimizers.x", "optimizer"));
  EXPECT_FALSE(IsBelowKeyPath("opt", "optimizer"));
  EXPECT_TRUE(IsBelowKeyPath("a.", "a"));
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

TEST(Names, GlobsThatCanMatchBelowAPath) {
  EXPECT_TRUE(GlobCanMatchBelow("model.*.w", "model.enc"));
  EXPECT_TRUE(GlobCanMatchBelow("model.*", "model"));
  EXPECT_TRUE(GlobCanMatchBelow("*.w", "anything.at.all"));
  EXPECT_TRUE(GlobCanMatchBelow("model.enc.w", "model.enc"));
  EXPECT_TRUE(GlobCanMatchBelow("model.e?c.[vw]", "model.enc"));
  EXPECT_FALSE(GlobCanMatchBelow("model.enc", "model.enc"));  // the path itself, not below
  EXPECT_FALSE(GlobCanMatchBelow("model.dec.*", "model.enc"));
  EXPECT_FALSE(GlobCanMatchBelow("optimizer*", "model"));
  EXPECT_FALSE(GlobCanMatchBelow("model.[!e]*", "model.enc"));
  EXPECT_TRUE(GlobCanMatchBelow("model.[!d]*.w", "model.enc"));
  EXPECT_FALSE(GlobCanMatchBelow("model.\\*", "model.x"));
  EXPECT_TRUE(GlobCanMatchBelow("model.\\*.w", "model.*"));
  // An unclosed '[' is a literal character.
  EXPECT_FALSE(GlobCanMatchBelow("a[", "a"));
  EXPECT_TRUE(GlobCanMatchBelow("a.[", "a"));
}

}  // namespace
}  // namespace ckpt
