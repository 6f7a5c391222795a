// An output file that replaces its destination only when complete and durable.
//
// Create() makes a temp file in the destination's folder (same filesystem, so rename is
// atomic), reserves its full size up front (a full disk fails here, before any work), and
// registers it for removal on Ctrl-C. Commit() fsyncs the data, renames over the
// destination and fsyncs the folder. Destroying an uncommitted output removes the temp file.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "base/byte_cursor.h"

namespace ckpt {

class AtomicOutput {
 public:
  static AtomicOutput Create(const std::string& final_path, uint64_t size);

  AtomicOutput(AtomicOutput&& other) noexcept;
  AtomicOutput& operator=(AtomicOutput&&) = delete;
  AtomicOutput(const AtomicOutput&) = delete;
  ~AtomicOutput();

  int fd() const { return fd_; }
  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }

  // Thread-safe positioned writes.
  void Write(uint64_t offset, Bytes data);
  // Copies [in_offset, +size) of in_fd to `offset` inside the kernel when it can
  // (copy_file_range), else through a buffer.
  void CopyFrom(int in_fd, uint64_t in_offset, uint64_t offset, uint64_t size);

  // fsyncs the data; Commit() skips its own fsync when nothing changed since.
  void Sync();
  // Gives the file this mode (and owner, when allowed) before it becomes visible. Without
  // it, Commit() gives a new file's usual mode (0666 less the umask).
  void SetMode(mode_t mode, uid_t uid, gid_t gid);
  // A new file's usual mode (0666 less the umask), set now rather than at Commit().
  void SetDefaultMode();
  void Commit();

 private:
  AtomicOutput() = default;
  void Discard();

  std::string final_path_;
  std::string temp_path_;
  int fd_ = -1;
  int slot_ = -1;
  bool committed_ = false;
  bool mode_set_ = false;
  std::atomic<bool> dirty_{true};  // written since the last fsync
};

// Bytes free for an unprivileged writer in the folder holding `path`.
uint64_t FreeSpaceFor(const std::string& path);

}  // namespace ckpt
