// Fuzz target: the zip reader, and reading every record it accepts.
#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "zip/zip_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::Bytes file(data, size);
  try {
    ckpt::zip::Archive a = ckpt::zip::Archive::Parse(file);
    for (const ckpt::zip::Entry& e : a.entries()) ckpt::zip::ReadRecord(file, e, 1 << 24);
  } catch (const ckpt::Error&) {
  }
  return 0;
}
