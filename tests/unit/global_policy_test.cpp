#include "torch/global_policy.h"

#include <gtest/gtest.h>

#include <map>
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
std::map<std::string, std::string> Verdicts(const std::string& pickle, const Trust& trust = {});

std::string TwoMembers(const std::string& module, const std::string& cls, const std::string& a,
                       const std::string& b) {
  return std::string("\x80\x02]q\x00(c__builtin__\ngetattr\nq\x01", 29) + "c" + module + "\n" +
         cls + "\nq\x02" + S(a) + "\x86Rh\x01h\x02" + S(b) + "\x86Re.";
}

TEST(GlobalPolicy, EnumMembersThroughGetattrAreAttributeReads) {
  const std::string members =
      TwoMembers("transformers.trainer_utils", "IntervalStrategy", "STEPS", "EPOCH");
  EXPECT_TRUE(FindUnsafe(pickle::Parse(test::B(members)).graph).empty());
  EXPECT_EQ(NamesOf(members), (std::vector<std::string>{
                                  "transformers.trainer_utils.IntervalStrategy",
                                  "transformers.trainer_utils.IntervalStrategy.EPOCH (getattr)",
                                  "transformers.trainer_utils.IntervalStrategy.STEPS (getattr)"}));
  PickleScan scan = ScanPickle(pickle::Parse(test::B(members)).graph);
  ASSERT_EQ(scan.names.size(), 3u);
  EXPECT_EQ(scan.names[2].raw, "transformers.trainer_utils.IntervalStrategy.STEPS");
  EXPECT_TRUE(scan.names[2].getattr);
  EXPECT_EQ(scan.names[2].verdict, Verdict::kAllowed);
  // getattr reads members of allowlisted Enums only: on any other target the lookup runs its
  // code (a module's __getattr__) and can return a method (getattr(pathlib.Path, 'write_text')).
  const std::string unlisted = TwoMembers("pkg.mod", "Stage", "GRADIENTS", "WEIGHTS");
  EXPECT_EQ(Findings(unlisted),
            (std::vector<std::string>{"reads pkg.mod.Stage.GRADIENTS (getattr)",
                                      "reads pkg.mod.Stage.WEIGHTS (getattr)"}));
  EXPECT_EQ(Findings(TwoMembers("pathlib", "Path", "write_text", "mkdir")),
            (std::vector<std::string>{"reads pathlib.Path.write_text (getattr)",
                                      "reads pathlib.Path.mkdir (getattr)"}));
  // ... unless the user trusts the Enum's module.
  EXPECT_TRUE(FindUnsafe(pickle::Parse(test::B(unlisted)).graph, Trust{{"pkg"}}).empty());
  EXPECT_EQ(Verdicts(unlisted, Trust{{"pkg"}})["pkg.mod.Stage.GRADIENTS (getattr)"], "trusted");
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
       {"reads pkg.C.attr (getattr)", "reads pkg.C.__class__ (getattr)"}},
      {"the memo reused on a denied target after a member",
       p2 + "(" + g + Put0() + "cpkg\nC\n" + S("attr") + "\x86R" + Get0() + "cposix\nsystem\n" +
           S("attr") + "\x86Rl.",
       {"reads pkg.C.attr (getattr)", "imports posix.system", "reads posix.system.attr (getattr)"}},
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

