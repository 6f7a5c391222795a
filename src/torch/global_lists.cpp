#include "torch/global_lists.h"

#include <fmt/format.h>

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
    {{"__builtin__", "xrange"}, {"builtins", "range"}}, {{"__builtin__", "unicode"}, {"builtins", "str"}},
    {{"__builtin__", "long"}, {"builtins", "int"}}, {{"__builtin__", "basestring"}, {"builtins", "str"}},
    {{"__builtin__", "unichr"}, {"builtins", "chr"}},
    {{"itertools", "izip"}, {"builtins", "zip"}}, {{"itertools", "imap"}, {"builtins", "map"}},
    {{"itertools", "ifilter"}, {"builtins", "filter"}},
    {{"itertools", "ifilterfalse"}, {"itertools", "filterfalse"}},
    {{"itertools", "izip_longest"}, {"itertools", "zip_longest"}},
    {{"UserDict", "IterableUserDict"}, {"collections", "UserDict"}},
    {{"UserList", "UserList"}, {"collections", "UserList"}},
    {{"UserString", "UserString"}, {"collections", "UserString"}},
    {{"UserDict", "UserDict"}, {"collections", "UserDict"}}, {{"whichdb", "whichdb"}, {"dbm", "whichdb"}},
    {{"multiprocessing.process", "Process"}, {"multiprocessing.context", "Process"}},
    {{"socket", "_socketobject"}, {"socket", "SocketType"}},
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
    // sub-interpreters: run_string() runs source text (3.11 _xxsubinterpreters, 3.13+
    // _interpreters, 3.14 concurrent.interpreters)
    "_xxsubinterpreters", "_interpreters", "_xxinterpchannels", "_interpchannels",
    "_xxinterpqueues", "_interpqueues", "interpreters",
    // foreign code, code generation, and modules that act when imported
    "cffi", "_pyio", "antigravity", "this", "turtle", "tkinter", "_tkinter", "IPython",
    "ipykernel", "ast", "dis", "compileall", "py_compile", "symtable",
};

