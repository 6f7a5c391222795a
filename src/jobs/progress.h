// How a running job says how far it is: it counts bytes of input and files done on a meter
// its caller made (the CLI draws a line on a terminal; the Python package calls a callback).
// A job never prints.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ckpt::jobs {

class ProgressMeter {
 public:
  virtual ~ProgressMeter() = default;

  std::atomic<uint64_t>& bytes_done() { return done_; }
  void FileDone() { ++files_; }

 protected:
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> files_{0};
};

// Makes the meter of one batch: `label` names the job ("convert"), `total` is its bytes of
// input. An empty function: no progress is shown.
using ProgressShown =
    std::function<std::unique_ptr<ProgressMeter>(const std::string& label, uint64_t total)>;

}  // namespace ckpt::jobs
