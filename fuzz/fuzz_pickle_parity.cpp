// Differential fuzz target: ckptool's pickle parser against CPython's C unpickler
// (Modules/_pickle.c) reading the same bytes from an io.BytesIO, which is how torch.load reads
// a zip's data.pkl. CPython runs embedded; its Unpickler subclass resolves every global to a
// recording stand-in class, so nothing the pickle names is ever imported or called: the
// stand-ins log the globals the unpickler looks up and the calls it makes (REDUCE, NEWOBJ,
// NEWOBJ_EX, INST, OBJ), in order. ckptool's graph gives the same log from its nodes.
//
// What must hold (anything else aborts with both logs):
//   - ckptool refuses on purpose (modifying an imported object or a storage, its limits): what
//     it saw until then is a prefix of CPython's log, or CPython failed first and its log is a
//     prefix of ckptool's;
//   - else, CPython loads the pickle: ckptool reads it too, with the same log;
//   - else, CPython fails: everything it did before failing is a prefix of ckptool's log
//     (ckptool saw all of it; it may read further or fail at the same place).
// Inputs on which CPython runs out of memory prove nothing; a memo index beyond 2^20 is not
// given to it at all (_pickle.c sizes its memo array to twice the index and zeroes it).
// The corpus is replayed by ctest (fuzz_replay.pickle_parity).
#include <Python.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pickle/parser.h"

namespace {

// The harness, run once: parity(data) -> (loaded, log, error).
constexpr const char* kHarness = R"PY(
import io, pickle, warnings
warnings.simplefilter("ignore")  # STRING escapes CPython deprecates, and the like

log = []

class _Meta(type):
    def __call__(cls, *args, **kwargs):      # REDUCE, INST/OBJ with arguments
        log.append(("c", cls._name))
        return object.__new__(cls)

class _Base(metaclass=_Meta):
    _name = "?"
    def __new__(cls, *args, **kwargs):       # NEWOBJ, NEWOBJ_EX, INST/OBJ without arguments
        log.append(("c", cls._name))
        return object.__new__(cls)
    def __call__(self, *args, **kwargs):     # a computed object called
        log.append(("c", "?"))
        return object.__new__(_Computed)
    def __setstate__(self, state):
        pass
    def __setitem__(self, key, value):
        pass
    def extend(self, items):
        pass
    def append(self, item):
        pass
    def add(self, item):
        pass
    def __hash__(self):
        return id(self)
    def __eq__(self, other):
        return self is other

class _Computed(_Base):
    _name = "?"

class _Storage:
    """What torch's persistent_load returns: a TypedStorage, which has item assignment but no
    extend/append/add and no __setstate__ (BUILD sets attributes)."""
    def __setitem__(self, key, value):
        pass

_classes = {}

class _Recorder(pickle.Unpickler):
    def find_class(self, module, name):
        # What a real import refuses fails here too.
        if not module or not name or "\0" in module + name or "\n" in module + name:
            raise ImportError("bad name")
        log.append(("g", module + "\n" + name))
        key = (module, name)
        if key not in _classes:
            _classes[key] = _Meta("Stand", (_Base,), {"_name": module + "\n" + name})
        return _classes[key]
    def persistent_load(self, pid):
        return _Storage()

def _large_memo(data):
    """Does a straight reading meet a memo index beyond 2^20 (where ckptool's reading may
    have stopped before it)?"""
    import pickletools
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name in ("PUT", "BINPUT", "LONG_BINPUT") and isinstance(arg, int) and arg > (1 << 20):
                return True
    except Exception:
        pass
    return False

def parity(data):
    log.clear()
    if _large_memo(data):
        return (None, [], "large memo index")
    # Each call is one input; the memo of stand-in classes would not change a log.
    try:
        _Recorder(io.BytesIO(data), encoding="utf-8").load()
        return (True, list(log), "")
    except MemoryError:
        return (None, list(log), "MemoryError")
    except RecursionError:
        return (None, list(log), "RecursionError")
    except BaseException as e:
        return (False, list(log), type(e).__name__ + ": " + str(e)[:200])
    finally:
        log.clear()
)PY";

PyObject* g_parity = nullptr;

struct Event {
  char kind;  // 'g' global, 'c' call
  std::string name;
  bool operator==(const Event&) const = default;
};

std::vector<Event> CkptoolLog(const ckpt::pickle::Graph& g) {
  using ckpt::pickle::Kind;
  std::vector<Event> out;
  for (ckpt::pickle::NodeId id = 0; id < g.nodes.size(); ++id) {
    Kind k = g.kind(id);
    if (k == Kind::kGlobal) {
      out.push_back(
          {'g', std::string(g.global_module(id)) + "\n" + std::string(g.global_name(id))});
    } else if (k == Kind::kObject) {
      ckpt::pickle::NodeId fn = g.compound(id).callable;
      bool global = fn != ckpt::pickle::kNil && g.kind(fn) == Kind::kGlobal;
      out.push_back(
          {'c', global ? std::string(g.global_module(fn)) + "\n" + std::string(g.global_name(fn))
                       : "?"});
    }
  }
  return out;
}

