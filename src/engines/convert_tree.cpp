#include "engines/convert_tree.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "base/error.h"
#include "checkpoint/manifest.h"
#include "dcp/dcp_checkpoint.h"
#include "file/checkpoint_file.h"
#include "io/atomic_output.h"
#include "io/file_copy.h"
#include "io/mapped_file.h"
#include "io/text_file.h"
#include "kernels/float_convert.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

bool IsIndex(const fs::path& p) {
  std::string name = p.filename().string();
  return name.size() > 11 && name.ends_with(".index.json");
}

}  // namespace

ConvertTree PlanConvertTree(const std::vector<std::string>& paths, const std::string& output_dir,
                            const std::string& output_file, const std::string& dtype_name,
                            bool force) {
  ConvertTree t;
  if (!output_file.empty() && (paths.size() != 1 || fs::is_directory(paths[0]))) {
    throw UsageError("-o names one output file: give exactly one input file");
  }
  for (const std::string& path : paths) {
    if (!fs::is_directory(path)) {
      if (!output_file.empty()) {
        // The output keeps the input's format: its name must say so.
        MappedFile m = MappedFile::Open(path);
        std::optional<Format> f = DetectFormat(m.bytes());
        bool st_out = output_file.ends_with(".safetensors");
        if (f && (*f == Format::kSafetensors) != st_out) {
          throw UsageError(fmt::format(
              "-o {}: convert keeps {}'s format ({}); {}", output_file, path, FormatName(*f),
              st_out ? fmt::format("`ckptool export {} -o {} --dtype {}` writes safetensors", path,
                                   output_file, dtype_name)
                     : "name the output .safetensors"));
        }
        t.checkpoints.push_back({path, output_file});
      } else if (!output_dir.empty()) {
        t.checkpoints.push_back(
            {path, (fs::path(output_dir) / fs::path(path).filename()).string()});
      } else {
        Fail("{}: give --output-dir DIR or -o FILE for a single file", path);
      }
      continue;
    }
    if (dcp::LooksLikeDcpCheckpoint(path)) {
      Fail(
          "{}: a torch.distributed.checkpoint folder; convert rewrites checkpoint files. `ckptool "
          "export {} --to OUT --dtype {}` writes its model in that dtype",
          path, path, dtype_name);
    }
    fs::path out = output_dir.empty() ? fs::path(path) / dtype_name : fs::path(output_dir);
    std::error_code ec;
    if (!force && fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec))) {
      Fail("{}: exists; --force writes over it", out.string());
    }
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(path)) {
      if (e.is_regular_file() && !e.is_symlink()) entries.push_back(e.path());
    }
    std::sort(entries.begin(), entries.end());
    for (const fs::path& p : entries) {
      PathPair job{p.string(), (out / p.filename()).string()};
      if (IsIndex(p)) {
        t.indexes.push_back(job);
        continue;
      }
      // A manifest names the bytes of the files here, not of their converted copies: the output
      // gets none (ckptool manifest OUT writes its own).
      if (IsManifestName(p.filename().string())) continue;
      MappedFile m = MappedFile::Open(p.string());
      if (DetectFormat(m.bytes())) {
        t.checkpoints.push_back(job);
      } else {
        t.copies.push_back(job);
      }
    }
  }
  if (!force) {
    for (const PathPair& j : t.checkpoints) {
      std::error_code ec;
      if (fs::exists(fs::symlink_status(j.output, ec)))
        Fail("{}: exists; --force replaces it", j.output);
    }
  }
  return t;
}

void CopyFile(const PathPair& job, const std::string& dtype_name) {
  if (!dtype_name.empty() && fs::path(job.input).filename() == "config.json") {
    MappedFile in = MappedFile::Open(job.input);
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(AsText(in.bytes()), nullptr, false);
    bool changed = false;
    if (j.is_object()) {
      std::string torch_name(kernels::TorchName(*kernels::ParseHalf(dtype_name)));
      for (const char* key : {"torch_dtype", "dtype"}) {
        if (j.contains(key) && j[key].is_string() && j[key] != torch_name) {
          j[key] = torch_name;
          changed = true;
        }
      }
    }
    if (changed) {
      std::string text =
          j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
      AtomicOutput out = AtomicOutput::Create(job.output, text.size());
      out.RequireUnchanged(in);
      out.Write(0, AsBytes(text));
      out.SetMode(in.mode(), in.uid(), in.gid());
      out.Commit();
      return;
    }
  }
  CopyFileAtomically(MappedFile::Open(job.input), job.output);
}

std::string WhyNothingToConvert(const std::string& folder, const std::string& dtype_name) {
  std::error_code ec;
  fs::path latest = fs::path(folder) / "latest";
  if (fs::is_regular_file(latest, ec)) {
    std::string tag = ReadMarkerFile(latest.string());
    if (!tag.empty()) {
      return fmt::format(
          "{} is a DeepSpeed folder (its 'latest' names {}): convert a tag folder, e.g. "
          "`ckptool convert --dtype {} {} --output-dir {}_{}/{}`",
          folder, tag, dtype_name, (fs::path(folder) / tag).string(),
          fs::path(folder).filename().string(), dtype_name, tag);
    }
  }
  return "";
}

uint64_t RewriteIndex(const PathPair& job, const std::map<std::string, uint64_t>& storage_bytes) {
  MappedFile in = MappedFile::Open(job.input);
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(AsText(in.bytes()));
  } catch (const nlohmann::json::exception& e) {
    Fail("{}: not valid JSON: {}", job.input, e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    Fail("{}: no weight_map: not a checkpoint index", job.input);
  }
  std::set<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (file.is_string()) shards.insert(file.get<std::string>());
  }
  uint64_t total = 0;
  for (const std::string& s : shards) {
    auto it = storage_bytes.find(s);
    if (it == storage_bytes.end())
      Fail("{}: names shard '{}', which was not converted", job.input, s);
    total += it->second;
  }
  if (!j.contains("metadata") || !j["metadata"].is_object())
    j["metadata"] = nlohmann::ordered_json::object();
  j["metadata"]["total_size"] = total;
  std::string text = j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  AtomicOutput out = AtomicOutput::Create(job.output, text.size());
  out.RequireUnchanged(in);
  out.Write(0, AsBytes(text));
  out.SetMode(in.mode(), in.uid(), in.gid());
  out.Commit();
  return total;
}

}  // namespace ckpt
