#include "io/folders.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "base/error.h"

namespace ckpt {

void SyncFolder(const std::string& path) {
  int fd = ::open(path.empty() ? "." : path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void CreateFolders(const std::string& dir, const std::string& for_path) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec) return;
  if (ec.value() == ENOSPC || ec.value() == EDQUOT)
    Fail("{}: cannot create the folder {}: no space left on device", for_path, dir);
  Fail("{}: cannot create the folder {}: {}", for_path, dir, std::strerror(ec.value()));
}

TempFolder::TempFolder(TempFolder&& other) noexcept
    : path(std::move(other.path)), keep(other.keep) {
  other.path.clear();
}

TempFolder& TempFolder::operator=(TempFolder&& other) noexcept {
  if (this != &other) {
    TempFolder gone(std::move(*this));  // removes what this held
    path = std::move(other.path);
    keep = other.keep;
    other.path.clear();
  }
  return *this;
}

TempFolder::~TempFolder() {
  std::error_code ec;
  if (keep || path.empty()) return;
  // remove_all stops at the first error, such as a file another process removed meanwhile.
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::filesystem::remove_all(path, ec);
    if (!ec) return;
  }
}

}  // namespace ckpt
