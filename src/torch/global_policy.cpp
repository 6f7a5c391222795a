#include "torch/global_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "base/names.h"
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
    // compatibility layers that re-export the above (six.moves.builtins.eval...)
    "six.moves",
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
    {"torch.storage", "_load_from_bytes"}, {"six", "exec_"}, {"future.utils", "exec_"},
    {"past.builtins", "execfile"},
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
  return module == root || IsBelowKeyPath(module, root);
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

std::string DisplayGlobal(std::string_view module, std::string_view name) {
  QualName q = Normalize(module, name);
  return fmt::format("{}.{}", q.module, q.name);
}

namespace {

// Reading attribute `attr` of the imported global module.name (see the header).
GlobalClass ClassifyAttribute(std::string_view module, std::string_view name,
                              std::string_view attr) {
  if (attr.empty() || attr.starts_with("__") || attr.find('.') != std::string_view::npos) {
    return GlobalClass::kUnsafe;
  }
  if (ClassifyGlobal(module, name) == GlobalClass::kUnsafe) return GlobalClass::kUnsafe;
  // A module's attribute may be another module it imported (torch._utils_internal.os).
  if (InAny(attr, kUnsafeModules) || InAny(attr, kUnsafeTorchModules)) return GlobalClass::kUnsafe;
  // The global may itself be a module (GLOBAL 'torch serialization'): its attribute is then
  // a global of that module.
  if (ClassifyGlobal(DisplayGlobal(module, name), attr) == GlobalClass::kUnsafe) {
    return GlobalClass::kUnsafe;
  }
  return GlobalClass::kOther;
}

bool IsGetattr(const pickle::Graph& g, pickle::NodeId id) {
  if (g.kind(id) != pickle::Kind::kGlobal) return false;
  QualName q = Normalize(g.global_module(id), g.global_name(id));
  return q.module == "builtins" && q.name == "getattr";
}

// How every node is used by the others: as the callable of some object, or in any other
// place (an element, a key or value, an argument tuple, a BUILD state, the root).
struct Uses {
  std::vector<uint8_t> called;
  std::vector<uint8_t> elsewhere;

  explicit Uses(const pickle::Graph& g) : called(g.nodes.size()), elsewhere(g.nodes.size()) {
    auto mark = [&](pickle::NodeId id) {
      if (id != pickle::kNil && id < elsewhere.size()) elsewhere[id] = 1;
    };
    // Every child of every node: tuples keep their items in the node, the others in a
    // Compound.
    for (pickle::NodeId n = 0; n < g.nodes.size(); ++n) {
      if (!g.has_compound(n)) continue;
      for (pickle::NodeId id : g.items(n)) mark(id);
      for (pickle::NodeId id : g.pairs(n)) mark(id);
      for (pickle::NodeId id : g.states(n)) mark(id);
      const pickle::Compound& c = g.compound(n);
      mark(c.args);
      mark(c.kwargs);
      if (c.callable != pickle::kNil && c.callable < called.size()) called[c.callable] = 1;
    }
    mark(g.root);
  }
};

// A call getattr(G, 'S') whose result is only ever read: its attribute path, else nil.
struct AttributeRead {
  pickle::NodeId global = pickle::kNil;
  pickle::NodeId attr = pickle::kNil;
};

AttributeRead AsAttributeRead(const pickle::Graph& g, const Uses& uses, pickle::NodeId call) {
  const pickle::Compound& c = g.compound(call);
  if (c.construct != pickle::Construct::kReduce || c.kwargs != pickle::kNil || uses.called[call] ||
      !g.items(call).empty() || !g.pairs(call).empty() || !g.states(call).empty() ||
      g.ArgCount(call) != 2) {
    return {};
  }
  pickle::NodeId target = g.Arg(call, 0), attr = g.Arg(call, 1);
  if (g.kind(target) != pickle::Kind::kGlobal || g.kind(attr) != pickle::Kind::kStr ||
      g.text(attr).empty()) {
    return {};
  }
  return {target, attr};
}

}  // namespace

