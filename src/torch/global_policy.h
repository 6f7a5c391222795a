// How risky each global a pickle imports is, and what in a pickle can run code.
//   kTorchAllowed: on torch's weights_only allowlist (torch/_weights_only_unpickler.py).
//   kUnsafe:       can run code or reach the system when unpickled (starts from
//                  picklescan's denylist: os/posix/subprocess, builtins eval/exec/getattr,
//                  importlib, runpy, ctypes, socket, pickle/marshal, known gadgets in the
//                  standard library, numpy and torch ...). Also every attribute path
//                  ("serialization.os.system": protocol 4+ unpicklers walk it attribute by
//                  attribute, so it reaches anything) and every dunder attribute
//                  ("__builtins__", "__dict__": module internals).
//   kOther:        an ordinary class (argparse.Namespace, numpy, Lightning's
//                  AttributeDict...): weights_only refuses it, but nothing here flags it.
// Names are first mapped the way Python 3 unpicklers map Python 2 names (_compat_pickle:
// "__builtin__" -> "builtins", "cPickle" -> "pickle", "commands" -> "subprocess"...), so an
// old spelling cannot hide a module; reports use that Python 3 spelling.
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
// getattr(torch.serialization, 'load')); otherwise it is only off the weights_only
// allowlist. Any other use of getattr keeps it an unsafe import.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "pickle/graph.h"

namespace ckpt::torch {

enum class GlobalClass { kTorchAllowed, kOther, kUnsafe };

GlobalClass ClassifyGlobal(std::string_view module, std::string_view name);
const char* GlobalClassName(GlobalClass c);

// Something a regular unpickler would do that can run code: import an unsafe global, or call
// an object the pickle computed (what another call returned, a dict entry...) rather than an
// imported global: the way gadget chains such as operator.getitem(builtins.__dict__, 'eval')
// reach a function no import names. torch.save never writes either.
struct UnsafeFinding {
  pickle::NodeId node = pickle::kNil;
  std::string what;  // "imports posix.system", "calls what operator.getitem returned"
};

// One name a pickle brings in: an imported global, or an attribute read through getattr.
struct ImportedName {
  std::string name;  // Python 3 spelling; attribute reads end in " (getattr)"
  std::string raw;   // as spelled in the stream: "__builtin__.set", "pkg.Color.RED"
  GlobalClass cls = GlobalClass::kOther;
  bool getattr = false;
};

struct PickleScan {
  std::vector<ImportedName> names;      // sorted by name, each once
  std::vector<UnsafeFinding> findings;  // in node order
};

// Everything in `graph` that imports or reads a name, and what can run code.
PickleScan ScanPickle(const pickle::Graph& graph);

// ScanPickle(graph).findings.
std::vector<UnsafeFinding> FindUnsafe(const pickle::Graph& graph);

// module.name as a Python 3 unpickler would import it ("__builtin__", "getattr" ->
// "builtins.getattr").
std::string DisplayGlobal(std::string_view module, std::string_view name);

}  // namespace ckpt::torch
