#include "io/file_copy.h"

#include <filesystem>
#include <system_error>

#include "base/error.h"
#include "io/atomic_output.h"
#include "io/folders.h"
#include "io/temp_files.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

void CopyInto(const fs::path& src, const fs::path& dest) {
  fs::create_directory(dest);
  for (const fs::directory_entry& e : fs::directory_iterator(src)) {
    fs::path to = dest / e.path().filename();
    std::error_code ec;
    if (e.is_symlink(ec)) {
      fs::copy_symlink(e.path(), to);
    } else if (e.is_directory(ec)) {
      CopyInto(e.path(), to);
    } else if (e.is_regular_file(ec)) {
      CopyFileAtomically(MappedFile::Open(e.path().string()), to.string());
    }
  }
  std::error_code ec;
  fs::permissions(dest, fs::status(src).permissions(), ec);
  SyncFolder(dest.string());
}

}  // namespace

void CopyFolderAtomically(const std::string& src, const std::string& dest) {
  std::error_code ec;
  if (fs::exists(dest, ec) && !(fs::is_directory(dest, ec) && fs::is_empty(dest, ec))) {
    Fail("{}: exists and is not an empty folder", dest);
  }
  fs::path target = fs::absolute(dest).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  TempFolder tmp;
  tmp.path = TempPathFor(target.string());
  CopyInto(src, tmp.path);
  if (fs::exists(target, ec)) fs::remove(target, ec);  // an empty folder
  fs::rename(tmp.path, target);
  tmp.keep = true;
  SyncFolder(target.parent_path().string());
}

void CopyFileAtomically(const MappedFile& in, const std::string& dest) {
  AtomicOutput out = AtomicOutput::Create(dest, in.size());
  out.RequireUnchanged(in);
  out.CopyFrom(in, 0, 0, in.size());
  out.SetMode(in.mode(), in.uid(), in.gid());
  out.Commit();
}

}  // namespace ckpt