bool IsPrefix(const std::vector<Event>& a, const std::vector<Event>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

std::string Show(const std::vector<Event>& log) {
  std::string s;
  for (const Event& e : log) {
    std::string n = e.name;
    for (char& c : n) c = c == '\n' ? '.' : c;
    s += std::string(1, e.kind) + " " + n + "\n";
  }
  return s;
}

// ckptool's refusals of what CPython does: modifying an imported object (BUILD, APPEND,
// SETITEM on a module, class or function), modifying a storage (BUILD or SETITEM on what
// persistent_load returned: torch's loaded tensors would not hold the bytes in the file), and
// its limits.
bool DeliberateRefusal(const std::string& error) {
  for (const char* what : {"monkey-patching", "on a persistent id", "(limit)"}) {
    if (error.find(what) != std::string::npos) return true;
  }
  return false;
}

[[noreturn]] void Diverge(const char* what, const std::vector<Event>& ck,
                          const std::string& ck_error, const std::vector<Event>& py,
                          const std::string& py_error) {
  std::fprintf(stderr, "pickle parity: %s\n--- ckptool (%s)\n%s--- CPython (%s)\n%s", what,
               ck_error.empty() ? "loaded" : ck_error.c_str(), Show(ck).c_str(),
               py_error.empty() ? "loaded" : py_error.c_str(), Show(py).c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Py_InitializeEx(0);
  PyObject* main = PyImport_AddModule("__main__");
  PyObject* globals = PyModule_GetDict(main);
  PyObject* r = PyRun_String(kHarness, Py_file_input, globals, globals);
  if (!r) {
    PyErr_Print();
    std::abort();
  }
  Py_DECREF(r);
  g_parity = PyDict_GetItemString(globals, "parity");
  if (!g_parity) std::abort();
  Py_INCREF(g_parity);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::pickle::Limits limits;
  limits.max_nodes = 1u << 20;
  ckpt::pickle::PartialParse parsed =
      ckpt::pickle::ParsePartial(ckpt::Bytes(data, size), 0, limits,
                                 ckpt::pickle::Reading{ckpt::pickle::FrameMode::kBytesIO, false});
  std::vector<Event> ck = CkptoolLog(parsed.result.graph);
  if (parsed.result.max_memo_key > (1u << 20)) return 0;

  PyObject* bytes =
      PyBytes_FromStringAndSize(reinterpret_cast<const char*>(data), static_cast<Py_ssize_t>(size));
  PyObject* res = PyObject_CallOneArg(g_parity, bytes);
  Py_DECREF(bytes);
  if (!res) {
    PyErr_Print();
    std::abort();
  }
  PyObject* loaded = PyTuple_GetItem(res, 0);
  PyObject* log = PyTuple_GetItem(res, 1);
  const char* err = PyUnicode_AsUTF8(PyTuple_GetItem(res, 2));
  std::string py_error = err ? err : "?";
  std::vector<Event> py;
  for (Py_ssize_t i = 0; i < PyList_Size(log); ++i) {
    PyObject* ev = PyList_GetItem(log, i);
    const char* k = PyUnicode_AsUTF8(PyTuple_GetItem(ev, 0));
    Py_ssize_t n = 0;
    const char* name = PyUnicode_AsUTF8AndSize(PyTuple_GetItem(ev, 1), &n);
    if (!k || !name) {  // a name CPython holds but cannot write as UTF-8 (a lone surrogate)
      PyErr_Clear();
      Py_DECREF(res);
      return 0;
    }
    py.push_back({k[0], std::string(name, static_cast<size_t>(n))});
  }
  bool py_loaded = loaded == Py_True;
  bool inconclusive = loaded == Py_None;
  Py_DECREF(res);
  if (inconclusive) return 0;

  const std::string& ck_error = parsed.error;
  if (!ck_error.empty() && DeliberateRefusal(ck_error)) {
    // ckptool stopped on purpose: what it saw until then is what CPython did (or CPython failed
    // first, after a part of what ckptool saw).
    if (!IsPrefix(ck, py) && !(!py_loaded && IsPrefix(py, ck))) {
      Diverge("ckptool's refusal came after other steps", ck, ck_error, py, py_error);
    }
    return 0;
  }
  if (py_loaded) {
    if (ck_error.empty()) {
      if (ck != py) Diverge("both loaded it, with different logs", ck, ck_error, py, py_error);
    } else {
      Diverge("CPython loads what ckptool refuses", ck, ck_error, py, py_error);
    }
  } else if (!IsPrefix(py, ck)) {
    Diverge("CPython did something before failing that ckptool did not see", ck, ck_error, py,
            py_error);
  }
  return 0;
}
