// Fuzz target: the whole inspect path (detection, any reader, tensor table, report) on a
// file held in memory (memfd), as the CLI sees it.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "checkpoint/verify.h"
#include "reports/inspect_output.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = ::memfd_create("ckpt-fuzz", 0);
  if (fd < 0) return 0;
  if (::write(fd, data, size) != static_cast<ssize_t>(size)) {
    ::close(fd);
    return 0;
  }
  try {
    ckpt::CheckpointFile f = ckpt::OpenCheckpoint("/proc/self/fd/" + std::to_string(fd));
    ckpt::FileReport r = ckpt::BuildReport(f);
    ckpt::RenderText(r, 20);
    std::string json;
    {
      ckpt::JsonStream out([&json](std::string_view t) { json.append(t); });
      ckpt::WriteJson(out, r);
    }
    // Whatever the file holds, the report is one valid JSON document (throws otherwise).
    if (!nlohmann::ordered_json::parse(json).is_object()) __builtin_trap();
    ckpt::Verify(f, 1);
  } catch (const ckpt::Error&) {
  }
  ::close(fd);
  return 0;
}
