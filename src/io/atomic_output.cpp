#include "io/atomic_output.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

#include "base/error.h"
#include "base/human.h"
#include "base/interrupt.h"
#include "io/folders.h"
#include "io/positioned_io.h"
#include "io/temp_files.h"

namespace ckpt {

namespace {

std::string DirOf(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

[[noreturn]] void FailErrno(const std::string& path, std::string_view what, int err) {
  if (err == ENOSPC || err == EDQUOT) Fail("{}: {}: no space left on device", path, what);
  Fail("{}: {}: {}", path, what, std::strerror(err));
}

// Bytes free for an unprivileged writer in the folder holding `path`.
uint64_t FreeSpaceFor(const std::string& path) {
  struct statvfs st {};
  if (::statvfs(DirOf(path).c_str(), &st) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

// The file that writing `path` replaces, or `path` when nothing is there yet. A symlink is
// followed, so a link such as Lightning's last.ckpt keeps pointing at the (now smaller) file
// instead of becoming a copy of it. An existing file is replaced only if this user could
// write it in place: rename() needs only the folder's permission, and a read-only
// checkpoint (or one owned by someone else) is not silently swapped behind its mode bits.
std::string ReplacedFile(const std::string& path, bool* exists) {
  struct stat st {};
  *exists = false;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return path;
    FailErrno(path, "cannot stat", errno);
  }
  std::string target = path;
  if (S_ISLNK(st.st_mode)) {
    std::unique_ptr<char, decltype(&std::free)> real(::realpath(path.c_str(), nullptr), &std::free);
    if (!real) FailErrno(path, "cannot follow the symlink", errno);
    target = real.get();
    if (::stat(target.c_str(), &st) != 0) FailErrno(path, "cannot stat", errno);
  }
  if (!S_ISREG(st.st_mode)) Fail("{}: not a regular file; nothing was replaced", path);
  if (::faccessat(AT_FDCWD, target.c_str(), W_OK, AT_EACCESS) != 0) {
    Fail("{}: no permission to replace it ({}); nothing was replaced", path, std::strerror(errno));
  }
  *exists = true;
  return target;
}

}  // namespace

namespace {
std::atomic<ReplaceHook> g_before_replace{nullptr};
std::atomic<ReplaceHook> g_after_replace{nullptr};
std::atomic<ReplaceHook> g_removed{nullptr};
}  // namespace

void SetReplaceHooks(ReplaceHook before, ReplaceHook after) {
  g_before_replace = before;
  g_after_replace = after;
}

void SetRemoveHook(ReplaceHook removed) {
  g_removed = removed;
}

bool RemoveOutputFile(const std::string& path, std::error_code& ec) {
  ec.clear();
  if (!std::filesystem::remove(path, ec)) {
    if (!ec) ec = std::make_error_code(std::errc::no_such_file_or_directory);
    return false;
  }
  if (ReplaceHook removed = g_removed.load()) removed(path);
  return true;
}

AtomicOutput AtomicOutput::Create(const std::string& path, uint64_t size) {
  InstallInterruptHandlers();
  AtomicOutput out;
  out.final_path_ = ReplacedFile(path, &out.replaces_);
  const std::string& final_path = out.final_path_;
  // Every command creates the folders an output needs, as `mkdir -p` would; an output that
  // is never put in place takes the folders it made (if empty) with it.
  out.made_ = std::make_unique<CreatedFolders>();
  out.made_->Create(DirOf(final_path), path);
  RemoveStaleTempFiles(final_path);  // first: a killed run's temp file may hold the space
  uint64_t free_bytes = FreeSpaceFor(final_path);
  if (free_bytes < size) {
    Fail("{}: the output needs {} but only {} is free there", path, HumanBytes(size),
         HumanBytes(free_bytes));
  }
  out.temp_path_ = TempPathFor(final_path);
  out.fd_ = ::open(out.temp_path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (out.fd_ < 0)
    FailErrno(path, fmt::format("cannot create a file in {}", DirOf(final_path)), errno);
  out.slot_ = RegisterTempFile(out.temp_path_);
  if (size > 0) {
    // Reserve the blocks so a full disk fails now, not half-way. tmpfs is the exception:
    // there fallocate zero-fills every page up front (as mold notes, ~1.8 s for 5 GiB),
    // and the free-space check above already covers it.
    struct statfs fs {};
    bool tmpfs = ::fstatfs(out.fd_, &fs) == 0 && fs.f_type == TMPFS_MAGIC;
    int rc = tmpfs ? EOPNOTSUPP : ::posix_fallocate(out.fd_, 0, static_cast<off_t>(size));
    if (rc == EOPNOTSUPP || rc == EINVAL)
      rc = ::ftruncate(out.fd_, static_cast<off_t>(size)) ? errno : 0;
    if (rc != 0) FailErrno(path, "cannot reserve space for the output", rc);
  }
  return out;
}

AtomicOutput::AtomicOutput(AtomicOutput&& other) noexcept
    : final_path_(std::move(other.final_path_)),
      replaces_(other.replaces_),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      slot_(std::exchange(other.slot_, -1)),
      committed_(std::exchange(other.committed_, true)),
      mode_set_(other.mode_set_),
      dirty_(other.dirty_.load()),
      inputs_(std::move(other.inputs_)),
      made_(std::move(other.made_)) {}

AtomicOutput::~AtomicOutput() {
  Discard();
}

void AtomicOutput::Discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
  UnregisterTempFile(slot_);
  slot_ = -1;
  if (made_ && committed_) made_->Keep();
  made_.reset();  // not committed: the folders it made go, if nothing else is in them
}

namespace {

thread_local AtomicOutput::Staged* t_staged = nullptr;
// The staging buffer, kept by the thread for the next run.
thread_local std::vector<uint8_t> t_stage_buffer;
thread_local AtomicOutput::CheckedWrites* t_checked = nullptr;

}  // namespace

AtomicOutput::CheckedWrites::CheckedWrites(AtomicOutput& out) : out_(out), outer_(t_checked) {
  t_checked = this;
}

AtomicOutput::CheckedWrites::~CheckedWrites() {
  t_checked = outer_;
}

AtomicOutput::Staged::Staged(AtomicOutput& out, uint64_t offset, uint64_t size)
    : out_(out), offset_(offset), size_(size), outer_(t_staged) {
  if (t_stage_buffer.size() < size) t_stage_buffer.resize(size);
  t_staged = this;
}

AtomicOutput::Staged::~Staged() {
  t_staged = outer_;
}

uint8_t* AtomicOutput::Staged::Take(uint64_t offset, uint64_t size) {
  if (offset < offset_ || size > size_ || offset - offset_ > size_ - size) return nullptr;
  uint64_t begin = offset - offset_, end = begin + size;
  if (!runs_.empty() && runs_.back().second == begin) {
    runs_.back().second = end;
  } else {
    runs_.emplace_back(begin, end);
  }
  return t_stage_buffer.data() + begin;
}

void AtomicOutput::Staged::Flush() {
  t_staged = outer_;  // what follows goes to the file
  std::sort(runs_.begin(), runs_.end());
  for (size_t i = 0; i < runs_.size();) {
    uint64_t begin = runs_[i].first, end = runs_[i].second;
    for (++i; i < runs_.size() && runs_[i].first <= end; ++i) end = std::max(end, runs_[i].second);
    out_.Write(offset_ + begin, Bytes(t_stage_buffer.data() + begin, end - begin));
  }
  runs_.clear();
}

void AtomicOutput::Write(uint64_t offset, Bytes data) {
  CheckInterrupt();
  dirty_ = true;
  if (t_staged != nullptr && &t_staged->out_ == this) {
    if (uint8_t* at = t_staged->Take(offset, data.size())) {
      NotChecked();  // the bytes reach the file at Flush
      if (!data.empty()) std::memcpy(at, data.data(), data.size());
      return;
    }
  }
  WriteFullyAt(fd_, data, offset, final_path_, "writing the new file failed");
  if (Checked()) CheckWritten(offset, data);
}

void AtomicOutput::CopyFrom(const MappedFile& in, uint64_t in_offset, uint64_t offset,
                            uint64_t size) {
  dirty_ = true;
  if (t_staged != nullptr && &t_staged->out_ == this) {
    if (uint8_t* at = t_staged->Take(offset, size)) {
      NotChecked();
      MappedFile::Window w(in, in_offset, size);
      if (size > 0) std::memcpy(at, w.bytes().data(), size);
      return;
    }
  }
  if (size > 0) NotChecked();  // the kernel copies
  if (in.fd() < 0) {
    // No descriptor for the kernel to copy from (a .ckz archive's member, a file in memory):
    // its bytes come through windows.
    constexpr uint64_t kWindow = uint64_t{4} << 20;
    while (size > 0) {
      CheckInterrupt();
      uint64_t n = std::min(size, kWindow);
      MappedFile::Window w(in, in_offset, n);
      Write(offset, w.bytes());
      in_offset += n;
      offset += n;
      size -= n;
    }
    return;
  }
  const int in_fd = in.fd();
  constexpr uint64_t kPiece = uint64_t{64} << 20;  // an interrupt is seen between pieces
  while (size > 0) {
    CheckInterrupt();
    off_t from = static_cast<off_t>(in_offset), to = static_cast<off_t>(offset);
    ssize_t n = ::copy_file_range(in_fd, &from, fd_, &to, std::min(size, kPiece), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // unsupported here, or a short source: fall back below
    in_offset += static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
  constexpr size_t kBuf = 1 << 20;
  std::unique_ptr<uint8_t[]> buf;
  while (size > 0) {
    if (!buf) buf = std::make_unique<uint8_t[]>(kBuf);
    size_t want = static_cast<size_t>(std::min<uint64_t>(kBuf, size));
    ssize_t n = ::pread(in_fd, buf.get(), want, static_cast<off_t>(in_offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) FailErrno(final_path_, "reading the input failed", n < 0 ? errno : EIO);
    Write(offset, Bytes(buf.get(), static_cast<size_t>(n)));
    in_offset += static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
}

bool AtomicOutput::Checked() const {
  for (const CheckedWrites* c = t_checked; c != nullptr; c = c->outer_) {
    if (&c->out_ == this) return true;
  }
  return false;
}

void AtomicOutput::NotChecked() {
  for (CheckedWrites* c = t_checked; c != nullptr; c = c->outer_) {
    if (&c->out_ == this) c->all_checked_ = false;
  }
}

void AtomicOutput::CheckWritten(uint64_t offset, Bytes written) const {
  thread_local std::vector<uint8_t> buffer;
  constexpr size_t kBuffer = 256 << 10;
  for (size_t done = 0; done < written.size();) {
    size_t n = std::min(kBuffer, written.size() - done);
    if (buffer.size() < n) buffer.resize(n);
    ReadFullyAt(fd_, buffer.data(), n, offset + done, temp_path_);
    if (std::memcmp(buffer.data(), written.data() + done, n) != 0) {
      Fail("{}: bytes {}..{} of the new file read back differently than they were written",
           temp_path_, offset + done, offset + done + n);
    }
    done += n;
  }
}

void AtomicOutput::Truncate(uint64_t size) {
  dirty_ = true;
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
    FailErrno(final_path_, "cannot set the new file's size", errno);
}

void AtomicOutput::Sync() {
  if (::fsync(fd_) != 0) FailErrno(final_path_, "fsync of the new file failed", errno);
  dirty_ = false;
}

namespace {

mode_t DefaultMode() {
  static const mode_t mode = [] {
    mode_t mask = ::umask(022);  // read the umask (once, at first use) ...
    ::umask(mask);               // ... and put it back
    return static_cast<mode_t>(0666 & ~mask);
  }();
  return mode;
}

}  // namespace

void AtomicOutput::SetMode(mode_t mode, uid_t uid, gid_t gid) {
  mode_set_ = true;
  dirty_ = true;
  if (::fchown(fd_, uid, gid) != 0 && errno != EPERM) FailErrno(final_path_, "chown failed", errno);
  if (::fchmod(fd_, mode & 07777) != 0) FailErrno(final_path_, "chmod failed", errno);
}

void AtomicOutput::SetDefaultMode() {
  if (::fchmod(fd_, DefaultMode()) != 0) FailErrno(final_path_, "chmod failed", errno);
  mode_set_ = true;
  dirty_ = true;
}

void LogCommitForTests(const std::string& path) {
  const char* dir = std::getenv("CKPT_TEST_COMMIT_LOG");
  if (!dir || !*dir) return;
  std::string log = std::string(dir) + "/" + std::to_string(::getpid()) + ".log";
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  std::string line = path + "\n";
  [[maybe_unused]] ssize_t n = ::write(fd, line.data(), line.size());  // O_APPEND: one write
  ::close(fd);
}

void AtomicOutput::BeforeReplace() const {
  ReplaceHook before = g_before_replace.load();
  if (!before) return;
  // A rewrite in place reads the file it replaces: the hook vets those bytes. An output that
  // names its inputs and reads none of them from here (decompress -f over a damaged file) is
  // no rewrite of this file.
  struct stat st {};
  bool in_place = inputs_.empty();
  if (::stat(final_path_.c_str(), &st) == 0) {
    for (const MappedFile::Stamp& input : inputs_) in_place |= input.inode == st.st_ino;
  }
  if (in_place) before(final_path_);
}

void AtomicOutput::Commit() {
  for (const MappedFile::Stamp& input : inputs_) {
    if (!input.ChangedOnDisk()) continue;
    if (replaces_)
      Fail("{}: the file changed while it was being processed; nothing was replaced", input.path);
    Fail("{}: the file changed while it was being processed; {} was not written", input.path,
         final_path_);
  }
  if (replaces_) BeforeReplace();
  if (!mode_set_) SetDefaultMode();
  if (dirty_) Sync();
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    FailErrno(final_path_, "cannot replace", errno);
  }
  committed_ = true;
  LogCommitForTests(final_path_);
  std::string dir = DirOf(final_path_);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  Discard();
  if (ReplaceHook after = g_after_replace.load()) after(final_path_);
}

}  // namespace ckpt
