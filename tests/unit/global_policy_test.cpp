#include "torch/global_policy.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "pickle/parser.h"
#include "test_util.h"
#include "torch/torch_file.h"

namespace ckpt::torch {
namespace {

using Names = std::vector<std::pair<const char*, const char*>>;

TEST(GlobalPolicy, FlagsCodeExecutionAndSystemAccess) {
  for (auto [m, n] : Names{{"os", "system"},
                           {"posix", "system"},
                           {"nt", "system"},
                           {"subprocess", "Popen"},
                           {"builtins", "eval"},
                           {"__builtin__", "exec"},
                           {"builtins", "getattr"},
                           {"importlib", "import_module"},
                           {"importlib.util", "find_spec"},
                           {"runpy", "run_path"},
                           {"ctypes", "CDLL"},
                           {"socket", "socket"},
                           {"pickle", "loads"},
                           {"marshal", "loads"},
                           {"shutil", "rmtree"},
                           {"webbrowser", "open"},
                           {"torch.hub", "load"}}) {
    EXPECT_EQ(ClassifyGlobal(m, n), GlobalClass::kUnsafe) << m << "." << n;
  }
}

// Each of these runs code, loads a nested pickle or touches files when a regular unpickler
// imports and calls it (most are published picklescan bypasses).
TEST(GlobalPolicy, FlagsKnownGadgetsOutsideTheObviousModules) {
  for (auto [m, n] : Names{{"operator", "getitem"},
                           {"_operator", "attrgetter"},
                           {"_functools", "partial"},
                           {"builtins", "__import__"},
                           {"idlelib.calltip", "get_entity"},
                           {"lib2to3.pgen2.pgen", "ParserGenerator"},
                           {"numpy.f2py.crackfortran", "getlincoef"},
                           {"numpy.testing._private.utils", "runstring"},
                           {"pip", "main"},
                           {"pydoc", "pipepager"},
                           {"uuid", "_get_command_stdout"},
                           {"_osx_support", "_read_output"},
                           {"doctest", "debug_script"},
                           {"torch.utils.cpp_extension", "load_inline"},
                           {"torch.serialization", "load"},
                           {"torch.storage", "_load_from_bytes"},
                           {"torch._inductor.codecache", "compile_file"},
                           {"torch.jit.unsupported_tensor_ops", "execWrapper"},
                           {"torch.utils.benchmark", "Timer"},
                           {"io", "FileIO"},
                           {"_io", "open"},
                           {"logging.config", "dictConfig"},
                           {"logging", "FileHandler"},
                           {"zipfile", "ZipFile"},
                           {"ssl", "get_server_certificate"},
                           {"_socket", "socket"},
                           {"cloudpickle", "loads"},
                           {"dill", "loads"},
                           {"numpy", "load"}}) {
    EXPECT_EQ(ClassifyGlobal(m, n), GlobalClass::kUnsafe) << m << "." << n;
  }
}

// Python 3 maps Python 2 module names before importing (protocols 0-2); the old spelling
// must not hide the module.
TEST(GlobalPolicy, Python2SpellingsAreMappedFirst) {
  for (auto [m, n] : Names{{"cPickle", "loads"},
                           {"commands", "getoutput"},
                           {"StringIO", "open"},
                           {"thread", "start_new_thread"},
                           {"urllib2", "urlopen"},
                           {"SimpleHTTPServer", "test"},
                           {"__builtin__", "intern"},
                           {"exceptions", "eval"}}) {
    EXPECT_EQ(ClassifyGlobal(m, n), GlobalClass::kUnsafe) << m << "." << n;
  }
  EXPECT_EQ(ClassifyGlobal("copy_reg", "_reconstructor"), GlobalClass::kOther);
  EXPECT_EQ(ClassifyGlobal("__builtin__", "set"), GlobalClass::kTorchAllowed);
}

// Protocol 4+ unpicklers resolve "a.b.c" attribute by attribute: torch.serialization.os.system
// is spelled ('torch', 'serialization.os.system'). Dunder names reach module internals.
TEST(GlobalPolicy, AttributePathsAndDunderNamesAreUnsafe) {
  for (auto [m, n] : Names{{"torch", "serialization.os.system"},
                           {"collections", "OrderedDict.fromkeys"},
                           {"builtins", "object.__subclasses__"},
                           {"torch", "FloatStorage.from_file"},
                           {"builtins", "__dict__"},
                           {"torch", "__builtins__"},
                           {"argparse", "__loader__"},
                           {"builtins", ""},
                           {"", "eval"}}) {
    EXPECT_EQ(ClassifyGlobal(m, n), GlobalClass::kUnsafe) << m << "." << n;
  }
  EXPECT_EQ(ClassifyGlobal("copyreg", "__newobj__"), GlobalClass::kOther);
  EXPECT_EQ(ClassifyGlobal("copy_reg", "__newobj_ex__"), GlobalClass::kOther);
  EXPECT_EQ(ClassifyGlobal("__main__", "MyModel"), GlobalClass::kOther);
}

TEST(GlobalPolicy, OrdinaryClassesAreListedNotFlagged) {
  for (auto [m, n] : Names{{"argparse", "Namespace"},
                           {"numpy.core.multiarray", "_reconstruct"},
                           {"numpy", "dtype"},
                           {"pytorch_lightning.utilities.parsing", "AttributeDict"},
                           {"deepspeed.runtime.fp16.loss_scaler", "LossScaler"},
                           {"ossify", "x"},
                           {"builtins", "slice"},
                           {"pathlib", "PosixPath"},
                           {"collections", "defaultdict"},
                           {"omegaconf.dictconfig", "DictConfig"},
                           {"testing", "x"},
                           {"torch.nn.modules.linear", "Linear"}}) {
    EXPECT_EQ(ClassifyGlobal(m, n), GlobalClass::kOther) << m << "." << n;
  }
}

TEST(GlobalPolicy, TorchAllowlist) {
  for (auto [m, n] : Names{{"torch._utils", "_rebuild_tensor_v2"},
                           {"torch", "FloatStorage"},
                           {"torch", "BFloat16Storage"},
                           {"collections", "OrderedDict"},
                           {"torch", "bfloat16"},
                           {"torch.nn.parameter", "Parameter"},
                           {"torch", "Size"},
                           {"__builtin__", "set"},
                           {"torch.serialization", "_get_layout"}}) {
    EXPECT_EQ(ClassifyGlobal(m, n), GlobalClass::kTorchAllowed) << m << "." << n;
  }
}

template <size_t N>
std::string Bytes(const char (&s)[N]) {  // a literal with NULs inside
  return std::string(s, N - 1);
}

std::vector<std::string> Findings(const std::string& pickle) {
  pickle::Graph g = pickle::Parse(test::B(pickle)).graph;
  std::vector<std::string> out;
  for (const UnsafeFinding& f : FindUnsafe(g)) out.push_back(f.what);
  return out;
}

// operator.getitem(builtins.__dict__, 'eval')('1+1'): real Python evaluates it (the eval
// is never imported by name). The call of a computed object is a finding of its own.
TEST(GlobalPolicy, CallsOfComputedObjectsAreFindings) {
  std::string gadget = Bytes(
      "\x80\x02"
      "c_operator\ngetitem\n(cbuiltins\n__dict__\nX\x04\x00\x00\x00"
      "evaltR"
      "(X\x03\x00\x00\x00"
      "1+1tR.");
  EXPECT_EQ(Findings(gadget),
            (std::vector<std::string>{"imports _operator.getitem", "imports builtins.__dict__",
                                      "calls what _operator.getitem returned"}));
  // A call of something that is not even a call result (here a dict) is reported too.
  std::string odd = "\x80\x02}(tR.";
  EXPECT_EQ(Findings(odd), std::vector<std::string>{"calls a computed dict"});
  // What torch.save wrote has none.
  std::string fixture = test::ReadFixture("small.pt");
  EXPECT_TRUE(FindUnsafe(ReadTorchZip(test::B(fixture)).model.graph).empty());
}

}  // namespace
}  // namespace ckpt::torch
