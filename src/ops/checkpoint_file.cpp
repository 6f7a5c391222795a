#include "ops/checkpoint_file.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <system_error>

#include "base/error.h"
#include "base/perf.h"
#include "dcp/dcp_checkpoint.h"
#include "io/temp_files.h"
#include "torch/pickle_read.h"
#include "zip/zip_archive.h"

namespace ckpt {

namespace fs = std::filesystem;

const char* FormatName(Format f) {
  switch (f) {
    case Format::kTorchZip:
      return "torch-zip";
    case Format::kTorchLegacy:
      return "torch-legacy";
    case Format::kSafetensors:
      return "safetensors";
  }
  return "?";
}

namespace {

bool IsTorchZip(Bytes file) {
  if (file.size() < 4 || LoadLE<uint32_t>(file.data()) != 0x04034b50) return false;
  try {
    zip::Archive a = zip::Archive::Parse(file);
    if (a.entries().empty()) return false;
    const std::string& first = a.entries().front().name;
    size_t slash = first.find('/');
    return slash != std::string::npos && a.Find(first.substr(0, slash) + "/data.pkl") != nullptr;
  } catch (const Error&) {
    return true;  // a broken zip: let the reader explain what is wrong with it
  }
}

}  // namespace

std::optional<Format> DetectFormat(Bytes file) {
  if (file.size() >= 4 && LoadLE<uint32_t>(file.data()) == 0x04034b50) {
    if (IsTorchZip(file)) return Format::kTorchZip;
    return std::nullopt;
  }
  if (torch::LooksLikeTorchLegacy(file)) return Format::kTorchLegacy;
  if (safetensors::LooksLikeSafetensors(file)) return Format::kSafetensors;
  return std::nullopt;
}

torch::ReadOptions ReleasingPages(const MappedFile& map, torch::ReadOptions options) {
  options.done_with = [&map](uint64_t offset, uint64_t size) { map.Release(offset, size); };
  return options;
}

CheckpointFile OpenCheckpoint(const std::string& path, const torch::ReadOptions& options) {
  PerfTimer timer("parse");
  CheckpointFile f;
  f.path = path;
  f.map = MappedFile::Open(path);
  WithContext(path, [&] {
    Bytes bytes = f.map.bytes();
    std::optional<Format> format = DetectFormat(bytes);
    if (!format) {
      if (bytes.size() >= 4 && LoadLE<uint32_t>(bytes.data()) == 0x04034b50) {
        Fail("zip archive without a data.pkl record: not a torch checkpoint");
      }
      // torch.load hands every file that is not a zip to pickle.load before it checks for
      // its magic number: say what that would run.
      std::string effects =
          torch::EffectsOfFirstPickle(bytes.first(std::min<size_t>(bytes.size(), 64u << 20)));
      if (!effects.empty()) {
        Fail(
            "not a checkpoint (no torch magic number), but torch.load would unpickle it, and "
            "the pickle {}",
            effects);
      }
      if (bytes.size() >= 1 && bytes[0] == 0x80) {
        Fail("a bare pickle, not a torch checkpoint (no torch magic number)");
      }
      Fail("not a checkpoint: neither a torch zip, a legacy torch file nor safetensors");
    }
    f.format = *format;
    torch::ReadOptions read = ReleasingPages(f.map, options);
    switch (f.format) {
      case Format::kTorchZip:
        f.torch = torch::ReadTorchZip(bytes, read);
        break;
      case Format::kTorchLegacy:
        f.torch = torch::ReadTorchLegacy(bytes, read);
        break;
      case Format::kSafetensors:
        f.st = safetensors::Parse(bytes);
        break;
    }
  });
  // Reading the zip touched a page around every record's local header (all of a file of 10^5
  // small records) and the pickle's pages: drop them from our resident set (the page cache
  // keeps them; what is read later comes back through windows).
  f.map.Release(0, f.map.size());
  return f;
}

std::vector<std::string> ExpandInputs(const std::vector<std::string>& inputs,
                                      std::vector<std::string>* skipped,
                                      std::vector<std::string>* dcp_folders) {
  std::vector<std::string> out;
  std::map<std::string, bool> is_dcp;  // folder -> holds a DCP checkpoint
  auto in_dcp_folder = [&](const fs::path& file) {
    std::string folder = file.parent_path().string();
    auto [it, fresh] = is_dcp.emplace(folder, false);
    if (fresh) {
      it->second = dcp::LooksLikeDcpCheckpoint(folder.empty() ? "." : folder);
      if (it->second && dcp_folders) dcp_folders->push_back(folder.empty() ? "." : folder);
    }
    return it->second && dcp::IsDcpPart(file.string());
  };
  for (const std::string& input : inputs) {
    std::error_code ec;
    if (!fs::is_directory(input, ec)) {
      if (dcp::IsDcpPart(input) && in_dcp_folder(fs::path(input))) continue;
      out.push_back(input);
      continue;
    }

    std::vector<std::string> found;
    fs::recursive_directory_iterator it(input, fs::directory_options::skip_permission_denied, ec);
    if (ec) Fail("{}: cannot list folder: {}", input, ec.message());
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) Fail("{}: cannot list folder: {}", input, ec.message());
      if (IsTempFileName(it->path().filename().string()) && it->is_directory(ec) &&
          !it->is_symlink(ec)) {
        it.disable_recursion_pending();  // a folder strip was building when it was stopped
        continue;
      }
      if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
      std::string p = it->path().string();
      // ckptool's own temp files (a run killed outright leaves them) are never inputs.
      if (IsTempFileName(it->path().filename().string())) continue;
      if (in_dcp_folder(it->path())) continue;
      try {
        MappedFile m = MappedFile::Open(p);
        if (DetectFormat(m.bytes())) {
          found.push_back(p);
        } else if (skipped) {
          skipped->push_back(p);
        }
      } catch (const Error&) {
        if (skipped) skipped->push_back(p);
      }
    }
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

}  // namespace ckpt
