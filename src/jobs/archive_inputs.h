// .ckz archives given to a rewriting job (convert, strip): each is restored bit for bit
// into a temp folder beside the command's output (the same file system), the command works on
// the original under its own name, and the folder goes whatever happens. What the command
// prints names "ARCHIVE: inner path", never the temp folder.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/archive_view.h"

namespace ckpt::jobs {

class ArchiveInputs {
 public:
  // Replaces each archive in `paths` by its restored original. `output` is the command's
  // output (-o or --output-dir); without one an archive is refused (ckpt::Error): the command
  // would rewrite a temp copy.
  // `give` names the options that set an output, for that message ("-o or --output-dir").
  ArchiveInputs(std::vector<std::string>& paths, const std::string& output, unsigned threads,
                const char* give);
  // `text` with every restored path shown as the archive's.
  std::string Shown(std::string text) const;

 private:
  std::vector<std::pair<std::string, std::unique_ptr<ArchiveView>>> views_;  // archive, view
};

}  // namespace ckpt::jobs
