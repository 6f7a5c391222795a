#include "io/temp_files.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace ckpt {

namespace {

constexpr size_t kSlots = 256;
constexpr size_t kPathMax = 4096;

enum SlotState : int { kFree = 0, kWriting = 1, kUsed = 2, kFolder = 3 };

struct Slot {
  std::atomic<int> state{kFree};
  char path[kPathMax] = {};
};

// Constant-initialised (all zero, in .bss): a dynamic initialiser would touch its 256 pages
// at every start-up, a few milliseconds of a command that reads a small file.
constinit std::array<Slot, kSlots> g_slots{};
std::atomic<bool> g_installed{false};
std::atomic<unsigned> g_counter{0};
std::atomic<bool> g_wrote{false};  // an output was started: something may have changed

void RemoveAll() {
  for (Slot& s : g_slots) {
    if (s.state.load() == kUsed) ::unlink(s.path);
  }
  // Folders were registered outermost first: remove them innermost first (rmdir fails, as it
  // should, on one that holds anything).
  for (size_t i = kSlots; i-- > 0;) {
    if (g_slots[i].state.load() == kFolder) ::rmdir(g_slots[i].path);
  }
}

void OnSignal(int sig) {
  RemoveAll();
  // One line, then die of the signal (the shell reports 128 + its number: 130 for Ctrl-C).
  static const char kWrote[] =
      "ckptool: interrupted: the outputs being written were removed; what was replaced before "
      "stays replaced, nothing is half written\n";
  static const char kNothing[] = "ckptool: interrupted: nothing was changed\n";
  ssize_t ignored = g_wrote.load() ? ::write(STDERR_FILENO, kWrote, sizeof kWrote - 1)
                                   : ::write(STDERR_FILENO, kNothing, sizeof kNothing - 1);
  (void)ignored;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// A mapped input that shrinks under us (another process truncated it) or an output mapping
// on a full filesystem raises SIGBUS: say so instead of dying with a bus error (as mold does).
void OnBusError(int) {
  static const char kMessage[] =
      "ckptool: error: a file being read was truncated by another process (or a disk is full); "
      "nothing was replaced\n";
  // Several threads may fault at once: one reports and exits, the others wait for it.
  static std::atomic<int> entered{0};
  if (entered.fetch_add(1) != 0) {
    for (;;) ::pause();
  }
  RemoveAll();
  ssize_t ignored = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  (void)ignored;
  ::_exit(1);
}

constexpr const char* kMarker = ".ckptool-tmp-";

}  // namespace

bool IsTempFileName(std::string_view name) {
  return name.find(kMarker) != std::string_view::npos;
}

void KeepCallersSignalHandlers() {
  g_installed.store(true);
}

void InstallInterruptHandlers() {
  if (g_installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    // A signal the caller ignores stays ignored (nohup, a background job of a script).
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
  struct sigaction bus {};
  bus.sa_handler = OnBusError;
  sigemptyset(&bus.sa_mask);
  ::sigaction(SIGBUS, &bus, nullptr);
}

void NoteChanging() {
  g_wrote.store(true);
}

namespace {

// Claims a free slot for `path` and publishes it to the signal handler in `state`; -1 when
// the path is too long or every slot is in use.
int ClaimSlot(const std::string& path, SlotState state) {
  if (path.size() >= kPathMax) return -1;
  for (size_t i = 0; i < kSlots; ++i) {
    int expected = kFree;
    Slot& s = g_slots[i];
    // Claim the slot, then write the path, then publish it to the signal handler.
    if (!s.state.compare_exchange_strong(expected, kWriting)) continue;
    std::memcpy(s.path, path.c_str(), path.size() + 1);
    s.state.store(state);
    return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

int RegisterTempFile(const std::string& path) {
  g_wrote.store(true);
  return ClaimSlot(path, kUsed);
}

int RegisterCreatedFolder(const std::string& path) {
  return ClaimSlot(path, kFolder);
}

void UnregisterTempFile(int slot) {
  if (slot >= 0 && static_cast<size_t>(slot) < kSlots) g_slots[slot].state.store(kFree);
}

std::string TempPathFor(const std::string& final_path) {
  std::filesystem::path p(final_path);
  std::string name = "." + p.filename().string() + kMarker + std::to_string(::getpid()) + "-" +
                     std::to_string(g_counter.fetch_add(1));
  return (p.parent_path() / name).string();
}

namespace {

// The pid in a temp name ("...<marker><pid>-<n>"), or 0.
pid_t TempOwner(const std::string& name) {
  size_t at = name.find(kMarker);
  if (at == std::string::npos) return 0;
  return static_cast<pid_t>(std::atoi(name.c_str() + at + std::strlen(kMarker)));
}

bool OwnerGone(pid_t pid) {
  if (pid <= 0 || pid == ::getpid()) return false;
  return !(::kill(pid, 0) == 0 || errno == EPERM);
}

}  // namespace

int RemoveStaleTempsIn(const std::string& dir) {
  namespace fs = std::filesystem;
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!IsTempFileName(name) || !OwnerGone(TempOwner(name))) continue;
    std::error_code rec;
    if (fs::remove_all(it->path(), rec) > 0 && !rec) ++removed;
  }
  return removed;
}

int RemoveStaleTempFiles(const std::string& final_path) {
  namespace fs = std::filesystem;
  fs::path p(final_path);
  fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  std::string prefix = "." + p.filename().string() + kMarker;
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    std::string rest = name.substr(prefix.size());
    pid_t pid = static_cast<pid_t>(std::atoi(rest.c_str()));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno == EPERM) continue;  // that process still runs
    // A temp folder (decompress of a folder archive) goes with everything in it.
    if (fs::remove_all(it->path(), ec) > 0) ++removed;
  }
  return removed;
}

}  // namespace ckpt
