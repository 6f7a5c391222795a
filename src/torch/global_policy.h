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
// old spelling cannot hide a module.
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

// Every finding in `graph`, in node order.
std::vector<UnsafeFinding> FindUnsafe(const pickle::Graph& graph);

}  // namespace ckpt::torch
