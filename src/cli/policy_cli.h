// What `ckptool apply` and `ckptool watch` share: finding and reading the policy, printing one
// line per action (text or JSON lines), and stopping gracefully on SIGINT/SIGTERM.
#pragma once

#include <atomic>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "policy/apply.h"
#include "policy/policy.h"

namespace ckpt::cli {

// Options both commands take.
struct PolicyCliOptions {
  std::string root = ".";
  std::string policy;
  std::optional<double> settle;
  bool json = false;
  bool retry_failed = false;
  bool yes = false;    // retention may delete
  bool quiet = false;  // only failures (and, for apply, nothing else)
  unsigned threads = 1;
};
void AddPolicyFlags(CLI::App& app, PolicyCliOptions* o);

// The policy for o.root (--policy, else ROOT/ckptool.toml). Prints every problem as
// "ckptool: error: FILE:LINE:COL: KEY: what" and returns nothing when it is not valid.
std::optional<policy::Policy> ReadPolicy(const PolicyCliOptions& o, bool json = false);

// The settle time: --settle, else the policy's settle_seconds, else 30 s.
double SettleSeconds(const PolicyCliOptions& o, const policy::Policy& p);

// One line per event: "[time ]CHECKPOINT: STEP: message", or a JSON object per line.
void PrintEvent(const ApplyEvent& e, bool json, bool with_time);

// The first SIGINT or SIGTERM sets stop() and wakes wake_fd(); the handlers that were there
// before (temp-file removal, then death by the signal) are put back, so a second signal
// aborts at once, removing the current temp file.
class GracefulStop {
 public:
  GracefulStop();
  ~GracefulStop();
  const std::atomic<bool>& stop() const;
  int signal_number() const;
  int wake_fd() const;  // readable once a signal came
};

}  // namespace ckpt::cli
