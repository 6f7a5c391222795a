#include "torch/global_policy.h"

#include <array>
#include <string>

#include "torch/dtype.h"

namespace ckpt::torch {

namespace {

// Whole modules (and their submodules) whose globals can execute code or touch the system.
constexpr std::array<std::string_view, 52> kUnsafeModules = {
    "os", "nt", "posix", "sys", "subprocess", "_posixsubprocess", "socket", "shutil",
    "runpy", "importlib", "pkgutil", "code", "codeop", "ctypes", "_ctypes", "marshal",
    "pickle", "_pickle", "cPickle", "dill", "shelve", "pty", "timeit", "bdb", "pdb",
    "asyncio", "pydoc", "venv", "webbrowser", "httplib", "http", "urllib", "urllib2",
    "requests", "aiohttp", "httpx", "ftplib", "smtplib", "telnetlib", "multiprocessing",
    "threading", "_thread", "signal", "platform", "commands", "popen2", "cProfile",
    "profile", "trace", "zipimport", "linecache", "tempfile",
};

struct QualName {
  std::string_view module;
  std::string_view name;
};

// Single functions that are dangerous in otherwise ordinary modules.
constexpr std::array<QualName, 30> kUnsafeNames = {{
    {"builtins", "eval"},        {"builtins", "exec"},       {"builtins", "execfile"},
    {"builtins", "compile"},     {"builtins", "open"},       {"builtins", "getattr"},
    {"builtins", "setattr"},     {"builtins", "delattr"},    {"builtins", "__import__"},
    {"builtins", "breakpoint"},  {"builtins", "input"},      {"builtins", "apply"},
    {"builtins", "globals"},     {"builtins", "locals"},     {"builtins", "vars"},
    {"builtins", "file"},        {"builtins", "reload"},     {"operator", "attrgetter"},
    {"operator", "methodcaller"}, {"types", "CodeType"},     {"types", "FunctionType"},
    {"functools", "partial"},    {"logging.config", "listen"}, {"torch", "load"},
    {"torch.serialization", "load"}, {"torch.hub", "load"},  {"torch.hub", "load_state_dict_from_url"},
    {"numpy", "load"},           {"numpy.testing._private.utils", "runstring"},
    {"io", "open"},
}};

constexpr std::array<QualName, 31> kTorchAllowed = {{
    {"collections", "OrderedDict"}, {"collections", "Counter"},
    {"torch.nn.parameter", "Parameter"}, {"torch.serialization", "_get_layout"},
    {"torch", "Size"}, {"torch", "Tensor"}, {"torch", "device"},
    {"_codecs", "encode"}, {"builtins", "bytearray"}, {"builtins", "set"},
    {"builtins", "complex"},
    {"torch._utils", "_rebuild_parameter"}, {"torch._utils", "_rebuild_parameter_with_state"},
    {"torch._utils", "_rebuild_qtensor"}, {"torch._utils", "_rebuild_tensor"},
    {"torch._utils", "_rebuild_tensor_v2"}, {"torch._utils", "_rebuild_tensor_v3"},
    {"torch._utils", "_rebuild_sparse_tensor"}, {"torch._utils", "_rebuild_sparse_csr_tensor"},
    {"torch._utils", "_rebuild_meta_tensor_no_storage"},
    {"torch._utils", "_rebuild_wrapper_subclass"},
    {"torch._utils", "_rebuild_device_tensor_from_numpy"},
    {"torch._utils", "_rebuild_device_tensor_from_cpu_tensor"},
    {"torch._utils", "_rebuild_nested_tensor"},
    {"torch._tensor", "_rebuild_from_type_v2"},
    {"torch", "per_tensor_affine"}, {"torch", "per_channel_affine"},
    {"torch", "per_tensor_symmetric"}, {"torch", "per_channel_symmetric"},
    {"torch", "per_channel_affine_float_qparams"}, {"torch.storage", "UntypedStorage"},
}};

bool InModule(std::string_view module, std::string_view root) {
  return module == root || (module.size() > root.size() && module.starts_with(root) &&
                            module[root.size()] == '.');
}

}  // namespace

GlobalClass ClassifyGlobal(std::string_view module, std::string_view name) {
  std::string_view m = module;
  if (m == "__builtin__" || m == "__builtins__") m = "builtins";
  for (const QualName& n : kUnsafeNames) {
    if (n.module == m && n.name == name) return GlobalClass::kUnsafe;
  }
  for (std::string_view root : kUnsafeModules) {
    if (InModule(m, root)) return GlobalClass::kUnsafe;
  }
  for (const QualName& n : kTorchAllowed) {
    if (n.module == m && n.name == name) return GlobalClass::kTorchAllowed;
  }
  if (m == "torch" || m == "torch.cuda") {
    std::string_view n = name;
    if (n.ends_with("Storage") || n.ends_with("Tensor")) return GlobalClass::kTorchAllowed;
    if (m == "torch" && FromName(n)) return GlobalClass::kTorchAllowed;
  }
  return GlobalClass::kOther;
}

std::vector<pickle::NodeId> UnsafeGlobals(const pickle::Graph& graph) {
  std::vector<pickle::NodeId> out;
  for (pickle::NodeId id = 0; id < graph.nodes.size(); ++id) {
    if (graph.kind(id) == pickle::Kind::kGlobal &&
        ClassifyGlobal(graph.global_module(id), graph.global_name(id)) == GlobalClass::kUnsafe) {
      out.push_back(id);
    }
  }
  return out;
}

const char* GlobalClassName(GlobalClass c) {
  switch (c) {
    case GlobalClass::kTorchAllowed: return "torch-allowed";
    case GlobalClass::kOther: return "other";
    case GlobalClass::kUnsafe: return "unsafe";
  }
  return "?";
}

}  // namespace ckpt::torch
