#include "checkpoint/archive_restore.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <mutex>

#include "base/error.h"
#include "checkpoint/archive_io.h"
#include "compress/pipeline.h"
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
using namespace archive_io;  // the archive code's shared plumbing (checkpoint/archive_io.h)

namespace {

// The mode a restored entry gets: the archived permission bits without set-user-ID and
// set-group-ID, which would turn a file from an archive into a program that runs as whoever
// restored it (the files belong to the user who decompresses).
mode_t RestoredMode(const Entry& e) {
  return static_cast<mode_t>(e.mode & ~(S_ISUID | S_ISGID));
}

// What is wrong with the checksum of the whole file `e` holds, which its chunks' checksums make
// (each chunk's is checked when it is decoded): "" when nothing is.
std::string FileChecksumProblem(const Index& index, const Entry& e) {
  if (e.chunk_count == 0) return e.crc == 0 ? "" : "the empty file's checksum is not 0";
  uint32_t crc = 0;
  for (uint64_t k = e.first_chunk; k < e.first_chunk + e.chunk_count; ++k) {
    const Chunk& ch = index.chunks[k];
    crc = k == e.first_chunk ? ch.crc : Crc32Combine(crc, ch.crc, ch.length);
  }
  return crc == e.crc ? "" : "the file's checksum does not match";
}

// Every file's checksum, once every chunk was decoded and checked.
void CheckFileCrcs(const ckz::Archive& a) {
  for (const Entry& e : a.index().entries) {
    if (e.type != EntryType::kFile) continue;
    std::string problem = FileChecksumProblem(a.index(), e);
    if (!problem.empty()) Fail("{}: {}: {}: the archive is damaged", a.name(), e.path, problem);
  }
}

// One-file archive into `out` (a temp file that becomes the destination).
void RestoreFile(const ckz::Archive& a, const RestoreOptions& o, const std::string& dest,
                 bool force) {
  const Index& index = a.index();
  const Entry& e = index.entries[0];
  if (!force) CheckOutputFree(dest, false);
  AtomicOutput out = AtomicOutput::Create(dest, e.size);
  if (!a.map().path().empty()) out.RequireUnchanged(a.map());
  ckz::DecodeLoop loop;
  loop.use = [&](size_t k, Bytes bytes) {
    const Chunk& ch = index.chunks[k];
    out.Write(ch.offset, bytes);
    if (o.bytes_done) *o.bytes_done += ch.length;
  };
  ckz::DecodeChunks(a, 0, index.chunks.size(), o.threads, loop);
  CheckFileCrcs(a);
  out.SetMode(RestoredMode(e), ::geteuid(), ::getegid());
  struct timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(e.mtime_ns)};
  if (::futimens(out.fd(), times) != 0) FailErrno(dest, "cannot set the modification time");
  out.Commit();
}

void StreamFile(const ckz::Archive& a, int fd, const RestoreOptions& o) {
  const Index& index = a.index();
  unsigned threads = std::max(1u, o.threads);
  std::vector<std::unique_ptr<ckz::ChunkCoder>> coders(threads);
  size_t window = threads * kSlotsPerThread;
  std::vector<std::vector<uint8_t>> slots(window);
  StreamSink sink(fd, fd == STDOUT_FILENO ? "stdout" : "the output");
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
        sink.Write(pos, {slots[slot].data(), ch.length});
        pos += ch.length;
        if (o.bytes_done) *o.bytes_done += ch.length;
      });
  CheckFileCrcs(a);
}

// A file being restored inside the temp folder: opened by the first chunk that needs it,
// finished (mode, mtime, fsync, close) by the last.
struct OpenFile {
  std::mutex mu;
  int fd = -1;
  std::atomic<uint64_t> pending{0};
};

void RestoreFolder(const ckz::Archive& a, const RestoreOptions& o, const std::string& dest,
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
  try {
    ckz::DecodeLoop loop;
    loop.use = [&](size_t k, Bytes bytes) {
      const Chunk& ch = index.chunks[k];
      const Entry& e = index.entries[ch.file];
      OpenFile& f = *files[ch.file];
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
  CheckFileCrcs(a);
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

void RestoreArchive(const ckz::Archive& a, const std::string& dest, const RestoreOptions& o) {
  if (a.index().kind == ckz::ArchiveKind::kFile) {
    RestoreFile(a, o, dest, o.force);
  } else {
    RestoreFolder(a, o, dest, o.force);
  }
}

void StreamArchive(const ckz::Archive& a, int fd, const RestoreOptions& o) {
  if (a.index().kind != ckz::ArchiveKind::kFile)
    Fail("{}: holds a folder; only a one-file archive streams", a.name());
  StreamFile(a, fd, o);
}

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
  for (size_t i = 0; i < index.entries.size(); ++i) {
    const Entry& e = index.entries[i];
    if (e.type != EntryType::kFile || bad_file[i]) continue;
    std::string problem = FileChecksumProblem(index, e);
    if (!problem.empty()) r.problems.push_back({e.path, problem});
  }
  return r;
}

std::string DefaultRestoredName(const std::string& archive) {
  std::string a = StripSlashes(archive);
  if (fs::path(a).filename().string() == ckz::kArchiveSuffix) return "";
  return ckz::WithoutArchiveSuffix(a);
}

}  // namespace ckpt
