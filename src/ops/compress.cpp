#include "ops/compress.h"

#include <fcntl.h>
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
#include "base/human.h"
#include "base/perf.h"
#include "compress/layout.h"
#include "compress/pipeline.h"
#include "dcp/dcp_checkpoint.h"
#include "io/atomic_output.h"
#include "io/crc32.h"
#include "io/folders.h"
#include "io/parallel_crc.h"
#include "io/positioned_io.h"
#include "io/temp_files.h"

namespace ckpt {

namespace fs = std::filesystem;
using ckz::Chunk;
using ckz::Entry;
using ckz::EntryType;
using ckz::Index;

namespace {

// Chunks in flight per thread in the ordered writer (result slots of up to ~1 MiB each).
constexpr size_t kSlotsPerThread = 4;
// One chunk in this many is decoded again in memory right after it is coded and compared
// with what it was made from (chunk_coder.h). Every chunk is decoded from disk before an
// original is removed (--rm, the policy's compress step) and by `verify`.
constexpr size_t kCheckEvery = 16;

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

struct timespec ToTimespec(int64_t ns) {
  struct timespec ts {};
  int64_t sec = ns / 1000000000, rem = ns % 1000000000;
  if (rem < 0) {
    rem += 1000000000;
    --sec;
  }
  ts.tv_sec = static_cast<time_t>(sec);
  ts.tv_nsec = static_cast<long>(rem);
  return ts;
}

[[noreturn]] void FailErrno(const std::string& path, std::string_view what) {
  Fail("{}: {}: {}", path, what, std::strerror(errno));
}

std::string StripSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

bool PathExists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

// Where the archive's bytes go: a temp file that becomes the archive, or stdout.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void Write(uint64_t offset, Bytes data) = 0;
};

class FileSink : public Sink {
 public:
  explicit FileSink(AtomicOutput& out) : out_(out) {}
  void Write(uint64_t offset, Bytes data) override { out_.Write(offset, data); }

 private:
  AtomicOutput& out_;
};

// Nowhere: a dry run only counts the bytes.
class NullSink : public Sink {
 public:
  void Write(uint64_t, Bytes) override {}
};

// Sequential writes to a descriptor (stdout); offsets only checked.
class StreamSink : public Sink {
 public:
  StreamSink(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  void Write(uint64_t offset, Bytes data) override {
    if (offset != pos_) Fail("internal: stream write at {} after {}", offset, pos_);
    while (!data.empty()) {
      ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) FailErrno(name_, "write failed");
      data = data.subspan(static_cast<size_t>(n));
      pos_ += static_cast<uint64_t>(n);
    }
  }

