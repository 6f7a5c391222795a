// What a pickle would import and call when torch.load unpickles it, each judged: the safety
// verdict of `inspect`, `verify` and the rewriting commands (docs/safety.md).
//
// Every global gets one verdict from the names in global_lists.h and from how the pickle uses
// it (REDUCE, NEWOBJ, NEWOBJ_EX, INST and OBJ call; BUILD, APPEND and SETITEM call methods of
// the object they apply to, so they are judged with that object's class):
//   kUnsafe        on the deny list: dangerous to import or call at all. A finding.
//   kWeightsOnly   on torch's weights_only allowlist.
//   kAllowed       on ckptool's reviewed allowlist of data constructors.
//   kCalls         called with arguments, or as a function, and on neither list: it runs
//                  code that the file picks when loaded. A finding ("calls X"), unless the
//                  user trusts its module (--trust).
//   kReconstructed a class whose instances are made without calling it (NEWOBJ with no
//                  arguments, copyreg._reconstructor(cls, object, ...)) and then given their
//                  state (BUILD): its __new__/__setstate__ run, but the file chooses no
//                  function to run. A note (dataclasses, argparse.Namespace, nn.Modules).
//   kReferenced    imported and only stored or passed along, never called. A note.
// Calling anything the pickle computed (what a call returned, a dict entry...) rather than
// an imported global is a finding too: that is how gadget chains such as
// operator.getitem(builtins.__dict__, 'eval') reach a function no import names.
//
// Attribute reads. Since Python 3.11 an Enum member pickles as getattr(EnumClass, 'NAME'):
// GLOBAL '__builtin__ getattr', GLOBAL 'module Class', a string, TUPLE2, REDUCE, with the
// getattr global memoised and fetched again (BINGET) for the next member. Such a call is
// judged as the attribute path Class.NAME, not as a use of getattr, when it is provably
// nothing more than a read:
//   - its arguments are exactly (an imported global G, a constant non-empty str S), built
//     by REDUCE, without keyword arguments;
//   - that getattr global is used nowhere else in the graph (not stored in a container, an
//     argument or an object state, not called in any other form);
//   - what it returned is never called and never the target of BUILD/APPEND/SETITEM.
// Then G.S is unsafe when G is, when S is a dunder or private name ("__..."), and when
// G.S reaches an unsafe module or function (getattr(os.path, 'join'),
// getattr(torch.serialization, 'load')); otherwise it is a reference. Any other use of
// getattr keeps it an unsafe import.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pickle/graph.h"
#include "torch/global_lists.h"

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

// Module globs the user trusts (--trust, `trust = [...]` in ckptool.toml): "mypkg" trusts
// mypkg and its submodules, "mypkg.*" likewise, "mypkg.models.Config" one name. Trust never
// lifts a deny-list verdict.
struct Trust {
  std::vector<std::string> patterns;
  bool Covers(std::string_view global) const;  // "module.name"
};

struct PickleScan {
  std::vector<ImportedName> names;      // sorted by name, each once
  std::vector<UnsafeFinding> findings;  // in node order (the order torch.load meets them)
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
