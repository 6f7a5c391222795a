// A 128-bit digest of an object graph's structure, sharing included: two graphs that
// CompareGraphs (graph_compare.h) finds different get different digests, barring an XXH3-128
// collision (the digest is a little stricter: a global's module and name count apart, where
// CompareGraphs compares "module.name"). Lets a writer check its read-back against a graph it
// has already freed.
#pragma once

#include <cstdint>

#include "pickle/graph.h"

namespace ckpt::pickle {

struct GraphDigest {
  uint64_t low = 0;
  uint64_t high = 0;
  bool operator==(const GraphDigest&) const = default;
};

// Digest of everything reachable from `root`: each node's kind and value, its children in
// order, and which references lead to one shared node. Linear in the nodes reached.
GraphDigest DigestGraph(const Graph& g, NodeId root);

}  // namespace ckpt::pickle
