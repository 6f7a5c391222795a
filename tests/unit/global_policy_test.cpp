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
                           {"torch.hub", "load"},
                           {"six", "exec_"},
                           {"six.moves.builtins", "eval"}}) {
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

namespace ckpt::torch {
namespace {

std::vector<std::string> NamesOf(const std::string& pickle) {
  std::vector<std::string> out;
  for (const ImportedName& n : ScanPickle(pickle::Parse(test::B(pickle)).graph).names) {
    out.push_back(n.name + (n.cls == GlobalClass::kUnsafe ? " UNSAFE" : ""));
  }
  return out;
}

// BINUNICODE text.
std::string S(const std::string& text) {
  std::string out = "X";
  for (int i = 0; i < 4; ++i) out += static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return out + text;
}

// BINPUT 0 and BINGET 0.
std::string Put0() {
  return std::string("q\0", 2);
}
std::string Get0() {
  return std::string("h\0", 2);
}

// Python 3.11's Enum members (protocol 2, as torch.save writes them): getattr memoised in
// slot 0, the class in slot 1, and a second member through BINGET.
const std::string kTwoMembers = Bytes(
    "\x80\x02]q\x00("
    "c__builtin__\ngetattr\nq\x01"
    "cpkg.mod\nStage\nq\x02X\x09\x00\x00\x00GRADIENTS\x86R"
    "h\x01h\x02X\x07\x00\x00\x00WEIGHTS\x86R"
    "e.");

TEST(GlobalPolicy, EnumMembersThroughGetattrAreAttributeReads) {
  EXPECT_TRUE(FindUnsafe(pickle::Parse(test::B(kTwoMembers)).graph).empty());
  EXPECT_EQ(NamesOf(kTwoMembers),
            (std::vector<std::string>{"pkg.mod.Stage", "pkg.mod.Stage.GRADIENTS (getattr)",
                                      "pkg.mod.Stage.WEIGHTS (getattr)"}));
  PickleScan scan = ScanPickle(pickle::Parse(test::B(kTwoMembers)).graph);
  ASSERT_EQ(scan.names.size(), 3u);
  EXPECT_EQ(scan.names[1].raw, "pkg.mod.Stage.GRADIENTS");
  EXPECT_TRUE(scan.names[1].getattr);
  EXPECT_EQ(scan.names[1].cls, GlobalClass::kOther);
}

// Each of these keeps getattr an unsafe import, or makes the read itself unsafe.
TEST(GlobalPolicy, GetattrBeyondAPlainReadStaysAFinding) {
  const std::string g = "c__builtin__\ngetattr\n";
  const std::string p2 = "\x80\x02";
  struct Case {
    const char* what;
    std::string pickle;
    std::vector<std::string> findings;
  };
  std::vector<Case> cases = {
      {"a denied module's function",
       p2 + g + "cos\npath\n" + S("join") + "\x86R.",
       {"imports os.path", "reads os.path.join (getattr)"}},
      {"a module global reaching a denied name",
       p2 + g + "ctorch\nserialization\n" + S("load") + "\x86R.",
       {"reads torch.serialization.load (getattr)"}},
      {"a module's attribute that is a denied module",
       p2 + g + "ctorch\n_utils_internal\n" + S("os") + "\x86R.",
       {"reads torch._utils_internal.os (getattr)"}},
      {"a dunder attribute",
       p2 + g + "cpkg\nC\n" + S("__init__") + "\x86R.",
       {"reads pkg.C.__init__ (getattr)"}},
      {"a private attribute",
       p2 + g + "cpkg\nC\n" + S("__priv") + "\x86R.",
       {"reads pkg.C.__priv (getattr)"}},
      // pkg.name() and pkg.make() are calls of globals on no allowlist: findings of their own.
      {"a computed name",
       p2 + g + "cpkg\nC\n" + "cpkg\nname\n)R\x86R.",
       {"imports builtins.getattr", "calls pkg.name"}},
      {"a computed target",
       p2 + g + "cpkg\nmake\n)R" + S("attr") + "\x86R.",
       {"imports builtins.getattr", "calls pkg.make"}},
      {"the result called",
       p2 + g + "cpkg\nC\n" + S("attr") + "\x86R)R.",
       {"imports builtins.getattr", "calls what builtins.getattr returned"}},
      {"three arguments",
       p2 + g + "cpkg\nC\n" + S("attr") + "N\x87R.",
       {"imports builtins.getattr"}},
      {"nested getattr",
       p2 + g + Put0() + Get0() + "cpkg\nC\n" + S("attr") + "\x86R" + S("more") + "\x86R.",
       {"imports builtins.getattr"}},
      {"getattr stored in a list", p2 + "]" + g + "a.", {"imports builtins.getattr"}},
      {"getattr returned", p2 + g + ".", {"imports builtins.getattr"}},
      {"BUILD on the result",
       p2 + g + "cpkg\nC\n" + S("attr") + "\x86R}b.",
       {"imports builtins.getattr"}},
      {"SETITEM on the result",
       p2 + g + "cpkg\nC\n" + S("attr") + "\x86R" + S("k") + "Ns.",
       {"imports builtins.getattr"}},
      {"the memo reused on a dunder after a member",
       p2 + "(" + g + Put0() + "cpkg\nC\n" + S("attr") + "\x86R" + Get0() + "cpkg\nC\n" +
           S("__class__") + "\x86Rl.",
       {"reads pkg.C.__class__ (getattr)"}},
      {"the memo reused on a denied target after a member",
       p2 + "(" + g + Put0() + "cpkg\nC\n" + S("attr") + "\x86R" + Get0() + "cposix\nsystem\n" +
           S("attr") + "\x86Rl.",
       {"imports posix.system", "reads posix.system.attr (getattr)"}},
      {"NEWOBJ instead of REDUCE",
       p2 + g + "cpkg\nC\n" + S("attr") + "\x86\x81.",
       {"imports builtins.getattr"}},
  };
  for (const Case& c : cases) EXPECT_EQ(Findings(c.pickle), c.findings) << c.what;
}

TEST(GlobalPolicy, ReportsSpellBuiltinsThePython3Way) {
  EXPECT_EQ(DisplayGlobal("__builtin__", "getattr"), "builtins.getattr");
  EXPECT_EQ(DisplayGlobal("__builtin__", "reduce"), "functools.reduce");
  EXPECT_EQ(Findings("\x80\x02"
                     "c__builtin__\neval\n."),
            std::vector<std::string>{"imports builtins.eval"});
  PickleScan scan = ScanPickle(pickle::Parse(test::B("\x80\x02"
                                                     "c__builtin__\nset\n."))
                                   .graph);
  ASSERT_EQ(scan.names.size(), 1u);
  EXPECT_EQ(scan.names[0].name, "builtins.set");
  EXPECT_EQ(scan.names[0].raw, "__builtin__.set");
}

}  // namespace
}  // namespace ckpt::torch
