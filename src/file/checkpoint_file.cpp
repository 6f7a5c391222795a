#include "file/checkpoint_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <system_error>

#include "base/error.h"
#include "base/perf.h"
#include "torch/pickle_read.h"
#include "zip/zip_archive.h"

namespace ckpt {

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

std::string CutCheckpointReason(const std::string& name, Bytes file) {
  std::string lower = std::filesystem::path(name).filename().string();
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  bool safetensors = lower.ends_with(".safetensors");
  bool torch = lower.ends_with(".pt") || lower.ends_with(".pth") || lower.ends_with(".bin") ||
               lower.ends_with(".ckpt");
  if (!safetensors && !torch) return "";
  if (file.empty()) return "empty (0 bytes): cut short, or never written";
  if (safetensors) {
    if (file.size() < 8)
      return fmt::format("cut short: {} bytes, fewer than a safetensors header's length",
                         file.size());
    uint64_t n = LoadLE<uint64_t>(file.data());
    if (n >= 2 && n <= safetensors::kMaxHeaderSize && n > file.size() - 8) {
      // What is there of the header must be JSON's start: whitespace, then '{'.
      size_t i = 8;
      while (i < file.size() &&
             (file[i] == ' ' || file[i] == '\t' || file[i] == '\n' || file[i] == '\r'))
        ++i;
      if (i == file.size() || file[i] == '{')
        return fmt::format(
            "cut short: its safetensors header takes {} bytes, the file has {} after the "
            "header's length",
            n, file.size() - 8);
    }
    return "";
  }
  // torch.save never writes fewer than a zip's end record (22 bytes) plus data.pkl's headers;
  // a legacy file starts with a 20-odd-byte magic number pickle.
  constexpr size_t kSmallestTorchFile = 64;
  bool zip_start = file[0] == 'P' && (file.size() < 2 || file[1] == 'K');
  if (file.size() < kSmallestTorchFile && (file[0] == 0x80 || zip_start))
    return fmt::format("cut short: {} bytes, fewer than any torch file has", file.size());
  return "";
}

torch::ReadOptions ReleasingPages(const MappedFile& map, torch::ReadOptions options) {
  options.done_with = [&map](uint64_t offset, uint64_t size) { map.Release(offset, size); };
  return options;
}

CheckpointFile OpenCheckpoint(const std::string& path, const torch::ReadOptions& options) {
  return OpenCheckpoint(Disk(), path, options);
}

CheckpointFile OpenCheckpoint(const Volume& volume, const std::string& path,
                              const torch::ReadOptions& options) {
  PerfTimer timer("parse");
  CheckpointFile f;
  f.path = path;
  f.map = volume.Open(path);
  WithContext(path, [&] {
    Bytes bytes = f.map.bytes();
    std::optional<Format> format = DetectFormat(bytes);
    if (!format) {
      if (std::string cut = CutCheckpointReason(path, bytes); !cut.empty()) Fail("{}", cut);
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

}  // namespace ckpt
