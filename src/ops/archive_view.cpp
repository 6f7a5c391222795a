#include "ops/archive_view.h"

#include <filesystem>

#include "io/temp_files.h"
#include "ops/compress.h"

namespace ckpt {

namespace fs = std::filesystem;

std::unique_ptr<ArchiveView> ArchiveView::Open(const std::string& archive,
                                               const std::string& parent, unsigned threads) {
  std::unique_ptr<ArchiveView> v(new ArchiveView());
  fs::create_directories(parent);
  RemoveStaleTempsIn(parent);
  v->folder_.path = TempPathFor((fs::path(parent) / "archive").string());
  fs::create_directory(v->folder_.path);
  std::string name = DefaultRestoredName(archive);
  name = name.empty() ? "restored" : fs::path(name).filename().string();
  v->skeleton_ = ckz::Skeleton::Build(archive, (fs::path(v->folder_.path) / name).string(),
                                      threads);  // errors name the archive
  return v;
}

std::string ArchiveView::Relative(const std::string& path) const {
  fs::path base = fs::path(root()).parent_path();
  return fs::path(path).lexically_relative(base).string();
}

std::string ReadOnlyTempParent() {
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  return ec ? std::string(".") : tmp.string();
}

}  // namespace ckpt
