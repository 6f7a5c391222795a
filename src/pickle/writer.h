// Writes a Graph back to a pickle stream: the inverse of the parser, for transforms that
// rewrite checkpoints.
//
// Output uses the protocol given (at least 2) and only the opcodes torch's weights_only
// unpickler knows where the value allows it: GLOBAL (never STACK_GLOBAL), BINUNICODE,
// BININT*, LONG1, BINFLOAT, BINPUT/BINGET, MARK/TUPLE*/APPENDS/SETITEMS, REDUCE, NEWOBJ,
// BUILD, BINPERSID. Values that only exist in newer protocols (bytes, sets, frozensets,
// NEWOBJ_EX, bytearray) are written with their own opcodes; they came from a file of that
// protocol. Containers and objects are memoized before their children, like CPython's
// pickler, so shared references and cycles come back as shared references and cycles.
#pragma once

#include <functional>
#include <string>

#include "pickle/graph.h"

namespace ckpt::pickle {

struct WriteOptions {
  int protocol = 2;
  // Called right before a persistent id is written (lets a caller number storages in the
  // order the stream first refers to them, as torch does).
  std::function<void(NodeId persid)> before_persid;
  // Bytes to reserve for the output up front (e.g. the size of the pickle the graph was read
  // from): a stream of many MiB then grows without its doubling copies. Reserved pages that
  // are never written cost address space, not memory.
  size_t reserve = 0;
};

std::string Write(Graph& graph, NodeId root, const WriteOptions& options = {});

}  // namespace ckpt::pickle
