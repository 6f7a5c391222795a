#include "engines/prune.h"

#include <gtest/gtest.h>

namespace ckpt {
namespace {

TEST(StepFromName, KnownLayouts) {
  EXPECT_EQ(StepFromName("global_step1200"), 1200);
  EXPECT_EQ(StepFromName("checkpoint-1200"), 1200);
  EXPECT_EQ(StepFromName("iter_0001200"), 1200);
  EXPECT_EQ(StepFromName("epoch=3-step=1200.ckpt"), 1200);
  EXPECT_EQ(StepFromName("step=1200.ckpt"), 1200);
  EXPECT_EQ(StepFromName("model_1200.pt"), 1200);
  EXPECT_EQ(StepFromName("step_1200"), 1200);
  EXPECT_EQ(StepFromName("global_step900"), 900);  // compared as numbers, not text
}

TEST(StepFromName, OtherNamesAreNotCheckpoints) {
  for (const char* name : {"latest", "last.ckpt", "config.json", "global_step", "checkpoint-abc",
                           "runs", "model.pt", ".ckptool-trash-global_step1-123", "mystep=5x"}) {
    EXPECT_EQ(StepFromName(name), -1) << name;
  }
}

}  // namespace
}  // namespace ckpt
