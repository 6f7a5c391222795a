// Torch zip checkpoints (torch/serialization.py _save, caffe2 PyTorchStreamWriter):
//   <prefix>/data.pkl            the object pickle (protocol 2 by default)
//   <prefix>/data/<key>          raw little-endian bytes of each storage
//   <prefix>/version or <prefix>/.data/version, <prefix>/byteorder,
//   <prefix>/.data/serialization_id, <prefix>/.format_version, <prefix>/.storage_alignment
// The prefix is whatever precedes the first '/' in the name of entry 0 (torch's reader
// does the same), so any top-level folder name is accepted. Every record under it is looked up
// as torch's miniz looks it up (zip::Archive::Find): A-Z case ignored.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <vector>

#include "base/checked.h"
#include "base/error.h"
#include "torch/pickle_read.h"
#include "torch/torch_file.h"

namespace ckpt::torch {

namespace {

void AddZipRegions(const zip::Archive& a, TorchFile& tf) {
  for (const zip::Entry& e : a.entries()) {
    tf.AddRegion("zip headers", e.header_size);
    if (e.extra_size) tf.AddRegion("zip padding", e.extra_size);
    if (e.descriptor_size) tf.AddRegion("zip headers", e.descriptor_size);
  }
  tf.AddRegion("zip directory", a.directory_size());
  tf.AddRegion("zip directory", a.end_records_size());
}

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// torch.load reads it with int(); ckptool's writer keeps the alignment, which the zip 'FB'
// extra field (a u16 of padding) limits to powers of two up to 32 KiB.
void ReadStorageAlignment(Bytes file, const zip::Entry& e, TorchFile& tf) {
  std::string v = Trimmed(zip::ReadRecord(file, e, 64));
  uint64_t a = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), a);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size() || a == 0) {
    tf.model.problems.push_back(
        {e.name, fmt::format("storage alignment '{}' is not a positive number", v)});
    return;
  }
  if ((a & (a - 1)) != 0 || a > 32768) {
    tf.model.notes.push_back(fmt::format(
        "storage alignment {} is not a power of two up to 32768; ckptool cannot rewrite it", a));
    return;
  }
  tf.storage_alignment = a;
}

// Does `name` start with `folder`, A-Z folded as miniz folds names?
bool StartsWithIgnoringCase(std::string_view name, std::string_view folder) {
  auto fold = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  return name.size() >= folder.size() &&
         std::equal(folder.begin(), folder.end(), name.begin(),
                    [&](char x, char y) { return fold(x) == fold(y); });
}

}  // namespace

