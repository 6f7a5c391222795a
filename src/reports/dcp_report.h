// What `inspect` and `verify` say about a torch.distributed.checkpoint folder as a whole:
// the global tensors its chunks make (fqn, dtype, full shape, chunk count, bytes), a rollup
// by top-level key (model vs optim), the non-tensor objects with what their pickles import,
// and a byte account of every file that adds up to its size.
#pragma once

#include <string>
#include <vector>

#include "base/json_stream.h"
#include "dcp/dcp_checkpoint.h"

namespace ckpt {

std::string RenderDcpText(const dcp::Checkpoint& c, size_t top_n);
// The folder as one JSON object, written a tensor at a time.
void WriteDcpJson(JsonStream& out, const dcp::Checkpoint& c);

// verify: every problem the reader found, what the pickles could run, and the CRC32 of
// every record of every item. Each line names the tensor (or object) and the file.
struct DcpVerifyResult {
  std::vector<torch::Problem> problems;
  std::vector<std::string> notes;
  uint64_t items_checked = 0;
  uint64_t bytes_checked = 0;
};
DcpVerifyResult VerifyDcp(const dcp::Checkpoint& c, unsigned threads, bool checksums = true);

}  // namespace ckpt
