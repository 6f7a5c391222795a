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
#include "io/temp_files.h"

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

void CreatedFolders::Create(const std::string& dir, const std::string& for_path) {
  if (dir.empty()) return;
  // The folders that do not exist yet, outermost first.
  std::vector<std::string> missing;
  std::error_code ec;
  for (std::filesystem::path p = std::filesystem::absolute(dir, ec).lexically_normal();
       !p.empty() && !std::filesystem::exists(p, ec) && p != p.parent_path(); p = p.parent_path())
    missing.insert(missing.begin(), p.string());
  // Registered before they exist: an interrupt that lands between the mkdir and the
  // registration would otherwise leave the folder behind (rmdir of one not made yet is a no-op).
  for (std::string& m : missing) {
    int slot = RegisterCreatedFolder(m);
    made_.emplace_back(std::move(m), slot);
  }
  CreateFolders(dir, for_path);
}

void CreatedFolders::Keep() {
  for (auto& [path, slot] : made_) UnregisterTempFile(slot);
  made_.clear();
}

CreatedFolders::~CreatedFolders() {
  for (size_t i = made_.size(); i-- > 0;) {
    UnregisterTempFile(made_[i].second);
    std::error_code ec;
    if (std::filesystem::is_empty(made_[i].first, ec) && !ec)
      std::filesystem::remove(made_[i].first, ec);
  }
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
