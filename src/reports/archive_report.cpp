#include "reports/archive_report.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "base/human.h"
#include "compress/index_stats.h"
#include "io/crc32.h"
#include "io/parallel_crc.h"

namespace ckpt {

namespace fs = std::filesystem;
using ckz::Entry;
using ckz::EntryType;
using ckz::Index;
using ckz::IndexStats;
using ckz::PlaneStat;
using ckz::StatsOf;

// ---------------------------------------------------------------------------------------
// Inspect.

namespace {

std::string Ratio(uint64_t original, uint64_t stored) {
  if (stored == 0) return original ? "inf" : "-";
  return fmt::format("{:.3f}x", static_cast<double>(original) / static_cast<double>(stored));
}

const char* PlaneName(ckz::Transform t, int p) {
  switch (t) {
    case ckz::Transform::kBytes:
      return "other bytes (zstd)";
    case ckz::Transform::kBF16:
      return p == 0 ? "bf16 exponent" : "bf16 sign+mantissa";
    case ckz::Transform::kF32: {
      static const char* kNames[] = {"f32 exponent", "f32 sign+mantissa hi", "f32 mantissa mid",
                                     "f32 mantissa lo"};
      return kNames[p];
    }
    case ckz::Transform::kF16:
      return p == 0 ? "f16 high byte" : "f16 low byte";
    case ckz::Transform::kF64: {
      static const char* kNames[] = {"f64 byte 7", "f64 byte 6", "f64 byte 5", "f64 byte 4",
                                     "f64 byte 3", "f64 byte 2", "f64 byte 1", "f64 byte 0"};
      return kNames[p];
    }
  }
  return "?";
}

}  // namespace

std::string RenderArchiveText(const ckz::Archive& a, size_t top) {
  const Index& index = a.index();
  IndexStats s = StatsOf(index);
  uint64_t original = 0, files = 0, tensors = 0;
  for (const Entry& e : index.entries) {
    if (e.type != EntryType::kFile) continue;
    original += e.size;
    ++files;
    tensors += e.tensors.size();
  }
  uint64_t size = a.bytes().size();
  std::string out = fmt::format("{}: ckptool archive (format {}), {}, level {}, {} ({} bytes)\n",
                                a.name(), ckz::kVersion,
                                index.kind == ckz::ArchiveKind::kFile
                                    ? "one file"
                                    : fmt::format("folder of {} entries", index.entries.size()),
                                index.level == 1 ? "max" : "fast", HumanBytes(size), size);
  out += fmt::format("  {} of original bytes in {} -> {} ({}, {} of the original)\n",
                     HumanBytes(original), Count(files, "file"), HumanBytes(size),
                     Ratio(original, size), Percent(size, original));
  out += fmt::format("  {}, {}\n\n", Count(index.chunks.size(), "chunk"), Count(tensors, "tensor"));
  out +=
      "  CODING                        original         stored    ratio   planes "
      "(raw/huffman/zstd)\n";
  for (int t = 0; t < ckz::kTransforms; ++t) {
    for (int p = 0; p < 8; ++p) {
      const PlaneStat& ps = s.planes[t][p];
      if (ps.original == 0) continue;
      out += fmt::format("    {:<24} {:>14} {:>14} {:>8}   {}/{}/{}\n",
                         PlaneName(static_cast<ckz::Transform>(t), p), HumanBytes(ps.original),
                         HumanBytes(ps.stored), Ratio(ps.original, ps.stored), ps.methods[0],
                         ps.methods[1], ps.methods[2]);
    }
  }
  if (s.fallback_chunks)
    out += fmt::format("    {:<24} {:>14} {:>14} {:>8}   {} chunks\n", "tensors as plain zstd",
                       HumanBytes(s.fallback.original), HumanBytes(s.fallback.stored),
                       Ratio(s.fallback.original, s.fallback.stored), s.fallback_chunks);
  uint64_t container =
      s.chunk_headers + a.index_frame_bytes() + ckz::kHeaderSize + ckz::kTrailerSize;
  out += fmt::format("    {:<24} {:>14} {:>14}\n", "headers, index", "", HumanBytes(container));
  // Files, largest first.
  std::vector<const Entry*> list;
  for (const Entry& e : index.entries)
    if (e.type == EntryType::kFile) list.push_back(&e);
  std::stable_sort(list.begin(), list.end(),
                   [](const Entry* x, const Entry* y) { return x->size > y->size; });
  out +=
      "\n  FILES                                         format          original         stored   "
      " ratio  tensors\n";
  size_t shown = 0;
  for (const Entry* e : list) {
    if (shown++ == top) {
      out += fmt::format("    ... and {} more\n", list.size() - top);
      break;
    }
    uint64_t stored = 0;
    for (uint64_t k = e->first_chunk; k < e->first_chunk + e->chunk_count; ++k)
      stored += index.chunks[k].stored_bytes();
    out += fmt::format("    {:<42} {:<13} {:>14} {:>14} {:>8} {:>8}\n", e->path,
                       ckz::FileFormatName(e->format), HumanBytes(e->size), HumanBytes(stored),
                       Ratio(e->size, stored), e->tensors.size());
  }
  size_t folders = 0, links = 0;
  for (const Entry& e : index.entries) {
    folders += e.type == EntryType::kFolder;
    links += e.type == EntryType::kSymlink;
  }
  if (folders || links) out += fmt::format("  plus {} folders and {} symlinks\n", folders, links);
  return out;
}

void WriteArchiveJson(JsonStream& out, const ckz::Archive& a,
                      const std::function<void(JsonStream&)>& extra) {
  const Index& index = a.index();
  IndexStats s = StatsOf(index);
  out.BeginObject();
  out.Member("path", a.name());
  out.Member("format", "ckz");
  out.Member("format_version", ckz::kVersion);
  out.Member("kind", index.kind == ckz::ArchiveKind::kFile ? "file" : "folder");
  out.Member("level", index.level == 1 ? "max" : "fast");
  out.Member("archive_bytes", a.bytes().size());
  out.Member("index_bytes", a.index_frame_bytes());
  out.Member("chunks", index.chunks.size());
  out.BeginArray("planes");
  for (int t = 0; t < ckz::kTransforms; ++t) {
    for (int p = 0; p < 8; ++p) {
      const PlaneStat& ps = s.planes[t][p];
      if (ps.original == 0) continue;
      out.Value({{"transform", ckz::TransformName(static_cast<ckz::Transform>(t))},
                 {"plane", p},
                 {"name", PlaneName(static_cast<ckz::Transform>(t), p)},
                 {"original_bytes", ps.original},
                 {"stored_bytes", ps.stored},
                 {"raw", ps.methods[0]},
                 {"huffman", ps.methods[1]},
                 {"zstd", ps.methods[2]}});
    }
  }
  out.End();
  out.Member("plain_zstd_chunks", s.fallback_chunks);
  out.Member("plain_zstd_original_bytes", s.fallback.original);
  out.Member("plain_zstd_stored_bytes", s.fallback.stored);
  uint64_t original = 0;
  for (const Entry& e : index.entries) {
    if (e.type == EntryType::kFile) original += e.size;
  }
  out.Member("original_bytes", original);
  out.BeginArray("entries");
  for (const Entry& e : index.entries) {
    out.BeginObject();
    out.Member("path", e.path);
    out.Member("type", e.type == EntryType::kFile     ? "file"
                       : e.type == EntryType::kFolder ? "folder"
                                                      : "symlink");
    out.Member("mode", fmt::format("{:04o}", e.mode));
    out.Member("mtime_ns", e.mtime_ns);
    if (e.type == EntryType::kSymlink) out.Member("target", e.target);
    if (e.type == EntryType::kFile) {
      uint64_t stored = 0;
      for (uint64_t k = e.first_chunk; k < e.first_chunk + e.chunk_count; ++k)
        stored += index.chunks[k].stored_bytes();
      out.Member("bytes", e.size);
      out.Member("stored_bytes", stored);
      out.Member("crc32", fmt::format("{:08x}", e.crc));
      out.Member("format", ckz::FileFormatName(e.format));
      out.Member("chunks", e.chunk_count);
      out.BeginArray("tensors");
      for (const ckz::TensorInfo& t : e.tensors) {
        out.BeginObject();
        out.Member("name", t.name);
        out.Member("dtype", t.dtype);
        out.Member("shape", t.shape);
        out.Member("begin", t.begin);
        out.Member("end", t.end);
        out.End();
      }
      out.End();
    }
    out.End();
  }
  out.End();
  if (extra) extra(out);
  out.End();
}

}  // namespace ckpt
