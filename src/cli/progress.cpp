#include "cli/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "base/human.h"
#include "cli/console.h"

namespace ckpt::cli {

namespace {
thread_local ProgressObserver t_observer;  // the observer of the command this thread runs
}  // namespace

void SetProgressObserver(ProgressObserver observer) {
  t_observer = std::move(observer);
}

bool ProgressWanted(bool text_output) {
  return t_observer || (text_output && !Capturing() && ::isatty(STDERR_FILENO) == 1);
}

jobs::ProgressShown ProgressFor(bool text_output) {
  if (!ProgressWanted(text_output)) return {};
  return [](const std::string& label, uint64_t total) -> std::unique_ptr<jobs::ProgressMeter> {
    return std::make_unique<Progress>(label, total, true);
  };
}

void ClearProgressLine() {
  if (!t_observer && !Capturing()) std::fputs("\r\033[K", stderr);
}

Progress::Progress(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)), total_(total), observer_(t_observer) {
  if (enabled) thread_ = std::thread([this] { Loop(); });
}

Progress::~Progress() {
  stop_ = true;
  if (thread_.joinable()) {
    thread_.join();
    if (observer_) {
      observer_(label_, files_.load(), done_.load(), total_);
    } else {
      std::fputs("\r\033[K", stderr);
    }
  }
}

void Progress::Loop() {
  using namespace std::chrono_literals;
  auto start = std::chrono::steady_clock::now();
  while (!stop_) {
    std::this_thread::sleep_for(150ms);  // about 6 refreshes a second, as zstd does
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    uint64_t done = done_;
    if (observer_) {
      observer_(label_, files_.load(), done, total_);
      continue;
    }
    std::string line = fmt::format("\r{}: {} files done, {} / {} ({:.0f} MiB/s)\033[K", label_,
                                   files_.load(), HumanBytes(done), HumanBytes(total_),
                                   secs > 0 ? static_cast<double>(done) / (1 << 20) / secs : 0.0);
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }
}

}  // namespace ckpt::cli
