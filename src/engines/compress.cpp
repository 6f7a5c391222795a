#include "engines/compress.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "base/error.h"
#include "base/perf.h"
#include "checkpoint/archive_io.h"
#include "checkpoint/integrity.h"
#include "checkpoint/manifest.h"
#include "compress/index_stats.h"
#include "compress/layout.h"
#include "compress/pipeline.h"
#include "dcp/dcp_checkpoint.h"
#include "io/atomic_output.h"
#include "io/crc32.h"
#include "io/folders.h"
#include "io/parallel_crc.h"
#include "io/temp_files.h"

namespace ckpt {

namespace fs = std::filesystem;
using ckz::Chunk;
using ckz::Entry;
using ckz::EntryType;
using ckz::Index;
using namespace archive_io;  // the archive jobs' shared plumbing (checkpoint/archive_io.h)

namespace {

// One chunk in this many is decoded again in memory right after it is coded and compared
// with what it was made from (chunk_coder.h). Every chunk is decoded from disk before an
// original is removed (--rm, the policy's compress step) and by `verify`.
constexpr size_t kCheckEvery = 16;

// ---------------------------------------------------------------------------------------
// Compress.

// One file of the input: analysed first, mapped again while its chunks are coded (at most
// the files with chunks in flight are open at once).
struct InputFile {
  std::string path;
  MappedFile::Stamp stamp;
  std::mutex mu;
  std::shared_ptr<MappedFile> map;
  std::atomic<uint64_t> pending{0};

  std::shared_ptr<MappedFile> Acquire() {
    std::lock_guard<std::mutex> lock(mu);
    if (!map) {
      auto m = std::make_shared<MappedFile>(MappedFile::Open(path));
      const MappedFile::Stamp& now = m->stamp();
      if (now.size != stamp.size || now.mtime_ns != stamp.mtime_ns || now.inode != stamp.inode)
        Fail("{}: the file changed while it was being compressed; nothing was written", path);
      map = std::move(m);
    }
    return map;
  }
  void Done() {
    if (pending.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mu);
      map.reset();
    }
  }
};

struct Collected {
  Index index;
  std::vector<std::string> paths;  // per entry, on disk
  std::vector<std::string> warnings;
};

Entry EntryFor(const std::string& disk_path, const struct stat& st, std::string rel) {
  Entry e;
  e.path = std::move(rel);
  e.mode = st.st_mode & 07777;
  e.mtime_ns = MtimeNs(st);
  if (S_ISDIR(st.st_mode)) {
    e.type = EntryType::kFolder;
  } else if (S_ISLNK(st.st_mode)) {
    e.type = EntryType::kSymlink;
    std::vector<char> buf(4097);
    ssize_t n = ::readlink(disk_path.c_str(), buf.data(), buf.size());
    if (n < 0) FailErrno(disk_path, "cannot read the symlink");
    if (static_cast<size_t>(n) >= buf.size()) Fail("{}: symlink target too long", disk_path);
    e.target.assign(buf.data(), static_cast<size_t>(n));
  } else {
    e.type = EntryType::kFile;
    e.size = static_cast<uint64_t>(st.st_size);
  }
  return e;
}

Collected CollectFolder(const std::string& root, const std::string& skip) {
  Collected c;
  c.index.kind = ckz::ArchiveKind::kFolder;
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0) FailErrno(root, "cannot stat");
  c.index.entries.push_back(EntryFor(root, st, ""));
  c.paths.push_back(root);
  std::vector<std::pair<std::string, std::string>> found;  // (relative, disk path)
  std::error_code ec;
  fs::recursive_directory_iterator it(root, ec), end;
  if (ec) Fail("{}: cannot list folder: {}", root, ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) Fail("{}: cannot list folder: {}", root, ec.message());
    std::string disk = it->path().string();
    if (IsTempFileName(it->path().filename().string())) continue;
    if (!skip.empty() && fs::equivalent(disk, skip, ec)) continue;
    // Lexically: fs::relative would follow a symlink to wherever it points.
    found.emplace_back(it->path().lexically_relative(root).generic_string(), disk);
  }
  std::sort(found.begin(), found.end());
  for (auto& [rel, disk] : found) {
    if (::lstat(disk.c_str(), &st) != 0) FailErrno(disk, "cannot stat");
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
      c.warnings.push_back(fmt::format("{}: not a file, folder or symlink; not archived", disk));
      continue;
    }
    if (!ckz::IsSafeRelativePath(rel)) Fail("{}: a path the archive cannot hold", disk);
    c.index.entries.push_back(EntryFor(disk, st, rel));
    c.paths.push_back(disk);
  }
  return c;
}

