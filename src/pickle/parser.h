// A pickle parser that never executes anything: it reads protocols 0-5 into a Graph.
//
// It reads what CPython's C unpickler (Modules/_pickle.c) reads from a file object, which is
// what torch.load runs: the same opcode stream (FRAME handling: stream_reader.h), the same
// text grammars for protocol-0 arguments (text_codec.h), the same stack, mark and memo rules,
// and it fails where _pickle.c fails (docs/pickle-parity.md lists each rule and its source).
//
// Supported opcodes: every opcode of protocols 0-5 except EXT1/2/4 (they name entries of
// Python's copyreg extension registry, which is empty in a torch process: _pickle.c fails
// there too) and the out-of-band buffer opcodes NEXT_BUFFER/READONLY_BUFFER (torch.load gives
// no buffers: _pickle.c fails). GLOBAL/STACK_GLOBAL/INST only record the name;
// REDUCE/NEWOBJ/OBJ/BUILD only record what would be called.
//
// Hard limits keep hostile input bounded in time and memory; each failure is an Error
// naming the stream offset and the opcode.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/byte_cursor.h"
#include "pickle/graph.h"
#include "pickle/stream_reader.h"

namespace ckpt::pickle {

struct Limits {
  uint64_t max_nodes = 1u << 25;  // values created (each ~50 bytes)
  uint64_t max_memo = 1u << 25;   // memo entries
  uint32_t max_depth = 2000;      // open MARKs and container nesting
};

// How to read (ParsePartial's alternative readings, for describing a refused pickle).
struct Reading {
  FrameMode frames = FrameMode::kStrict;
  // BUILD on an imported object (a module, class or function) is refused in a normal
  // reading. With this set it is applied instead, as a regular unpickler would: its dict
  // state sets attributes, so a later GLOBAL or STACK_GLOBAL of module.attribute yields the
  // value set rather than an import. What such a pickle goes on to import and call can then
  // be judged.
  bool apply_patches = false;
};

struct ParseResult {
  Graph graph;
  uint64_t end = 0;  // bytes consumed, through STOP
  // Values and MARKs still on the stack under the result at STOP. Unpicklers ignore them;
  // no pickler leaves any, so they mean a damaged stream (one flipped bit can turn the
  // closing SETITEMS of a dict into a TUPLE).
  size_t leftover = 0;
  // Bytes of the last FRAME still unread at STOP. _pickle.c reading a file has read them
  // (the next pickle of a legacy torch file starts after them); no pickler leaves any.
  uint64_t frame_rest = 0;
  // What _pickle.c accepts and reads as ckptool does, but no pickler writes: the marks of a
  // stream made to confuse scanners or code that walks the result ("pickle offset 23: a
  // second PROTO opcode..."). Readers report them as problems.
  std::vector<std::string> anomalies;
  uint64_t max_memo_key = 0;  // the largest memo index PUT, BINPUT, LONG_BINPUT or MEMOIZE set
};

// Parses one pickle from the start of `data`; `base_offset` is where `data` starts in the
// file, so messages give file offsets. Throws ckpt::Error at the first opcode _pickle.c
// would fail on, and where a straight reading and _pickle.c's would differ (kStrict).
ParseResult Parse(Bytes data, uint64_t base_offset = 0, const Limits& limits = {},
                  const Reading& reading = {});

// Like Parse, but never throws for what the stream holds: `result.graph` has every node made
// before the failing opcode, so the globals imported and the calls made by then (what
// torch.load would have run before failing) can be judged. `result.end` is where reading
// stopped.
struct PartialParse {
  ParseResult result;
  std::string error;      // empty when the pickle was read through its STOP
  bool diverged = false;  // the error is a FrameDivergence (stream_reader.h)
  bool patched = false;   // the error is a BUILD/APPEND/SETITEM on an imported object
};
PartialParse ParsePartial(Bytes data, uint64_t base_offset = 0, const Limits& limits = {},
                          const Reading& reading = {});

}  // namespace ckpt::pickle
