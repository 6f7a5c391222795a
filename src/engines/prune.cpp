#include "engines/prune.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/names.h"
#include "checkpoint/discovery.h"
#include "checkpoint/integrity.h"
#include "checkpoint/manifest.h"
#include "compress/archive.h"
#include "dcp/dcp_checkpoint.h"
#include "engines/strip.h"
#include "file/checkpoint_file.h"
#include "io/atomic_output.h"
#include "io/temp_files.h"
#include "io/text_file.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTrashPrefix = ".ckptool-trash-";

uint64_t SizeOf(const fs::path& p) {
  std::error_code ec;
  if (fs::is_regular_file(fs::symlink_status(p, ec))) return fs::file_size(p, ec);
  uint64_t total = 0;
  for (fs::recursive_directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) total += it->file_size(ec);
  }
  return total;
}

// Names that something in ROOT points at.
std::set<std::string> Pointed(const fs::path& root, std::vector<std::string>& notes) {
  std::set<std::string> out;
  std::error_code ec;
  if (fs::is_regular_file(root / "latest", ec)) {
    std::string tag = ReadMarkerFile((root / "latest").string());
    out.insert(tag);
    notes.push_back(fmt::format("'latest' names {}", tag));
  }
  if (fs::is_regular_file(root / "latest_checkpointed_iteration.txt", ec)) {
    std::string it = ReadMarkerFile((root / "latest_checkpointed_iteration.txt").string());
    if (!it.empty() && std::all_of(it.begin(), it.end(), ::isdigit)) {
      std::string name = fmt::format("iter_{:07d}", std::stoull(it));
      out.insert(name);
      notes.push_back(fmt::format("latest_checkpointed_iteration.txt names {}", name));
    }
  }
  // HF Trainer: trainer_state.json at the top and in each checkpoint.
  std::vector<fs::path> states;
  if (fs::exists(root / "trainer_state.json", ec)) states.push_back(root / "trainer_state.json");
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.is_directory(ec) && !e.is_symlink(ec) &&
        fs::exists(e.path() / "trainer_state.json", ec)) {
      states.push_back(e.path() / "trainer_state.json");
    }
  }
  for (const fs::path& s : states) {
    try {
      nlohmann::json j = nlohmann::json::parse(ReadMarkerFile(s.string()));
      if (j.contains("best_model_checkpoint") && j["best_model_checkpoint"].is_string()) {
        std::string best =
            fs::path(j["best_model_checkpoint"].get<std::string>()).filename().string();
        if (out.insert(best).second)
          notes.push_back(fmt::format("best_model_checkpoint is {}", best));
      }
    } catch (const std::exception&) {
      notes.push_back(fmt::format("{}: unreadable, ignored", s.string()));
    }
  }
  // Symlinks inside ROOT (Lightning's last.ckpt) protect what they point at, if inside ROOT.
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (!e.is_symlink(ec)) continue;
    fs::path target = fs::read_symlink(e.path(), ec);
    if (target.is_relative()) target = root / target;
    fs::path canon = fs::weakly_canonical(target, ec);
    if (canon.parent_path() == fs::weakly_canonical(root, ec)) {
      out.insert(canon.filename().string());
      notes.push_back(
          fmt::format("{} links to {}", e.path().filename().string(), canon.filename().string()));
    }
  }
  return out;
}

}  // namespace

