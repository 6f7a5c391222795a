// Reading a pickle that torch.load will unpickle, so that a refusal says what torch.load
// would have done with it.
#pragma once

#include <string>

#include "base/byte_cursor.h"
#include "pickle/parser.h"

namespace ckpt::torch {

// pickle::Parse in strict mode. When the pickle is refused (broken structure, or a FRAME
// that makes torch.load read other opcodes), the error also lists every global torch.load
// would have imported and every call it would have made before failing, each judged
// (global_policy.h); for a FRAME divergence, what it would run reading on as _pickle.c does
// and what a straight reading shows. Throws ckpt::Error.
pickle::ParseResult ParseTorchPickle(Bytes data, uint64_t base_offset,
                                     const pickle::Limits& limits = {});

// What unpickling the pickle at the start of `data` would import and call before it stops
// (at its STOP or where it fails), as DescribeEffects words it; empty when nothing. For a
// file torch.load would hand to pickle.load although it is no checkpoint.
std::string EffectsOfFirstPickle(Bytes data, const pickle::Limits& limits = {});

}  // namespace ckpt::torch
