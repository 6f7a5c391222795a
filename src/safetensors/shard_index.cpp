#include "safetensors/shard_index.h"

#include <nlohmann/json.hpp>

#include <set>

#include "base/error.h"
#include "io/mapped_file.h"

namespace ckpt::safetensors {

std::vector<std::string> WeightMapFiles(const std::string& path) {
  nlohmann::json j;
  try {
    MappedFile m = MappedFile::Open(path);
    if (m.size() > (64u << 20)) return {};
    j = nlohmann::json::parse(AsText(m.bytes()), nullptr, false);
  } catch (const Error&) {
    return {};
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) return {};
  std::set<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (file.is_string()) files.insert(file.get<std::string>());
  }
  return {files.begin(), files.end()};
}

}  // namespace ckpt::safetensors
