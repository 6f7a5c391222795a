// A rate-limited progress line on stderr, shown only when stderr is a terminal.
#pragma once

#include <atomic>
#include <cstdint>
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

// True when stderr is an interactive terminal.
bool StderrIsTerminal();

}  // namespace ckpt::cli