// A checkpoint looks complete when every checkpoint file in it opens cleanly (and a folder
// holds at least one, with no half-written temp files).
bool LooksComplete(const std::string& path, std::string* why) {
  fs::path p(path);
  std::vector<std::string> files;
  std::vector<std::string> dcp_folders;
  std::error_code ec;
  if (!ArchivedCheckpointName(p.filename().string()).empty() &&
      fs::is_regular_file(fs::symlink_status(p, ec))) {
    // A compressed checkpoint: complete when its index is whole (compress renames the archive
    // into place only once it is written; a copy still under way has no valid footer).
    try {
      ckz::Archive::Open(p.string());
      return true;
    } catch (const Error& e) {
      *why = e.what();
      return false;
    }
  }
  if (fs::is_directory(fs::symlink_status(p, ec))) {
    for (fs::recursive_directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
      if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
      std::string name = it->path().filename().string();
      if (IsTempFileName(name) || name.ends_with(".tmp")) {
        *why = "holds a temp file " + name;
        return false;
      }
    }
    // The one folder discovery: a torch.distributed.checkpoint folder is one checkpoint, its
    // .distcp items are not torch files.
    try {
      files = ExpandInputs({p.string()}, nullptr, &dcp_folders);
    } catch (const Error& e) {
      *why = e.what();
      return false;
    }
  } else {
    files.push_back(p.string());
  }
  int checkpoints = 0;
  for (const std::string& f : files) {
    try {
      MappedFile m = MappedFile::Open(f);
      if (!DetectFormat(m.bytes())) continue;
      ++checkpoints;
      CheckpointFile c = OpenCheckpoint(f);
      if (c.torch && !c.torch->model.problems.empty()) {
        *why =
            fmt::format("{}: {}", fs::path(f).filename().string(), c.torch->model.problems[0].what);
        return false;
      }
    } catch (const Error& e) {
      *why = e.what();
      return false;
    }
  }
  for (const std::string& d : dcp_folders) {
    try {
      dcp::Checkpoint c = dcp::OpenDcp(d);
      if (!c.problems.empty()) {
        *why = fmt::format("{}: {}: {}", d, c.problems[0].where, c.problems[0].what);
        return false;
      }
      ++checkpoints;
    } catch (const Error& e) {
      *why = e.what();
      return false;
    }
  }
  if (checkpoints == 0) {
    *why = "no checkpoint file inside";
    return false;
  }
  return true;
}

bool IsTrashName(const std::string& name) {
  return name.rfind(kTrashPrefix, 0) == 0;
}

// Rename first (atomic: the checkpoint's name is gone at once), then delete.
void TrashEntry(const std::string& dir, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    Fail("internal: '{}' is not an entry of {}; nothing deleted", name, dir);
  fs::path root(dir);
  fs::path trash = root / fmt::format("{}{}-{}", kTrashPrefix, name, ::getpid());
  std::error_code ec;
  NoteChanging();
  fs::rename(root / name, trash, ec);
  if (ec) Fail("{}: cannot delete it: {}; it is untouched", (root / name).string(), ec.message());
  fs::remove_all(trash, ec);
  if (ec) {
    Fail(
        "{}: renamed to {} for deletion, but deleting it failed: {}; the next prune --yes removes "
        "the rest",
        (root / name).string(), trash.filename().string(), ec.message());
  }
  // A file checkpoint's manifest beside it (checkpoint/manifest.h) goes with it: never left naming
  // bytes that are gone.
  fs::path sidecar = root / (name + kManifestSuffix);
  if (fs::is_regular_file(fs::symlink_status(sidecar, ec))) fs::remove(sidecar, ec);
}

namespace {

void StripKept(const fs::path& p, PruneEntry& e, const PruneOptions& o) {
  StripOptions so;
  so.threads = o.threads;
  std::vector<std::string> files;
  if (fs::is_directory(p)) {
    NoteChanging();
    for (const std::string& t : TrainingOnlyFiles(p.string())) {
      std::error_code ec;
      if (!RemoveOutputFile(t, ec) && ec != std::errc::no_such_file_or_directory)
        Fail("{}: could not delete this training-only file: {}", t, ec.message());
    }
    for (const std::string& f : ExpandInputs({p.string()})) files.push_back(f);
  } else {
    files.push_back(p.string());
  }
  for (const std::string& f : files) StripFile(f, so);
  e.stripped = true;
  e.bytes_after = SizeOf(p);
}

}  // namespace

std::string ArchivedCheckpointName(const std::string& name) {
  std::string stem = ckz::WithoutArchiveSuffix(name);
  return !stem.empty() && StepFromName(stem) >= 0 ? stem : "";
}

