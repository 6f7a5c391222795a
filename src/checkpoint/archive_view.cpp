#include "checkpoint/archive_view.h"

#include <filesystem>

#include "checkpoint/archive_restore.h"
#include "checkpoint/discovery.h"
#include "file/checkpoint_file.h"
#include "io/mapped_file.h"
#include "io/temp_files.h"

namespace ckpt {

namespace fs = std::filesystem;

std::unique_ptr<ArchiveView> ArchiveView::Prepare(const std::string& archive,
                                                  const std::string& parent) {
  std::unique_ptr<ArchiveView> v(new ArchiveView());
  CreateFolders(parent, archive);
  RemoveStaleTempsIn(parent);
  v->folder_.path = TempPathFor((fs::path(parent) / "archive").string());
  fs::create_directory(v->folder_.path);
  std::string name = DefaultRestoredName(archive);
  name = name.empty() ? "restored" : fs::path(name).filename().string();
  v->root_ = (fs::path(v->folder_.path) / name).string();
  return v;
}

std::unique_ptr<ArchiveView> ArchiveView::Open(const std::string& archive,
                                               const std::string& parent, unsigned threads) {
  std::unique_ptr<ArchiveView> v = Prepare(archive, parent);
  v->skeleton_ = ckz::Skeleton::Build(archive, v->root_, threads);  // errors name the archive
  return v;
}

std::unique_ptr<ArchiveView> ArchiveView::Restore(const std::string& archive,
                                                  const std::string& parent, unsigned threads) {
  std::unique_ptr<ArchiveView> v = Prepare(archive, parent);
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
  std::error_code ec;
  if (fs::is_regular_file(root(), ec)) {
    MappedFile m = MappedFile::Open(root());
    if (!DetectFormat(m.bytes())) return {};
  }
  return Locate({root()});
}

std::string ReadOnlyTempParent() {
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  return ec ? std::string(".") : tmp.string();
}

}  // namespace ckpt