 private:
  int fd_;
  std::string name_;
  uint64_t pos_ = 0;
};

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
// became, from the index alone.
struct PlaneStat {
  uint64_t original = 0;
  uint64_t stored = 0;
  uint64_t methods[3] = {};  // planes per method
};
struct IndexStats {
  PlaneStat planes[ckz::kTransforms][8];
  CodingStats transforms[ckz::kTransforms];
  CodingStats fallback;  // typed chunks coded whole by plain zstd
  uint64_t fallback_chunks = 0;
  uint64_t chunk_headers = 0;
};

IndexStats StatsOf(const Index& index) {
  IndexStats s;
  for (const Chunk& c : index.chunks) {
    s.chunk_headers += ckz::ChunkHeaderSize(c.planes.size());
    const Entry& e = index.entries[c.file];
    std::vector<ckz::Run> runs = ckz::RunsOf(e.ranges, c.offset, c.length);
    bool typed_runs = false;
    for (const ckz::Run& r : runs) typed_runs |= r.transform != ckz::Transform::kBytes;
    if (c.coding == ckz::Coding::kWhole) {
      if (typed_runs) {
        ++s.fallback_chunks;
        s.fallback.original += c.length;
        s.fallback.stored += c.planes[0].stored;
      } else {
        PlaneStat& p = s.planes[0][0];
        p.original += c.length;
        p.stored += c.planes[0].stored;
        ++p.methods[static_cast<int>(c.planes[0].method)];
        s.transforms[0].original += c.length;
        s.transforms[0].stored += c.planes[0].stored;
      }
      continue;
    }
    std::vector<ckz::PlaneShape> shapes = ckz::PlaneShapes(runs);
    for (size_t i = 0; i < shapes.size() && i < c.planes.size(); ++i) {
      int t = static_cast<int>(shapes[i].transform);
      PlaneStat& p = s.planes[t][shapes[i].plane];
      p.original += shapes[i].size;
      p.stored += c.planes[i].stored;
      ++p.methods[static_cast<int>(c.planes[i].method)];
      s.transforms[t].original += shapes[i].size;
      s.transforms[t].stored += c.planes[i].stored;
    }
  }
  return s;
}

void CheckOutputFree(const std::string& out, bool force) {
  if (!force && PathExists(out)) Fail("{}: exists; --force replaces it", out);
}

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

std::string DefaultRestoredName(const std::string& archive) {
  std::string a = StripSlashes(archive);
  if (fs::path(a).filename().string() == ckz::kArchiveSuffix) return "";
  return ckz::WithoutArchiveSuffix(a);
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
  if (o.to_stdout && o.remove_input) Fail("--rm cannot be used with -c");
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

  IndexStats s = StatsOf(index);
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
    if (folder) SyncFolder(fs::path(path).parent_path().string());
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// Decompress.

namespace {

// The mode a restored entry gets: the archived permission bits without set-user-ID and
// set-group-ID, which would turn a file from an archive into a program that runs as whoever
// restored it (the files belong to the user who decompresses).
mode_t RestoredMode(const Entry& e) {
  return static_cast<mode_t>(e.mode & ~(S_ISUID | S_ISGID));
}

void CheckFileCrcs(const ckz::Archive& a, const std::vector<uint32_t>& chunk_crcs) {
  const Index& index = a.index();
  for (const Entry& e : index.entries) {
    if (e.type != EntryType::kFile || e.chunk_count == 0) {
      if (e.type == EntryType::kFile && e.crc != 0)
        Fail("{}: {}: the empty file's checksum is not 0: the archive is damaged", a.name(),
             e.path);
      continue;
    }
    uint32_t crc = 0;
    for (uint64_t k = e.first_chunk; k < e.first_chunk + e.chunk_count; ++k) {
      crc = k == e.first_chunk ? chunk_crcs[k]
                               : Crc32Combine(crc, chunk_crcs[k], index.chunks[k].length);
    }
    if (crc != e.crc)
      Fail("{}: {}: the file's checksum does not match: the archive is damaged", a.name(), e.path);
  }
}

// One-file archive into `out` (a temp file that becomes the destination).
void RestoreFile(const ckz::Archive& a, const DecompressOptions& o, const std::string& dest,
                 bool force) {
  const Index& index = a.index();
  const Entry& e = index.entries[0];
  if (!force) CheckOutputFree(dest, false);
  AtomicOutput out = AtomicOutput::Create(dest, e.size);
  if (!a.map().path().empty()) out.RequireUnchanged(a.map());
  std::vector<uint32_t> crcs(index.chunks.size());
  ckz::DecodeLoop loop;
  loop.use = [&](size_t k, Bytes bytes) {
    const Chunk& ch = index.chunks[k];
    crcs[k] = ch.crc;  // checked by the decode
    out.Write(ch.offset, bytes);
    if (o.bytes_done) *o.bytes_done += ch.length;
  };
  ckz::DecodeChunks(a, 0, index.chunks.size(), o.threads, loop);
  CheckFileCrcs(a, crcs);
  out.SetMode(RestoredMode(e), ::geteuid(), ::getegid());
  struct timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(e.mtime_ns)};
  if (::futimens(out.fd(), times) != 0) FailErrno(dest, "cannot set the modification time");
  out.Commit();
}

void StreamFile(const ckz::Archive& a, const DecompressOptions& o) {
  const Index& index = a.index();
  unsigned threads = std::max(1u, o.threads);
  std::vector<std::unique_ptr<ckz::ChunkCoder>> coders(threads);
  size_t window = threads * kSlotsPerThread;
  std::vector<std::vector<uint8_t>> slots(window);
  StreamSink sink(STDOUT_FILENO, "stdout");
  uint32_t crc = 0;
  uint64_t pos = 0;
  ckz::OrderedPipeline(
      index.chunks.size(), threads, window,
      [&](size_t k, unsigned w, size_t slot) {
        if (!coders[w]) coders[w] = std::make_unique<ckz::ChunkCoder>();
        slots[slot].resize(index.chunks[k].length);
        a.DecodeChunk(*coders[w], k, slots[slot].data());
      },
      [&](size_t k, size_t slot) {
        const Chunk& ch = index.chunks[k];
        crc = k == 0 ? ch.crc : Crc32Combine(crc, ch.crc, ch.length);
        sink.Write(pos, {slots[slot].data(), ch.length});
        pos += ch.length;
        if (o.bytes_done) *o.bytes_done += ch.length;
      });
  if (crc != index.entries[0].crc)
    Fail("{}: {}: the file's checksum does not match: the archive is damaged", a.name(),
         index.entries[0].path);
}

// A file being restored inside the temp folder: opened by the first chunk that needs it,
// finished (mode, mtime, fsync, close) by the last.
struct OpenFile {
  std::mutex mu;
  int fd = -1;
  std::atomic<uint64_t> pending{0};
};

void RestoreFolder(const ckz::Archive& a, const DecompressOptions& o, const std::string& dest,
                   bool force) {
  const Index& index = a.index();
  fs::path dest_path = fs::absolute(dest).lexically_normal();
  if (dest_path.filename().empty()) dest_path = dest_path.parent_path();
  bool replacing = PathExists(dest_path.string());
  if (replacing && !force) Fail("{}: exists; --force replaces it", dest);
  if (!a.map().path().empty() && a.map().stamp().ChangedOnDisk())
    Fail("{}: the archive changed on disk", a.name());
  // Like every writer, the folders above the output are created as `mkdir -p` would.
  CreateFolders(dest_path.parent_path().string(), dest);
  TempFolder tmp{TempPathFor(dest_path.string())};
  RemoveStaleTempFiles(dest_path.string());
  if (::mkdir(tmp.path.c_str(), 0700) != 0) FailErrno(tmp.path, "cannot create the folder");
  auto at = [&](const Entry& e) { return e.path.empty() ? tmp.path : tmp.path + "/" + e.path; };
  // Folders first (writable while we fill them), then files, then symlinks.
  for (const Entry& e : index.entries) {
    if (e.type == EntryType::kFolder && !e.path.empty() && ::mkdir(at(e).c_str(), 0700) != 0)
      FailErrno(at(e), "cannot create the folder");
  }
  std::vector<std::unique_ptr<OpenFile>> files(index.entries.size());
  auto finish = [&](const Entry& e, int fd) {
    if (::fchmod(fd, RestoredMode(e)) != 0) FailErrno(at(e), "chmod failed");
    struct timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(e.mtime_ns)};
    if (::futimens(fd, times) != 0) FailErrno(at(e), "cannot set the modification time");
    if (::fsync(fd) != 0) FailErrno(at(e), "fsync failed");
  };
  for (size_t i = 0; i < index.entries.size(); ++i) {
    const Entry& e = index.entries[i];
    if (e.type != EntryType::kFile) continue;
    files[i] = std::make_unique<OpenFile>();
    files[i]->pending = e.chunk_count;
    if (e.chunk_count == 0) {
      int fd = ::open(at(e).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0) FailErrno(at(e), "cannot create");
      finish(e, fd);
      ::close(fd);
    }
  }
  std::vector<uint32_t> crcs(index.chunks.size());
  try {
    ckz::DecodeLoop loop;
    loop.use = [&](size_t k, Bytes bytes) {
      const Chunk& ch = index.chunks[k];
      const Entry& e = index.entries[ch.file];
      OpenFile& f = *files[ch.file];
      crcs[k] = ch.crc;
      int fd;
      {
        std::lock_guard<std::mutex> lock(f.mu);
        if (f.fd < 0) {
          f.fd = ::open(at(e).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
          if (f.fd < 0) FailErrno(at(e), "cannot create");
        }
        fd = f.fd;
      }
      WriteFullyAt(fd, bytes, ch.offset, at(e), "write failed");
      if (o.bytes_done) *o.bytes_done += ch.length;
      if (f.pending.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(f.mu);
        finish(e, f.fd);
        ::close(f.fd);
        f.fd = -1;
      }
    };
    ckz::DecodeChunks(a, 0, index.chunks.size(), o.threads, loop);
  } catch (...) {
    for (auto& f : files)
      if (f && f->fd >= 0) ::close(f->fd);
    throw;
  }
  CheckFileCrcs(a, crcs);
  for (const Entry& e : index.entries) {
    if (e.type != EntryType::kSymlink) continue;
    if (::symlink(e.target.c_str(), at(e).c_str()) != 0)
      FailErrno(at(e), "cannot create the symlink");
    struct timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(e.mtime_ns)};
    ::utimensat(AT_FDCWD, at(e).c_str(), times, AT_SYMLINK_NOFOLLOW);
  }
  // Folders last, deepest first: their modes may forbid writing, their mtimes would change.
  for (size_t i = index.entries.size(); i-- > 0;) {
    const Entry& e = index.entries[i];
    if (e.type != EntryType::kFolder) continue;
    SyncFolder(at(e));
    if (::chmod(at(e).c_str(), RestoredMode(e)) != 0) FailErrno(at(e), "chmod failed");
    struct timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(e.mtime_ns)};
    if (::utimensat(AT_FDCWD, at(e).c_str(), times, 0) != 0)
      FailErrno(at(e), "cannot set the modification time");
  }
  if (!a.map().path().empty() && a.map().stamp().ChangedOnDisk())
    Fail("{}: the archive changed while it was being read; nothing was written", a.name());
  struct stat st {};
  if (!replacing) {
    if (::rename(tmp.path.c_str(), dest_path.c_str()) != 0)
      FailErrno(dest, "cannot rename into place");
    tmp.keep = true;
  } else if (::lstat(dest_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    if (::renameat2(AT_FDCWD, tmp.path.c_str(), AT_FDCWD, dest_path.c_str(), RENAME_EXCHANGE) != 0)
      FailErrno(dest, "cannot swap in the restored folder (nothing was replaced)");
    // tmp.path now holds the old folder; ~TempFolder removes it.
  } else {
    if (::unlink(dest_path.c_str()) != 0) FailErrno(dest, "cannot replace");
    if (::rename(tmp.path.c_str(), dest_path.c_str()) != 0)
      FailErrno(dest, "cannot rename into place");
    tmp.keep = true;
  }
  LogCommitForTests(dest_path.string());
  SyncFolder(dest_path.parent_path().string());
}

}  // namespace