// Modules of torch (and their submodules) with the same powers: loading nested pickles,
// compiling and running code, remote calls.
constexpr std::string_view kUnsafeTorchModules[] = {
    "torch.serialization", "torch.hub", "torch.package", "torch.jit._serialization",
    "torch.jit.unsupported_tensor_ops", "torch.utils.cpp_extension", "torch.utils.bottleneck",
    "torch.utils.collect_env", "torch.utils._config_module", "torch.utils.benchmark",
    "torch.utils.data.datapipes.utils.decoder", "torch._inductor", "torch._dynamo",
    "torch.fx", "torch.distributed.rpc", "torch.testing", "torch.jit", "torch.distributed.elastic",
    "torch.distributed.launcher", "torch.distributed.run", "torch.multiprocessing", "torch.export",
    "torch._export", "torch.onnx", "torch.ops", "torch._ops", "torch.library", "torch.classes",
    "torch._classes", "torch.compiler", "torch.utils.tensorboard", "torch._higher_order_ops",
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
    {"torch", "save"}, {"numpy", "save"}, {"numpy", "savez"}, {"numpy", "savez_compressed"},
    {"numpy", "savetxt"}, {"numpy", "genfromtxt"}, {"numpy", "memmap"}, {"torch", "compile"},
    {"torch", "from_file"}, {"torch", "vmap"}, {"torch", "cond"},
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


// ckptool's reviewed allowlist: data constructors a file may call (or name) beyond torch's
// weights_only list, and the classes the real training stacks pickle. Each builds a value
// from its arguments without running code that the file chooses; what those that take
// other globals as arguments accept there is declared in torch/signatures.cpp. A name here
// is still judged by the deny list first (it is never on it). No allowlisted class makes
// callable instances: the verdict relies on data never being callable.
constexpr QualName kAllowed[] = {
    // builtins and the standard library's value types
    {"builtins", "set"}, {"builtins", "frozenset"}, {"builtins", "bytearray"}, {"builtins", "bytes"},
    {"builtins", "complex"}, {"builtins", "slice"}, {"builtins", "range"}, {"builtins", "list"},
    {"builtins", "dict"}, {"builtins", "tuple"}, {"builtins", "int"}, {"builtins", "float"},
    {"builtins", "str"}, {"builtins", "bool"}, {"builtins", "object"}, {"builtins", "NoneType"},
    {"builtins", "Ellipsis"}, {"builtins", "NotImplemented"}, {"builtins", "len"},
    {"builtins", "abs"}, {"builtins", "min"}, {"builtins", "max"}, {"builtins", "sum"},
    {"builtins", "round"}, {"builtins", "sorted"}, {"builtins", "reversed"},
    {"builtins", "enumerate"}, {"builtins", "zip"}, {"builtins", "any"}, {"builtins", "all"},
    {"builtins", "divmod"},
    {"collections", "OrderedDict"}, {"collections", "Counter"}, {"collections", "defaultdict"},
    {"collections", "deque"}, {"collections", "ChainMap"}, {"_collections", "deque"},
    {"_collections", "defaultdict"}, {"_collections", "OrderedDict"},
    {"_codecs", "encode"}, {"codecs", "encode"},
    {"copyreg", "_reconstructor"}, {"copyreg", "__newobj__"}, {"copyreg", "__newobj_ex__"},
    {"_operator", "or_"}, {"operator", "or_"},  // how Python >= 3.11 pickles combined Flags
    {"datetime", "datetime"}, {"datetime", "date"}, {"datetime", "time"},
    {"datetime", "timedelta"}, {"datetime", "timezone"}, {"decimal", "Decimal"},
    {"fractions", "Fraction"}, {"uuid", "UUID"}, {"uuid", "SafeUUID"}, {"re", "_compile"},
    {"pathlib", "Path"}, {"pathlib", "PosixPath"}, {"pathlib", "WindowsPath"},
    {"pathlib", "PurePath"}, {"pathlib", "PurePosixPath"}, {"pathlib", "PureWindowsPath"},
    {"pathlib._local", "Path"}, {"pathlib._local", "PosixPath"}, {"pathlib._local", "WindowsPath"},
    {"pathlib._local", "PurePath"}, {"pathlib._local", "PurePosixPath"},
    {"pathlib._local", "PureWindowsPath"}, {"argparse", "Namespace"}, {"types", "SimpleNamespace"},
    // numpy arrays, scalars, dtypes and random states
    {"numpy", "ndarray"}, {"numpy", "dtype"}, {"numpy.core.multiarray", "_reconstruct"},
    {"numpy._core.multiarray", "_reconstruct"}, {"numpy.core.multiarray", "scalar"},
    {"numpy._core.multiarray", "scalar"}, {"numpy.core.numeric", "_frombuffer"},
    {"numpy._core.numeric", "_frombuffer"}, {"numpy.random._pickle", "__randomstate_ctor"},
    {"numpy.random._pickle", "__generator_ctor"}, {"numpy.random._pickle", "__bit_generator_ctor"},
    {"numpy.random.mtrand", "RandomState"}, {"numpy.random._generator", "Generator"},
    {"numpy.random._mt19937", "MT19937"}, {"numpy.random._pcg64", "PCG64"},
    {"numpy.random._pcg64", "PCG64DXSM"}, {"numpy.random._philox", "Philox"},
    {"numpy.random._sfc64", "SFC64"},
    // torch values outside weights_only's list
    {"torch.nn.parameter", "Buffer"}, {"torch.nn.parameter", "UninitializedParameter"},
    {"torch", "contiguous_format"}, {"torch", "channels_last"}, {"torch", "channels_last_3d"},
    {"torch", "preserve_format"}, {"torch", "strided"}, {"torch", "sparse_coo"},
    {"torch", "sparse_csr"}, {"torch", "sparse_csc"}, {"torch", "sparse_bsr"},
    {"torch", "sparse_bsc"}, {"torch", "_mkldnn"}, {"torch", "jagged"},
    {"torch._utils", "_rebuild_sparse_csr_tensor"},
    // torch.__version__ (a str subclass: copyreg._reconstructor(TorchVersion, str, '2.13.0'))
    {"torch.torch_version", "TorchVersion"},
    // jagged nested tensors (torch 2.x adds these to weights_only's list when torch.nested is
    // imported): a dataclass of two ints, the tensor class, and its rebuild function
    {"torch._dynamo.decorators", "_DimRange"},
    {"torch.nested._internal.nested_tensor", "NestedTensor"},
    {"torch.nested._internal.nested_tensor", "_rebuild_njt"},
    {"torch.distributed.checkpoint.metadata", "Metadata"},
    {"torch.distributed.checkpoint.metadata", "MetadataIndex"},
    {"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"},
    {"torch.distributed.checkpoint.metadata", "TensorStorageMetadata"},
    {"torch.distributed.checkpoint.metadata", "BytesStorageMetadata"},
    {"torch.distributed.checkpoint.metadata", "TensorProperties"},
    {"torch.distributed.checkpoint.metadata", "StorageMeta"},
    {"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"},
    {"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
    {"torch.distributed._shard.checkpoint.filesystem", "_StorageInfo"},
    {"megatron.core.dist_checkpointing.strategies.torch", "MCoreMetadata"},
    {"torch.distributed.checkpoint.planner", "WriteItemType"},
    {"torch.distributed.checkpoint.planner", "LoadItemType"},
    {"torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"},
    {"torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"},
    {"torch.distributed._shard.metadata", "ShardMetadata"},
    {"torch.distributed._shard.checkpoint.metadata", "Metadata"},
    {"torch.distributed._shard.checkpoint.metadata", "MetadataIndex"},
    {"torch.distributed._shard.checkpoint.metadata", "ChunkStorageMetadata"},
    {"torch.distributed._shard.checkpoint.metadata", "TensorStorageMetadata"},
    {"torch.distributed._shard.checkpoint.metadata", "BytesStorageMetadata"},
    // Enums, dataclasses and value classes of the training stacks (before Python 3.11 an Enum
    // member pickles as a call of its class with its value)
    {"deepspeed.runtime.zero.config", "ZeroStageEnum"},
    {"deepspeed.runtime.zero.offload_config", "OffloadDeviceEnum"},
    {"deepspeed.runtime.fp16.loss_scaler", "LossScaler"},
    {"deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"},
    {"deepspeed.utils.tensor_fragment", "fragment_address"},
    {"deepspeed.checkpoint.constants", "ZERO_STAGE"},
    {"transformers.trainer_utils", "IntervalStrategy"}, {"transformers.trainer_utils", "SchedulerType"},
    {"transformers.trainer_utils", "HubStrategy"}, {"transformers.trainer_utils", "SaveStrategy"},
    {"transformers.trainer_utils", "EvaluationStrategy"}, {"transformers.trainer_utils", "FSDPOption"},
    {"transformers.trainer_utils", "ShardedDDPOption"}, {"transformers.training_args", "OptimizerNames"},
    {"transformers.training_args", "ParallelMode"}, {"transformers.training_args", "TrainingArguments"},
    {"transformers.training_args_seq2seq", "Seq2SeqTrainingArguments"},
    {"transformers.debug_utils", "DebugOption"}, {"transformers.utils.generic", "PaddingStrategy"},
    {"transformers.utils.generic", "TensorType"}, {"transformers.trainer_pt_utils", "AcceleratorConfig"},
    // TrainingArguments (training_args.bin) holds accelerate's process state, rebuilt from its
    // __dict__ (no __setstate__; a Borg whose class code is accelerate's own)
    {"accelerate.state", "PartialState"}, {"accelerate.state", "AcceleratorState"},
    {"accelerate.utils.dataclasses", "DistributedType"}, {"accelerate.utils.dataclasses", "PrecisionType"},
    {"accelerate.utils.dataclasses", "DynamoBackend"}, {"accelerate.utils.dataclasses", "RNGType"},
    {"lightning.fabric.utilities.data", "AttributeDict"},
    {"lightning.pytorch.trainer.states", "TrainerStatus"},
    {"lightning.pytorch.trainer.states", "TrainerFn"},
    {"lightning.pytorch.trainer.states", "RunningStage"},
    {"pytorch_lightning.trainer.states", "TrainerStatus"},
    {"pytorch_lightning.trainer.states", "TrainerFn"},
    {"pytorch_lightning.trainer.states", "RunningStage"},
    {"lightning_fabric.utilities.data", "AttributeDict"},
    {"pytorch_lightning.utilities.parsing", "AttributeDict"},
    {"lightning.pytorch.utilities.parsing", "AttributeDict"},
    {"megatron.core.enums", "ModelType"}, {"megatron.core.transformer.enums", "AttnMaskType"},
    {"megatron.core.transformer.enums", "AttnType"}, {"megatron.core.transformer.enums", "AttnBackend"},
    {"megatron.core.transformer.enums", "ModelType"}, {"megatron.model.enums", "AttnMaskType"},
    {"megatron.model.enums", "AttnType"}, {"megatron.model.enums", "LayerType"},
    {"megatron.model.enums", "PositionEmbeddingType"},
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
  // A reviewed name is judged by itself, not by the module it lives in (torch._dynamo).
  if (Listed(q, kAllowed)) return GlobalClass::kOther;
  if (Listed(q, kUnsafeNames) || Listed(q, kUnsafeLoaders) || InAny(q.module, kUnsafeModules) ||
      InAny(q.module, kUnsafeTorchModules)) {
    return GlobalClass::kUnsafe;
  }
  // A module's attribute named like a module of the deny list is, in practice, that module
  // (GLOBAL 'pathlib os' is the os module pathlib imported): judged as what it resolves to.
  if (InAny(q.name, kUnsafeModules)) return GlobalClass::kUnsafe;
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

bool IsAllowedGlobal(std::string_view module, std::string_view name) {
  return Listed(Normalize(module, name), kAllowed);
}

bool IsUnsafeModulePath(std::string_view path) {
  return InAny(path, kUnsafeModules) || InAny(path, kUnsafeTorchModules);
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
