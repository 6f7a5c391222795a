// Folders as the writers use them: made durable after a rename into them, and temp folders
// that go away unless handed on.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ckpt {

// fsync of a folder, so that a rename or removal in it survives a crash. Errors are ignored
// (some file systems cannot open a folder for fsync).
void SyncFolder(const std::string& path);

// Creates `dir` and the folders above it, as `mkdir -p` does, for the output `for_path`.
// Throws ckpt::Error("<for_path>: cannot create the folder <dir>: <reason>").
void CreateFolders(const std::string& dir, const std::string& for_path);

// Output folders a command creates (`mkdir -p`): each folder that did not exist is removed
// again if it is still empty when the command ends, fails or is interrupted (SIGINT, SIGTERM,
// SIGHUP: io/temp_files.h), so a run that wrote nothing leaves no empty folder behind.
class CreatedFolders {
 public:
  CreatedFolders() = default;
  CreatedFolders(const CreatedFolders&) = delete;
  CreatedFolders& operator=(const CreatedFolders&) = delete;
  ~CreatedFolders();
  // CreateFolders(dir, for_path), remembering what it made.
  void Create(const std::string& dir, const std::string& for_path);
  // Something was put in place in them: they stay.
  void Keep();

 private:
  std::vector<std::pair<std::string, int>> made_;  // path, interrupt slot; outermost first
};

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
