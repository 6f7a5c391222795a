// The names a pickle can import, in tables: how Python 3 renames Python 2 names, which names
// can run code or reach the system (the deny list), which are on torch's weights_only
// allowlist, and ckptool's reviewed allowlist of data constructors with what each does with
// the globals it is given. torch/global_policy.h judges a pickle's graph with them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ckpt::torch {

// How risky a name is by itself (whatever the pickle does with it):
//   kTorchAllowed: on torch's weights_only allowlist (torch/_weights_only_unpickler.py).
//   kUnsafe:       can run code or reach the system when imported or called (starts from
//                  picklescan's denylist: os/posix/subprocess, builtins eval/exec/getattr,
//                  importlib, runpy, ctypes, socket, pickle/marshal, sub-interpreters, known
//                  gadgets in the standard library, numpy and torch...). Also every attribute
//                  path ("serialization.os.system": protocol 4+ unpicklers walk it attribute by
//                  attribute, so it reaches anything) and every dunder attribute
//                  ("__builtins__", "__dict__": module internals).
//   kOther:        anything else (argparse.Namespace, numpy, a project's own classes...).
enum class GlobalClass { kTorchAllowed, kOther, kUnsafe };

// Names are first mapped the way Python 3 unpicklers map Python 2 names (_compat_pickle:
// "__builtin__" -> "builtins", "cPickle" -> "pickle", "commands" -> "subprocess"...), so an
// old spelling cannot hide a module; DisplayGlobal gives that Python 3 spelling.
GlobalClass ClassifyGlobal(std::string_view module, std::string_view name);
const char* GlobalClassName(GlobalClass c);
std::string DisplayGlobal(std::string_view module, std::string_view name);

// On ckptool's allowlist of data constructors (kOther names only; see global_lists.cpp).
bool IsAllowedGlobal(std::string_view module, std::string_view name);

// Is `path` (a module, or a module's attribute) one of the deny list's modules or below one?
bool IsUnsafeModulePath(std::string_view path);

}  // namespace ckpt::torch
