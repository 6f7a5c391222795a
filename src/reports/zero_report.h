// What `inspect` and `verify` say about a DeepSpeed ZeRO checkpoint as a whole: the model it
// consolidates to (names, shapes, bytes, which rank files hold each parameter) next to what
// the optimizer state costs.
#pragma once

#include <string>

#include "base/json_stream.h"
#include "deepspeed/zero_checkpoint.h"

namespace ckpt {

std::string RenderZeroText(const deepspeed::ZeroCheckpoint& z, size_t top_n);
// The consolidated model as one JSON object, written a tensor at a time.
void WriteZeroJson(JsonStream& out, const deepspeed::ZeroCheckpoint& z);

}  // namespace ckpt