// The items of every torch.distributed.checkpoint folder being archived, by the archive path
// of the data file holding them: the folder's metadata says where each item is (its data
// files are not read here). Items through a stream transform (zstd) are left out: their
// bytes are not tensor elements. A folder whose metadata does not parse is plain bytes.
std::unordered_map<std::string, std::vector<ckz::ItemSpan>> DcpItems(const Collected& c) {
  std::unordered_map<std::string, std::vector<ckz::ItemSpan>> items;
  for (size_t i = 0; i < c.index.entries.size(); ++i) {
    const Entry& e = c.index.entries[i];
    if (e.type != EntryType::kFolder || !dcp::LooksLikeDcpCheckpoint(c.paths[i])) continue;
    dcp::Metadata md;
    try {
      md = dcp::ReadFolderMetadata(c.paths[i]);
    } catch (const std::exception&) {
      continue;
    }
    std::set<std::pair<std::string_view, uint64_t>> seen;  // per-rank metadata may repeat one
    for (const dcp::StorageEntry& s : md.storage) {
      if (!s.transforms.empty() || !ckz::IsSafeRelativePath(s.path) || s.path.empty()) continue;
      if (!seen.emplace(s.path, s.offset).second) continue;
      std::string name = s.fqn;
      bool piece = false;
      for (int64_t v : s.offsets) piece = piece || v != 0;
      if (piece) {
        name += "[";
        for (size_t d = 0; d < s.offsets.size(); ++d)
          name += fmt::format("{}{}", d ? "," : "", s.offsets[d]);
        name += "]";
      }
      items[e.path.empty() ? s.path : e.path + "/" + s.path].push_back({s.offset, s.length, name});
    }
  }
  return items;
}

// Per transform (and the plain-zstd fallback): original bytes and the plane bytes they

}  // namespace

std::string DefaultArchiveName(const std::string& path) {
  std::string p = StripSlashes(path);
  std::string name = fs::path(p).filename().string();
  if (name == "." || name == ".." || name.empty()) {
    // "." names the folder we are in: its archive goes beside it, under its own name.
    std::error_code ec;
    fs::path real = fs::canonical(p, ec);
    if (ec || real.filename().empty()) Fail("{}: give the archive's name with -o", path);
    return real.string() + std::string(ckz::kArchiveSuffix);
  }
  return p + std::string(ckz::kArchiveSuffix);
}

