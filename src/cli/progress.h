// A rate-limited progress line on stderr, shown only when stderr is a terminal, or reported
// to an observer (the Python package's progress callbacks).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace ckpt::cli {

class Progress {
 public:
  // `total` bytes of work; `label` prefixes the line. Does nothing unless enabled.
  Progress(std::string label, uint64_t total, bool enabled);
  ~Progress();

  std::atomic<uint64_t>& bytes_done() { return done_; }
  void FileDone() { ++files_; }

 private:
  void Loop();

  std::string label_;
  uint64_t total_;
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> files_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Whether a command shows progress: to an observer when one is set, else on stderr when
// `text_output` (no --json, -q...) and stderr is an interactive terminal.
bool ProgressWanted(bool text_output);

// Receives (label, files done, bytes done, bytes total) about 6 times a second while a
// command with progress runs, on a thread of its own, instead of the line on stderr. Empty:
// none. Set it before the command starts.
using ProgressObserver = std::function<void(const std::string&, uint64_t, uint64_t, uint64_t)>;
void SetProgressObserver(ProgressObserver observer);

}  // namespace ckpt::cli
