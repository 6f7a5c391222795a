#include "policy/ledger.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "base/error.h"
#include "io/atomic_output.h"
#include "io/mapped_file.h"
#include "io/temp_files.h"

namespace ckpt::policy {

namespace fs = std::filesystem;

namespace {

constexpr int kVersion = 1;
constexpr size_t kRemovedKept = 1000;

nlohmann::ordered_json StepJson(const StepRecord& r) {
  nlohmann::ordered_json j = {{"options", r.options}, {"at", r.at}};
  if (r.before || r.after) {
    j["before"] = r.before;
    j["after"] = r.after;
  }
  if (!r.note.empty()) j["note"] = r.note;
  return j;
}

StepRecord StepFromJson(const nlohmann::ordered_json& j) {
  StepRecord r;
  r.options = nlohmann::ordered_json(j.at("options"));
  r.at = j.at("at").get<std::string>();
  if (j.contains("before")) r.before = j.at("before").get<uint64_t>();
  if (j.contains("after")) r.after = j.at("after").get<uint64_t>();
  if (j.contains("note")) r.note = j.at("note").get<std::string>();
  return r;
}

}  // namespace

std::string UtcNow() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  std::time_t t = now.tv_sec;
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, now.tv_nsec / 1000000);
}

std::string LedgerDir(const std::string& root) {
  return (fs::path(root) / ".ckptool").string();
}

Ledger Ledger::Load(const std::string& root) {
  Ledger l;
  l.root_ = root;
  l.path_ = (fs::path(LedgerDir(root)) / "state.json").string();
  RemoveStaleTempFiles(l.path_);
  std::error_code ec;
  if (!fs::exists(l.path_, ec)) return l;
  MappedFile m = MappedFile::Open(l.path_);
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(AsText(m.bytes()));
    if (!j.is_object() || j.value("format", "") != "ckptool-ledger")
      Fail("not a ckptool ledger (no \"format\": \"ckptool-ledger\")");
    int version = j.at("version").get<int>();
    if (version != kVersion)
      Fail("ledger version {}; this ckptool reads version {}", version, kVersion);
    for (const auto& [name, c] : j.at("checkpoints").items()) {
      CheckpointRecord r;
      r.step = c.at("step").get<int64_t>();
      r.layout = c.value("layout", "");
      r.files = FingerprintFromJson(c.at("files"));
      for (const auto& [step, s] : c.at("steps").items()) r.steps[step] = StepFromJson(s);
      if (c.contains("running")) {
        r.running = StepFromJson(c.at("running"));
        r.running_step = c.at("running").at("step").get<std::string>();
      }
      if (c.contains("failed")) {
        const nlohmann::ordered_json& f = c.at("failed");
        r.failed =
            FailedRecord{f.at("step").get<std::string>(), nlohmann::ordered_json(f.at("options")),
                         f.at("at").get<std::string>(), f.at("error").get<std::string>()};
      }
      if (c.contains("checked")) {
        const nlohmann::ordered_json& k = c.at("checked");
        r.checked =
            IntegrityRecord{k.at("at").get<std::string>(), k.at("damage").get<std::string>()};
      }
      if (c.contains("outputs")) r.outputs = c.at("outputs").get<std::vector<std::string>>();
      l.checkpoints_[name] = std::move(r);
    }
    if (j.contains("removed")) {
      for (const auto& x : j.at("removed")) {
        l.removed_.push_back({x.at("name").get<std::string>(), x.at("step").get<int64_t>(),
                              x.at("bytes").get<uint64_t>(), x.at("at").get<std::string>(),
                              x.at("reason").get<std::string>()});
      }
    }
  } catch (const nlohmann::json::exception& e) {
    Fail(
        "{}: not a readable ledger: {} (move it away to start afresh: every step then runs "
        "again, which changes nothing already done)",
        l.path_, e.what());
  } catch (const Error& e) {
    Fail(
        "{}: {} (move it away to start afresh: every step then runs again, which changes "
        "nothing already done)",
        l.path_, e.what());
  }
  return l;
}

nlohmann::ordered_json Ledger::ToJson() const {
  nlohmann::ordered_json j = {{"format", "ckptool-ledger"},
                              {"version", kVersion},
                              {"updated", UtcNow()},
                              {"checkpoints", nlohmann::ordered_json::object()}};
  for (const auto& [name, r] : checkpoints_) {
    nlohmann::ordered_json c = {
        {"step", r.step}, {"layout", r.layout}, {"files", policy::ToJson(r.files)}};
    nlohmann::ordered_json steps = nlohmann::ordered_json::object();
    for (const auto& [step, s] : r.steps) steps[step] = StepJson(s);
    c["steps"] = steps;
    if (r.running) {
      nlohmann::ordered_json run = {{"step", r.running_step}};
      run.update(StepJson(*r.running));
      c["running"] = run;
    }
    if (r.failed) {
      c["failed"] = {{"step", r.failed->step},
                     {"options", r.failed->options},
                     {"at", r.failed->at},
                     {"error", r.failed->error}};
    }
    if (r.checked) c["checked"] = {{"at", r.checked->at}, {"damage", r.checked->damage}};
    if (!r.outputs.empty()) c["outputs"] = r.outputs;
    j["checkpoints"][name] = c;
  }
  nlohmann::ordered_json removed = nlohmann::ordered_json::array();
  size_t from = removed_.size() > kRemovedKept ? removed_.size() - kRemovedKept : 0;
  for (size_t i = from; i < removed_.size(); ++i) {
    const RemovedRecord& x = removed_[i];
    removed.push_back({{"name", x.name},
                       {"step", x.step},
                       {"bytes", x.bytes},
                       {"at", x.at},
                       {"reason", x.reason}});
  }
  j["removed"] = removed;
  return j;
}

void Ledger::Save() {
  if (removed_.size() > kRemovedKept)
    removed_.erase(removed_.begin(), removed_.end() - kRemovedKept);
  fs::create_directories(LedgerDir(root_));
  std::string text =
      ToJson().dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  AtomicOutput out = AtomicOutput::Create(path_, text.size());
  out.Write(0, AsBytes(text));
  out.SetDefaultMode();
  out.Commit();
}

RootLock::RootLock(const std::string& root) {
  std::error_code ec;
  fs::create_directories(LedgerDir(root), ec);
  if (ec) Fail("{}: cannot create it: {}", LedgerDir(root), ec.message());
  std::string path = (fs::path(LedgerDir(root)) / "lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) Fail("{}: {}", path, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char buf[64] = {};
    ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "another process";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    Fail("{}: another ckptool apply or watch ({}) is working on this folder", root, holder);
  }
  std::string me = fmt::format("pid {}\n", ::getpid());
  if (::ftruncate(fd_, 0) == 0) {
    ssize_t ignored = ::pwrite(fd_, me.data(), me.size(), 0);
    (void)ignored;
  }
}

RootLock::~RootLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace ckpt::policy
