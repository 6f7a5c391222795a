// Folders as the writers use them: made durable after a rename into them, and temp folders
// that go away unless handed on.
#pragma once

#include <string>
#include <utility>

namespace ckpt {

// fsync of a folder, so that a rename or removal in it survives a crash. Errors are ignored
// (some file systems cannot open a folder for fsync).
void SyncFolder(const std::string& path);

// Creates `dir` and the folders above it, as `mkdir -p` does, for the output `for_path`.
// Throws ckpt::Error("<for_path>: cannot create the folder <dir>: <reason>").
void CreateFolders(const std::string& dir, const std::string& for_path);

// Removes a temp folder (and what is in it) on the way out unless `keep` was set.
struct TempFolder {
  std::string path;
  bool keep = false;

  TempFolder() = default;
  explicit TempFolder(std::string p) : path(std::move(p)) {}
  TempFolder(TempFolder&& other) noexcept;  // the folder goes with it
  TempFolder& operator=(TempFolder&& other) noexcept;
  ~TempFolder();
};

}  // namespace ckpt
