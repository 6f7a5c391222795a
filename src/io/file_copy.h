// Copying a file whole, the way every output is written: into a temp file beside `dest`
// (the kernel copies, copy_file_range), with the input's permissions, refused if the input
// changed meanwhile, then renamed over `dest`.
#pragma once

#include <string>

#include "io/mapped_file.h"

namespace ckpt {

void CopyFileAtomically(const MappedFile& in, const std::string& dest);

}  // namespace ckpt