DecompressResult DecompressArchive(const std::string& path, const DecompressOptions& o) {
  PerfTimer timer("decompress");
  DecompressResult r;
  r.input = path;
  ckz::Archive a = ckz::Archive::Open(path);
  const Index& index = a.index();
  r.archive_bytes = a.bytes().size();
  for (const Entry& e : index.entries) {
    if (e.type != EntryType::kFile) continue;
    r.restored_bytes += e.size;
    ++r.files;
  }
  if (o.to_stdout) {
    if (index.kind != ckz::ArchiveKind::kFile)
      Fail("{}: holds a folder; -c streams a one-file archive only", path);
    if (o.remove_input) Fail("--rm cannot be used with -c");
    r.output = "-";
    StreamFile(a, o);
    return r;
  }
  r.output = o.output.empty() ? DefaultRestoredName(path) : StripSlashes(o.output);
  if (r.output.empty()) Fail("{}: the name does not end in .ckz; give the output with -o", path);
  if (o.dry_run) {
    CheckOutputFree(r.output, o.force);
    ArchiveVerifyResult v = VerifyArchive(a, o.threads);
    if (!v.problems.empty()) Fail("{}: {}", path, v.problems[0].what);
    return r;
  }
  if (index.kind == ckz::ArchiveKind::kFile) {
    RestoreFile(a, o, r.output, o.force);
  } else {
    RestoreFolder(a, o, r.output, o.force);
  }
  if (o.remove_input) {
    if (::unlink(path.c_str()) != 0) FailErrno(path, "restored, but the archive cannot be removed");
    r.removed = true;
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// Inspect and verify.

ArchiveVerifyResult VerifyArchive(const ckz::Archive& a, unsigned threads) {
  const Index& index = a.index();
  ArchiveVerifyResult r;
  std::vector<std::string> errors(index.chunks.size());
  std::vector<char> ok(index.chunks.size(), 0);
  ckz::DecodeLoop loop;
  loop.use = [&](size_t k, Bytes) { ok[k] = 1; };
  loop.on_error = [&](size_t k, const std::string& error) { errors[k] = error; };
  ckz::DecodeChunks(a, 0, index.chunks.size(), threads, loop);
  r.chunks = index.chunks.size();
  std::vector<bool> bad_file(index.entries.size(), false);
  for (size_t k = 0; k < errors.size(); ++k) {
    if (!ok[k]) {
      r.problems.push_back({a.DescribeChunk(k), errors[k]});
      bad_file[index.chunks[k].file] = true;
    } else {
      r.bytes += index.chunks[k].length;
    }
  }
  std::vector<uint32_t> crcs(index.chunks.size());
  for (size_t k = 0; k < crcs.size(); ++k) crcs[k] = index.chunks[k].crc;
  for (size_t i = 0; i < index.entries.size(); ++i) {
    const Entry& e = index.entries[i];
    if (e.type != EntryType::kFile || bad_file[i] || e.chunk_count == 0) continue;
    uint32_t crc = 0;
    for (uint64_t k = e.first_chunk; k < e.first_chunk + e.chunk_count; ++k)
      crc = k == e.first_chunk ? crcs[k] : Crc32Combine(crc, crcs[k], index.chunks[k].length);
    if (crc != e.crc) r.problems.push_back({e.path, "the file's checksum does not match"});
  }
  return r;
}

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
