#include "jobs/archive_inputs.h"

#include <filesystem>

#include "base/error.h"
#include "compress/archive.h"

namespace ckpt::jobs {

namespace fs = std::filesystem;

ArchiveInputs::ArchiveInputs(std::vector<std::string>& paths, const std::string& output,
                             unsigned threads, const char* give) {
  for (std::string& p : paths) {
    if (!ckz::IsArchiveFile(p)) continue;
    if (output.empty()) {
      Fail(
          "{}: an archive is rewritten into a new checkpoint: give {} (ckptool decompress "
          "restores the original)",
          p, give);
    }
    fs::path out = fs::absolute(output).lexically_normal();
    if (!out.has_filename()) out = out.parent_path();  // "out/"
    views_.emplace_back(p, ArchiveView::Restore(p, out.parent_path().string(), threads));
    p = views_.back().second->root();
  }
}

std::string ArchiveInputs::Shown(std::string text) const {
  for (const auto& [archive, view] : views_) text = view->Rename(text, archive + ": ");
  return text;
}

}  // namespace ckpt::jobs
