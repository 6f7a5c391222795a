// A parsed torch checkpoint file (zip or legacy container) and its byte map.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/byte_cursor.h"
#include "pickle/parser.h"
#include "torch/model.h"
#include "zip/zip_archive.h"

namespace ckpt::torch {

enum class Container { kZip, kLegacy };

// Bytes of the file that are not storage data, under one label (headers, pickle, padding...).
// Totals, not ranges: a file of 10^5 records has 10^5 headers.
struct Region {
  uint64_t size = 0;
  std::string label;
};

struct ReadOptions {
  pickle::Limits limits;
  uint64_t max_pickle_bytes = 4ull << 30;
  // Called with byte ranges of the input the reader is done with (the zip directory's walk
  // over every local header, the pickle once parsed), so that a mapped input can drop their
  // pages from the resident set before the tensor table is built. Empty: nothing to drop.
  std::function<void(uint64_t offset, uint64_t size)> done_with;
};

struct TorchFile {
  // Counts `size` bytes under `label`.
  void AddRegion(std::string_view label, uint64_t size);

  Container container = Container::kZip;
  Model model;
  std::vector<Region> regions;  // everything but storage data, by label in first-seen order
  uint64_t pickle_offset = 0;   // data.pkl (or the legacy object pickle) in the file
  uint64_t pickle_size = 0;
  std::vector<std::string> records;  // zip: other records' names (version, byteorder...)
  std::string prefix;                // zip: top-level folder ("archive", "model"...)
  std::string byteorder = "little";
  // Zip only.
  uint64_t storage_alignment = 64;  // the .storage_alignment record (torch >= 2.6 writes it)
  std::optional<zip::Archive> archive;
};

// Torch zip checkpoint (torch >= 1.6 default). Throws ckpt::Error on unreadable structure;
// problems that still let the file be described go to model.problems.
TorchFile ReadTorchZip(Bytes file, const ReadOptions& options = {});

// Legacy torch.save format (_use_new_zipfile_serialization=False, torch < 1.6).
TorchFile ReadTorchLegacy(Bytes file, const ReadOptions& options = {});

// Does the file start like a legacy torch file (a pickle of torch's magic number)?
bool LooksLikeTorchLegacy(Bytes file);

}  // namespace ckpt::torch