TorchFile ReadTorchZip(Bytes file, const ReadOptions& options) {
  TorchFile tf;
  tf.container = Container::kZip;
  tf.archive = zip::Archive::Parse(file);
  const zip::Archive& a = *tf.archive;
  if (a.entries().empty()) Fail("zip archive has no records");
  const std::string& first = a.entries().front().name;
  size_t slash = first.find('/');
  if (slash == std::string::npos) {
    Fail("record '{}' is not in a folder; torch requires one top-level folder", first);
  }
  tf.prefix = first.substr(0, slash);
  std::string root = tf.prefix + "/";
  if (a.Find(root + "constants.pkl") != nullptr) {
    Fail(
        "this is a TorchScript archive (it has {}constants.pkl), not a torch.save checkpoint: "
        "torch.load hands it to torch.jit.load, which runs the TorchScript code inside",
        root);
  }
  const zip::Entry* pkl = a.Find(root + "data.pkl");
  if (pkl == nullptr) Fail("no {}data.pkl record: not a torch checkpoint", root);
  AddZipRegions(a, tf);

  // A stored pickle (what torch.save writes) is parsed where it lies in the mapping; a
  // deflated one is inflated first.
  std::string inflated;
  Bytes pb;
  if (pkl->method == zip::Method::kStored) {
    if (pkl->size > options.max_pickle_bytes) {
      Fail("record '{}' is {} bytes, over the limit of {}", pkl->name, pkl->size,
           options.max_pickle_bytes);
    }
    pb = zip::RawData(file, *pkl);
  } else {
    inflated = zip::ReadRecord(file, *pkl, options.max_pickle_bytes);
    pb = AsBytes(inflated);
  }
  tf.pickle_offset = pkl->data_offset;
  tf.pickle_size = pkl->compressed_size;
  tf.AddRegion("pickle", pkl->compressed_size);
  pickle::ParseResult parsed = WithContext(pkl->name, [&] {
    return ParseTorchPickle(pb, pkl->method == zip::Method::kStored ? pkl->data_offset : 0,
                            options.limits);
  });
  if (parsed.end != pb.size()) {
    tf.model.problems.push_back(
        {pkl->name, fmt::format("{} bytes after the pickle's STOP", pb.size() - parsed.end)});
  }
  for (const std::string& odd : parsed.anomalies) tf.model.problems.push_back({pkl->name, odd});
  if (parsed.leftover) {
    tf.model.problems.push_back(
        {pkl->name,
         fmt::format("{} values are left unused on the pickle's stack at STOP (a damaged pickle: "
                     "no pickler writes that)",
                     parsed.leftover)});
  }
  tf.model.graph = std::move(parsed.graph);
  std::string().swap(inflated);
  // The directory's walk touched a page around every record's local header (all of a file of
  // 10^5 small records) and the graph holds what the pickle said: the reader is done with
  // those bytes before the tensor table is built, when memory peaks.
  if (options.done_with) options.done_with(0, file.size());
  BuildTensorTable(tf.model, /*legacy=*/false);

  // Locate each storage's record. torch's getRecord finds it as Find does, ignoring A-Z case,
  // so two keys that differ only in case ('a', 'A') would read the same bytes.
  std::vector<int32_t> storage_of(a.entries().size(), -1);
  for (size_t k = 0; k < tf.model.storages.size(); ++k) {
    Storage& s = tf.model.storages[k];
    std::string record = root + "data/" + s.key;
    const zip::Entry* e = a.Find(record);
    if (e == nullptr) {
      tf.model.problems.push_back({record, "storage record is missing"});
      continue;
    }
    s.entry = static_cast<int32_t>(e - a.entries().data());
    if (int32_t other = storage_of[s.entry]; other >= 0) {
      tf.model.problems.push_back(
          {e->name, fmt::format("storages '{}' and '{}' both read this record (torch's zip "
                                "reader ignores letter case in record names)",
                                tf.model.storages[other].key, s.key)});
    }
    storage_of[s.entry] = static_cast<int32_t>(k);
    s.present = true;
    s.data_offset = e->data_offset;
    s.compressed = e->method != zip::Method::kStored;
    if (e->size != s.nbytes) {
      tf.model.problems.push_back(
          {record, fmt::format("record holds {} bytes but the pickle says {} x {} = {} bytes",
                               e->size, s.numel, Name(s.dtype), s.nbytes)});
    }
  }

  // Every other record: metadata (version, byteorder...) or orphaned data.
  for (size_t i = 0; i < a.entries().size(); ++i) {
    const zip::Entry& e = a.entries()[i];
    if (&e == pkl || storage_of[i] >= 0) continue;
    tf.records.push_back(e.name);
    bool orphan = StartsWithIgnoringCase(e.name, root + "data/");
    tf.AddRegion(orphan ? "unreferenced records" : "metadata records", e.compressed_size);
    // PyTorchStreamReader::getAllRecords (torch >= 2.2, which torch.load calls) compares
    // the folder with strncmp: exactly.
    if (e.name.rfind(root, 0) != 0) {
      tf.model.problems.push_back({e.name, fmt::format("record is outside the '{}' folder "
                                                       "(torch >= 2.2 refuses such files)",
                                                       root)});
    }
  }
  if (const zip::Entry* e = a.Find(root + ".storage_alignment")) ReadStorageAlignment(file, *e, tf);
  if (const zip::Entry* e = a.Find(root + "byteorder")) {
    tf.byteorder = Trimmed(zip::ReadRecord(file, *e, 64));
    if (tf.byteorder != "little" && tf.byteorder != "big") {
      tf.model.problems.push_back({e->name, fmt::format("unknown byte order '{}'", tf.byteorder)});
    }
  }
  const zip::Entry* version = a.Find(root + ".data/version");
  if (version == nullptr) version = a.Find(root + "version");
  if (version == nullptr) {
    tf.model.problems.push_back({root + "version", "no version record (torch.load requires one)"});
  } else {
    std::string v = Trimmed(zip::ReadRecord(file, *version, 64));
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) {
      tf.model.problems.push_back({version->name, fmt::format("version '{}' is not a number", v)});
    }
  }
  return tf;
}

}  // namespace ckpt::torch
