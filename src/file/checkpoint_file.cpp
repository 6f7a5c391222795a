#include "file/checkpoint_file.h"

#include <algorithm>
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

}  // namespace ckpt
