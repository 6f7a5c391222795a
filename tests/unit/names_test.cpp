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
