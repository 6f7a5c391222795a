// A rate-limited progress line on stderr, shown only when stderr is a terminal, or reported
// to an observer (the Python package's progress callbacks).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "jobs/progress.h"

namespace ckpt::cli {

// Receives (label, files done, bytes done, bytes total) about 6 times a second while a
// command with progress runs, on a thread of its own, instead of the line on stderr.
using ProgressObserver = std::function<void(const std::string&, uint64_t, uint64_t, uint64_t)>;

class Progress : public jobs::ProgressMeter {
 public:
  // `total` bytes of work; `label` prefixes the line. Does nothing unless enabled.
  Progress(std::string label, uint64_t total, bool enabled);
  ~Progress() override;

 private:
  void Loop();

  std::string label_;
  uint64_t total_;
  std::atomic<bool> stop_{false};
  ProgressObserver observer_;  // the creating thread's, when the line was made
  std::thread thread_;
};

// Whether a command shows progress: to an observer when one is set, else on stderr when
// `text_output` (no --json, -q...), the command is not captured (console.h) and stderr is
// an interactive terminal.
bool ProgressWanted(bool text_output);

// What a job run by a command shows its progress on: this line (or the observer) when
// ProgressWanted(text_output), else nothing.
jobs::ProgressShown ProgressFor(bool text_output);

// The observer of the commands the calling thread runs from now on (empty: none); a
// Progress takes the one of the thread that creates it.
void SetProgressObserver(ProgressObserver observer);

// Clears the progress line before a result is printed, when one is drawn on a terminal.
void ClearProgressLine();

}  // namespace ckpt::cli
