// How risky each global a pickle imports is.
//   kTorchAllowed: on torch's weights_only allowlist (torch/_weights_only_unpickler.py).
//   kUnsafe:       can run code or reach the system when unpickled (starts from
//                  picklescan's denylist: os/posix/subprocess, builtins eval/exec/getattr,
//                  importlib, runpy, ctypes, socket, pickle/marshal, ...).
//   kOther:        an ordinary class (argparse.Namespace, numpy, Lightning's
//                  AttributeDict...): weights_only refuses it, but nothing here flags it.
#pragma once

#include <string_view>
#include <vector>

#include "pickle/graph.h"

namespace ckpt::torch {

enum class GlobalClass { kTorchAllowed, kOther, kUnsafe };

GlobalClass ClassifyGlobal(std::string_view module, std::string_view name);
const char* GlobalClassName(GlobalClass c);

// Every global node of `graph` classified kUnsafe, in stream order.
std::vector<pickle::NodeId> UnsafeGlobals(const pickle::Graph& graph);

}  // namespace ckpt::torch
