// Fuzz target: the pickle parser, the safety verdict (torch/value_kinds.h) over what it built,
// the writer with a round trip as the oracle, then the tensor walker.
//
// Oracle: whatever graph the parser accepts, the writer either refuses (a ckpt::Error: a
// value the protocol cannot hold, nesting too deep...) or writes a pickle that parses back to
// the same graph (pickle::CompareGraphs: kinds, values and sharing) with the same digest
// (pickle::DigestGraph, which the rewriters check their read-back with). A written pickle that
// does not parse, or parses differently, aborts: that is a writer (or parser) bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "pickle/graph_compare.h"
#include "pickle/graph_digest.h"
#include "pickle/parser.h"
#include "pickle/writer.h"
#include "torch/global_policy.h"
#include "torch/model.h"

namespace {

[[noreturn]] void Mismatch(int protocol, const std::string& what) {
  std::fprintf(stderr, "pickle round trip (protocol %d): %s\n", protocol, what.c_str());
  std::abort();
}

void RoundTrip(ckpt::pickle::Graph& graph, int protocol) {
  ckpt::pickle::WriteOptions o;
  o.protocol = protocol;
  std::string written;
  try {
    written = ckpt::pickle::Write(graph, graph.root, o);
  } catch (const ckpt::Error&) {
    return;  // refused: allowed
  }
  ckpt::pickle::Graph back;
  try {
    // Default (larger) limits: the written stream may memoize more than the input did.
    ckpt::pickle::ParseResult r = ckpt::pickle::Parse(
        ckpt::Bytes(reinterpret_cast<const uint8_t*>(written.data()), written.size()));
    if (r.end != written.size()) Mismatch(protocol, "bytes after STOP in the written pickle");
    back = std::move(r.graph);
  } catch (const ckpt::Error& e) {
    Mismatch(protocol, std::string("the written pickle does not parse: ") + e.what());
  }
  std::string diff = ckpt::pickle::CompareGraphs(graph, graph.root, back, back.root);
  if (!diff.empty()) Mismatch(protocol, diff);
  if (ckpt::pickle::DigestGraph(graph, graph.root) != ckpt::pickle::DigestGraph(back, back.root)) {
    Mismatch(protocol, "equal graphs with different digests");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::pickle::Limits limits;
  limits.max_nodes = 1 << 20;
  limits.max_memo = 1 << 20;
  ckpt::torch::Model m;
  try {
    m.graph = ckpt::pickle::Parse(ckpt::Bytes(data, size), 0, limits).graph;
  } catch (const ckpt::Error&) {
    return 0;
  }
  // The verdict runs on every graph the parser builds (cycles, shared nodes, any shape): it
  // must never crash, and what it accepts must be what it says.
  ckpt::torch::PickleScan scan = ckpt::torch::ScanPickle(m.graph);
  if (scan.accepted.size() != m.graph.nodes.size()) std::abort();
  (void)ckpt::torch::DescribeEffects(m.graph);
  // The protocol torch writes, and the newest (which every value kind fits).
  RoundTrip(m.graph, 2);
  RoundTrip(m.graph, 5);
  try {
    ckpt::torch::BuildTensorTable(m, false);
  } catch (const ckpt::Error&) {
  }
  return 0;
}
