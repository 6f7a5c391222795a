// Which files the rewriters (shrink, strip, convert) take: none whose rewrite could lose
// something (structural problems, tensor forms not fully understood) or launder something
// (pickles that can run code, unless the user allows it: they are never run either way).
#pragma once

#include "file/checkpoint_file.h"
#include "torch/global_policy.h"

namespace ckpt {

// Throws ckpt::Error naming the file and the reason.
void CheckRewritable(const CheckpointFile& f, bool allow_unsafe_globals,
                     const torch::Trust& trust = {});

}  // namespace ckpt
