// Fuzz target: torch.distributed.checkpoint folders (dcp/dcp_checkpoint.h) given in one input
// as records [u8 name length][name][u32 LE length][bytes]; the first record is the .metadata
// pickle, the others the folder's files by relative path. Besides not crashing: a tensor the
// reader calls complete must read back, through its logical model, as exactly numel elements
// from spans inside the inputs, and problems must be reported for anything it leaves out.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "base/endian.h"
#include "base/error.h"
#include "dcp/dcp_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt;
  Bytes metadata;
  std::map<std::string, Bytes> files;
  bool first = true;
  for (size_t at = 0; at < size && files.size() < 16;) {
    size_t name_len = data[at++];
    if (name_len > size - at) break;
    std::string name(reinterpret_cast<const char*>(data + at), name_len);
    at += name_len;
    if (size - at < 4) break;
    uint32_t len = LoadLE<uint32_t>(data + at);
    at += 4;
    if (len > size - at) len = static_cast<uint32_t>(size - at);
    if (first) {
      metadata = Bytes(data + at, len);
      first = false;
    } else {
      files[name] = Bytes(data + at, len);
    }
    at += len;
  }
  if (first) return 0;
  dcp::Checkpoint c;
  try {
    c = dcp::ReadDcp(metadata, files);
  } catch (const Error&) {
    return 0;
  }
  size_t complete = 0;
  for (const dcp::Tensor& t : c.tensors) complete += t.complete;
  LogicalModel m = dcp::DcpLogicalModel(c);
  if (m.tensors.size() != complete) std::abort();
  if (complete < c.tensors.size() && c.problems.empty()) std::abort();  // left out silently
  for (const LogicalTensor& t : m.tensors) {
    uint64_t want = t.numel * torch::ElementSize(t.stored);
    if (want > (uint64_t{64} << 20)) continue;
    uint64_t got = 0;
    try {
      t.read(0, t.numel, [&](Bytes span) { got += span.size(); });
    } catch (const Error&) {
      std::abort();  // a complete tensor must read
    }
    if (got != want) std::abort();
  }
  return 0;
}
