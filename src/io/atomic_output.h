// An output file that replaces its destination only when complete and durable.
//
// Create() settles what will be replaced (a symlink's target, never the link; only a file
// this user may write), checks the free space, makes a temp file in that file's folder (same
// filesystem, so rename is atomic), reserves its full size up front (a full disk fails here,
// before any work), and registers it for removal on Ctrl-C. Commit() refuses if an input it
// was told about changed meanwhile, then fsyncs the data, renames over the destination and
// fsyncs the folder. Destroying an uncommitted output removes the temp file.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "base/byte_cursor.h"
#include "io/folders.h"
#include "io/mapped_file.h"

namespace ckpt {

// For tests: when CKPT_TEST_COMMIT_LOG names a folder, every output put into place (a file
// renamed over its destination, a folder swapped in) is logged as one line in
// <folder>/<pid>.log, so a test can check that no two processes (MPI ranks) wrote the same
// path. Costs one getenv per output otherwise.
void LogCommitForTests(const std::string& path);

// Hooks around replacing an existing file in place (manifests use them: checkpoint/manifest.h).
// `before(path)` runs when Commit() is about to replace `path` with what was made from it (an
// input of the output is that file, or no input was named) and may throw to refuse; `after(path)`
// once Commit() has put any file in place, new or replacing one (a throw there is the command's
// error: the file is already in place). Set once, before any command runs.
using ReplaceHook = void (*)(const std::string& path);
void SetReplaceHooks(ReplaceHook before, ReplaceHook after);

// Deletes a file a command removes on purpose (strip --delete-files: a training-only file),
// then runs the removal hook (manifests forget the file). Returns false with `ec` set when it
// could not be deleted (nothing else is done then).
bool RemoveOutputFile(const std::string& path, std::error_code& ec);
void SetRemoveHook(ReplaceHook removed);

class AtomicOutput {
 public:
  // Throws ckpt::Error naming `path` when it cannot: not enough space, a folder it may not
  // create files in, an existing file it may not write.
  static AtomicOutput Create(const std::string& path, uint64_t size);

  AtomicOutput(AtomicOutput&& other) noexcept;
  AtomicOutput& operator=(AtomicOutput&&) = delete;
  AtomicOutput(const AtomicOutput&) = delete;
  ~AtomicOutput();

  int fd() const { return fd_; }
  const std::string& temp_path() const { return temp_path_; }
  // The file Commit() replaces: `path` itself, or the file it links to.
  const std::string& final_path() const { return final_path_; }

  // Thread-safe positioned writes.
  void Write(uint64_t offset, Bytes data);

  // While one lives on a thread, that thread's Write and CopyFrom calls inside
  // [offset, offset + size) of this output are collected in memory, and Flush() writes them
  // with one pwrite per contiguous run: a run of 10^3 tiny records costs a few syscalls
  // instead of three per record (header, data, descriptor). Only bytes written are flushed,
  // so a hole never overwrites what another thread wrote. Without Flush() (an exception on
  // the way out) the collected bytes are dropped: the output is being abandoned.
  class Staged {
   public:
    Staged(AtomicOutput& out, uint64_t offset, uint64_t size);
    ~Staged();
    Staged(const Staged&) = delete;
    Staged& operator=(const Staged&) = delete;
    void Flush();

   private:
    friend class AtomicOutput;
    // Where [offset, offset + size) goes in the buffer, or nullptr outside the range.
    uint8_t* Take(uint64_t offset, uint64_t size);

    AtomicOutput& out_;
    uint64_t offset_;
    uint64_t size_;
    Staged* outer_;  // the thread's previous staging, restored when this one goes
    std::vector<std::pair<uint64_t, uint64_t>> runs_;  // written [begin, end), merged
  };
  // While one lives on a thread, that thread's Write calls on this output that reach the file
  // (not those collected by a Staged range) read their bytes straight back and fail unless
  // the file holds what was written. Read back at once, a chunk is still in the cache: this
  // costs a fraction of re-reading the finished file, so a writer can skip that re-read for
  // ranges whose every byte was checked here (all_checked()). A CopyFrom that the kernel
  // does (its bytes never pass through memory), or any write a Staged range collects, is not
  // checked and clears all_checked().
  class CheckedWrites {
   public:
    explicit CheckedWrites(AtomicOutput& out);
    ~CheckedWrites();
    CheckedWrites(const CheckedWrites&) = delete;
    CheckedWrites& operator=(const CheckedWrites&) = delete;
    bool all_checked() const { return all_checked_; }

   private:
    friend class AtomicOutput;
    AtomicOutput& out_;
    CheckedWrites* outer_;
    bool all_checked_ = true;
  };
  // Fails, naming the byte range, unless the file holds `written` at `offset`.
  void CheckWritten(uint64_t offset, Bytes written) const;

  // Copies [in_offset, +size) of `in` to `offset` inside the kernel when it can
  // (copy_file_range), else through a buffer. Inside a Staged range the bytes are read
  // through a MappedFile::Window instead, so a run's Prefetched bytes serve them; so are those
  // of a file without a descriptor (a .ckz archive's member).
  void CopyFrom(const MappedFile& in, uint64_t in_offset, uint64_t offset, uint64_t size);

  // Bounded-size mode: Create() reserved an upper bound; this cuts the file to the size
  // actually written (an archive whose compressed size is known only at the end).
  void Truncate(uint64_t size);

  // fsyncs the data; Commit() skips its own fsync when nothing changed since.
  void Sync();
  // Gives the file this mode (and owner, when allowed) before it becomes visible. Without
  // it, Commit() gives a new file's usual mode (0666 less the umask).
  void SetMode(mode_t mode, uid_t uid, gid_t gid);
  // A new file's usual mode (0666 less the umask), set now rather than at Commit().
  void SetDefaultMode();
  // Commit() fails, leaving the destination as it was, if `input` changed on disk after it
  // was opened: what was written came from a file that is no longer there.
  void RequireUnchanged(const MappedFile& input) { inputs_.push_back(input.stamp()); }
  void Commit();

 private:
  AtomicOutput() = default;
  void Discard();
  void BeforeReplace() const;
  // A CheckedWrites of this output lives on this thread.
  bool Checked() const;
  // Clears all_checked() of this thread's CheckedWrites of this output: bytes that did not
  // pass CheckWritten.
  void NotChecked();

  std::string final_path_;
  bool replaces_ = false;  // final_path_ existed at Create()
  std::string temp_path_;
  int fd_ = -1;
  int slot_ = -1;
  bool committed_ = false;
  bool mode_set_ = false;
  std::atomic<bool> dirty_{true};  // written since the last fsync
  std::vector<MappedFile::Stamp> inputs_;
  // The folders Create() made for it: removed again, if empty, when it is discarded.
  std::unique_ptr<CreatedFolders> made_;
};

}  // namespace ckpt