int64_t StepFromName(const std::string& name_arg) {
  std::string name = ckz::WithoutArchiveSuffix(name_arg);
  if (name.empty()) name = name_arg;
  static const std::vector<std::regex> patterns = {
      std::regex(R"(^global_step(\d+)$)"),
      std::regex(R"(^checkpoint-(\d+)$)"),
      std::regex(R"(^iter_(\d+)$)"),
      std::regex(R"((?:^|[-_])step=(\d+)(?:[-_.]|$))"),
      std::regex(R"(^(?:model|step|ckpt|checkpoint)[_-](\d+)(?:\.[A-Za-z0-9]+)?$)"),
  };
  std::smatch m;
  for (const std::regex& r : patterns) {
    if (std::regex_search(name, m, r) && m[1].length() <= 18) return std::stoll(m[1].str());
  }
  return -1;
}

namespace {

bool IntactForPrune(const std::string& path, unsigned threads, bool checksums, std::string* why) {
  std::vector<torch::Problem> damage = FindDamage(path, threads, checksums);
  if (damage.empty()) return true;
  *why = DescribeDamage(damage, path);
  return false;
}

}  // namespace

PruneResult Prune(const std::string& root_arg, const PruneOptions& o) {
  PruneResult r = PlanPrune(root_arg, o);
  if (r.entries.empty())
    Fail("{}: no recognisable checkpoints (global_stepN, checkpoint-N, iter_N, step=N...)",
         root_arg);
  if (o.yes) ExecutePrune(root_arg, r, o);
  return r;
}

PruneResult PlanPrune(const std::string& root_arg, const PruneOptions& o,
                      const CompletenessTest& complete, const CompletenessTest& intact) {
  if (o.keep_last < 1)
    throw UsageError("--keep-last must be at least 1: ckptool never deletes every checkpoint");
  fs::path root(root_arg);
  if (!fs::is_directory(root)) Fail("{}: not a folder", root_arg);
  PruneResult r;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string name = e.path().filename().string();
    if (IsTrashName(name)) {
      r.notes.push_back(
          fmt::format("{}: left by an interrupted prune{}", name, o.yes ? "; removed" : ""));
      continue;
    }
    if (e.is_symlink(ec)) continue;      // never followed; its target is protected below
    if (IsManifestName(name)) continue;  // a file checkpoint's manifest goes with it
    int64_t step = StepFromName(name);
    bool latest_copy = step < 0 && IsLastCheckpointName(name) && e.is_regular_file(ec);
    if (step < 0 && !latest_copy) continue;
    PruneEntry pe;
    pe.name = name;
    pe.latest_copy = latest_copy;
    pe.step = latest_copy ? UINT64_MAX : static_cast<uint64_t>(step);
    pe.bytes = SizeOf(e.path());
    pe.archive = !ArchivedCheckpointName(name).empty() && e.is_regular_file(ec);
    std::string why;
    pe.complete =
        complete ? complete(e.path().string(), &why) : LooksComplete(e.path().string(), &why);
    if (!pe.complete) pe.reason = "looks incomplete (" + why + "): left alone";
    r.entries.push_back(std::move(pe));
  }
  // A checkpoint kept beside its archive (compress without --rm, or a run stopped between
  // writing the archive and removing the original) is one checkpoint: counted once, judged by
  // the original, deleted together.
  {
    std::map<std::string, size_t> by_name;
    for (size_t i = 0; i < r.entries.size(); ++i) by_name[r.entries[i].name] = i;
    std::vector<bool> merged(r.entries.size(), false);
    for (size_t i = 0; i < r.entries.size(); ++i) {
      if (!r.entries[i].archive) continue;
      auto orig = by_name.find(ArchivedCheckpointName(r.entries[i].name));
      if (orig == by_name.end()) continue;
      PruneEntry& original = r.entries[orig->second];
      original.also.push_back(r.entries[i].name);
      original.bytes += r.entries[i].bytes;
      merged[i] = true;
    }
    size_t k = 0;
    for (size_t i = 0; i < r.entries.size(); ++i) {
      if (merged[i]) continue;
      if (k != i) r.entries[k] = std::move(r.entries[i]);
      ++k;
    }
    r.entries.resize(k);
  }
  // Numeric order by step; ties by modification time.
  std::sort(r.entries.begin(), r.entries.end(), [&](const PruneEntry& a, const PruneEntry& b) {
    if (a.step != b.step) return a.step < b.step;
    return fs::last_write_time(root / a.name, ec) < fs::last_write_time(root / b.name, ec);
  });
  std::set<std::string> pointed = Pointed(root, r.notes);
  uint64_t newest_seen = 0;
  for (size_t i = r.entries.size(); i-- > 0;) {
    PruneEntry& e = r.entries[i];
    if (!e.complete) {
      e.keep = true;
      continue;
    }
    if (e.latest_copy) {
      e.keep = true;
      e.reason = "Lightning's last checkpoint (what fit(ckpt_path=\"last\") resumes from)";
      continue;
    }
    // Would it count among the newest kept? Only if it verifies.
    if (newest_seen < o.keep_last) {
      std::string why;
      std::string path = (root / e.name).string();
      bool ok = intact ? intact(path, &why) : IntactForPrune(path, o.threads, o.checksums, &why);
      if (!ok) {
        e.keep = true;
        e.damaged = true;
        e.reason = fmt::format("damaged ({}): kept as it is, not counted", why);
        continue;
      }
    }
    ++newest_seen;
    if (newest_seen == 1) {
      e.keep = true;
      e.reason = "newest complete checkpoint";
    } else if (newest_seen <= o.keep_last) {
      e.keep = true;
      e.reason = fmt::format("among the newest {}", o.keep_last);
    } else if (pointed.count(e.name) ||
               (e.archive && pointed.count(ArchivedCheckpointName(e.name)))) {
      e.keep = true;
      e.reason = "pointed at (latest / best / symlink)";
    } else if (o.keep_every && e.step % o.keep_every == 0) {
      e.keep = true;
      e.reason = fmt::format("step is a multiple of {}", o.keep_every);
    } else if (MatchesAnyGlob(o.keep, e.name)) {
      e.keep = true;
      e.reason = "matches --keep";
    } else {
      e.reason = "older than the newest kept";
    }
    if (e.keep && !e.archive && o.strip_older && newest_seen > o.strip_older)
      e.reason += "; optimizer state stripped";
  }
  for (PruneEntry& e : r.entries) {
    if (!e.keep) r.bytes_freed += e.bytes;
  }
  return r;
}

