#include "engines/reshard_folder.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "checkpoint/integrity.h"
#include "checkpoint/manifest.h"
#include "io/atomic_output.h"
#include "io/temp_files.h"

namespace ckpt::reshard {

namespace fs = std::filesystem;

fs::path Destination(const std::string& output, const std::string& fallback) {
  fs::path dest =
      fs::absolute(output.empty() ? fs::path(fallback) : fs::path(output)).lexically_normal();
  if (dest.filename().empty()) dest = dest.parent_path();
  return dest;
}

void RefuseOverlap(const fs::path& dest, const std::vector<std::string>& folders,
                   const std::string& shown) {
  const fs::path out = fs::weakly_canonical(dest);
  auto within = [](const fs::path& a, const fs::path& b) {  // a is b or below it
    auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
    return ib == b.end();
  };
  for (const std::string& folder : folders) {
    const fs::path source = fs::weakly_canonical(fs::absolute(folder));
    if (within(out, source) || within(source, out))
      Fail("{}: the output would be, or hold, the checkpoint {} itself; choose another -o", shown,
           folder);
  }
}

OutputFolder::OutputFolder(fs::path d, std::string s) : dest(std::move(d)), shown(std::move(s)) {
  std::error_code ec;
  replace = fs::exists(dest, ec);
}

void OutputFolder::CheckDestination(bool force) const {
  std::error_code ec;
  if (replace && !force) Fail("{}: exists (use --force to write it again)", shown);
  if (replace && !fs::is_directory(dest, ec)) Fail("{}: exists and is not a folder", shown);
}

void OutputFolder::Create(const std::string& checkpoint, unsigned threads) {
  RefuseDamaged(checkpoint, threads, "nothing written");
  created.Create(dest.parent_path().string(), shown);
  tmp = TempFolder(TempPathFor(dest.string()));
  fs::create_directory(tmp.path);
}

void RefuseFindings(const std::vector<std::string>& findings) {
  if (findings.empty()) return;
  Fail("{}{}; nothing written (the output would carry it)", findings.front(),
       findings.size() > 1 ? fmt::format(" (and {} more)", findings.size() - 1) : "");
}

void ShareFolder(const ReshardTeam& team, TempFolder& tmp, const std::string& error) {
  if (!team.decide) {
    if (!error.empty()) Fail("{}", error);
    return;
  }
  std::string decided = team.decide(nlohmann::json{{"folder", tmp.path}, {"error", error}}.dump());
  if (decided.empty()) Fail("rank 0 stopped before the output folder was laid out");
  nlohmann::json d = nlohmann::json::parse(decided);
  if (!d["error"].get<std::string>().empty()) Fail("{}", d["error"].get<std::string>());
  if (team.rank != 0) tmp.path = d["folder"].get<std::string>(), tmp.keep = true;  // rank 0's
}

bool ConfirmShares(const ReshardTeam& team, const std::string& error) {
  if (!team.confirm) {
    if (!error.empty()) Fail("{}", error);
    return true;
  }
  std::string first = team.confirm(error);
  if (!error.empty()) Fail("{}", error);
  if (team.rank != 0) return false;  // rank 0 puts the folder into place
  if (!first.empty()) Fail("{}", first);
  return true;
}

TreeTotals SyncTree(const std::string& folder) {
  TreeTotals t;
  std::vector<std::string> folders;
  for (const auto& e : fs::recursive_directory_iterator(folder)) {
    if (e.is_directory()) {
      folders.push_back(e.path().string());
    } else if (e.is_regular_file()) {
      t.bytes += e.file_size();
      ++t.files;
    }
  }
  std::sort(folders.rbegin(), folders.rend());  // the deepest first
  for (const std::string& f : folders) SyncFolder(f);
  SyncFolder(folder);
  return t;
}

void InstallFolder(TempFolder& tmp, const fs::path& dest, bool replace,
                   const std::vector<const MappedFile*>& inputs, const std::string& shown) {
  for (const MappedFile* in : inputs) {
    if (in->stamp().ChangedOnDisk())
      Fail("{}: the file changed while it was being read; nothing was written", in->path());
  }
  if (replace) {
    if (::renameat2(AT_FDCWD, tmp.path.c_str(), AT_FDCWD, dest.c_str(), RENAME_EXCHANGE) != 0)
      Fail("{}: cannot swap in the new folder: {} (nothing was replaced)", shown,
           std::strerror(errno));
  } else {
    fs::rename(tmp.path, dest);
    tmp.keep = true;
  }
  LogCommitForTests(dest.string());
  SyncFolder(dest.parent_path().string());
  RecordFolderWritten(dest.string());  // into a manifest of a folder holding it, if any
}

}  // namespace ckpt::reshard
