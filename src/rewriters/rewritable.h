// Which files the rewriters (shrink, strip, convert) and export take: none whose rewrite could
// lose something (structural problems, tensor forms not fully understood) or launder something:
// bytes whose zip CRC32 fails (a rewrite would write fresh checksums over them and the damage
// would become invisible), pickles that can run code (unless the user allows it: they are never
// run either way).
#pragma once

#include "file/checkpoint_file.h"
#include "torch/global_policy.h"

namespace ckpt {

// Throws ckpt::Error naming the file and the reason. Reads every record of a zip once
// (`threads` at a time) to check its CRC32.
void CheckRewritable(const CheckpointFile& f, bool allow_unsafe_globals, const torch::Trust& trust,
                     unsigned threads);

// The CRC32 check alone: throws naming the file and the first damaged record.
void CheckUndamaged(const CheckpointFile& f, unsigned threads);

}  // namespace ckpt
