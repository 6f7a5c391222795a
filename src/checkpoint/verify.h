// `ckptool verify`: checks what torch.load does not. CRC32 of every zip record, the
// container structure, storage record sizes against the pickle, every view inside its
// storage, safetensors offsets, and globals that could run code when unpickled.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "file/checkpoint_file.h"
#include "torch/global_policy.h"
#include "torch/model.h"

namespace ckpt {

struct VerifyResult {
  std::vector<torch::Problem> problems;  // empty: all is well
  std::vector<std::string> notes;        // worth knowing, never a failure
  uint64_t records_checked = 0;
  uint64_t bytes_checked = 0;  // bytes whose CRC32 was computed
};

// `checksums` false: the structure alone (the zip directory, sizes, the pickle), without
// reading every record for its CRC32.
VerifyResult Verify(const CheckpointFile& file, unsigned threads, const torch::Trust& trust = {},
                    bool checksums = true);

// The CRC32 of every record of a torch zip against its directory: a problem per mismatch or
// unreadable record, with records_checked and bytes_checked counted into `out`.
void CheckRecordCrcs(const CheckpointFile& f, unsigned threads, VerifyResult& out);

// What verifying one checkpoint (file, folder or archive) found, as `ckptool verify` prints
// it for every kind: one line per problem ("path: where: what"), else the OK line, then notes.
struct VerifyOutcome {
  std::vector<torch::Problem> problems;
  std::string ok;
  std::vector<std::string> notes;
};

}  // namespace ckpt
