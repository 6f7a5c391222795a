#include "engines/compress.h"

#include <unistd.h>

#include <filesystem>

#include "base/error.h"
#include "base/perf.h"
#include "checkpoint/archive_io.h"
#include "checkpoint/archive_restore.h"
#include "checkpoint/manifest.h"

namespace ckpt {

using ckz::Entry;
using ckz::EntryType;
using ckz::Index;
using namespace archive_io;  // the archive code's shared plumbing (checkpoint/archive_io.h)

DecompressResult DecompressArchive(const std::string& path, const DecompressOptions& o) {
  PerfTimer timer("decompress");
  DecompressResult r;
  r.input = path;
  ckz::Archive a = ckz::Archive::Open(path);
  const Index& index = a.index();
  r.archive_bytes = a.bytes().size();
  for (const Entry& e : index.entries) {
    if (e.type != EntryType::kFile) continue;
    r.restored_bytes += e.size;
    ++r.files;
  }
  if (o.to_stdout) {
    if (index.kind != ckz::ArchiveKind::kFile)
      Fail("{}: holds a folder; -c streams a one-file archive only", path);
    if (o.remove_input) throw UsageError("--rm cannot be used with -c");
    r.output.assign(1, '-');  // (= "-" trips GCC 12's false -Wrestrict once inlined)
    StreamArchive(a, STDOUT_FILENO, {o.threads, false, o.bytes_done});
    return r;
  }
  r.output = o.output.empty() ? DefaultRestoredName(path) : StripSlashes(o.output);
  if (r.output.empty()) Fail("{}: the name does not end in .ckz; give the output with -o", path);
  if (o.dry_run) {
    CheckOutputFree(r.output, o.force);
    ArchiveVerifyResult v = VerifyArchive(a, o.threads);
    if (!v.problems.empty()) Fail("{}: {}", path, v.problems[0].what);
    return r;
  }
  RestoreArchive(a, r.output, {o.threads, o.force, o.bytes_done});
  if (o.remove_input) {
    if (::unlink(path.c_str()) != 0) FailErrno(path, "restored, but the archive cannot be removed");
    r.removed = true;
    // The archive's own manifest beside it, if one was made, names a file that is gone.
    std::error_code ec;
    std::filesystem::remove(path + kManifestSuffix, ec);
  }
  return r;
}

}  // namespace ckpt
