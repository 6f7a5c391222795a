// Copying a file whole, the way every output is written: into a temp file beside `dest`
// (the kernel copies, copy_file_range), with the input's permissions, refused if the input
// changed meanwhile, then renamed over `dest`.
#pragma once

#include <string>

#include "io/mapped_file.h"

namespace ckpt {

void CopyFileAtomically(const MappedFile& in, const std::string& dest);

// Copies the folder `src` to `dest` (which must not exist, or be an empty folder): regular
// files as CopyFileAtomically copies them, symlinks as links, subfolders recursively, into a
// temp folder beside `dest` that is fsynced and then renamed to `dest`. Nothing is left
// behind on failure.
void CopyFolderAtomically(const std::string& src, const std::string& dest);

}  // namespace ckpt
