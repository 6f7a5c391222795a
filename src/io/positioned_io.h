// Whole positioned reads and writes: pread/pwrite until every byte is done, retried on EINTR.
// Every writer of ckptool writes through WriteFullyAt, so a full disk reads the same wherever
// it happens.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/byte_cursor.h"

namespace ckpt {

// Writes all of `data` at `offset` of `fd`. Throws ckpt::Error("<path>: <what>: no space left
// on device") on ENOSPC/EDQUOT, "<path>: <what>: <strerror>" on other failures.
void WriteFullyAt(int fd, Bytes data, uint64_t offset, const std::string& path,
                  std::string_view what);

// Reads exactly `size` bytes at `offset` of `fd` into dst. A short read means the file shrank
// under us: ckpt::InputChanged("<path>: the file was truncated while being read ...").
void ReadFullyAt(int fd, uint8_t* dst, uint64_t size, uint64_t offset, const std::string& path);

}  // namespace ckpt