void ExecutePrune(const std::string& root_arg, PruneResult& r, const PruneOptions& o) {
  fs::path root(root_arg);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (IsTrashName(e.path().filename().string())) fs::remove_all(e.path(), ec);
  }
  // A folder this user may not change fails here, before anything is deleted.
  bool deletes =
      std::any_of(r.entries.begin(), r.entries.end(), [](const PruneEntry& e) { return !e.keep; });
  if (deletes && ::faccessat(AT_FDCWD, root.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    Fail("{}: cannot delete checkpoints in this folder ({}); nothing was deleted", root_arg,
         std::strerror(errno));
  }
  for (PruneEntry& e : r.entries) {
    if (e.keep) continue;
    for (const std::string& a : e.also) TrashEntry(root_arg, a);
    TrashEntry(root_arg, e.name);
  }
  if (o.strip_older) {
    uint64_t seen = 0;
    for (size_t i = r.entries.size(); i-- > 0;) {
      PruneEntry& e = r.entries[i];
      if (!e.keep || !e.complete || e.latest_copy || e.damaged) continue;
      if (++seen > o.strip_older && !e.archive) StripKept(root / e.name, e, o);
    }
  }
}

bool IsLastCheckpointName(const std::string& name) {
  if (name == "last.ckpt") return true;
  if (!name.starts_with("last-v") || !name.ends_with(".ckpt")) return false;
  std::string_view digits = std::string_view(name).substr(6, name.size() - 6 - 5);
  return !digits.empty() &&
         std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace ckpt
