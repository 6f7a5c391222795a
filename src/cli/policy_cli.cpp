#include "cli/policy_cli.h"

#include <fcntl.h>
#include <fmt/format.h>

#include <signal.h>
#include <unistd.h>
#include <filesystem>

#include <iostream>
#include <nlohmann/json.hpp>

#include "base/utf8.h"
#include "cli/commands.h"
#include "io/parallel.h"
#include "policy/ledger.h"

namespace ckpt::cli {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
int g_pipe[2] = {-1, -1};
struct sigaction g_old_int {};
struct sigaction g_old_term {};

void OnStopSignal(int sig) {
  if (!g_stop.exchange(true)) {
    g_signal = sig;
    char c = 1;
    ssize_t ignored = ::write(g_pipe[1], &c, 1);
    (void)ignored;
  }
  // The next one aborts: the handlers from before (temp files removed, death by signal).
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
}

}  // namespace

void AddPolicyFlags(CLI::App& app, PolicyCliOptions* o) {
  app.add_option("root", o->root, "Folder holding the checkpoints (default: the current one)");
  app.add_option("--policy", o->policy, "Policy file (default: ROOT/ckptool.toml)");
  app.add_option("--settle", o->settle,
                 "Seconds nothing in a checkpoint may change before it counts as complete "
                 "(default: the policy's settle_seconds, else 30)")
      ->check(CLI::Range(0.0, 86400.0 * 365));
  app.add_flag("--json", o->json, "One JSON object per line for each action");
  app.add_flag("-q,--quiet", o->quiet, "Print only failures");
  app.add_flag("--yes", o->yes,
               "Let retention delete checkpoints (or set delete = true in [retention])");
  app.add_flag("--retry-failed", o->retry_failed,
               "Run steps again that failed before on the same files with the same options");
  o->threads = DefaultThreads();
  app.add_option("-j,--threads", o->threads, "Threads (files of one checkpoint in parallel)")
      ->capture_default_str();
}

std::optional<policy::Policy> ReadPolicy(const PolicyCliOptions& o, bool json) {
  std::error_code ec;
  if (!std::filesystem::is_directory(o.root, ec)) {
    PrintError(fmt::format("{}: not a folder", o.root));
    return std::nullopt;
  }
  std::string file = policy::FindPolicy(o.root, o.policy);
  if (file.empty()) {
    PrintError(
        fmt::format("{}: no policy: put a ckptool.toml there or give --policy FILE", o.root));
    return std::nullopt;
  }
  try {
    return policy::LoadPolicy(file);
  } catch (const policy::PolicyError& e) {
    nlohmann::ordered_json problems = nlohmann::ordered_json::array();
    for (const policy::PolicyProblem& p : e.problems()) {
      PrintError(p.Text());
      problems.push_back({{"file", p.file},
                          {"line", p.line},
                          {"column", p.column},
                          {"key", p.key},
                          {"what", p.what}});
    }
    if (json) PrintJson({{"file", file}, {"valid", false}, {"problems", problems}});
    return std::nullopt;
  } catch (const Error& e) {
    PrintError(e.what());
    if (json) PrintJson({{"file", file}, {"valid", false}, {"problems", {{{"what", e.what()}}}}});
    return std::nullopt;
  }
}

double SettleSeconds(const PolicyCliOptions& o, const policy::Policy& p) {
  if (o.settle) return *o.settle;
  if (p.settle_seconds) return *p.settle_seconds;
  return 30;
}

void PrintEvent(const ApplyEvent& e, bool json, bool with_time) {
  if (json) {
    nlohmann::ordered_json j = {{"time", policy::UtcNow()},   {"event", e.kind},
                                {"checkpoint", e.checkpoint}, {"step", e.step},
                                {"message", e.message},       {"dry_run", e.dry_run}};
    if (e.before || e.after) {
      j["before"] = e.before;
      j["after"] = e.after;
    }
    for (const auto& [k, v] : e.details.items()) j[k] = v;
    Out() << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << std::endl;
    return;
  }
  std::string what = e.kind == "wait"     ? "waiting"
                     : e.kind == "resume" ? "resuming"
                     : e.kind == "step"   ? e.step
                     : e.kind == "delete" ? "retention"
                     : e.step.empty()     ? e.kind
                                          : e.step + " " + e.kind;
  std::string line = e.checkpoint.empty()
                         ? fmt::format("{}: {}", what, e.message)
                         : fmt::format("{}: {}: {}", e.checkpoint, what, e.message);
  if (with_time) line = policy::UtcNow() + " " + line;
  Out() << Printable(line) << std::endl;
}

GracefulStop::GracefulStop() {
  g_stop = false;
  g_signal = 0;
  if (g_pipe[0] < 0 && ::pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) g_pipe[0] = g_pipe[1] = -1;
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
}

GracefulStop::~GracefulStop() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
}

const std::atomic<bool>& GracefulStop::stop() const {
  return g_stop;
}
int GracefulStop::signal_number() const {
  return g_signal.load();
}
int GracefulStop::wake_fd() const {
  return g_pipe[0];
}

}  // namespace ckpt::cli
