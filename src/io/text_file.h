// Small text files that name something (DeepSpeed's `latest`, Megatron's
// latest_checkpointed_iteration.txt): their content without surrounding white space, as the
// frameworks read them (`.strip()`). Empty when the file cannot be read.
#pragma once

#include <string>
#include <string_view>

namespace ckpt {

std::string ReadMarkerFile(const std::string& path);
// `text` without surrounding white space.
std::string MarkerText(std::string_view text);

}  // namespace ckpt
