#include "io/positioned_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace ckpt {

void WriteFullyAt(int fd, Bytes data, uint64_t offset, const std::string& path,
                  std::string_view what) {
  while (!data.empty()) {
    ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      if (err == ENOSPC || err == EDQUOT) Fail("{}: {}: no space left on device", path, what);
      Fail("{}: {}: {}", path, what, std::strerror(err));
    }
    data = data.subspan(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
}

void ReadFullyAt(int fd, uint8_t* dst, uint64_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::pread(fd, dst, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail("{}: read failed: {}", path, std::strerror(errno));
    if (n == 0) {
      throw InputChanged(
          fmt::format("{}: the file was truncated while being read (by another process?)", path));
    }
    dst += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

}  // namespace ckpt
