#include "safetensors/shard_index.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "io/mapped_file.h"
#include "io/volume.h"

namespace ckpt::safetensors {

std::map<std::string, std::vector<std::string>> WeightMap(const std::string& path,
                                                          const Volume& volume) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(volume.ReadText(path, 64u << 20), nullptr, false);
  } catch (const Error&) {
    return {};
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) return {};
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (file.is_string()) out[file.get<std::string>()].push_back(name);
  }
  return out;
}

std::vector<std::string> WeightMapFiles(const std::string& path, const Volume& volume) {
  std::vector<std::string> files;
  for (const auto& [file, names] : WeightMap(path, volume)) files.push_back(file);
  return files;
}

}  // namespace ckpt::safetensors
