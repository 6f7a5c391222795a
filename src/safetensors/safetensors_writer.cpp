#include "safetensors/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include <string_view>

#include "base/endian.h"
#include "base/error.h"
#include "base/name_index.h"
#include "safetensors/safetensors_file.h"

namespace ckpt::safetensors {

Layout LayOut(const std::vector<OutTensor>& tensors, std::map<std::string, std::string> metadata) {
  metadata.emplace("format", "pt");
  // The header is assembled entry by entry: a JSON object keeps keys unique by searching
  // them (ordered_json linearly), which is quadratic in the number of tensors.
  // It is built after 8 bytes that become its length: the header is made in place.
  std::string json(8, '\0');
  // Room for the whole header at once (a doubling string would hold up to twice it).
  size_t estimate = 64;
  for (const OutTensor& t : tensors) estimate += t.name.size() + 80 + 21 * t.shape.size();
  json.reserve(estimate);
  NameIndex names;  // finds a repeated name: indices into `tensors`, 16 bytes each
  names.Reserve(tensors.size());
  auto name_of = [&tensors](uint32_t i) -> std::string_view { return tensors[i].name; };
  if (tensors.size() >= NameIndex::kNone)
    Fail("{} tensors: more than a header can list", tensors.size());
  try {
    json += "{\"__metadata__\":" + nlohmann::json(metadata).dump();
    uint64_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const OutTensor& t = tensors[i];
      if (t.name == "__metadata__") Fail("a tensor cannot be named __metadata__");
      if (names.Insert(t.name, static_cast<uint32_t>(i), name_of) != i)
        Fail("tensor name '{}' appears twice", t.name);
      json += ',';
      json += nlohmann::json(t.name).dump();
      json += ":{\"dtype\":";
      json += nlohmann::json(t.dtype).dump();
      json += ",\"shape\":[";
      for (size_t d = 0; d < t.shape.size(); ++d) {
        if (d) json += ',';
        json += std::to_string(t.shape[d]);
      }
      json += "],\"data_offsets\":[";
      json += std::to_string(offset);
      json += ',';
      json += std::to_string(offset + t.size);
      json += "]}";
      offset += t.size;
    }
    json += '}';
  } catch (const nlohmann::json::exception&) {
    // Names come from pickles, which may hold any bytes; safetensors headers are UTF-8.
    for (const OutTensor& t : tensors) {
      try {
        nlohmann::json(t.name).dump();
      } catch (const nlohmann::json::exception&) {
        Fail("tensor name '{}' is not valid UTF-8; safetensors cannot hold it", t.name);
      }
    }
    Fail("__metadata__ holds text that is not valid UTF-8");
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t text = json.size() - 8;
  if (text > kMaxHeaderSize) Fail("safetensors header would be {} bytes, over the limit", text);
  std::string length;
  AppendLE<uint64_t>(length, text);
  json.replace(0, 8, length);
  Layout l;
  l.header = std::move(json);
  uint64_t data = l.header.size();
  uint64_t offset = 0;
  for (const OutTensor& t : tensors) {
    l.offsets.push_back(data + offset);
    offset += t.size;
  }
  l.total_size = data + offset;
  return l;
}

}  // namespace ckpt::safetensors
