#include "io/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/interrupt.h"

namespace ckpt {

struct Sha256::State {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~State() { EVP_MD_CTX_free(ctx); }
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  if (!state_->ctx || EVP_DigestInit_ex(state_->ctx, EVP_sha256(), nullptr) != 1)
    Fail("internal: cannot start a SHA-256");
}

Sha256::~Sha256() = default;

void Sha256::Update(Bytes data) {
  if (!data.empty() && EVP_DigestUpdate(state_->ctx, data.data(), data.size()) != 1)
    Fail("internal: SHA-256 update failed");
}

std::string Sha256::HexDigest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(state_->ctx, md, &n) != 1) Fail("internal: SHA-256 final failed");
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

std::string Sha256OfFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail("{}: cannot open: {}", path, std::strerror(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  Sha256 h;
  thread_local std::vector<uint8_t> buf(1 << 20);
  try {
    for (;;) {
      CheckInterrupt();
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) Fail("{}: cannot read: {}", path, std::strerror(errno));
      if (n == 0) break;
      h.Update(Bytes(buf.data(), static_cast<size_t>(n)));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return h.HexDigest();
}

}  // namespace ckpt
