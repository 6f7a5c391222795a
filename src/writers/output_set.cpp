#include "writers/output_set.h"

#include <fcntl.h>
#include <stdio.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>

#include "base/error.h"
#include "io/temp_files.h"

namespace ckpt {

namespace fs = std::filesystem;

bool IsModelSetFile(const std::string& name) {
  static const std::regex kSet(
      R"(model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json)");
  return std::regex_match(name, kSet);
}

namespace {

bool IsFileOutput(const std::string& to) {
  for (const char* ext : {".safetensors", ".pt", ".pth", ".bin", ".ckpt"}) {
    if (to.ends_with(ext)) return true;
  }
  return false;
}

// Does `folder` hold a model set? Throws when a name of the set is taken by something that is
// not a file (a folder, a device): replacing it would lose what is not ours.
bool HoldsModelSet(const fs::path& folder, const std::string& shown) {
  std::error_code ec;
  bool found = false;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    std::string name = e.path().filename().string();
    if (!IsModelSetFile(name)) continue;
    if (!e.is_regular_file(ec))
      Fail("{}: {} is not a file a model export wrote; not replacing it", shown, name);
    found = true;
  }
  return found;
}

fs::path FolderOf(const std::string& to) {
  fs::path dest = fs::absolute(to).lexically_normal();
  if (dest.filename().empty()) dest = dest.parent_path();
  return dest;
}

std::string Shown(std::string to) {
  while (to.size() > 1 && to.ends_with('/')) to.pop_back();
  return to;
}

}  // namespace

void OutputPlace::Check(const std::string& to, bool force, Kind kind) {
  std::error_code ec;
  if (kind == Kind::kModelSet && IsFileOutput(to)) {
    if (fs::exists(fs::symlink_status(to, ec)) && !force)
      Fail("{}: exists; --force replaces it", to);
    return;
  }
  fs::path dest = FolderOf(to);
  if (fs::exists(dest, ec) && !fs::is_directory(dest, ec))
    Fail("{}: exists and is not a folder", to);
  if (kind == Kind::kFolder) {
    if (fs::exists(dest, ec) && !force) Fail("{}: exists; --force replaces it", to);
    return;
  }
  if (fs::is_directory(dest, ec) && HoldsModelSet(dest, Shown(to)) && !force)
    Fail("{}: holds a model already; --force replaces it (the files beside it stay)", to);
}

OutputPlace::OutputPlace(const std::string& to, bool force, Kind kind)
    : to_(to), shown_(Shown(to)), kind_(kind) {
  Check(to, force, kind);
  folder_ = kind == Kind::kFolder || !IsFileOutput(to);
  if (!folder_) {
    write_to_ = to;  // a single file is replaced atomically by its writer
    return;
  }
  fs::path dest = FolderOf(to);
  fs::create_directories(dest.parent_path());
  RemoveStaleTempsIn(dest.parent_path().string());
  temp_.path = TempPathFor(dest.string());
  fs::create_directory(temp_.path);
  write_to_ = temp_.path;
  to_ = dest.string();
}

std::string OutputPlace::Unmasked(std::string message) const {
  if (!folder_) return message;
  for (size_t at = 0; (at = message.find(write_to_, at)) != std::string::npos;) {
    message.replace(at, write_to_.size(), shown_);
    at += shown_.size();
  }
  return message;
}

std::vector<std::string> OutputPlace::Commit(const std::vector<std::string>& written) {
  if (!folder_) return written;
  std::error_code ec;
  fs::path dest(to_);
  if (fs::is_directory(dest, ec)) {
    // Everything the destination holds besides its model set comes along (hard links; a copy
    // where the file system has none).
    for (const auto& e : fs::directory_iterator(dest)) {
      if (kind_ == Kind::kFolder) break;
      std::string name = e.path().filename().string();
      if (IsModelSetFile(name) || IsTempFileName(name)) continue;
      fs::path into = fs::path(temp_.path) / name;
      if (fs::exists(fs::symlink_status(into, ec))) continue;  // written anew (a config)
      if (e.is_regular_file(ec) && !e.is_symlink(ec)) {
        fs::create_hard_link(e.path(), into, ec);
        if (ec) fs::copy_file(e.path(), into);
      } else {
        fs::copy(e.path(), into, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
      }
    }
    fs::permissions(temp_.path, fs::status(dest).permissions(), ec);
    SyncFolder(temp_.path);
    if (::renameat2(AT_FDCWD, temp_.path.c_str(), AT_FDCWD, dest.c_str(), RENAME_EXCHANGE) != 0)
      Fail("{}: cannot swap in the new files: {} (nothing was replaced)", to_,
           std::strerror(errno));
    // temp_.path now holds the old folder; it goes when temp_ does.
  } else {
    fs::rename(temp_.path, dest);
    temp_.keep = true;
  }
  SyncFolder(dest.parent_path().string());
  std::vector<std::string> out;
  for (const std::string& w : written) {
    out.push_back((fs::path(shown_) / fs::path(w).filename()).string());
  }
  return out;
}

}  // namespace ckpt
