// Fuzz target: the safetensors reader.
#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "safetensors/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ckpt::safetensors::Parse(ckpt::Bytes(data, size));
  } catch (const ckpt::Error&) {
  }
  return 0;
}
