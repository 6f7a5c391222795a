// `ckptool watch ROOT`: apply's pass run again whenever something under ROOT changes
// (inotify), when a settling checkpoint's time is up, and every --rescan seconds (network
// file systems do not deliver events). One checkpoint is processed at a time; SIGTERM or
// SIGINT lets the current step finish, then it exits 0 (a second signal aborts that step:
// its temp file is removed and the original stays as it was).
#include <fmt/format.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/policy_cli.h"
#include "engines/prune.h"
#include "policy/apply.h"

namespace ckpt::cli {

namespace {

namespace fs = std::filesystem;

struct WatchCliOptions {
  PolicyCliOptions p;
  double rescan = 60;
  double debounce = 0.5;
  bool no_inotify = false;
};

// inotify watches on ROOT and every folder below it (checkpoint folders and their subfolders),
// added as folders appear. Events only say "look again"; the pass itself finds out what.
class Watcher {
 public:
  Watcher(std::string root, bool enabled) : root_(std::move(root)) {
    if (!enabled) return;
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ < 0) {
      error_ = std::strerror(errno);
      return;
    }
    AddTree(root_);
  }
  ~Watcher() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  const std::string& error() const { return error_; }
  bool root_gone() const { return root_gone_; }

  // Reads what is pending; true when something outside .ckptool changed.
  bool Drain() {
    bool relevant = false;
    alignas(inotify_event) char buf[64 * 1024];
    for (;;) {
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      for (char* p = buf; p < buf + n;) {
        auto* ev = reinterpret_cast<inotify_event*>(p);
        p += sizeof(inotify_event) + ev->len;
        if (ev->mask & IN_Q_OVERFLOW) {
          relevant = true;
          AddTree(root_);  // events were lost: make sure every folder is watched
          continue;
        }
        auto it = dirs_.find(ev->wd);
        if (it == dirs_.end()) continue;
        if (ev->mask & IN_IGNORED) {
          dirs_.erase(it);
          continue;
        }
        std::string dir = it->second;
        if ((ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) && dir == root_) root_gone_ = true;
        std::string name = ev->len ? std::string(ev->name) : "";
        if (dir == root_ && (name == ".ckptool" || IsTrashName(name))) continue;
        if (dir != root_ && Inside(dir, (fs::path(root_) / ".ckptool").string())) continue;
        relevant = true;
        if ((ev->mask & IN_ISDIR) && (ev->mask & (IN_CREATE | IN_MOVED_TO)) && !name.empty())
          AddTree((fs::path(dir) / name).string());
      }
    }
    return relevant;
  }

 private:
  static bool Inside(const std::string& p, const std::string& dir) {
    return p == dir ||
           (p.size() > dir.size() && p.compare(0, dir.size(), dir) == 0 && p[dir.size()] == '/');
  }

  void Add(const std::string& dir) {
    uint32_t mask = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE |
                    IN_MODIFY | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR;
    int wd = ::inotify_add_watch(fd_, dir.c_str(), mask);
    if (wd >= 0) {
      dirs_[wd] = dir;
    } else if (errno == ENOSPC && error_.empty()) {
      error_ = "too many folders for fs.inotify.max_user_watches; the rest relies on rescans";
    }
  }

  void AddTree(const std::string& dir) {
    Add(dir);
    std::error_code ec;
    for (fs::recursive_directory_iterator
             it(dir, fs::directory_options::skip_permission_denied, ec),
         end;
         !ec && it != end; it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (!it->is_directory(ec) || it->is_symlink(ec)) continue;
      if (name == ".ckptool" || IsTrashName(name)) {
        it.disable_recursion_pending();
        continue;
      }
      Add(it->path().string());
    }
  }

