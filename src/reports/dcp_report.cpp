#include "reports/dcp_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "base/human.h"
#include "base/utf8.h"
#include "io/crc32.h"
#include "io/parallel_crc.h"
#include "io/range_stream.h"
#include "zip/zip_archive.h"

namespace ckpt {

namespace {

uint64_t TensorBytes(const dcp::Tensor& t) {
  return t.numel * torch::ElementSize(t.dtype);
}

std::string TopKey(const std::string& fqn) {
  return fqn.substr(0, fqn.find('.'));
}

uint64_t ItemLength(const dcp::Checkpoint& c, int32_t item) {
  return item < 0 ? 0 : c.meta.storage[c.items[static_cast<size_t>(item)].entry].length;
}

struct Rollup {
  uint64_t tensors = 0, objects = 0, bytes = 0, stored = 0;
};

std::map<std::string, Rollup> Rollups(const dcp::Checkpoint& c) {
  std::map<std::string, Rollup> r;
  for (const dcp::Tensor& t : c.tensors) {
    Rollup& x = r[TopKey(t.fqn)];
    x.tensors++;
    x.bytes += TensorBytes(t);
    for (const dcp::Chunk& ch : t.chunks) x.stored += ItemLength(c, ch.item);
  }
  for (const dcp::Object& o : c.objects) {
    Rollup& x = r[TopKey(o.fqn)];
    x.objects++;
    x.bytes += ItemLength(c, o.item);  // an object's size is its archive's
    x.stored += ItemLength(c, o.item);
  }
  return r;
}

std::vector<std::string> FilesOf(const dcp::Checkpoint& c, const dcp::Tensor& t) {
  std::set<std::string> files;
  for (const dcp::Chunk& ch : t.chunks) {
    if (ch.item >= 0)
      files.insert(c.meta.storage[c.items[static_cast<size_t>(ch.item)].entry].path);
  }
  return {files.begin(), files.end()};
}

std::vector<std::string> ObjectGlobals(const dcp::Checkpoint& c, const dcp::Object& o) {
  std::vector<std::string> out;
  if (o.item < 0) return out;
  for (const torch::ImportedName& n : c.items[static_cast<size_t>(o.item)].scan.names)
    out.push_back(n.name);
  return out;
}

// Findings that mean a pickle could run code: the metadata's and every object's.
std::vector<std::string> Unsafe(const dcp::Checkpoint& c) {
  std::vector<std::string> out;
  for (const torch::UnsafeFinding& u : c.meta.scan.findings)
    out.push_back(fmt::format("{}: the pickle {}", fmt::join(c.metadata_files, ", "), u.what));
  for (const dcp::Object& o : c.objects) {
    if (o.item < 0) continue;
    for (const torch::UnsafeFinding& u : c.items[static_cast<size_t>(o.item)].scan.findings)
      out.push_back(fmt::format("object '{}': the pickle {}", o.fqn, torch::ExplainFinding(u)));
  }
  return out;
}

}  // namespace

void WriteDcpJson(JsonStream& out, const dcp::Checkpoint& c) {
  out.BeginObject();
  out.Member("format", "dcp");
  out.Member("folder", c.folder);
  std::vector<std::string> names;
  for (const torch::ImportedName& n : c.meta.scan.names) names.push_back(n.name);
  out.Member("metadata", {{"files", c.metadata_files},
                          {"bytes", c.metadata_bytes},
                          {"class", c.meta.class_name},
                          {"globals", names}});
  out.BeginArray("tensors");
  uint64_t tensor_bytes = 0;
  for (const dcp::Tensor& t : c.tensors) {
    out.BeginObject();
    out.Member("name", t.fqn);
    out.Member("dtype", torch::Name(t.dtype));
    out.Member("shape", t.shape);
    out.Member("chunks", t.chunks.size());
    out.Member("bytes", TensorBytes(t));
    out.BeginArray("files");
    for (const std::string& f : FilesOf(c, t)) out.Value(f);
    out.End();
    out.End();
    tensor_bytes += TensorBytes(t);
  }
  out.End();
  out.BeginArray("objects");
  for (const dcp::Object& o : c.objects) {
    out.Value(
        {{"name", o.fqn}, {"bytes", ItemLength(c, o.item)}, {"globals", ObjectGlobals(c, o)}});
  }
  out.End();
  out.BeginArray("rollup");
  for (const auto& [key, r] : Rollups(c)) {
    out.Value({{"key", key},
               {"tensors", r.tensors},
               {"objects", r.objects},
               {"bytes", r.bytes},
               {"stored_bytes", r.stored}});
  }
  out.End();
  out.BeginArray("files");
  uint64_t total = c.metadata_bytes;
  for (const dcp::DataFile& f : c.files) {
    out.Value({{"path", f.name},
               {"bytes", f.bytes.size()},
               {"items", f.items},
               {"item_bytes", f.item_bytes}});
    total += f.bytes.size();
  }
  out.End();
  out.Member("tensor_bytes", tensor_bytes);
  out.Member("total_bytes", total);
  out.Member("unsafe", Unsafe(c));
  out.BeginArray("problems");
  for (const torch::Problem& p : c.problems) out.Value({{"where", p.where}, {"what", p.what}});
  out.End();
  out.End();
}

std::string RenderDcpText(const dcp::Checkpoint& c, size_t top_n) {
  uint64_t tensor_bytes = 0, total = c.metadata_bytes;
  for (const dcp::Tensor& t : c.tensors) tensor_bytes += TensorBytes(t);
  for (const dcp::DataFile& f : c.files) total += f.bytes.size();
  std::string out =
      fmt::format("{}: torch.distributed.checkpoint folder, {} files, {}\n", Printable(c.folder),
                  c.files.size() + c.metadata_files.size(), HumanBytes(total));
  out += fmt::format("  {} tensors ({}) in {} chunks, {} objects; metadata {} ({})\n",
                     c.tensors.size(), HumanBytes(tensor_bytes), c.items.size() - c.objects.size(),
                     c.objects.size(), fmt::join(c.metadata_files, ", "),
                     Printable(c.meta.class_name));
  out += "\n  FILES\n";
  out += fmt::format("    {:<32} {:>12} {:>8} {:>12}\n", "file", "bytes", "items", "item bytes");
  for (const dcp::DataFile& f : c.files) {
    out += fmt::format("    {:<32} {:>12} {:>8} {:>12}\n", Printable(f.name),
                       HumanBytes(f.bytes.size()), f.items, HumanBytes(f.item_bytes));
  }
  out += "\n  BY TOP-LEVEL KEY\n";
  out += fmt::format("    {:<24} {:>8} {:>8} {:>12} {:>12}\n", "key", "tensors", "objects",
                     "tensor", "stored");
  for (const auto& [key, r] : Rollups(c)) {
    out += fmt::format("    {:<24} {:>8} {:>8} {:>12} {:>12}\n", Printable(key), r.tensors,
                       r.objects, HumanBytes(r.bytes), HumanBytes(r.stored));
  }
  std::vector<const dcp::Tensor*> largest;
  for (const dcp::Tensor& t : c.tensors) largest.push_back(&t);
  size_t n = std::min(top_n, largest.size());
  std::partial_sort(largest.begin(), largest.begin() + static_cast<ptrdiff_t>(n), largest.end(),
                    [](const dcp::Tensor* a, const dcp::Tensor* b) {
                      return TensorBytes(*a) != TensorBytes(*b) ? TensorBytes(*a) > TensorBytes(*b)
                                                                : a->fqn < b->fqn;
                    });
  out += fmt::format("\n  LARGEST TENSORS ({} of {})\n", n, largest.size());
  for (size_t i = 0; i < n; ++i) {
    const dcp::Tensor& t = *largest[i];
    out += fmt::format("    {:<56} {:<9} {:<20} {:>4} chunks {:>12}\n", Printable(t.fqn),
                       torch::Name(t.dtype), ShapeText(t.shape), t.chunks.size(),
                       HumanBytes(TensorBytes(t)));
  }
  if (!c.objects.empty()) {
    out += "\n  OBJECTS (torch.save'd values)\n";
    for (const dcp::Object& o : c.objects) {
      std::vector<std::string> g = ObjectGlobals(c, o);
      out += fmt::format("    {:<40} {:>12}  {}\n", Printable(o.fqn),
                         HumanBytes(ItemLength(c, o.item)),
                         Printable(fmt::format("{}", fmt::join(g, ", "))));
    }
  }
  for (const std::string& u : Unsafe(c)) out += "  UNSAFE: " + Printable(u) + "\n";
  for (const torch::Problem& p : c.problems)
    out += "  PROBLEM: " + Printable(p.where + ": " + p.what) + "\n";
  return out;
}

DcpVerifyResult VerifyDcp(const dcp::Checkpoint& c, unsigned threads, bool checksums) {
  DcpVerifyResult r;
  r.problems = c.problems;
  for (const std::string& u : Unsafe(c)) r.problems.push_back({"pickle", u + " (never run)", true});
  if (!checksums) return r;  // structure: OpenDcp checked every chunk against the metadata
  // Every record of every readable item against its CRC32.
  // 32 bytes per record (an item holds ~6); the record's name is read again only for a message.
  struct Record {
    uint64_t data_offset;
    uint64_t size;
    uint32_t item;
    uint32_t index;  // in its item's archive
    uint32_t crc;
    bool stored;
  };
  std::vector<Record> records;
  dcp::ItemPages pages(c);
  for (size_t i = 0; i < c.items.size(); ++i) {
    const dcp::Item& item = c.items[i];
    if (!item.readable) continue;
    zip::Archive a = zip::Archive::Parse(item.archive);
    pages.Read(item);
    uint32_t index = 0;
    for (const zip::Entry& e : a.entries()) {
      records.push_back({e.data_offset, e.size, static_cast<uint32_t>(i), index++, e.crc32,
                         e.method == zip::Method::kStored});
    }
    r.items_checked++;
  }
  auto name_of = [&](const Record& rec) {
    zip::Archive a = zip::Archive::Parse(c.items[rec.item].archive);
    return a.entries()[rec.index].name;
  };
  std::vector<uint64_t> sizes;
  sizes.reserve(records.size());
  for (const Record& rec : records) sizes.push_back(rec.stored ? rec.size : 0);
  std::vector<uint32_t> crcs =
      ParallelCrc(sizes, threads, kCrcPiece, [&](size_t k, uint64_t off, uint64_t len) {
        const dcp::Item& item = c.items[records[k].item];
        uint64_t at = records[k].data_offset + off;
        if (item.map != nullptr) {
          return Crc32OfRange(*item.map, item.archive_offset + at, len);
        }
        return Crc32(0, item.archive.subspan(at, len));
      });
  // Names of what each item holds, for the messages.
  std::vector<std::string> owner(c.items.size());
  for (size_t i = 0; i < c.items.size(); ++i) owner[i] = c.meta.storage[c.items[i].entry].fqn;
  for (const dcp::Tensor& t : c.tensors) {
    for (const dcp::Chunk& ch : t.chunks) {
      if (ch.item >= 0)
        owner[static_cast<size_t>(ch.item)] =
            fmt::format("{} chunk at {}", t.fqn, fmt::join(ch.meta.offsets, ","));
    }
  }
  for (const dcp::Object& o : c.objects) {
    if (o.item >= 0) owner[static_cast<size_t>(o.item)] = o.fqn;
  }
  for (size_t k = 0; k < records.size(); ++k) {
    const Record& e = records[k];
    if (!e.stored) {
      r.notes.push_back(
          fmt::format("{}: record '{}' is compressed; its CRC is checked by the reader",
                      owner[e.item], name_of(e)));
      continue;
    }
    r.bytes_checked += e.size;
    if (crcs[k] != e.crc) {
      const dcp::StorageEntry& s = c.meta.storage[c.items[e.item].entry];
      r.problems.push_back(
          {owner[e.item], fmt::format("record '{}' of its item at {} of {} fails its "
                                      "CRC32 check (stored {:08x}, computed {:08x})",
                                      name_of(e), s.offset, s.path, e.crc, crcs[k])});
    }
  }
  return r;
}

}  // namespace ckpt
