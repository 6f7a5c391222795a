#include "policy/completeness.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "base/names.h"
#include "dcp/dcp_checkpoint.h"
#include "engines/prune.h"
#include "io/text_file.h"

namespace ckpt::policy {

namespace fs = std::filesystem;

namespace {

bool AllDigits(const std::string& s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// The access mode of an open file descriptor, from /proc/<pid>/fdinfo/<fd> ("flags: 0100001").
bool OpenForWriting(const std::string& pid, const char* fd) {
  std::ifstream in("/proc/" + pid + "/fdinfo/" + fd);
  std::string key;
  while (in >> key) {
    if (key == "flags:") {
      std::string octal;
      in >> octal;
      long flags = std::strtol(octal.c_str(), nullptr, 8);
      int mode = static_cast<int>(flags & O_ACCMODE);
      return mode == O_WRONLY || mode == O_RDWR;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return false;
}

std::string Comm(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/comm");
  std::string comm;
  std::getline(in, comm);
  return comm;
}

bool IsTorchSuffix(const std::string& name) {
  return name.ends_with(".ckpt");
}

}  // namespace

std::map<ino_t, std::string> FilesOpenForWriting(dev_t dev) {
  std::map<ino_t, std::string> out;
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  std::string self = std::to_string(::getpid());
  while (dirent* p = ::readdir(proc)) {
    std::string pid = p->d_name;
    if (!AllDigits(pid) || pid == self) continue;
    int fds = ::open(("/proc/" + pid + "/fd").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fds < 0) continue;  // gone, or another user's process
    DIR* d = ::fdopendir(fds);
    if (!d) {
      ::close(fds);
      continue;
    }
    while (dirent* f = ::readdir(d)) {
      if (f->d_name[0] == '.') continue;
      struct stat st {};
      if (::fstatat(fds, f->d_name, &st, 0) != 0) continue;  // follows the link to the file
      if (!S_ISREG(st.st_mode) || st.st_dev != dev || out.count(st.st_ino)) continue;
      if (OpenForWriting(pid, f->d_name)) {
        out[st.st_ino] = fmt::format("pid {} ({})", pid, Comm(pid));
      }
    }
    ::closedir(d);
  }
  ::closedir(proc);
  return out;
}

Completeness::Completeness(std::string root, const Options& options)
    : root_(std::move(root)), o_(options) {
  struct stat st {};
  if (::stat(root_.c_str(), &st) == 0) dev_ = st.st_dev;
}

void Completeness::BeginPass() {
  std::error_code ec;
  fs::path root(root_);
  have_latest_ = fs::is_regular_file(root / "latest", ec);
  latest_ = have_latest_ ? ReadMarkerFile((root / "latest").string()) : "";
  have_megatron_ = fs::is_regular_file(root / "latest_checkpointed_iteration.txt", ec);
  megatron_ =
      have_megatron_ ? ReadMarkerFile((root / "latest_checkpointed_iteration.txt").string()) : "";
  writers_ = FilesOpenForWriting(dev_);
  // Forget checkpoints that are gone (a watch runs for weeks).
  std::erase_if(
      seen_, [&](const auto& kv) { return !fs::exists(fs::symlink_status(root / kv.first, ec)); });
  std::erase_if(parsed_, [&](const auto& kv) {
    return !fs::exists(fs::symlink_status(root / kv.first, ec));
  });
  stats_.clear();
  layouts_.clear();
  next_settle_.reset();
}

std::string Completeness::MarkerMissing(const std::string& name, bool folder, int64_t step,
                                        std::string* layout) const {
  fs::path p = fs::path(root_) / name;
  std::error_code ec;
  std::vector<Layout> markers;
  if (o_.layout != Layout::kAuto) {
    markers.push_back(o_.layout);
    if (o_.layout != Layout::kPlain && o_.layout != Layout::kDcp && folder)
      markers.push_back(Layout::kDcp);  // a folder of .distcp files is never complete without
                                        // its .metadata
  } else if (!folder) {
    markers.push_back(IsTorchSuffix(name) ? Layout::kLightning : Layout::kPlain);
  } else {
    bool hf = name.starts_with("checkpoint-");
    bool deepspeed = name.starts_with("global_step");
    if (!hf && !deepspeed && !name.starts_with("iter_")) {
      for (const auto& e : fs::directory_iterator(p, ec)) {
        std::string f = e.path().filename().string();
        if (f.ends_with("_model_states.pt") || f.ends_with("_optim_states.pt")) deepspeed = true;
      }
    }
    if (hf) markers.push_back(Layout::kHfTrainer);
    if (deepspeed && !hf) markers.push_back(Layout::kDeepSpeed);
    if (name.starts_with("iter_")) markers.push_back(Layout::kMegatron);
    markers.push_back(Layout::kDcp);
  }
  std::string missing;
  std::vector<std::string> names;
  for (Layout l : markers) {
    std::string why;
    switch (l) {
      case Layout::kDeepSpeed: {
        names.push_back("deepspeed");
        if (!have_latest_) {
          why = "DeepSpeed's 'latest' is not written yet";
        } else if (latest_ != name && StepFromName(latest_) < step) {
          why = fmt::format("DeepSpeed's 'latest' names {}, not this tag or a newer one",
                            latest_.empty() ? "nothing" : "'" + latest_ + "'");
        }
        break;
      }
      case Layout::kHfTrainer:
        names.push_back("hf-trainer");
        if (!folder || !fs::is_regular_file(p / "trainer_state.json", ec))
          why = "trainer_state.json is not written yet";
        break;
      case Layout::kMegatron:
        names.push_back("megatron");
        if (!have_megatron_) {
          why = "latest_checkpointed_iteration.txt is not written yet";
        } else if (!AllDigits(megatron_) || std::stoll(megatron_) < step) {
          why = fmt::format("latest_checkpointed_iteration.txt says '{}', not {} or later",
                            megatron_, step);
        }
        break;
      case Layout::kDcp: {
        if (!folder) break;
        // Every folder holding .distcp files must also hold the metadata.
        std::vector<fs::path> dirs = {p};
        for (fs::recursive_directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
          if (it->is_directory(ec) && !it->is_symlink(ec)) dirs.push_back(it->path());
        }
        for (const fs::path& d : dirs) {
          bool distcp = false;
          for (const auto& e : fs::directory_iterator(d, ec)) {
            if (e.path().extension() == ".distcp") distcp = true;
          }
          if (!distcp) continue;
          if (std::find(names.begin(), names.end(), "dcp") == names.end()) names.push_back("dcp");
          if (!dcp::LooksLikeDcpCheckpoint(d.string())) {
            why = fmt::format("{}: .distcp files without .metadata (not written yet)",
                              d.lexically_relative(root_).string());
            break;
          }
        }
        if (o_.layout == Layout::kDcp && names.empty()) why = "no .distcp files (layout = \"dcp\")";
        break;
      }
      case Layout::kLightning:
        names.push_back("lightning");
        break;
      case Layout::kPlain:
        names.push_back(folder ? "plain" : "file");
        break;
      case Layout::kAuto:
        break;
    }
    if (missing.empty() && !why.empty()) missing = why;
  }
  if (names.empty()) names.push_back("plain");
  std::string joined;
  for (const std::string& n : names) joined += (joined.empty() ? "" : "+") + n;
  *layout = joined;
  return missing;
}

bool Completeness::Complete(const std::string& path, std::string* why) {
  std::string name = fs::path(path).filename().string();
  std::error_code ec;
  bool folder = fs::is_directory(fs::symlink_status(path, ec));
  std::string layout = "ckz";
  // A compressed checkpoint (NAME.ckz) has no framework marker: compress renamed it into place
  // once written, and LooksComplete reads its index.
  bool archive = !folder && !ArchivedCheckpointName(name).empty();
  std::string missing = archive ? "" : MarkerMissing(name, folder, StepFromName(name), &layout);
  layouts_[name] = layout;
  std::vector<std::string> exclude;
  if (o_.outputs_inside) exclude = o_.outputs_inside(name);
  Fingerprint stat = StatCheckpoint(root_, name, exclude);
  stats_[name] = stat;
  // Our own observations (watch): reset the clock whenever anything changed.
  auto now = std::chrono::steady_clock::now();
  auto [seen, fresh] = seen_.try_emplace(name, Seen{stat, now});
  if (!fresh && !SameStat(seen->second.stat, stat)) seen->second = Seen{stat, now};
  if (!missing.empty()) {
    *why = missing;
    return false;
  }
  if (stat.empty()) {
    *why = "nothing inside";
    return false;
  }
  for (const auto& [rel, s] : stat) {
    auto w = writers_.find(static_cast<ino_t>(s.inode));
    if (w != writers_.end()) {
      *why = fmt::format("{} is open for writing by {}", rel, w->second);
      return false;
    }
  }
  if (o_.recorded) {
    const Fingerprint* r = o_.recorded(name);
    if (r && SameStat(*r, stat)) return true;
  }
  // Settle: the newest change (a file's time, or the folder's for files added or removed).
  int64_t newest = NewestMtimeNs(stat);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    newest = std::max<int64_t>(
        newest, static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
  }
  timespec wall{};
  ::clock_gettime(CLOCK_REALTIME, &wall);
  double age =
      static_cast<double>(static_cast<int64_t>(wall.tv_sec) * 1000000000 + wall.tv_nsec - newest) /
      1e9;
  double observed = std::chrono::duration<double>(now - seen->second.since).count();
  double wait = 0;
  bool skewed = age < -1.0;  // a file server's clock ahead of ours: only observation counts
  if (!skewed && age < o_.settle_seconds) wait = o_.settle_seconds - age;
  if (o_.observe && observed < o_.settle_seconds)
    wait = std::max(wait, o_.settle_seconds - observed);
  if (!o_.observe && skewed && o_.settle_seconds > 0) {
    *why = fmt::format("its files are dated {:.0f} s in the future; run watch (it observes)", -age);
    return false;
  }
  if (o_.interrupted && o_.interrupted(name)) wait = 0;
  if (wait > 0) {
    double quiet = std::max(0.0, o_.observe ? std::min(age, observed) : age);
    *why = fmt::format("settling: nothing changed for {:.1f} s of the {:g} s settle time", quiet,
                       o_.settle_seconds);
    next_settle_ = next_settle_ ? std::min(*next_settle_, wait) : wait;
    return false;
  }
  // Every file opens cleanly (prune's test), remembered until the files change.
  auto p = parsed_.find(name);
  if (p == parsed_.end() || !SameStat(p->second.stat, stat)) {
    Parsed r;
    r.stat = stat;
    r.ok = LooksComplete(path, &r.why);
    p = parsed_.insert_or_assign(name, std::move(r)).first;
  }
  if (p->second.ok) return true;
  // The framework's marker says it finished writing (or compress renamed the archive into place
  // once written) and nothing changed since: a file that does not open is damage, which the
  // policy reports as such (checkpoint/integrity.h), not a checkpoint still being written.
  bool marked = archive || (layout != "plain" && layout != "file");
  if (marked) return true;
  *why = p->second.why;
  return false;
}

std::string Completeness::LayoutOf(const std::string& name) const {
  auto it = layouts_.find(name);
  return it == layouts_.end() ? "" : it->second;
}

const Fingerprint* Completeness::StatOf(const std::string& name) const {
  auto it = stats_.find(name);
  return it == stats_.end() ? nullptr : &it->second;
}

}  // namespace ckpt::policy
