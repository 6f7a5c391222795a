// `inspect` of a .ckz archive: what it holds and how each kind of bytes was coded, read from
// its index without decoding a chunk.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "base/json_stream.h"
#include "compress/archive.h"

namespace ckpt {

std::string RenderArchiveText(const ckz::Archive& a, size_t top);
// `extra` writes more members into the archive's object (inspect: the held checkpoints).
void WriteArchiveJson(JsonStream& out, const ckz::Archive& a,
                      const std::function<void(JsonStream&)>& extra = {});

}  // namespace ckpt