  std::string root_;
  int fd_ = -1;
  std::string error_;
  bool root_gone_ = false;
  std::map<int, std::string> dirs_;
};

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int RunWatch(const WatchCliOptions& o) {
  std::optional<policy::Policy> p = ReadPolicy(o.p);
  if (!p) return 1;
  if (!fs::is_directory(o.p.root)) {
    PrintError(fmt::format("{}: not a folder", o.p.root));
    return 1;
  }
  GracefulStop graceful;
  ApplyOptions ao;
  ao.yes = o.p.yes;
  ao.retry_failed = o.p.retry_failed;
  ao.threads = o.p.threads;
  ao.settle_seconds = SettleSeconds(o.p, *p);
  ao.observe = true;
  ao.stop = &graceful.stop();
  bool json = o.p.json;
  ao.log = [json, quiet = o.p.quiet](const ApplyEvent& e) {
    if (!quiet || e.kind == "failed" || e.kind == "damaged") PrintEvent(e, json, true);
  };
  Applier applier(o.p.root, *p, ao);
  Watcher watcher(o.p.root, !o.no_inotify);
  {
    ApplyEvent start{"note", "", "watch",
                     fmt::format("watching {} (policy {}; settle {:g} s; {}rescan every {:g} s)",
                                 o.p.root, p->file, ao.settle_seconds,
                                 watcher.fd() >= 0 ? "inotify, " : "inotify off, ", o.rescan)};
    if (!watcher.error().empty()) start.message += "; inotify: " + watcher.error();
    PrintEvent(start, json, true);
  }
  auto last_pass = Clock::now();
  bool pending = true;  // run a pass first thing
  std::optional<double> next_settle;
  std::string last_error;
  while (!graceful.stop()) {
    if (pending) {
      pending = false;
      last_pass = Clock::now();
      try {
        PassResult r = applier.RunPass();
        next_settle = r.next_settle;
        last_error.clear();
        if (r.stopped) break;
      } catch (const std::exception& e) {
        // The folder changed under the pass (a checkpoint deleted mid-walk...): say so once
        // and look again soon.
        std::string what = e.what();
        if (what != last_error) PrintEvent({"failed", "", "pass", what}, json, true);
        last_error = what;
        next_settle = std::max(1.0, std::min(o.rescan, 5.0));
      }
      if (graceful.stop()) break;
    }
    if (watcher.root_gone()) {
      PrintError(fmt::format("{}: the folder itself was deleted or moved; stopping", o.p.root));
      return 1;
    }
    // Sleep until an event, the next settle time, the rescan, or a signal.
    double timeout = o.rescan - Since(last_pass);
    if (next_settle) timeout = std::min(timeout, *next_settle + 0.05 - Since(last_pass));
    timeout = std::max(0.0, timeout);
    pollfd fds[2] = {{graceful.wake_fd(), POLLIN, 0}, {watcher.fd(), POLLIN, 0}};
    int n = ::poll(fds, watcher.fd() >= 0 ? 2 : 1, static_cast<int>(timeout * 1000));
    if (graceful.stop()) break;
    if (n == 0) {
      pending = true;  // a settle time or the rescan is due
      continue;
    }
    if (n > 0 && watcher.fd() >= 0 && (fds[1].revents & POLLIN)) {
      if (watcher.Drain()) {
        // Let a burst of writes pass before looking (a trainer writes many pieces).
        auto burst = Clock::now();
        while (Since(burst) < o.debounce && !graceful.stop()) {
          pollfd w[2] = {{graceful.wake_fd(), POLLIN, 0}, {watcher.fd(), POLLIN, 0}};
          if (::poll(w, 2, static_cast<int>(o.debounce * 1000)) <= 0) break;
          if (!watcher.Drain()) break;
          if (Since(burst) > 5 * o.debounce) break;  // a steady stream: look anyway
        }
        pending = true;
      }
    }
  }
  int sig = graceful.signal_number();
  PrintEvent({"note", "", "watch",
              fmt::format("stopping on {}; every step was finished", sig == SIGTERM  ? "SIGTERM"
                                                                     : sig == SIGINT ? "SIGINT"
                                                                                     : "a signal")},
             json, true);
  return 0;
}

}  // namespace

Runner AddWatch(CLI::App& app) {
  auto o = std::make_shared<WatchCliOptions>();
  AddPolicyFlags(app, &o->p);
  app.add_option("--rescan", o->rescan,
                 "Look at the whole folder every SECONDS even without inotify events (network "
                 "file systems)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  app.add_flag("--no-inotify", o->no_inotify,
               "Do not use inotify; find changes by --rescan alone (file systems whose events "
               "do not reach this machine)");
  app.footer(
      "Stays running beside training and applies the policy to each checkpoint as it "
      "completes (its framework's marker written, nothing in it changed for the settle time, "
      "no file of it open for writing). One line per action (--json: JSON lines). SIGTERM or "
      "SIGINT: the current step is finished, then it exits 0.");
  return [o] { return RunWatch(*o); };
}

}  // namespace ckpt::cli
