#include "checkpoint/archive_io.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace ckpt::archive_io {

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

void CheckOutputFree(const std::string& out, bool force) {
  if (!force && PathExists(out)) Fail("{}: exists; --force replaces it", out);
}

void StreamSink::Write(uint64_t offset, Bytes data) {
  if (offset != pos_) Fail("internal: stream write at {} after {}", offset, pos_);
  while (!data.empty()) {
    ssize_t n = ::write(fd_, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) FailErrno(name_, "write failed");
    data = data.subspan(static_cast<size_t>(n));
    pos_ += static_cast<uint64_t>(n);
  }
}

}  // namespace ckpt::archive_io
