// File plumbing shared by the archive code (compress.cpp, archive_restore.cpp): where archive
// bytes go (sinks), file times and checks. Private to the archive code.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>

#include "base/byte_cursor.h"
#include "compress/format.h"
#include "io/atomic_output.h"

namespace ckpt::archive_io {

// Chunks in flight per thread in the ordered writer (result slots of up to ~1 MiB each).
inline constexpr size_t kSlotsPerThread = 4;

int64_t MtimeNs(const struct stat& st);
struct timespec ToTimespec(int64_t ns);
[[noreturn]] void FailErrno(const std::string& path, std::string_view what);
std::string StripSlashes(std::string p);
bool PathExists(const std::string& p);
// Refuses an existing output unless `force`.
void CheckOutputFree(const std::string& out, bool force);

// Where the archive's bytes go: a temp file that becomes the archive, or stdout.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void Write(uint64_t offset, Bytes data) = 0;
};

class FileSink : public Sink {
 public:
  explicit FileSink(AtomicOutput& out) : out_(out) {}
  void Write(uint64_t offset, Bytes data) override { out_.Write(offset, data); }

 private:
  AtomicOutput& out_;
};

// Nowhere: a dry run only counts the bytes.
class NullSink : public Sink {
 public:
  void Write(uint64_t, Bytes) override {}
};

// Sequential writes to a descriptor (stdout); offsets only checked.
class StreamSink : public Sink {
 public:
  StreamSink(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  void Write(uint64_t offset, Bytes data) override;

 private:
  int fd_;
  std::string name_;
  uint64_t pos_ = 0;
};

}  // namespace ckpt::archive_io
