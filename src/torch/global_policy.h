// What a pickle would import and call when torch.load unpickles it, judged: the safety
// verdict of `inspect`, `verify`, the rewriting commands and ckptool.load (docs/safety.md).
//
// The judgement itself is torch/value_kinds.h: every value gets a kind, and every call,
// BUILD, APPEND and SETITEM is accepted only when it fits a declared data constructor
// (torch/signatures.h). This file turns that into what the commands report: each imported
// name once with a verdict, and the findings in the order torch.load meets them.
//
// Verdicts of a name:
//   kUnsafe        on the deny list: dangerous to import or call at all. A finding.
//   kWeightsOnly   on torch's weights_only allowlist.
//   kAllowed       on ckptool's reviewed allowlist of data constructors.
//   kTrusted       the user trusts its module (--trust).
//   kCalls         called, and on no list: it runs code the file picks. A finding.
//   kReconstructed a class on no list instantiated without a call (NEWOBJ with no
//                  arguments, copyreg's helpers): its __setstate__ runs. A finding.
//   kReferenced    imported and only stored or passed along, never called. A note.
// Every call the kinds refuse is a finding too, whatever the names: a callable passed where
// only data may go, a computed callable, BUILD twice or with a dunder key, a getattr that is
// not an Enum member read.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pickle/graph.h"
#include "torch/global_lists.h"
#include "torch/trust.h"

namespace ckpt::torch {

enum class Verdict : uint8_t {
  kWeightsOnly,
  kAllowed,
  kTrusted,  // would be kCalls, kReconstructed or kReferenced; the user trusts its module
  kReferenced,
  kReconstructed,
  kCalls,
  kUnsafe,
};
const char* VerdictName(Verdict v);  // "weights_only", "allowed", "trusted", "referenced"...

// Something a regular unpickler would do that can run code: import an unsafe global, call an
// unlisted one, or call an object the pickle computed.
struct UnsafeFinding {
  pickle::NodeId node = pickle::kNil;
  std::string what;    // "imports posix.system", "calls builtins.print", "calls what X returned"
  std::string called;  // a "calls X" finding: X (what --trust is matched against); else empty
};

// One name a pickle brings in: an imported global, or an attribute read through getattr.
struct ImportedName {
  std::string name;  // Python 3 spelling; attribute reads end in " (getattr)"
  std::string raw;   // as spelled in the stream: "__builtin__.set", "pkg.Color.RED"
  GlobalClass cls = GlobalClass::kOther;
  bool getattr = false;
  Verdict verdict = Verdict::kReferenced;
};

struct PickleScan {
  std::vector<ImportedName> names;      // sorted by name, each once
  std::vector<UnsafeFinding> findings;  // in node order (the order torch.load meets them)
  // Per node: a call accepted as the data constructor it calls (with what was applied to
  // it), a global that may be imported; every other node 1. What ckptool.load may build.
  std::vector<uint8_t> accepted;
};

// Everything in `graph` that imports or reads a name, judged.
PickleScan ScanPickle(const pickle::Graph& graph, const Trust& trust = {});

// A finding as one line: what the pickle does and why that is a problem.
std::string ExplainFinding(const UnsafeFinding& u);

// ScanPickle(graph, trust).findings.
std::vector<UnsafeFinding> FindUnsafe(const pickle::Graph& graph, const Trust& trust = {});

// For a pickle torch.load would stop reading part way: every global imported and every call
// made before that point, in stream order, each with its verdict ("imports posix.system
// (unsafe), calls posix.system (unsafe)"); at most `max_items`, then "and N more". Empty if
// there were none.
std::string DescribeEffects(const pickle::Graph& graph, size_t max_items = 12);

}  // namespace ckpt::torch
