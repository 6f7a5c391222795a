// Fuzz target: DeepSpeed universal checkpoints read as a model (deepspeed/zero_checkpoint.h,
// ConsolidateUniversal) over files given in one input: [u8 stage] then records [u8 role:
// 0 = model states file, else a parameter's fp32.pt, taken in param_shapes order][u32 LE
// length][bytes of a torch file]. Besides not crashing, every tensor it maps must be made of
// pieces that add up to its elements and lie inside their file, and a trainable parameter's
// piece must be its fp32.pt's.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "base/endian.h"
#include "base/error.h"
#include "deepspeed/zero_checkpoint.h"
#include "piece_checks.h"
#include "torch/torch_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt;
  if (size < 1) return 0;
  std::vector<Bytes> models, params;
  for (size_t at = 1; at + 5 <= size && models.size() + params.size() < 64;) {
    uint8_t role = data[at];
    uint32_t len = LoadLE<uint32_t>(data + at + 1);
    at += 5;
    if (len > size - at) len = static_cast<uint32_t>(size - at);
    (role == 0 ? models : params).push_back(Bytes(data + at, len));
    at += len;
  }
  deepspeed::ZeroCheckpoint z;
  z.folder = "fuzz";
  z.universal = true;
  z.stage = 1 + data[0] % 3;
  std::vector<Bytes> inputs;
  auto read = [&](Bytes b) {
    std::optional<Format> format = DetectFormat(b);
    if (!format || *format == Format::kSafetensors) Fail("not a torch file");
    auto f = std::make_unique<CheckpointFile>();
    f->path = "file";
    f->torch = *format == Format::kTorchZip ? torch::ReadTorchZip(b) : torch::ReadTorchLegacy(b);
    z.files.push_back(std::move(f));
    inputs.push_back(b);
    return z.files.size() - 1;
  };
  std::vector<size_t> fp32_files;
  try {
    for (Bytes b : models) read(b);
    z.model_files = z.files.size();
    size_t next = 0;
    deepspeed::ConsolidateUniversal(z, [&](const std::string&) {
      if (next >= params.size()) Fail("no fp32.pt left");
      fp32_files.push_back(read(params[next++]));
      return fp32_files.back();
    });
  } catch (const Error&) {
    return 0;
  }
  for (const deepspeed::ZeroTensor& t : z.tensors) {
    fuzz::CheckPieces(t.pieces, t.numel, t.stored, inputs);
    for (const deepspeed::Piece& p : t.pieces) {
      if (t.kind == deepspeed::ZeroTensor::Kind::kTrainable && p.file < z.model_files)
        std::abort();  // a trainable parameter read from anywhere but its fp32.pt
    }
  }
  return 0;
}
