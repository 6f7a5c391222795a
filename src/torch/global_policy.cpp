#include "torch/global_policy.h"

#include <fmt/format.h>

#include <string>
#include <utility>

#include "torch/dtype.h"

namespace ckpt::torch {

namespace {

struct QualName {
  std::string_view module;
  std::string_view name;
};

// The tables stay packed.
// clang-format off
// Python 3's unpickler renames Python 2 modules (and a few single names) before importing
// them when the stream's protocol is below 3 (Lib/_compat_pickle.py IMPORT_MAPPING and the
// NAME_MAPPING entries that move a name to another module). Applied here whatever the
// protocol: a false alarm is cheaper than a hidden import.
constexpr std::pair<std::string_view, std::string_view> kImportMapping[] = {
    {"__builtin__", "builtins"}, {"__builtins__", "builtins"}, {"exceptions", "builtins"},
    {"copy_reg", "copyreg"}, {"Queue", "queue"}, {"SocketServer", "socketserver"},
    {"ConfigParser", "configparser"}, {"repr", "reprlib"}, {"tkFileDialog", "tkinter.filedialog"},
    {"tkSimpleDialog", "tkinter.simpledialog"}, {"tkColorChooser", "tkinter.colorchooser"},
    {"tkCommonDialog", "tkinter.commondialog"}, {"Dialog", "tkinter.dialog"}, {"Tkdnd", "tkinter.dnd"},
    {"tkFont", "tkinter.font"}, {"tkMessageBox", "tkinter.messagebox"},
    {"ScrolledText", "tkinter.scrolledtext"}, {"Tkconstants", "tkinter.constants"},
    {"Tix", "tkinter.tix"}, {"ttk", "tkinter.ttk"}, {"Tkinter", "tkinter"}, {"markupbase", "_markupbase"},
    {"_winreg", "winreg"}, {"thread", "_thread"}, {"dummy_thread", "_dummy_thread"},
    {"dbhash", "dbm.bsd"}, {"dumbdbm", "dbm.dumb"}, {"dbm", "dbm.ndbm"}, {"gdbm", "dbm.gnu"},
    {"xmlrpclib", "xmlrpc.client"}, {"SimpleXMLRPCServer", "xmlrpc.server"}, {"httplib", "http.client"},
    {"htmlentitydefs", "html.entities"}, {"HTMLParser", "html.parser"}, {"Cookie", "http.cookies"},
    {"cookielib", "http.cookiejar"}, {"BaseHTTPServer", "http.server"},
    {"test.test_support", "test.support"}, {"commands", "subprocess"}, {"urlparse", "urllib.parse"},
    {"robotparser", "urllib.robotparser"}, {"urllib2", "urllib.request"}, {"anydbm", "dbm"},
    {"_abcoll", "collections.abc"}, {"cPickle", "pickle"}, {"_elementtree", "xml.etree.ElementTree"},
    {"FileDialog", "tkinter.filedialog"}, {"SimpleDialog", "tkinter.simpledialog"},
    {"DocXMLRPCServer", "xmlrpc.server"}, {"SimpleHTTPServer", "http.server"},
    {"CGIHTTPServer", "http.server"}, {"UserDict", "collections"}, {"UserList", "collections"},
    {"UserString", "collections"}, {"whichdb", "dbm"}, {"StringIO", "io"},
};

constexpr std::pair<QualName, QualName> kNameMapping[] = {
    {{"__builtin__", "reduce"}, {"functools", "reduce"}},
    {{"__builtin__", "intern"}, {"sys", "intern"}},
    {{"_socket", "fromfd"}, {"socket", "fromfd"}},
    {{"_multiprocessing", "Connection"}, {"multiprocessing.connection", "Connection"}},
    {{"multiprocessing.forking", "Popen"}, {"multiprocessing.popen_fork", "Popen"}},
};

// Whole modules (and their submodules) whose globals can execute code, load code or data
// from elsewhere, or touch the system: files, processes, network, the import machinery.
constexpr std::string_view kUnsafeModules[] = {
    // processes, the OS, the interpreter
    "os", "nt", "posix", "sys", "subprocess", "_posixsubprocess", "pty", "signal", "resource",
    "fcntl", "termios", "mmap", "atexit", "platform", "commands", "popen2", "_winapi", "msvcrt",
    "winreg", "multiprocessing", "_multiprocessing", "threading", "_thread", "_dummy_thread",
    "concurrent", "asyncio", "ctypes", "_ctypes", "faulthandler", "gc",
    // running or compiling code
    "runpy", "code", "codeop", "timeit", "bdb", "pdb", "trace", "cProfile", "profile", "doctest",
    "pydoc", "idlelib", "lib2to3", "_pyrepl", "cgitb", "test.support",
    // importing, installing
    "importlib", "imp", "_imp", "_frozen_importlib", "_frozen_importlib_external", "pkgutil",
    "zipimport", "site", "ensurepip", "pip", "setuptools", "distutils", "venv", "_osx_support",
    "_aix_support",
    // nested pickles and other loaders
    "pickle", "_pickle", "cPickle", "dill", "cloudpickle", "joblib", "shelve", "marshal",
    "numpy.f2py", "numpy.distutils", "numpy.ctypeslib", "numpy.testing", "pandas.io.pickle",
    // files
    "shutil", "tempfile", "linecache", "fileinput", "zipfile", "tarfile", "logging.config",
    "logging.handlers",
    // network
    "socket", "_socket", "ssl", "_ssl", "socketserver", "http", "httplib", "urllib", "urllib2",
    "xmlrpc", "ftplib", "smtplib", "poplib", "imaplib", "nntplib", "telnetlib", "webbrowser",
    "wsgiref", "requests", "aiohttp", "httpx",
};

// Modules of torch (and their submodules) with the same powers: loading nested pickles,
// compiling and running code, remote calls.
constexpr std::string_view kUnsafeTorchModules[] = {
    "torch.serialization", "torch.hub", "torch.package", "torch.jit._serialization",
    "torch.jit.unsupported_tensor_ops", "torch.utils.cpp_extension", "torch.utils.bottleneck",
    "torch.utils.collect_env", "torch.utils._config_module", "torch.utils.benchmark",
    "torch.utils.data.datapipes.utils.decoder", "torch._inductor", "torch._dynamo",
    "torch.fx.experimental.symbolic_shapes", "torch.distributed.rpc", "torch.testing._internal",
};

// Single functions that are dangerous in otherwise ordinary modules.
constexpr QualName kUnsafeNames[] = {
    {"builtins", "eval"}, {"builtins", "exec"}, {"builtins", "execfile"}, {"builtins", "compile"},
    {"builtins", "open"}, {"builtins", "getattr"}, {"builtins", "setattr"}, {"builtins", "delattr"},
    {"builtins", "breakpoint"}, {"builtins", "input"}, {"builtins", "apply"}, {"builtins", "globals"},
    {"builtins", "locals"}, {"builtins", "vars"}, {"builtins", "file"}, {"builtins", "reload"},
    {"builtins", "help"}, {"builtins", "exit"}, {"builtins", "quit"},
    {"operator", "attrgetter"}, {"operator", "itemgetter"}, {"operator", "methodcaller"},
    {"operator", "getitem"}, {"operator", "call"}, {"_operator", "attrgetter"},
    {"_operator", "itemgetter"}, {"_operator", "methodcaller"}, {"_operator", "getitem"},
    {"_operator", "call"}, {"functools", "partial"}, {"_functools", "partial"},
    {"types", "CodeType"}, {"types", "FunctionType"}, {"types", "LambdaType"}, {"types", "MethodType"},
    {"io", "open"}, {"io", "FileIO"}, {"_io", "open"}, {"_io", "FileIO"}, {"codecs", "open"},
    {"logging", "FileHandler"}, {"uuid", "_get_command_stdout"}, {"pandas", "read_pickle"},
    {"torch.storage", "_load_from_bytes"},
};

// More single functions: loaders of other files (a pickle inside a pickle is never scanned).
constexpr QualName kUnsafeLoaders[] = {
    {"torch", "load"}, {"torch.jit", "load"}, {"numpy", "load"}, {"numpy", "loadtxt"},
    {"numpy", "fromfile"}, {"numpy.lib.npyio", "load"}, {"gzip", "open"}, {"bz2", "open"},
    {"lzma", "open"}, {"builtins", "__import__"},
};

constexpr QualName kTorchAllowed[] = {
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
};

// clang-format on

bool InModule(std::string_view module, std::string_view root) {
  return module == root || (module.size() > root.size() && module.starts_with(root) &&
                            module[root.size()] == '.');
}

template <size_t N>
bool InAny(std::string_view module, const std::string_view (&roots)[N]) {
  for (std::string_view root : roots) {
    if (InModule(module, root)) return true;
  }
  return false;
}

template <size_t N>
bool Listed(const QualName& q, const QualName (&names)[N]) {
  for (const QualName& n : names) {
    if (n.module == q.module && n.name == q.name) return true;
  }
  return false;
}

// What a Python 3 unpickler would import for (module, name).
QualName Normalize(std::string_view module, std::string_view name) {
  for (const auto& [from, to] : kNameMapping) {
    if (from.module == module && from.name == name) return to;
  }
  for (const auto& [from, to] : kImportMapping) {
    if (from == module) return {to, name};
  }
  return {module, name};
}

bool IsDunder(std::string_view name) {
  return name.size() > 4 && name.starts_with("__") && name.ends_with("__");
}

}  // namespace

GlobalClass ClassifyGlobal(std::string_view module, std::string_view name) {
  QualName q = Normalize(module, name);
  if (q.name.find('.') != std::string_view::npos || q.name.empty() || q.module.empty()) {
    return GlobalClass::kUnsafe;
  }
  // copyreg's constructors are how protocols 0 and 1 spell "make an object of this class".
  if (IsDunder(q.name) && !(q.module == "copyreg" && q.name.starts_with("__newobj"))) {
    return GlobalClass::kUnsafe;
  }
  if (Listed(q, kTorchAllowed)) return GlobalClass::kTorchAllowed;
  if (Listed(q, kUnsafeNames) || Listed(q, kUnsafeLoaders) || InAny(q.module, kUnsafeModules) ||
      InAny(q.module, kUnsafeTorchModules)) {
    return GlobalClass::kUnsafe;
  }
  if (q.module == "torch" || q.module == "torch.cuda") {
    if (q.name.ends_with("Storage") || q.name.ends_with("Tensor"))
      return GlobalClass::kTorchAllowed;
    if (q.module == "torch" && FromName(q.name)) return GlobalClass::kTorchAllowed;
  }
  return GlobalClass::kOther;
}

std::vector<UnsafeFinding> FindUnsafe(const pickle::Graph& graph) {
  using pickle::Kind;
  std::vector<UnsafeFinding> out;
  for (pickle::NodeId id = 0; id < graph.nodes.size(); ++id) {
    Kind kind = graph.kind(id);
    if (kind == Kind::kGlobal) {
      if (ClassifyGlobal(graph.global_module(id), graph.global_name(id)) == GlobalClass::kUnsafe) {
        out.push_back({id, "imports " + graph.GlobalText(id)});
      }
      continue;
    }
    if (kind != Kind::kObject) continue;
    pickle::NodeId callable = graph.compound(id).callable;
    if (callable == pickle::kNil || graph.kind(callable) == Kind::kGlobal) continue;
    pickle::NodeId maker = graph.CalledGlobal(callable);
    out.push_back(
        {id, maker != pickle::kNil
                 ? fmt::format("calls what {} returned", graph.GlobalText(maker))
                 : fmt::format("calls a computed {}", pickle::KindName(graph.kind(callable)))});
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
