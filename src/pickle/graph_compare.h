// Structural equality of two object graphs, sharing included: the same values, and two
// references to one node on one side are two references to one node on the other.
#pragma once

#include <functional>
#include <string>

#include "pickle/graph.h"

namespace ckpt::pickle {

// Returns "" when equal, else a description of the first difference found.
// `skip(a_node)` returning true makes that subtree of `a` match anything (used to ignore
// the parts a transform changed on purpose, such as storage ids).
std::string CompareGraphs(const Graph& a, NodeId a_root, const Graph& b, NodeId b_root,
                          const std::function<bool(NodeId)>& skip = nullptr);

}  // namespace ckpt::pickle
