// Fuzz target: the legacy (non-zip) torch reader.
#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "torch/torch_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ckpt::torch::ReadTorchLegacy(ckpt::Bytes(data, size));
  } catch (const ckpt::Error&) {
  }
  return 0;
}
