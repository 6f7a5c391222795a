// Fuzz target: the pickle parser, then the tensor walker and the writer over what it built.
#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "pickle/parser.h"
#include "pickle/writer.h"
#include "torch/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::pickle::Limits limits;
  limits.max_nodes = 1 << 20;
  limits.max_memo = 1 << 20;
  try {
    ckpt::torch::Model m;
    m.graph = ckpt::pickle::Parse(ckpt::Bytes(data, size), 0, limits).graph;
    ckpt::torch::BuildTensorTable(m, false);
    ckpt::pickle::WriteOptions o;
    o.protocol = 5;
    ckpt::pickle::Write(m.graph, m.graph.root, o);
  } catch (const ckpt::Error&) {
  }
  return 0;
}
