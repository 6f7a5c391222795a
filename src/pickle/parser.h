// A pickle parser that never executes anything: it reads protocols 0-5 into a Graph.
//
// Supported opcodes: every opcode of protocols 0-5 except EXT1/2/4 (they name entries of
// Python's copyreg extension registry, which only a live interpreter can resolve) and the
// out-of-band buffer opcodes NEXT_BUFFER/READONLY_BUFFER (the buffers are not in the file).
// GLOBAL/STACK_GLOBAL/INST only record the name; REDUCE/NEWOBJ/OBJ/BUILD only record what
// would be called. FRAME headers are checked and skipped.
//
// Hard limits keep hostile input bounded in time and memory; each failure is an Error
// naming the stream offset and the opcode.
#pragma once

#include <cstdint>

#include "base/byte_cursor.h"
#include "pickle/graph.h"

namespace ckpt::pickle {

struct Limits {
  uint64_t max_nodes = 1u << 25;  // values created (each ~50 bytes)
  uint64_t max_memo = 1u << 25;   // memo entries
  uint32_t max_depth = 2000;      // open MARKs and container nesting
};

struct ParseResult {
  Graph graph;
  uint64_t end = 0;  // bytes consumed, through STOP
  // Values and MARKs still on the stack under the result at STOP. Unpicklers ignore them;
  // no pickler leaves any, so they mean a damaged stream (one flipped bit can turn the
  // closing SETITEMS of a dict into a TUPLE).
  size_t leftover = 0;
};

// Parses one pickle from the start of `data`; `base_offset` is where `data` starts in the
// file, so messages give file offsets.
ParseResult Parse(Bytes data, uint64_t base_offset = 0, const Limits& limits = {});

}  // namespace ckpt::pickle
