// What a checkpoint folder promises beyond its files, checked without a manifest: each Hugging
// Face index (*.index.json) names shards that exist and hold the tensors it maps to them; each
// symlink to a checkpoint file (Lightning's last.ckpt, save_last="link": by the name of the link
// or of its target) points at something that exists; other links are any folder's business.
#pragma once

#include <string>
#include <vector>

#include "torch/model.h"

namespace ckpt {

// The problems of the folder at `path` and every folder below it, each named by the index or
// link at fault (relative to `path`); none for a file. A shard that does not parse is left to
// the file's own verification.
std::vector<torch::Problem> CheckFolderPromises(const std::string& path);

}  // namespace ckpt