namespace ckpt::torch {
namespace {

using namespace std::string_literals;

// name -> verdict of every global the pickle names.
std::map<std::string, std::string> Verdicts(const std::string& pickle, const Trust& trust) {
  pickle::Graph g = pickle::Parse(test::B(pickle)).graph;
  std::map<std::string, std::string> out;
  for (const ImportedName& n : ScanPickle(g, trust).names) out[n.name] = VerdictName(n.verdict);
  return out;
}

TEST(CallAllowlist, CallsOfUnlistedNamesAreFindings) {
  // REDUCE of a name on no list: "calls X", whatever it is (print is harmless; the frame
  // exploits hide exactly such calls).
  std::string call =
      "\x80\x02"
      "cbuiltins\nprint\nX\x02\x00\x00\x00hi\x85R."s;
  EXPECT_EQ(Findings(call), std::vector<std::string>{"calls builtins.print"});
  EXPECT_EQ(Verdicts(call)["builtins.print"], "calls");
  // INST and OBJ call what they name; NEWOBJ with arguments calls its __new__.
  EXPECT_EQ(Findings("(X\x01\x00\x00\x00"
                     "aipkg\nmake\n."s),
            std::vector<std::string>{"calls pkg.make"});
  EXPECT_EQ(Findings("\x80\x02"
                     "cpkg\nC\nK\x01\x85\x81."s),
            std::vector<std::string>{"calls pkg.C"});
  // The sub-interpreters that run source text are on the deny list.
  EXPECT_EQ(Verdicts("\x80\x02"
                     "c_xxsubinterpreters\ncreate\n)R."s)["_xxsubinterpreters.create"],
            "unsafe");
  EXPECT_EQ(Verdicts("\x80\x02"
                     "c_interpreters\nrun_string\n."s)["_interpreters.run_string"],
            "unsafe");
}

TEST(CallAllowlist, ReconstructionOfUnlistedClassesIsAFinding) {
  // A dataclass: GLOBAL, EMPTY_TUPLE, NEWOBJ, BUILD with its fields. Its __setstate__ (or a
  // __setattr__, a property) runs: _DataPipeSerializationWrapper's calls pickle.loads.
  std::string dc =
      "\x80\x02"
      "cpkg\nConfig\n)\x81}X\x01\x00\x00\x00"
      "aK\x01sb."s;
  EXPECT_EQ(Findings(dc), std::vector<std::string>{
                              "makes pkg.Config without calling it (NEWOBJ): not on the allowlist, "
                              "and its __setstate__ runs when loaded"});
  EXPECT_EQ(Verdicts(dc)["pkg.Config"], "reconstructed");
  EXPECT_TRUE(FindUnsafe(pickle::Parse(test::B(dc)).graph, Trust{{"pkg"}}).empty());
  // Protocol 0/1: copyreg._reconstructor(cls, object, None).
  std::string p1 = "ccopy_reg\n_reconstructor\n(cpkg\nC\nc__builtin__\nobject\nNtR."s;
  EXPECT_EQ(Findings(p1),
            std::vector<std::string>{"makes pkg.C without calling it (copyreg._reconstructor): not "
                                     "on the allowlist, and its __setstate__ runs when loaded"});
  EXPECT_EQ(Verdicts(p1)["pkg.C"], "reconstructed");
  EXPECT_EQ(Verdicts(p1)["copyreg._reconstructor"], "allowed");
  // An allowlisted class is made so: argparse.Namespace, torch.__version__'s TorchVersion.
  EXPECT_TRUE(
      Findings("ccopy_reg\n_reconstructor\n(cargparse\nNamespace\nc__builtin__\nobject\nNtR."s)
          .empty());
  EXPECT_TRUE(Findings("\x80\x02"
                       "ccopy_reg\n_reconstructor\nctorch.torch_version\nTorchVersion\n"
                       "c__builtin__\nstr\nX\x06\x00\x00\x00"
                       "2.13.0\x87R."s)
                  .empty());
  // ... but with another base, base.__new__(cls, state) and base.__init__ run: the base must be
  // object or a builtin data type.
  std::string p1b = "ccopy_reg\n_reconstructor\n(cargparse\nNamespace\ncpkg\nBase\nNtR."s;
  EXPECT_EQ(Findings(p1b), std::vector<std::string>{
                               "passes pkg.Base to copyreg._reconstructor as its argument 2, where "
                               "it takes only object or a builtin data type: "
                               "copyreg._reconstructor would call it"});
  // A name only stored is a reference.
  EXPECT_EQ(Verdicts("\x80\x02"
                     "cpkg\nthing\n\x85."s)["pkg.thing"],
            "referenced");
}

TEST(CallAllowlist, AllowedConstructorsThatCallTheirArguments) {
  // torch._tensor._rebuild_from_type_v2(func, new_type, args, state) calls func: only a tensor
  // rebuild function may go there.
  std::string s =
      "\x80\x02"
      "ctorch._tensor\n_rebuild_from_type_v2\n(cpkg\nevil\nctorch\nTensor\n)"
      "}tR."s;
  EXPECT_EQ(Findings(s), std::vector<std::string>{
                             "passes pkg.evil to torch._tensor._rebuild_from_type_v2 as its "
                             "argument 1, where it takes only a tensor rebuild function: "
                             "torch._tensor._rebuild_from_type_v2 would call it"});
  // ... also when the callable is laundered through an allowed function: max([print]) is
  // refused where print goes in as data.
  std::string laundered =
      "\x80\x02"
      "ctorch._tensor\n_rebuild_from_type_v2\n(cbuiltins\nmax\n]cbuiltins\nprint\na\x85R"
      "ctorch\nTensor\n)}tR."s;
  EXPECT_EQ(Findings(laundered),
            std::vector<std::string>{"calls builtins.max with a list holding builtins.print "
                                     "as its argument 1, where only data may go: a "
                                     "callable passed as data is called by what receives it"});
  // map(f, xs) calls f when iterated (by list(), say): map is on no list.
  std::string m =
      "\x80\x02"
      "cbuiltins\nlist\ncbuiltins\nmap\ncpkg\nf\n]\x86R\x85R."s;
  EXPECT_EQ(Findings(m), std::vector<std::string>{"calls builtins.map"});
  // defaultdict's factory is called for a missing key: a data type only.
  EXPECT_TRUE(Findings("\x80\x02"
                       "ccollections\ndefaultdict\ncbuiltins\nlist\n\x85R."s)
                  .empty());
  EXPECT_EQ(
      Findings("\x80\x02"
               "ccollections\ndefaultdict\ncbuiltins\nprint\n\x85R."s),
      std::vector<std::string>{
          "passes builtins.print to collections.defaultdict as its argument 1, where it takes "
          "only a builtin data type: collections.defaultdict would call it"});
  // Data constructors of the real stacks are allowed.
  for (const char* g :
       {"collections\ndefaultdict\n", "datetime\ndatetime\n", "pathlib\nPosixPath\n",
        "argparse\nNamespace\n", "numpy.core.multiarray\n_reconstruct\n",
        "transformers.trainer_utils\nIntervalStrategy\n",
        "torch._dynamo.decorators\n_DimRange\n"}) {
    std::string call =
        "\x80\x02"
        "c"s +
        g + ")R.";
    EXPECT_TRUE(Findings(call).empty()) << g;
  }
}

TEST(CallAllowlist, BuildPlantsNoMethods) {
  // OrderedDict() + BUILD {'__setstate__': print} + BUILD 'hi': _pickle.c finds the planted
  // __setstate__ on the instance and calls print('hi').
  const std::string od =
      "\x80\x02"
      "ccollections\nOrderedDict\n)R";
  EXPECT_EQ(Findings(od + "}" + S("__setstate__") + "cbuiltins\nprint\nsb" + S("hi") + "b."),
            std::vector<std::string>{"BUILD twice on what collections.OrderedDict made: the first "
                                     "state can plant a __setstate__ in the instance that the "
                                     "second BUILD calls"});
  // One BUILD planting a callable (APPENDS then calls the planted extend).
  EXPECT_EQ(Findings(od + "}" + S("extend") + "cbuiltins\nprint\nsb(" + S("x") + "e."),
            std::vector<std::string>{
                "BUILD gives what collections.OrderedDict made a state holding a dict holding "
                "builtins.print: planted as an attribute, it is called by whatever looks that "
                "method up"});
  // Data state is fine (state_dict's _metadata), a dunder key is not.
  EXPECT_TRUE(Findings(od + "}" + S("_metadata") + "}sb.").empty());
  EXPECT_EQ(Findings(od + "}" + S("__dict__") + "}sb."),
            std::vector<std::string>{"BUILD sets '__dict__' on what collections.OrderedDict made: "
                                     "a dunder attribute planted in the instance"});
  // APPENDS onto what a function returned (not an instance): its append is looked up.
  EXPECT_EQ(Findings("\x80\x02"
                     "cbuiltins\nlen\n](K\x01"
                     "e\x85R(K\x01"
                     "e."s),
            std::vector<std::string>{"applies BUILD, APPEND or SETITEM to what builtins.len "
                                     "returned, which is no instance"});
}

TEST(CallAllowlist, TrustAcceptsAModuleButNeverTheDenyList) {
  std::string call =
      "\x80\x02"
      "cmyproj.models\nConfig\nK\x01\x85R."s;
  EXPECT_FALSE(Findings(call).empty());
  pickle::Graph g = pickle::Parse(test::B(call)).graph;
  for (const char* p : {"myproj", "myproj.*", "myproj.models.Config", "myproj.models.*"}) {
    EXPECT_TRUE(FindUnsafe(g, Trust{{p}}).empty()) << p;
    EXPECT_EQ(Verdicts(call, Trust{{p}})["myproj.models.Config"], "trusted") << p;
  }
  EXPECT_FALSE(FindUnsafe(g, Trust{{"myproject"}}).empty());
  EXPECT_FALSE(FindUnsafe(g, Trust{{"other.*"}}).empty());
  pickle::Graph os = pickle::Parse(test::B("\x80\x02"
                                           "cos\nsystem\nX\x01\x00\x00\x00x\x85R."s))
                         .graph;
  EXPECT_FALSE(FindUnsafe(os, Trust{{"os"}}).empty());
}

TEST(CallAllowlist, DescribeEffectsListsWhatRunsInOrder) {
  std::string s =
      "\x80\x02"
      "cbuiltins\nprint\nX\x02\x00\x00\x00hi\x85R0cposix\nsystem\n."s;
  EXPECT_EQ(DescribeEffects(pickle::Parse(test::B(s)).graph),
            "imports builtins.print, calls builtins.print (UNSAFE: not on the allowlist), imports "
            "posix.system (UNSAFE)");
}

}  // namespace
}  // namespace ckpt::torch