PickleScan ScanPickle(const pickle::Graph& graph) {
  using pickle::Kind;
  using pickle::NodeId;
  PickleScan scan;
  const size_t n = graph.nodes.size();
  Uses uses(graph);

  // Every call of a getattr global, and whether all of that global's uses are plain reads.
  std::vector<NodeId> getattr_calls;
  std::vector<uint8_t> reads_only(n);  // getattr globals excused as attribute reads
  for (NodeId id = 0; id < n; ++id) {
    if (IsGetattr(graph, id)) reads_only[id] = uses.called[id] && !uses.elsewhere[id];
  }
  for (NodeId id = 0; id < n; ++id) {
    if (graph.kind(id) != Kind::kObject) continue;
    NodeId callable = graph.compound(id).callable;
    if (callable == pickle::kNil || !IsGetattr(graph, callable)) continue;
    getattr_calls.push_back(id);
    if (AsAttributeRead(graph, uses, id).global == pickle::kNil) reads_only[callable] = 0;
  }

  std::set<std::string> listed;
  auto add_name = [&](ImportedName name) {
    if (listed.insert(name.name).second) scan.names.push_back(std::move(name));
  };
  size_t next_read = 0;
  for (NodeId id = 0; id < n; ++id) {
    Kind kind = graph.kind(id);
    if (kind == Kind::kGlobal) {
      if (reads_only[id]) continue;  // judged by its reads below
      std::string_view module = graph.global_module(id), name = graph.global_name(id);
      GlobalClass cls = ClassifyGlobal(module, name);
      std::string display = DisplayGlobal(module, name);
      if (cls == GlobalClass::kUnsafe) scan.findings.push_back({id, "imports " + display});
      add_name({display, graph.GlobalText(id), cls, false});
      continue;
    }
    if (kind != Kind::kObject) continue;
    NodeId callable = graph.compound(id).callable;
    if (next_read < getattr_calls.size() && getattr_calls[next_read] == id) {
      ++next_read;
      if (reads_only[callable]) {
        AttributeRead read = AsAttributeRead(graph, uses, id);
        std::string_view module = graph.global_module(read.global),
                         name = graph.global_name(read.global);
        std::string_view attr = graph.text(read.attr);
        GlobalClass cls = ClassifyAttribute(module, name, attr);
        std::string path = fmt::format("{}.{}", DisplayGlobal(module, name), attr);
        if (cls == GlobalClass::kUnsafe)
          scan.findings.push_back({id, fmt::format("reads {} (getattr)", path)});
        add_name({path + " (getattr)", fmt::format("{}.{}", graph.GlobalText(read.global), attr),
                  cls, true});
        continue;
      }
    }
    if (callable == pickle::kNil || graph.kind(callable) == Kind::kGlobal) continue;
    NodeId maker = graph.CalledGlobal(callable);
    scan.findings.push_back(
        {id, maker != pickle::kNil
                 ? fmt::format("calls what {} returned",
                               DisplayGlobal(graph.global_module(maker), graph.global_name(maker)))
                 : fmt::format("calls a computed {}", pickle::KindName(graph.kind(callable)))});
  }
  std::sort(scan.names.begin(), scan.names.end(),
            [](const ImportedName& a, const ImportedName& b) { return a.name < b.name; });
  return scan;
}

std::vector<UnsafeFinding> FindUnsafe(const pickle::Graph& graph) {
  return ScanPickle(graph).findings;
}

const char* GlobalClassName(GlobalClass c) {
  switch (c) {
    case GlobalClass::kTorchAllowed:
      return "torch-allowed";
    case GlobalClass::kOther:
      return "other";
    case GlobalClass::kUnsafe:
      return "unsafe";
  }
  return "?";
}

}  // namespace ckpt::torch
