// SHA-256 (OpenSSL's libcrypto: SHA-NI or AVX2 where the CPU has them), as OpenSSF model
// signing hashes a model's files.
#pragma once

#include <memory>
#include <string>

#include "base/byte_cursor.h"

namespace ckpt {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(Bytes data);
  // The digest as 64 lowercase hex digits; the hasher is spent afterwards.
  std::string HexDigest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The SHA-256 of a whole file, read once from start to end (1 MiB at a time; interruptible).
// Throws ckpt::Error naming the path when it cannot be read.
std::string Sha256OfFile(const std::string& path);

}  // namespace ckpt
