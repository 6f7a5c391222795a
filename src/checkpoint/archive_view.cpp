#include "checkpoint/archive_view.h"

#include <filesystem>

#include "checkpoint/archive_restore.h"
#include "checkpoint/discovery.h"
#include "file/checkpoint_file.h"
#include "io/mapped_file.h"
#include "io/temp_files.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

// The name the held path gets: the original's, as the archive's name says it.
std::string HeldName(const std::string& archive) {
  std::string name = DefaultRestoredName(archive);
  return name.empty() ? "restored" : fs::path(name).filename().string();
}

}  // namespace

std::unique_ptr<ArchiveView> ArchiveView::Open(const std::string& archive, unsigned threads) {
  std::unique_ptr<ArchiveView> v(new ArchiveView());
  // Errors name the archive.
  v->volume_ = ckz::ArchiveVolume::Open(archive, (fs::path(archive) / HeldName(archive)).string(),
                                        threads ? threads : 1);
  v->root_ = v->volume_->root();
  return v;
}

std::unique_ptr<ArchiveView> ArchiveView::Restore(const std::string& archive,
                                                  const std::string& parent, unsigned threads) {
  std::unique_ptr<ArchiveView> v(new ArchiveView());
  CreateFolders(parent, archive);
  RemoveStaleTempsIn(parent);
  v->folder_.path = TempPathFor((fs::path(parent) / "archive").string());
  fs::create_directory(v->folder_.path);
  v->root_ = (fs::path(v->folder_.path) / HeldName(archive)).string();
  RestoreOptions o;
  o.threads = threads ? threads : 1;
  // Errors name the archive; every chunk's CRC is checked.
  RestoreArchive(ckz::Archive::Open(archive), v->root_, o);
  return v;
}

std::string ArchiveView::Relative(const std::string& path) const {
  fs::path base = fs::path(root()).parent_path();
  return fs::path(path).lexically_relative(base).string();
}

std::string ArchiveView::Rename(std::string text, const std::string& prefix) const {
  const std::string from = fs::path(root()).parent_path().string() + "/";
  const std::string& to = prefix;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

std::vector<Located> ArchiveView::Checkpoints() const {
  if (volume().IsFile(root()) && !DetectFormat(volume().Open(root()).bytes())) return {};
  return Locate(volume_, {root()});
}

}  // namespace ckpt