CompressResult CompressPath(const std::string& given, const CompressOptions& o) {
  PerfTimer timer("compress");
  std::string path = StripSlashes(given);
  CompressResult r;
  r.input = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) FailErrno(path, "cannot open");
  bool folder = S_ISDIR(st.st_mode);
  if (!folder && !S_ISREG(st.st_mode)) Fail("{}: not a file or folder", path);
  if (!folder && path.ends_with(ckz::kArchiveSuffix))
    Fail("{}: already a .ckz archive (name ends in .ckz); not compressed again", path);
  if (o.to_stdout && o.remove_input) throw UsageError("--rm cannot be used with -c");
  r.output = o.to_stdout ? "-" : (o.output.empty() ? DefaultArchiveName(path) : o.output);
  if (!o.to_stdout) {
    CheckOutputFree(r.output, o.force);
    if (folder) {
      std::error_code ec;
      fs::path out_abs = fs::weakly_canonical(fs::absolute(r.output), ec);
      fs::path in_abs = fs::weakly_canonical(fs::absolute(path), ec);
      fs::path rel = out_abs.lexically_relative(in_abs);
      if (rel.empty() || rel == "." || *rel.begin() != "..")
        Fail("{}: the archive cannot be written inside the folder it archives", r.output);
    }
  }

  // 0. Nothing damaged goes in unseen: the archive's checksums would vouch for it, and with
  // --rm the original, the evidence, would go.
  if (!o.allow_damaged) {
    PerfTimer t("check");
    RefuseDamaged(path, o.threads,
                  "not archived, its checksums would vouch for it (--allow-damaged archives it "
                  "as it is, the damage kept)");
  }

  // 1. What to archive.
  Collected c;
  if (folder) {
    c = CollectFolder(path, o.to_stdout ? "" : r.output);
  } else {
    c.index.kind = ckz::ArchiveKind::kFile;
    c.index.entries.push_back(EntryFor(path, st, fs::path(path).filename().string()));
    c.paths.push_back(path);
  }
  c.index.level = static_cast<uint8_t>(o.level);
  r.warnings = std::move(c.warnings);
  Index& index = c.index;

  // 2. Where the tensors are, and the chunks.
  std::vector<std::unique_ptr<InputFile>> inputs(index.entries.size());
  {
    PerfTimer t("analyse");
    std::unordered_map<std::string, std::vector<ckz::ItemSpan>> dcp_items = DcpItems(c);
    for (size_t i = 0; i < index.entries.size(); ++i) {
      Entry& e = index.entries[i];
      if (e.type != EntryType::kFile) continue;
      auto in = std::make_unique<InputFile>();
      in->path = c.paths[i];
      MappedFile m = MappedFile::Open(in->path);
      in->stamp = m.stamp();
      e.size = m.size();
      auto items = dcp_items.find(e.path);
      auto release = [&m](uint64_t offset, uint64_t size) { m.Release(offset, size); };
      ckz::FileLayout layout = items != dcp_items.end()
                                   ? ckz::AnalyzeItems(m.bytes(), items->second, release)
                                   : ckz::AnalyzeFile(m.bytes(), release);
      e.format = layout.format;
      e.ranges = std::move(layout.ranges);
      e.tensors = std::move(layout.tensors);
      r.tensors += e.tensors.size();
      e.first_chunk = index.chunks.size();
      for (const ckz::ChunkSpan& s : ckz::PlanChunks(e.size, e.ranges)) {
        Chunk ch;
        ch.file = static_cast<uint32_t>(i);
        ch.offset = s.offset;
        ch.length = s.length;
        index.chunks.push_back(std::move(ch));
      }
      e.chunk_count = index.chunks.size() - e.first_chunk;
      in->pending = e.chunk_count;
      r.before += e.size;
      ++r.files;
      inputs[i] = std::move(in);
    }
  }
  r.chunks = index.chunks.size();

  // 3. The output: a temp file reserving an upper bound, or stdout.
  uint64_t bound = ckz::kHeaderSize + ckz::kTrailerSize;
  for (const Chunk& ch : index.chunks) bound += ckz::ChunkHeaderSize(17) + ch.length;
  std::string index_guess = ckz::SerializeIndex(index);
  bound += ZSTD_compressBound(index_guess.size() + index.chunks.size() * 17 * 5);
  std::optional<AtomicOutput> out;
  std::unique_ptr<Sink> sink;
  if (o.dry_run) {
    sink = std::make_unique<NullSink>();
  } else if (o.to_stdout) {
    sink = std::make_unique<StreamSink>(STDOUT_FILENO, "stdout");
  } else {
    out.emplace(AtomicOutput::Create(r.output, bound));
    sink = std::make_unique<FileSink>(*out);
  }
  std::string header = ckz::FileHeader();
  sink->Write(0, AsBytes(header));
  uint64_t pos = header.size();

  // 4. Chunks coded in parallel, appended in order.
  {
    PerfTimer t("code chunks");
    unsigned threads = std::max(1u, o.threads);
    std::vector<std::unique_ptr<ckz::ChunkCoder>> coders(threads);
    size_t window = threads * kSlotsPerThread;
    std::vector<std::string> slots(window);
    ckz::OrderedPipeline(
        index.chunks.size(), threads, window,
        [&](size_t k, unsigned worker, size_t slot) {
          if (!coders[worker]) coders[worker] = std::make_unique<ckz::ChunkCoder>(o.level);
          Chunk& ch = index.chunks[k];
          const Entry& e = index.entries[ch.file];
          InputFile& in = *inputs[ch.file];
          std::shared_ptr<MappedFile> map = in.Acquire();
          {
            MappedFile::Window w(*map, ch.offset, ch.length);
            coders[worker]->Encode(w.bytes(), ckz::RunsOf(e.ranges, ch.offset, ch.length), ch,
                                   slots[slot], k % kCheckEvery == 0);
          }
          map.reset();
          in.Done();
        },
        [&](size_t k, size_t slot) {
          Chunk& ch = index.chunks[k];
          ch.archive_offset = pos;
          sink->Write(pos, AsBytes(slots[slot]));
          pos += slots[slot].size();
          if (o.bytes_done) *o.bytes_done += ch.length;
        });
  }

  // 5. Per-file checksums, the index and the trailer.
  for (Entry& e : index.entries) {
    if (e.type != EntryType::kFile) continue;
    uint32_t crc = 0;
    for (uint64_t k = e.first_chunk; k < e.first_chunk + e.chunk_count; ++k) {
      const Chunk& ch = index.chunks[k];
      crc = k == e.first_chunk ? ch.crc : Crc32Combine(crc, ch.crc, ch.length);
    }
    e.crc = crc;
  }
  std::string raw = ckz::SerializeIndex(index);
  std::string frame(ZSTD_compressBound(raw.size()), '\0');
  size_t n = ZSTD_compress(frame.data(), frame.size(), raw.data(), raw.size(), 9);
  if (ZSTD_isError(n)) Fail("zstd: index: {}", ZSTD_getErrorName(n));
  frame.resize(n);
  uint64_t index_offset = pos;
  sink->Write(pos, AsBytes(frame));
  pos += frame.size();
  std::string trailer =
      ckz::Trailer(index_offset, frame.size(), raw.size(), Crc32(0, AsBytes(frame)));
  sink->Write(pos, AsBytes(trailer));
  pos += trailer.size();
  r.after = pos;

  ckz::IndexStats s = ckz::StatsOf(index);
  for (int t = 0; t < ckz::kTransforms; ++t) r.by_transform[t] = s.transforms[t];
  r.whole_chunks = s.fallback_chunks;
  if (o.dry_run) return r;

  // 6. Commit: cut to size, fsync, (read back with --rm), inputs unchanged, rename.
  if (out) {
    out->Truncate(pos);
    if (folder) {
      out->SetDefaultMode();
    } else {
      out->SetMode(st.st_mode, ::geteuid(), ::getegid());
    }
    out->Sync();
    if (o.remove_input) {
      PerfTimer t("verify");
      WithContext(
          fmt::format("{}: reading the new archive back failed; nothing was removed", r.output),
          [&] {
            ckz::Archive back = ckz::Archive::Open(out->temp_path());
            ArchiveVerifyResult v = VerifyArchive(back, o.threads);
            if (!v.problems.empty()) Fail("{}", v.problems[0].what);
            const Index& bi = back.index();
            if (bi.chunks.size() != index.chunks.size()) Fail("chunk count differs");
            for (size_t k = 0; k < bi.chunks.size(); ++k)
              if (bi.chunks[k].crc != index.chunks[k].crc) Fail("chunk {} differs", k);
          });
    }
    for (const auto& in : inputs) {
      if (in && in->stamp.ChangedOnDisk())
        Fail("{}: the file changed while it was being compressed; {} was not written", in->path,
             r.output);
    }
    out->Commit();
  } else {
    for (const auto& in : inputs) {
      if (in && in->stamp.ChangedOnDisk())
        Fail(
            "{}: the file changed while it was being compressed; the archive written to stdout "
            "does not hold it as it is now",
            in->path);
    }
  }

  // 7. --rm: the originals go, only what was archived (a folder that gained files stays).
  if (o.remove_input) {
    for (size_t i = index.entries.size(); i-- > 0;) {
      const Entry& e = index.entries[i];
      const std::string& p = c.paths[i];
      if (e.type == EntryType::kFolder) {
        if (::rmdir(p.c_str()) != 0)
          r.warnings.push_back(fmt::format("{}: not removed: {}", p, std::strerror(errno)));
      } else if (::unlink(p.c_str()) != 0) {
        r.warnings.push_back(fmt::format("{}: not removed: {}", p, std::strerror(errno)));
      }
    }
    r.removed = !PathExists(path);
    // A file's manifest beside it names bytes that are gone now (the archive's checksums
    // stand for them): removed, and said. A folder's is inside it, archived with it.
    std::error_code ec;
    const std::string sidecar = path + kManifestSuffix;
    if (r.removed && !folder && fs::is_regular_file(sidecar, ec) && fs::remove(sidecar, ec))
      r.warnings.push_back(
          fmt::format("{}: removed with {} (the archive holds what it named)", sidecar, path));
    if (folder) SyncFolder(fs::path(path).parent_path().string());
  }
  return r;
}

}  // namespace ckpt
