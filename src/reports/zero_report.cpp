#include "reports/zero_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "base/human.h"
#include "base/utf8.h"

namespace ckpt {

namespace {

using deepspeed::ZeroTensor;

const char* KindName(ZeroTensor::Kind k) {
  switch (k) {
    case ZeroTensor::Kind::kBuffer:
      return "buffer";
    case ZeroTensor::Kind::kFrozen:
      return "frozen";
    case ZeroTensor::Kind::kTrainable:
      return "trainable";
  }
  return "?";
}

uint64_t TensorBytes(const ZeroTensor& t) {
  return t.numel * torch::ElementSize(t.dtype);
}

// The rank files holding a tensor's pieces, by file name.
std::vector<std::string> FilesOf(const deepspeed::ZeroCheckpoint& z, const ZeroTensor& t) {
  std::set<size_t> files;
  for (const deepspeed::Piece& p : t.pieces) files.insert(p.file);
  std::vector<std::string> out;
  for (size_t f : files) out.push_back(std::filesystem::path(z.files[f]->path).filename().string());
  return out;
}

}  // namespace

std::string RenderZeroText(const deepspeed::ZeroCheckpoint& z, size_t top_n) {
  uint64_t bytes[3] = {0, 0, 0}, counts[3] = {0, 0, 0};
  for (const ZeroTensor& t : z.tensors) {
    bytes[static_cast<int>(t.kind)] += TensorBytes(t);
    counts[static_cast<int>(t.kind)]++;
  }
  uint64_t model = bytes[0] + bytes[1] + bytes[2];
  std::string out = z.universal
                        ? fmt::format(
                              "{}: DeepSpeed universal checkpoint of ZeRO stage {} from {} "
                              "ranks (loads on any number), tag {}\n",
                              Printable(z.folder), z.stage, z.world_size, Printable(z.tag))
                        : fmt::format("{}: DeepSpeed ZeRO stage {}, {} ranks, tag {}\n",
                                      Printable(z.folder), z.stage, z.world_size, Printable(z.tag));
  out += fmt::format("  consolidated model (as zero_to_fp32 builds it): {} tensors, {}\n",
                     z.tensors.size(), HumanBytes(model));
  out += fmt::format(
      "    trainable {} ({}, float32)   frozen {} ({})   buffers {} ({}, float32)   tied names "
      "{}\n",
      counts[2], HumanBytes(bytes[2]), counts[1], HumanBytes(bytes[1]), counts[0],
      HumanBytes(bytes[0]), z.aliases.size());
  out += fmt::format(
      "  optimizer state files: {} ({}, {:.1f}x the model)\n", z.files.size() - z.model_files,
      HumanBytes(z.optimizer_bytes),
      model ? static_cast<double>(z.optimizer_bytes) / static_cast<double>(model) : 0.0);
  std::vector<const ZeroTensor*> rows;
  for (const ZeroTensor& t : z.tensors) rows.push_back(&t);
  std::stable_sort(rows.begin(), rows.end(), [](const ZeroTensor* a, const ZeroTensor* b) {
    return TensorBytes(*a) > TensorBytes(*b);
  });
  size_t n = std::min(top_n, rows.size());
  out += fmt::format("\n  LARGEST PARAMETERS (top {} of {})\n", n, rows.size());
  for (size_t i = 0; i < n; ++i) {
    const ZeroTensor& t = *rows[i];
    std::vector<std::string> files = FilesOf(z, t);
    out +=
        fmt::format("    {:>12}  {:<9} {:<9} {:<20} {}  ({} file{})\n", HumanBytes(TensorBytes(t)),
                    torch::Name(t.dtype), KindName(t.kind), ShapeText(t.shape), Printable(t.name),
                    files.size(), files.size() == 1 ? "" : "s");
  }
  for (const auto& [alias, owner] : z.aliases) {
    out += fmt::format("  tied: {} = {}\n", Printable(alias), Printable(owner));
  }
  return out;
}

void WriteZeroJson(JsonStream& out, const deepspeed::ZeroCheckpoint& z) {
  out.BeginObject();
  out.Member("folder", z.folder);
  out.Member("tag", z.tag);
  out.Member("stage", z.stage);
  out.Member("world_size", z.world_size);
  out.Member("optimizer_bytes", z.optimizer_bytes);
  out.BeginArray("tensors");
  for (const ZeroTensor& t : z.tensors) {
    out.BeginObject();
    out.Member("name", t.name);
    out.Member("kind", KindName(t.kind));
    out.Member("dtype", torch::Name(t.dtype));
    out.Member("stored_dtype", torch::Name(t.stored));
    out.Member("shape", t.shape);
    out.Member("bytes", TensorBytes(t));
    out.BeginArray("files");
    for (const std::string& f : FilesOf(z, t)) out.Value(f);
    out.End();
    out.End();
  }
  out.End();
  // A json object (not streamed): a key given twice keeps its first place and last owner.
  nlohmann::ordered_json aliases = nlohmann::ordered_json::object();
  for (const auto& [alias, owner] : z.aliases) aliases[alias] = owner;
  out.Member("aliases", aliases);
  out.End();
}

}  // namespace ckpt
