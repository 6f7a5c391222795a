#!/usr/bin/env python3
"""Semantic oracle fuzzer: ckptool's safety verdict against what Python's unpickler really does.

For each input (the bytes of a pickle, as a torch file's data.pkl), ckptool._core.judge_pickle
gives the verdict of torch::ScanPickle. When it is SAFE (no findings; for a pickle torch.load
would stop reading part way, none among what it makes before that point), the promise is that
torch.load(weights_only=False) of it runs no code the file chooses: every call is an allowlisted
data constructor (a name judged weights_only, allowed or trusted) applied to data. The oracle
then loads the bytes through torch itself (torch.serialization._load, torch's UnpicklerWrapper
and persistent_load, over an in-memory archive) with a pickle module whose Unpickler is
pickle._Unpickler with the opcodes that call things rewritten to do what _pickle.c does while
watching it:

  - every global is resolved here (find_class): a name the verdict never saw, a module, or a
    path through a module is a failure; an accepted name resolves to the real object; any
    other callable or class resolves to a proxy whose call, from wherever it comes (REDUCE,
    map() iterating, PyDict_Merge calling keys(), a rebuild function calling its argument),
    is a failure;
  - REDUCE, NEWOBJ, NEWOBJ_EX, INST and OBJ may call only accepted objects (by identity, so a
    laundered max([Path]) is Path); anything else is "calls a computed object". Making an
    instance without a call (NEWOBJ with no arguments, copyreg's helpers, the rebuild
    functions that take a class) is allowed for any class: what counts is whether the class's
    own code then runs (below); a C constructor of its own given arguments is a call;
  - BUILD, APPEND(S), ADDITEMS and SETITEM(S) look their method up as _pickle.c does; one
    found in the instance __dict__ or through a class __getattr__ (planted by the pickle) is a
    failure, and so is one that changes an imported object (patching a class, function or
    registry for the whole process) or switches an object's class to one not accepted;
    callables stored as attributes (BUILD, a rebuild function's state) become proxies that
    fail when anything calls them;
  - getattr(G, 'S') (an Enum member, as newer Pythons pickle some) is allowed only as the read
    the verdict lists ("G.S (getattr)"); what it returns may not be called, nor be a module;
  - while the load runs, Python code of a class that is not accepted (a reconstructed class's
    __new__, __setstate__, __setitem__, __torch_function__...) is a failure (sys.setprofile),
    and an audit hook raises on processes, file writes, sockets, ctypes, compile/exec of text,
    nested unpickling, patching of classes and functions, and the like (what a module's own
    code does while the import system runs it is not counted).

Categories: unlisted (resolves a name the verdict never saw: it stopped reading where Python
does not), module, mismatch (an accepted name Python renames), call-global, call-computed,
planted, reconstruct, class-switch, mutate-global, getattr, audit, new-import.

A failure raises (atheris reports a crash) with its category, e.g. "[planted] BUILD calls the
__setstate__ planted in the instance __dict__ of a Namespace". Inputs whose verdict has
findings are only judged, not loaded.

Usage (PYTHONPATH must hold a build's python/ folder with ckptool._core; by default
build-oracle/python or build/python of this checkout is used):
  .venv/bin/python fuzz/semantic_oracle.py CORPUS_DIR [SEED_DIR...] [libFuzzer flags]
  .venv/bin/python fuzz/semantic_oracle.py --replay FILE_OR_DIR...   # verdicts and failures
Environment:
  ORACLE_IGNORE=planted,reconstruct   categories not reported (the path is still cut short)
  ORACLE_IMPORTS=refuse|allow|strict  a module not yet imported, for a name the verdict does
                                      not accept: refused as missing (default: the fuzzer stays
                                      deterministic), imported under the audit hook, or a failure
  ORACLE_TRUST=mod1,mod2              --trust patterns given to the verdict
  ORACLE_COLLECT=DIR                  failures are saved to DIR (a few of each kind) and the run
                                      goes on, instead of stopping at the first
"""
import inspect
import os
import pickle
import pickletools
import random
import struct
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

ACCEPTED = frozenset({"weights_only", "allowed", "trusted"})
CATEGORIES = ("unlisted", "module", "mismatch", "call-global", "call-computed", "planted",
              "reconstruct", "class-switch", "mutate-global", "getattr", "audit", "new-import")


class Violation(BaseException):
    """The verdict said SAFE and the real unpickler did this. A BaseException, so that code
    under test catching Exception does not swallow it."""

    def __init__(self, category, message):
        super().__init__(f"[{category}] {message}")
        self.category = category
        self.message = message


class Refused(Exception):
    """The oracle stopped a path it will not run (an ignored category, a huge allocation)."""


# ---------------------------------------------------------------------------------------------
# Building pickles (used by the mutator and by make_semantic_seeds.py). Each returns opcodes
# that push one value; nothing here uses the memo.

def op_global(module, name):
    return b"c" + module.encode("utf-8") + b"\n" + name.encode("utf-8") + b"\n"


def op_stack_global(module, name):
    return op_str(module) + op_str(name) + b"\x93"


def op_str(s):
    b = s.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(b)) + b


def op_int(i):
    if 0 <= i < 256:
        return b"K" + bytes([i])
    if -2**31 <= i < 2**31:
        return b"J" + struct.pack("<i", i)
    b = pickle.encode_long(i)
    return b"\x8a" + bytes([len(b)]) + b


def op_none():
    return b"N"


def op_tuple(*items):
    if not items:
        return b")"
    if len(items) <= 3:
        return b"".join(items) + b"\x85\x86\x87"[len(items) - 1:len(items)]
    return b"(" + b"".join(items) + b"t"


def op_list(*items):
    return b"(" + b"".join(items) + b"l" if items else b"]"


def op_dict(*pairs):
    out = b"}"
    if pairs:
        out += b"(" + b"".join(k + v for k, v in pairs) + b"u"
    return out


def op_call(func, *args):
    return func + op_tuple(*args) + b"R"


def op_newobj(cls, *args):
    return cls + op_tuple(*args) + b"\x81"


def launder_max(x):
    return op_call(op_global("builtins", "max"), op_list(x))


def getattr_read(obj, attr):
    return op_call(op_global("builtins", "getattr"), obj, op_str(attr))


def op_storage(numel=1, key="0", storage="FloatStorage"):
    """A persistent id torch's persistent_load turns into a storage (data/KEY)."""
    return op_tuple(op_str("storage"), op_global("torch", storage), op_str(key), op_str("cpu"),
                    op_int(numel)) + b"Q"


def op_tensor(numel=1, key="0"):
    """torch._utils._rebuild_tensor_v2 over a storage, as torch.save writes a tensor."""
    return op_call(op_global("torch._utils", "_rebuild_tensor_v2"), op_storage(numel, key),
                   op_int(0), op_tuple(op_int(numel)), op_tuple(op_int(1)), b"\x89",
                   op_call(op_global("collections", "OrderedDict")))


def plant(holder, key, value):
    """holder with {key: value} BUILT into it (its __dict__ when it has no __setstate__)."""
    return holder + op_dict((op_str(key), value)) + b"b"


def pickle_of(effects=(), root=b"}", proto=2):
    """A pickle that evaluates each effect (discarding it) and returns root."""
    return b"\x80" + bytes([proto]) + b"".join(e + b"0" for e in effects) + root + b"."


# ---------------------------------------------------------------------------------------------
# The oracle.

_state = None          # the load being watched (the audit hook and the proxies read it)
_oracle_objects = {}   # filled by _init(): torch, the rebuild functions...

# Audit events that a load that runs no chosen code never raises. Prefixes end in '.'.
_DANGEROUS = (
    "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "os.kill",
    "os.killpg", "os.startfile", "os.remove", "os.rmdir", "os.rename", "os.truncate",
    "os.chmod", "os.chown", "os.chflags", "os.lchflags", "os.link", "os.symlink", "os.mkdir",
    "os.mkfifo", "os.mknod", "os.utime", "os.putenv", "os.unsetenv", "os.setxattr",
    "os.removexattr", "os.chdir", "os.fchdir", "os.add_dll_directory", "os.chroot",
    "os.setuid", "os.setgid", "os.setsid", "os.listdir", "os.scandir", "os.walk", "os.fwalk",
    "os.getxattr", "os.listxattr", "subprocess.", "pty.", "shutil.", "socket.", "ctypes.",
    "_ctypes.", "compile", "exec", "marshal.", "pickle.find_class", "code.__new__",
    "function.__new__", "sys.addaudithook", "sys.settrace", "sys.setprofile",
    "sys._current_frames", "sys.monitoring.", "builtins.input", "builtins.breakpoint",
    "webbrowser.", "urllib.", "http.", "ftplib.", "smtplib.", "poplib.", "imaplib.", "nntplib.",
    "telnetlib.", "mmap.", "sqlite3.", "tempfile.", "syslog.", "resource.", "signal.",
    "gc.get_", "cpython.", "fcntl.", "object.__setattr__", "object.__delattr__",
    "object.__getattr__", "time.sleep", "msvcrt.", "winreg.", "_winapi.", "glob.", "tarfile.",
    "zipfile.", "_thread.", "threading.",
)
_EXACT_DANGEROUS = frozenset(e for e in _DANGEROUS if not e.endswith("."))
_PREFIX_DANGEROUS = tuple(e for e in _DANGEROUS if e.endswith("."))
# What a module's own code does while it is imported (namedtuple sets __defaults__, typing
# compiles annotations): module code, not the pickle's doing, when the import system runs it.
_IMPORT_EVENTS = frozenset({"marshal.loads", "compile", "exec", "object.__setattr__",
                            "object.__getattr__", "object.__delattr__", "os.listdir",
                            "os.scandir", "glob.glob", "sys._getframe"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _module_file(filename):
    """Is this the file of an installed module (code an import runs), not text the pickle
    compiled?"""
    return isinstance(filename, str) and filename.endswith(".py") and os.path.isfile(filename)


def _in_import():
    """Is the import system on the stack (a module being loaded, not the pickle's doing)?"""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.startswith("<frozen importlib"):
            return True
        f = f.f_back
    return False


def _audit(event, args):
    st = _state
    if st is None or st.phase is None:
        return
    saved, st.phase = st.phase, None  # what the hook itself does raises events too
    try:
        _judge_event(st, saved, event, args)
    finally:
        st.phase = saved


def _in_literal_eval():
    """Is the compile being audited ast.literal_eval's parse (mode 'eval', a constant
    expression only)?"""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name == "literal_eval" and f.f_code.co_filename.endswith("ast.py"):
            return True
        f = f.f_back
    return False


def _judge_event(st, phase, event, args):
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
            (isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writes:
            st.fail("audit", f"opens {path!r} for writing (mode {mode!r})")
        return
    if event == "import":
        if phase == "load" and st.imports == "strict":
            st.fail("new-import", f"imports {args[0]!r} while loading")
        return
    if event == "exec" and args and _module_file(getattr(args[0], "co_filename", None)):
        return  # a module being imported (torch and numpy import lazily)
    if event == "compile" and len(args) > 1 and _module_file(args[1]):
        return
    if event == "compile" and _in_literal_eval():
        return  # ast.literal_eval (numpy parses a dtype's "(2,3)i4" shape with it): no code
    if event == "object.__setattr__" and len(args) > 1 and args[1] == "__class__":
        return  # class switches are judged by what class results (check_class)
    if event in _IMPORT_EVENTS and _in_import():
        return  # a module being imported: its bytecode, its own set-up
    if not (event in _EXACT_DANGEROUS or event.startswith(_PREFIX_DANGEROUS)):
        return
    if phase == "import" and event in ("object.__getattr__", "os.listdir", "os.scandir"):
        return  # a module that ORACLE_IMPORTS=allow lets in, doing its own set-up
    st.fail("audit", f"raises the audit event {event}{_short(args)}")


def _short(args, limit=160):
    try:
        text = repr(tuple(args))
    except BaseException:
        text = "(...)"
    return text if len(text) <= limit else text[:limit] + "...)"


def _describe(obj):
    if isinstance(obj, _Proxy):
        return obj._oracle_name
    try:
        t = type(obj)
        name = getattr(obj, "__qualname__", None) if isinstance(obj, (type, types.FunctionType,
                                                                       types.BuiltinFunctionType)) else None
        if name:
            return f"{getattr(obj, '__module__', '?')}.{name}"
        return f"a {t.__module__}.{t.__qualname__}"
    except BaseException:
        return "an object"


class _Proxy:
    """Stands for a callable the pickle may not call. Calling it, from anywhere, fails."""
    __slots__ = ("_oracle_target", "_oracle_name", "_oracle_category", "_oracle_why")

    def __init__(self, target, name, category, why):
        object.__setattr__(self, "_oracle_target", target)
        object.__setattr__(self, "_oracle_name", name)
        object.__setattr__(self, "_oracle_category", category)
        object.__setattr__(self, "_oracle_why", why)

    def __call__(self, *args, **kwargs):
        st = _state
        why = self._oracle_why
        if st is None:
            raise Refused(f"{self._oracle_name} called outside a load")
        st.fail(self._oracle_category, f"calls {self._oracle_name} ({why})")
        raise Refused("ignored")

    def __repr__(self):
        return f"<oracle proxy {self._oracle_name}>"

    def __reduce__(self):
        raise TypeError("oracle proxies do not pickle")


class _GetattrProxy:
    """builtins.getattr, allowed only as an attribute read the verdict lists."""
    __slots__ = ()

    def __call__(self, *args, **kwargs):
        if _state is None:
            raise Refused("getattr outside a load")
        return _state.getattr_read(args, kwargs)

    def __repr__(self):
        return "<oracle getattr>"


_MISSING = object()


def _lookup(obj, name):
    """obj.name as PyObject_GetAttr finds it, with where it came from: "class" (the type's
    own attribute, or a data descriptor), "instance" (the instance __dict__: the pickle may
    have put it there), "getattr" (a class __getattr__, which may hand out the object's
    contents), or (None, _MISSING) when there is none."""
    t = type(obj)
    found = _MISSING
    for k in t.__mro__:
        d = k.__dict__
        if name in d:
            found = d[name]
            break
    if found is not _MISSING:
        ft = type(found)
        if hasattr(ft, "__set__") or hasattr(ft, "__delete__"):
            return "class", getattr(obj, name)
    try:
        inst = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        inst = None
    own = inst.get(name, _MISSING) if isinstance(inst, dict) else _MISSING
    if t.__getattribute__ is object.__getattribute__:
        if own is not _MISSING:
            return "instance", own
        if found is not _MISSING:
            return "class", getattr(obj, name)
    try:
        value = getattr(obj, name)
    except AttributeError:
        return None, _MISSING
    if own is not _MISSING and own is value:
        return "instance", value
    return ("class" if found is not _MISSING else "getattr"), value


def _c_constructor(cls):
    """Does cls have a constructor of its own written in C (tp_new of a static type)?"""
    new = cls.__dict__.get("__new__")
    return isinstance(new, types.BuiltinFunctionType) and new is not object.__new__ and \
        not cls.__flags__ & (1 << 9)  # Py_TPFLAGS_HEAPTYPE


def _empty_state(state):
    if isinstance(state, tuple) and len(state) == 2:
        return not state[0] and not state[1]
    return state is None


def _would_run(obj, name, arg):
    """Would _pickle.c's call of obj.name(arg) run (not fail for its arguments)? Looked up on
    a class, a method is unbound: arg takes the place of self."""
    where, method = _lookup(obj, name)
    if where is None:
        return False
    if not isinstance(obj, type):
        return True
    try:
        inspect.signature(method).bind(arg)
        return True
    except TypeError:
        return False
    except ValueError:
        return isinstance(arg, getattr(method, "__objclass__", ()))


def _would_change(obj, op, state):
    """Would _pickle.c's op change obj (rather than fail or do nothing)?"""
    if op == "SETITEM":
        return hasattr(type(obj), "__setitem__")
    if op == "APPEND":
        return type(obj) is list or _would_run(obj, "extend", []) or \
            _would_run(obj, "append", None)
    if op == "ADDITEMS":
        return isinstance(obj, set) or _would_run(obj, "add", None)
    if _would_run(obj, "__setstate__", state):
        return True
    slot = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slot = state
    has_dict = isinstance(getattr(obj, "__dict__", None), dict)
    if isinstance(state, dict) and state and has_dict:
        return True
    if not (isinstance(slot, dict) and slot):
        return False
    if isinstance(obj, type):  # setattr on a class, unless a static (C) one
        return not obj.__flags__ & (1 << 8)  # Py_TPFLAGS_IMMUTABLETYPE
    return has_dict


def _builtin_type(t):
    return getattr(t, "__module__", None) == "builtins"


def _huge(a):
    """An argument that makes an allowlisted constructor run or allocate without bound."""
    if isinstance(a, range):
        return len(a) > 1 << 16
    if isinstance(a, str) and len(a) < 64 and any(c in a for c in "eE"):
        digits = "".join(c for c in a.split("e")[-1].split("E")[-1] if c.isdigit())
        return len(digits) > 3
    d = _oracle_objects.get("Decimal")
    if d is not None and isinstance(a, d):
        try:
            return a.is_finite() and abs(a.adjusted()) > 4096
        except Exception:
            return True
    return False


class _LoadState:
    def __init__(self, verdict, imports, ignore):
        self.names = dict(verdict["names"])
        self.spelled = {(m, n): d for m, n, d in verdict.get("globals", ())}
        self.error = verdict.get("error", "")
        self.imports = imports
        self.ignore = ignore
        self.accept_all = False
        self.phase = None            # None (hook off), "load", "import"
        self.violations = []
        self.keep = []               # keeps objects alive: their ids stay theirs
        self.global_ids = {}         # id -> the name it was imported (or read) as
        self.accepted_ids = set()
        self.made = {}               # id -> (object, its type then, "accepted"/"reconstructed")
        self.watched = set()         # code objects of classes that are not accepted
        self.watched_classes = set()
        self.switch_targets = set()  # classes a rebuild function's state sets as __class__
        self.profiling = False
        self.notes = []

    # -- failures ------------------------------------------------------------------------
    def fail(self, category, message):
        if category in self.ignore:
            raise Refused(f"[{category}] {message} (ignored)")
        v = Violation(category, message)
        self.violations.append(v)
        raise v

    def _keep(self, obj):
        self.keep.append(obj)
        return obj

    # -- globals -------------------------------------------------------------------------
    def register_global(self, obj, name, accepted):
        self._keep(obj)
        self.global_ids.setdefault(id(obj), name)
        if accepted:
            self.accepted_ids.add(id(obj))

    def is_global(self, obj):
        return isinstance(obj, (_Proxy, _GetattrProxy)) or id(obj) in self.global_ids or \
            isinstance(obj, (type, types.ModuleType, types.FunctionType,
                             types.BuiltinFunctionType, types.MethodType))

    def find_class(self, unpickler, module, name):
        display = self.spelled.get((module, name))
        if display is None and module == "torch._tensor":  # torch's own renaming
            display = self.spelled.get(("torch.tensor", name))
        if display is None or (display not in self.names and display != "builtins.getattr"):
            # Resolved here, by an unpickler the verdict did not foresee: a failure when it
            # imports something (a name that does not resolve only raises).
            self.resolve(unpickler, module, name, module if display is None else display)
            stopped = f" (it stopped reading: {self.error})" if self.error else ""
            self.fail("unlisted", f"imports {module}.{name}, which the verdict "
                      f"{'never saw' if display is None else 'does not list'}{stopped}")
        verdict = self.names.get(display)
        accepted = verdict in ACCEPTED
        # What Python imports: protocols 0-2 rename Python 2 names (_compat_pickle).
        pm, pn = module, name
        if unpickler.proto < 3 and unpickler.fix_imports:
            import _compat_pickle
            if (pm, pn) in _compat_pickle.NAME_MAPPING:
                pm, pn = _compat_pickle.NAME_MAPPING[(pm, pn)]
            elif pm in _compat_pickle.IMPORT_MAPPING:
                pm = _compat_pickle.IMPORT_MAPPING[pm]
        same = f"{pm}.{pn}" == display
        obj = self.resolve(unpickler, pm, pn, display, accepted and same)
        if isinstance(obj, types.ModuleType):
            if accepted:
                self.fail("module", f"{display} is the module {obj.__name__}")
            # A module only referenced (stored) runs nothing; any use of it is a failure.
            return _ModuleRef(self, display, obj.__name__)
        if accepted and not same and not self.accept_all:
            self.fail("mismatch", f"accepts {display} ({verdict}) but Python imports {pm}.{pn}")
        if obj is getattr and display == "builtins.getattr" and verdict is None:
            return _GetattrProxy()
        self.register_global(obj, display, accepted)
        if accepted or not callable(obj):
            return obj
        proxy = _Proxy(obj, display, "call-global", f"verdict {verdict}: never called")
        self.register_global(proxy, display, False)
        return proxy

    def resolve(self, unpickler, module, name, display, accepted=False):
        """What Python's find_class returns for (module, name) (after the renaming)."""
        if module not in sys.modules:
            self.import_module(module, accepted, display)
        mod = sys.modules[module]
        if unpickler.proto < 4:
            return getattr(mod, name)
        obj = mod
        parts = name.split(".")
        for i, part in enumerate(parts):
            if part == "<locals>":
                raise AttributeError(f"Can't get local attribute {name!r} on {mod!r}")
            obj = getattr(obj, part)
            if isinstance(obj, types.ModuleType) and i + 1 < len(parts):
                self.fail("module", f"{display} resolves through the module {obj.__name__}")
        return obj

    def import_module(self, module, accepted, display):
        saved = self.phase
        if accepted:
            self.phase = None
            try:
                __import__(module, level=0)
            finally:
                self.phase = saved
            return
        if self.imports == "refuse":
            raise ModuleNotFoundError(f"oracle: {module} is not imported yet (for {display})")
        if self.imports == "strict":
            self.fail("new-import", f"imports the module {module} for {display}, a name the "
                      f"verdict does not accept: its top-level code runs")
        self.phase = "import"
        try:
            __import__(module, level=0)
        finally:
            self.phase = saved
        self.notes.append(f"imported {module} for {display}")

    # -- calls ---------------------------------------------------------------------------
    def call(self, func, args, kwargs, how):
        if isinstance(func, (_Proxy, _GetattrProxy)):
            return func(*args, **kwargs)
        if not callable(func):
            raise TypeError(f"{how}: {type(func).__name__} object is not callable")
        if id(func) not in self.accepted_ids:
            self.fail("call-computed", f"{how} calls a computed object, {_describe(func)}")
        args, kind = self.prepare_args(func, args)
        self.budget(func, args, kwargs)
        result = func(*args, **kwargs)
        if self.switch_targets:
            self.check_made_class(result, _describe(func))
        self.made_now(result, kind)
        return result

    def made_now(self, obj, kind):
        if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
            return
        self._keep(obj)
        self.made.setdefault(id(obj), (obj, type(obj), kind))

    def reconstruct(self, cls, args, how):
        """The class NEWOBJ (or a rebuild function) makes an instance of without calling
        it: cls.__new__(cls, *args). Allowed for any class the pickle names (the verdict
        calls it reconstructed): what matters is whether its own code then runs, which
        watch() catches; a constructor of its own in C given arguments is a call."""
        if isinstance(cls, _Proxy):
            real = cls._oracle_target
            if isinstance(real, type):
                self.watch(real)
                if args and _c_constructor(real):
                    self.fail("reconstruct", f"{how} passes arguments to the constructor of "
                              f"{cls._oracle_name} (written in C)")
            return real
        return cls

    def prepare_args(self, func, args):
        o = _oracle_objects
        kind = "accepted"
        positions = o["reconstructs"].get(id(func))
        name = _describe(func)
        if positions is not None:
            args = list(args)
            if func is o["reconstructor"] and len(args) > 1 and isinstance(args[1], _Proxy):
                if isinstance(args[1]._oracle_target, type):
                    self.fail("call-global", f"{name} calls {args[1]._oracle_name}.__new__ "
                              f"and __init__ (its base class argument)")
                args[1] = args[1]._oracle_target  # base.__new__ is its type's: not a call
            extra = ()
            if func is o["newobj"]:
                extra = args[1:]
            elif func is o["newobj_ex"]:
                extra = [a for a in args[1:] if a]
            for i in positions:
                if i < len(args) and isinstance(args[i], _Proxy):
                    args[i] = self.reconstruct(args[i], extra, name)
                    kind = "reconstructed"
            args = tuple(args)
        if id(func) in o["sets_state"] and len(args) > 3:
            self.check_state(args[3], name)
        return args, kind

    def check_made_class(self, obj, how):
        """After a rebuild function set the state: the class the object ended up with."""
        t = type(obj)
        if t in self.switch_targets:
            self.check_class(t, how)

    def check_state(self, state, how):
        """The state a rebuild function setattr()s onto what it made: a class switch, or
        callables that become the object's attributes."""
        for part in (state if isinstance(state, tuple) else (state,)):
            if not isinstance(part, dict):
                continue
            for k in list(part):
                if k == "__class__":
                    # setattr(obj, '__class__', C) works when the layouts match: C, not a
                    # proxy, so that it does as in torch.load; judged after the call.
                    v = part[k]
                    if isinstance(v, _Proxy):
                        part[k] = v = v._oracle_target
                    if isinstance(v, type):
                        self.switch_targets.add(v)
                else:
                    part[k] = self.planted(part[k], k, f"what {how} makes")

    def check_class(self, cls, how):
        if isinstance(cls, _Proxy) or (isinstance(cls, type) and id(cls) not in self.accepted_ids
                                       and not _builtin_type(cls)):
            self.fail("class-switch", f"{how} sets __class__ to {_describe(cls)}, a class the "
                      f"verdict does not accept")

    def planted(self, value, key, where):
        """A value the pickle stores as an attribute: callables become proxies that fail when
        anything calls them."""
        if not callable(value) or (isinstance(value, _Proxy) and
                                   value._oracle_category == "planted"):
            return value
        p = _Proxy(value, f"{_describe(value)}, stored as {key!r} in {where}", "planted",
                   "a callable the pickle planted as an attribute")
        return self._keep(p)

    def budget(self, func, args, kwargs):
        """Calls that would allocate or iterate without bound are not run: the fuzzer would
        only find out-of-memory and hangs."""
        try:
            sized = func in _oracle_objects["sized"]
        except TypeError:
            sized = False
        limit = 4096 if func is round else (1 << 24 if sized else None)
        values = list(args[:4]) + list(kwargs.values())
        for a in list(values):
            if isinstance(a, (tuple, list)) and len(a) < 8:
                values.extend(a)
        for a in values:
            if isinstance(a, int) and not isinstance(a, bool):
                if limit is not None and abs(a) > limit:
                    raise Refused(f"{_describe(func)} with {a}")
            elif _huge(a):
                raise Refused(f"{_describe(func)} with {_short((a,), 60)}")

    # -- Python code of classes that are not accepted ---------------------------------------
    def watch(self, cls):
        if not isinstance(cls, type) or cls in self.watched_classes:
            return
        self.watched_classes.add(cls)
        safe = _oracle_objects["safe_bases"]
        saved, self.phase = self.phase, None  # reading __code__ is an audit event
        try:
            for k in cls.__mro__:
                if k in safe or id(k) in self.accepted_ids or _builtin_type(k):
                    continue
                for v in list(vars(k).values()):
                    for f in (v, getattr(v, "__func__", None), getattr(v, "fget", None),
                              getattr(v, "fset", None), getattr(v, "fdel", None)):
                        code = getattr(f, "__code__", None)
                        if isinstance(code, types.CodeType):
                            self.watched.add(code)
            if self.watched and not self.profiling:
                self.profiling = True
                sys.setprofile(self.profile)
        finally:
            self.phase = saved

    def profile(self, frame, event, arg):
        if event != "call" or self.phase != "load":
            return
        self.phase = None  # reading f_code is an audit event
        code = frame.f_code
        self.phase = "load"
        if code in self.watched:
            self.fail("reconstruct", f"runs {code.co_qualname} ({code.co_filename}:"
                      f"{code.co_firstlineno}), code of a class the verdict does not accept")

    # -- what BUILD, APPEND, SETITEM and ADDITEMS apply to ------------------------------------
    def check_target(self, obj, op, state=None):
        """Before BUILD, APPEND, SETITEM or ADDITEMS changes obj. An imported object (or one
        the pickle computed from it) that the operation would really change is a failure: the
        pickle patches a class, function, module or registry for the whole process. One it
        would not change: False for a BUILD that does nothing, else the error Python raises."""
        if self.is_global(obj):
            real = obj._oracle_target if isinstance(obj, _Proxy) else \
                getattr if isinstance(obj, _GetattrProxy) else obj
            saved, self.phase = self.phase, None  # inspect.signature compiles text
            try:
                changes = _would_change(real, op, state)
            finally:
                self.phase = saved
            if changes:
                self.fail("mutate-global", f"{op} changes {_describe(obj)}, an imported "
                          f"object: it patches it for the whole process")
            if op == "BUILD" and _empty_state(state):
                return False
            raise TypeError(f"{op} on {_describe(obj)} fails")
        m = self.made.get(id(obj))
        if m is not None and type(obj) is not m[1]:
            self.check_class(type(obj), f"the pickle (before {op})")
        return True

    def method(self, obj, name, op):
        """obj.name for the unpickler to call, or _MISSING; fails when the pickle planted it."""
        where, value = _lookup(obj, name)
        if where in ("instance", "getattr"):
            if not callable(value):  # calling it raises TypeError: nothing runs
                raise TypeError(f"{op}: {type(value).__name__} object is not callable")
            self.fail("planted", f"{op} calls {name} of {_describe(obj)}, found in its "
                      f"{'instance __dict__' if where == 'instance' else 'class __getattr__'} "
                      f"(planted by the pickle): {_describe(value)}")
        return value

    def final_checks(self):
        for obj, t, _ in list(self.made.values()):
            if type(obj) is not t:
                self.check_class(type(obj), "the pickle")

    def getattr_read(self, args, kwargs):
        if kwargs or len(args) != 2:
            self.fail("getattr", f"calls builtins.getattr with {len(args)} arguments"
                      f"{' and keywords' if kwargs else ''}, not as a read")
        target, attr = args
        if not isinstance(attr, str):
            self.fail("getattr", f"calls builtins.getattr with the name {_describe(attr)}")
        if isinstance(target, _Proxy) and target._oracle_category == "call-global":
            display, real = target._oracle_name, target._oracle_target
        elif id(target) in self.global_ids and not isinstance(target, _Proxy):
            display, real = self.global_ids[id(target)], target
        else:
            self.fail("getattr", f"getattr({_describe(target)}, {attr!r}): a read of an object "
                      f"the pickle computed")
        path = f"{display}.{attr}"
        verdict = self.names.get(path + " (getattr)")
        if verdict is None:
            self.fail("getattr", f"reads {path} through getattr, which the verdict does not "
                      f"list")
        value = getattr(real, attr)
        if isinstance(value, types.ModuleType):
            self.fail("module", f"getattr reads {path}, the module {value.__name__}")
        self.register_global(value, path, False)
        if callable(value) and id(value) not in self.accepted_ids:
            p = _Proxy(value, path + " (getattr)", "call-global",
                       f"read through getattr, verdict {verdict}: never called")
            self.register_global(p, path, False)
            return p
        return value


class OracleUnpickler(pickle._Unpickler):
    """pickle._Unpickler doing what _pickle.c does, watched by the current _LoadState."""
    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file, **kwargs):
        super().__init__(file, **kwargs)
        self._oracle = _state
        self._oracle_data = file.getvalue()
        self._oracle_file = file

    def find_class(self, module, name):
        return self._oracle.find_class(self, module, name)

    # A text line (GLOBAL, INST, INT...) must end with a newline: _pickle.c's reader fails
    # on a last line without one, where pickle.py would take it minus its last byte.
    @property
    def readline(self):
        return self._oracle_readline

    @readline.setter
    def readline(self, read):
        def checked():
            line = read()
            if not line.endswith(b"\n"):
                raise pickle.UnpicklingError("pickle data was truncated")
            return line
        self._oracle_readline = checked

    # REDUCE: PyObject_CallObject(callable, argtup).
    def load_reduce(self):
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        if not isinstance(args, tuple):
            raise pickle.UnpicklingError("REDUCE arguments are not a tuple")
        stack[-1] = self._oracle.call(func, args, {}, "REDUCE")
    dispatch[pickle.REDUCE[0]] = load_reduce

    # NEWOBJ and NEWOBJ_EX: cls->tp_new(cls, args, kwargs).
    def _newobj(self, cls, args, kwargs, op):
        st = self._oracle
        kind = "accepted"
        if isinstance(cls, _Proxy):
            cls = st.reconstruct(cls, args or kwargs, op)
            kind = "reconstructed"
        elif isinstance(cls, type) and id(cls) not in st.accepted_ids:
            st.fail("call-computed", f"{op} makes an instance of a computed class "
                    f"{_describe(cls)}")
        if not isinstance(cls, type):
            raise pickle.UnpicklingError(f"{op} class argument must be a type")
        if not isinstance(args, tuple) or (kwargs is not None and not isinstance(kwargs, dict)):
            raise pickle.UnpicklingError(f"{op} arguments are not a tuple and a dict")
        st.budget(cls, args, kwargs or {})
        obj = cls.__new__(cls, *args, **(kwargs or {}))
        st.made_now(obj, kind)
        self.append(obj)

    def load_newobj(self):
        args = self.stack.pop()
        cls = self.stack.pop()
        self._newobj(cls, args, None, "NEWOBJ")
    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self):
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self._newobj(cls, args, kwargs, "NEWOBJ_EX")
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    # BYTEARRAY8: pickle.py zero-fills the whole length before reading; _pickle.c's buffer is
    # not touched until read, so a length past the end of the data costs it nothing.
    def load_bytearray8(self):
        n, = struct.unpack("<Q", self.read(8))
        if n > len(self._oracle_data):
            raise pickle.UnpicklingError("pickle data was truncated")
        b = bytearray(n)
        self.readinto(b)
        self.append(b)
    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8

    # FRAME: _pickle.c reads the whole frame at once and fails when the data ends first;
    # pickle.py would go on with what there is.
    def load_frame(self):
        n, = struct.unpack("<Q", self.read(8))
        u = self._unframer
        left = len(self._oracle_data) - self._oracle_file.tell()
        if u.current_frame is not None:
            left += len(u.current_frame.getbuffer()) - u.current_frame.tell()
        if n > left:
            raise pickle.UnpicklingError("pickle data was truncated")
        u.load_frame(n)
    dispatch[pickle.FRAME[0]] = load_frame

    # INST: _pickle.c looks for the MARK before it reads (and imports) the class.
    def load_inst(self):
        if not self.metastack:
            raise pickle.UnpicklingError("could not find MARK")
        pickle._Unpickler.load_inst(self)
    dispatch[pickle.INST[0]] = load_inst

    # INST and OBJ: _pickle.c's instantiate(): no arguments and a class without
    # __getinitargs__ is cls.__new__(cls); anything else calls it.
    def _instantiate(self, klass, args):
        real = klass._oracle_target if isinstance(klass, _Proxy) else klass
        if not args and isinstance(real, type) and not hasattr(real, "__getinitargs__"):
            self._newobj(klass, (), None, "INST/OBJ")
            return
        self.append(self._oracle.call(klass, tuple(args), {}, "INST/OBJ"))

    # Storages come from torch's persistent_load.
    def load_binpersid(self):
        pid = self.stack.pop()
        obj = self.persistent_load(pid)
        self._oracle.made_now(obj, "accepted")
        self.append(obj)
    dispatch[pickle.BINPERSID[0]] = load_binpersid

    # BUILD: __setstate__ as PyObject_GetAttr finds it, else the dict and slot states.
    def load_build(self):
        st, stack = self._oracle, self.stack
        state = stack.pop()
        inst = stack[-1]
        if not st.check_target(inst, "BUILD", state):
            return
        setstate = st.method(inst, "__setstate__", "BUILD")
        if setstate is not _MISSING:
            setstate(state)
            return
        slotstate = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slotstate = state
        what = f"the instance __dict__ of {_describe(inst)}"
        if state is not None:
            if not isinstance(state, dict):
                raise pickle.UnpicklingError("state is not a dictionary")
            inst_dict = inst.__dict__
            for k, v in state.items():
                if type(k) is str:
                    k = sys.intern(k)
                inst_dict[k] = st.planted(v, k, what)
        if slotstate is not None:
            if not isinstance(slotstate, dict):
                raise pickle.UnpicklingError("slot state is not a dictionary")
            for k, v in slotstate.items():
                if k == "__class__":
                    # Fails unless both classes have the same layout; when it works, the
                    # object is now of a class the pickle chose.
                    saved, st.phase = st.phase, None  # its audit event is this same check
                    try:
                        setattr(inst, k, v._oracle_target if isinstance(v, _Proxy) else v)
                    finally:
                        st.phase = saved
                    st.check_class(v, "BUILD's slot state")
                    continue
                if k == "__dict__" and isinstance(v, dict):
                    for kk in list(v):
                        v[kk] = st.planted(v[kk], kk, what)
                else:
                    v = st.planted(v, k, what)
                setattr(inst, k, v)
    dispatch[pickle.BUILD[0]] = load_build

    # APPEND and APPENDS: _pickle.c's do_append (APPEND too calls extend() when there is one).
    def _append(self, items):
        st = self._oracle
        lst = self.stack[-1]
        if not items:
            return
        st.check_target(lst, "APPEND")
        if type(lst) is list:
            lst.extend(items)
            return
        extend = st.method(lst, "extend", "APPEND")
        if extend is not _MISSING:
            extend(items)
            return
        append = st.method(lst, "append", "APPEND")
        if append is _MISSING:
            raise AttributeError(f"{type(lst).__name__} has no append")
        for item in items:
            append(item)

    def load_append(self):
        value = self.stack.pop()
        self._append([value])
    dispatch[pickle.APPEND[0]] = load_append

    def load_appends(self):
        self._append(self.pop_mark())
    dispatch[pickle.APPENDS[0]] = load_appends

    # SETITEM and SETITEMS: PyObject_SetItem, whatever the object is.
    def _setitems(self, items):
        if not items:
            return
        if len(items) % 2:
            raise pickle.UnpicklingError("odd number of items for SETITEMS")
        d = self.stack[-1]
        self._oracle.check_target(d, "SETITEM")
        for i in range(0, len(items), 2):
            d[items[i]] = items[i + 1]

    def load_setitem(self):
        value = self.stack.pop()
        key = self.stack.pop()
        self._setitems([key, value])
    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_setitems(self):
        self._setitems(self.pop_mark())
    dispatch[pickle.SETITEMS[0]] = load_setitems

    # ADDITEMS: set.update for a set (or subclass), else add() per item.
    def load_additems(self):
        st = self._oracle
        items = self.pop_mark()
        s = self.stack[-1]
        if not items:
            return
        st.check_target(s, "ADDITEMS")
        if isinstance(s, set):
            set.update(s, items)
            return
        add = st.method(s, "add", "ADDITEMS")
        if add is _MISSING:
            raise AttributeError(f"{type(s).__name__} has no add")
        for item in items:
            add(item)
    dispatch[pickle.ADDITEMS[0]] = load_additems


_unpickler_module = types.ModuleType("oracle_pickle")
_unpickler_module.Unpickler = OracleUnpickler


class ArchiveRecords:
    """The records torch.serialization._load reads through torch._C.PyTorchFileReader, in
    memory: data.pkl and byteorder, and data/N either from a real archive or as zeros of the
    size the persistent id asks for."""

    MAX_SYNTHETIC = 1 << 24

    def __init__(self, pkl, records=None):
        self.records = dict(records or {})
        self.records["data.pkl"] = pkl
        self.records.setdefault("byteorder", b"little")

    def has_record(self, name):
        return name in self.records

    def get_record(self, name):
        if name not in self.records:
            raise RuntimeError(f"archive/{name} not found")
        return self.records[name]

    def get_storage_from_record(self, name, nbytes, dtype):
        torch = _oracle_objects["torch"]
        if name in self.records:
            data = self.records[name]
            t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
                torch.empty(0, dtype=torch.uint8)
            return t
        if not isinstance(nbytes, int) or nbytes < 0 or nbytes > self.MAX_SYNTHETIC:
            raise RuntimeError(f"archive/{name}: no record of {nbytes} bytes")
        return torch.zeros(nbytes, dtype=torch.uint8)

    def get_all_records(self):
        return list(self.records)

    def serialization_id(self):
        return ""


_hook_installed = False


# Modules imported before any load: those of the allowlisted names a checkpoint usually
# names, and every codec (_codecs.encode looks its encoding up, importing it the first time).
_PRELOAD = (
    "collections", "copyreg", "_codecs", "codecs", "datetime", "decimal", "fractions", "uuid",
    "re", "pathlib", "argparse", "types", "operator", "enum", "numpy", "numpy.core.multiarray",
    "numpy.core.numeric", "numpy._core.multiarray", "numpy._core.numeric", "numpy.random",
    "numpy.random._pickle", "torch", "torch._tensor", "torch._utils", "torch.storage",
    "torch.nn.parameter", "torch.serialization", "torch.utils.serialization",
)


def _init():
    """Imports torch and what the oracle compares identities with; installs the audit hook
    (once per process: hooks cannot be removed; it acts only while a load is watched)."""
    global _hook_installed
    if _oracle_objects:
        return
    import importlib
    import pkgutil
    import warnings
    warnings.simplefilter("ignore")
    for m in _PRELOAD:
        try:
            importlib.import_module(m)
        except ImportError:
            pass
    import encodings
    for info in pkgutil.iter_modules(encodings.__path__):
        try:
            importlib.import_module("encodings." + info.name)
        except Exception:
            pass
    import collections
    import copyreg
    import decimal
    import enum

    import numpy
    import torch
    repr(torch.zeros(1))  # imports what printing a tensor imports (an error message may)
    reconstructs = {
        id(copyreg._reconstructor): (0,),
        id(copyreg.__newobj__): (0,),
        id(copyreg.__newobj_ex__): (0,),
        id(torch._tensor._rebuild_from_type_v2): (1,),
        id(torch._utils._rebuild_wrapper_subclass): (0,),
    }
    for m in ("numpy.core.multiarray", "numpy._core.multiarray"):
        f = getattr(sys.modules.get(m), "_reconstruct", None)
        if f is not None:
            reconstructs[id(f)] = (0,)
    storages = {getattr(torch, n) for n in dir(torch) if n.endswith("Storage")}
    _oracle_objects.update(
        torch=torch,
        load=torch.serialization._load,
        Decimal=decimal.Decimal,
        reconstructs=reconstructs,
        reconstructor=copyreg._reconstructor,
        newobj=copyreg.__newobj__,
        newobj_ex=copyreg.__newobj_ex__,
        sets_state={id(torch._tensor._rebuild_from_type_v2),
                    id(torch._utils._rebuild_parameter_with_state)},
        # Constructors whose integer arguments are sizes (or, for round, digits).
        sized={bytes, bytearray, range, round, torch.storage.UntypedStorage,
               torch.storage.TypedStorage, numpy.ndarray} | storages,
        safe_bases={object, torch.Tensor, torch._C.TensorBase, torch.nn.Parameter,
                    numpy.ndarray, numpy.generic, enum.Enum, enum.IntEnum, enum.Flag,
                    enum.IntFlag, enum.ReprEnum, collections.OrderedDict},
    )
    if not _hook_installed:
        sys.addaudithook(_audit)
        _hook_installed = True


def _core():
    try:
        from ckptool import _core
    except ImportError:
        for cand in (os.path.join(ROOT, "build-oracle", "python"),
                     os.path.join(ROOT, "build", "python")):
            if os.path.isdir(os.path.join(cand, "ckptool")):
                sys.path.insert(0, cand)
                break
        from ckptool import _core
    return _core


_judge = None


def judge(data, trust=()):
    """The verdict: {findings, names, raw, globals, error, effects}."""
    global _judge
    if _judge is None:
        _judge = _core().judge_pickle
    return _judge(bytes(data), list(trust))


class _ModuleRef:
    """A module a global resolved to that the verdict only lets be stored: reading an attribute
    of it, calling it or changing it is a failure."""
    __slots__ = ("_owner", "_display", "_module")

    def __init__(self, owner, display, module):
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_display", display)
        object.__setattr__(self, "_module", module)

    def _use(self, what):
        owner = object.__getattribute__(self, "_owner")
        owner.fail("module", f"{object.__getattribute__(self, '_display')} is the module "
                   f"{object.__getattribute__(self, '_module')}, and the pickle {what}")

    def __getattr__(self, name):
        self._use(f"reads its attribute {name!r}")

    def __setattr__(self, name, value):
        self._use(f"sets its attribute {name!r}")

    def __call__(self, *args, **kwargs):
        self._use("calls it")

    def __repr__(self):
        return f"<module reference {object.__getattribute__(self, '_display')}>"


class Outcome:
    def __init__(self, verdict):
        self.verdict = verdict
        # SAFE is what `verify` passes: no finding, and a pickle it reads to its STOP (one it
        # stops reading part way is refused whole, whatever came before).
        self.safe = not verdict["findings"] and not verdict.get("error")
        self.loaded = False
        self.result = None
        self.error = None        # what the real load raised, if it failed
        self.violations = []
        self.notes = []

    def __repr__(self):
        if not self.safe:
            return f"<unsafe: {len(self.verdict['findings'])} findings>"
        if self.violations:
            return f"<ORACLE FAILURE {self.violations[0]}>"
        return f"<safe; load {'ok' if self.error is None else 'failed: ' + self.error}>"


def _env_set(name):
    return frozenset(x.strip() for x in os.environ.get(name, "").split(",") if x.strip())


def check(data, trust=None, records=None, imports=None, ignore=None, pretend_safe=False,
          accept_all=False, accept=None):
    """Judges `data`; when SAFE, loads it as torch.load(weights_only=False) would, watched.
    `records`: the archive's other records (data/N), else storages are zeros.
    `pretend_safe`: load it whatever the findings (the oracle's own tests: each name keeps
    its verdict); `accept_all`: and every name as accepted (its proxies and hooks stay out of
    the way of a benign file); `accept`: and the names in it as accepted, any other as
    referenced (the oracle's own tests, whatever the verdict). Returns an Outcome; never
    raises a Violation (see outcome.violations)."""
    global _state
    _init()
    if trust is None:
        trust = sorted(_env_set("ORACLE_TRUST"))
    verdict = judge(data, trust)
    if pretend_safe or accept_all or accept is not None:
        verdict = dict(verdict, findings=[], error="")
    if accept_all or accept is not None:
        names = [n for n, _ in verdict["names"]]
        # The globals' names too (a pickle the verdict stopped reading), but not a getattr
        # the verdict took as attribute reads.
        names += [d for _, _, d in verdict["globals"]
                  if d != "builtins.getattr" or "builtins.getattr" in names]
        verdict["names"] = [(n, "allowed" if accept_all or n in accept else "referenced")
                            for n in names]
    out = Outcome(verdict)
    if not out.safe:
        return out
    ignore = _env_set("ORACLE_IGNORE") if ignore is None else frozenset(ignore)
    if not ignore <= set(CATEGORIES):
        raise ValueError(f"unknown categories {sorted(ignore - set(CATEGORIES))}")
    st = _LoadState(verdict, imports or os.environ.get("ORACLE_IMPORTS", "refuse"), ignore)
    st.accept_all = accept_all
    archive = ArchiveRecords(bytes(data), records)
    torch = _oracle_objects["torch"]
    saved_profile = sys.getprofile()
    _state = st
    st.phase = "load"
    try:
        out.result = _oracle_objects["load"](archive, None, _unpickler_module, encoding="utf-8")
        out.loaded = True
        st.final_checks()
    except Violation:
        pass
    except Refused as e:
        out.error = f"refused: {e}"
    except RecursionError:
        out.error = "RecursionError"
    except (Exception, SystemExit, KeyboardInterrupt, GeneratorExit) as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        out.error = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        st.phase = None
        _state = None
        if st.profiling:
            sys.setprofile(saved_profile)
        torch.serialization._serialization_tls.map_location = None
    out.violations = list(st.violations)
    out.notes = st.notes
    return out


# ---------------------------------------------------------------------------------------------
# The mutator: libFuzzer's byte mutations, and insertions that know how pickles attack.

METHOD_NAMES = ("__setstate__", "extend", "append", "add", "keys", "items", "replace",
                "__reduce__", "__reduce_ex__", "__getitem__", "__iter__", "__class__", "__dict__",
                "__getattr__", "__call__", "update", "__len__", "copy", "__fspath__", "read",
                "readline", "__index__", "__format__", "__eq__", "__hash__", "values", "get",
                "__missing__", "__torch_function__", "fromkeys", "write_text", "write_bytes",
                "_rebuild_tensor_v2", "system")
# Callables a pickle may try to reach: referenced-only names the verdict lets through when
# they are not called directly, allowlisted ones, and a few deny-listed ones.
CALLABLES = (
    ("builtins", "print"), ("builtins", "iter"), ("builtins", "next"), ("builtins", "repr"),
    ("builtins", "type"), ("builtins", "hasattr"), ("builtins", "isinstance"),
    ("builtins", "dir"), ("builtins", "format"), ("builtins", "memoryview"),
    ("builtins", "id"), ("builtins", "hash"), ("builtins", "callable"),
    ("builtins", "super"), ("builtins", "property"), ("builtins", "classmethod"),
    ("builtins", "max"), ("builtins", "min"), ("builtins", "sorted"), ("builtins", "list"),
    ("builtins", "dict"), ("builtins", "map"), ("builtins", "set"), ("builtins", "str"),
    ("collections", "OrderedDict"), ("collections", "defaultdict"), ("pathlib", "Path"),
    ("argparse", "Namespace"), ("types", "SimpleNamespace"), ("copy", "deepcopy"),
    ("functools", "reduce"), ("itertools", "starmap"), ("json", "loads"),
    ("base64", "b64decode"), ("zlib", "decompress"), ("codecs", "decode"),
    ("textwrap", "dedent"), ("fnmatch", "filter"), ("string", "Formatter"),
    ("inspect", "getsource"), ("logging", "warning"), ("warnings", "warn"),
    ("random", "seed"), ("math", "factorial"), ("operator", "add"), ("operator", "contains"),
    ("operator", "setitem"), ("operator", "delitem"), ("copyreg", "_reconstructor"),
    ("torch", "tensor"), ("torch", "zeros"), ("torch", "manual_seed"), ("torch", "set_num_threads"),
    ("torch._utils", "_rebuild_tensor_v2"), ("torch.nn.parameter", "Parameter"),
    ("numpy", "frombuffer"), ("numpy", "array"), ("builtins", "eval"), ("posix", "system"),
    ("os", "system"), ("builtins", "getattr"), ("builtins", "setattr"),
)
HOLDERS = (  # objects of allowlisted classes with an instance __dict__
    lambda: op_call(op_global("argparse", "Namespace")),
    lambda: op_call(op_global("types", "SimpleNamespace")),
    lambda: op_call(op_global("collections", "OrderedDict")),
    lambda: op_call(op_global("collections", "Counter")),
    lambda: op_newobj(op_global("argparse", "Namespace")),
    lambda: op_call(op_global("copyreg", "_reconstructor"), op_global("argparse", "Namespace"),
                    op_global("builtins", "object"), op_none()),
    lambda: op_call(op_global("copyreg", "__newobj__"), op_global("collections", "OrderedDict")),
)
MODULE_PATHS = (
    ("pathlib", "os"), ("torch._utils", "torch"), ("collections", "sys"), ("argparse", "os"),
    ("torch", "serialization"), ("numpy", "lib"), ("copyreg", "__builtins__"),
    ("torch._tensor", "_C"), ("uuid", "os"), ("pathlib", "os.system"), ("argparse", "_os"),
    ("torch", "_utils._rebuild_tensor_v2"), ("collections", "abc.Mapping"),
)
ATTR_READS = (  # (class, attribute) for getattr reads
    (("pathlib", "Path"), "write_text"), (("pathlib", "Path"), "unlink"),
    (("collections", "OrderedDict"), "fromkeys"), (("argparse", "Namespace"), "__init__"),
    (("uuid", "SafeUUID"), "safe"), (("torch", "Tensor"), "add_"), (("builtins", "str"), "format"),
    (("builtins", "dict"), "fromkeys"), (("types", "SimpleNamespace"), "__setstate__"),
    (("pathlib", "Path"), "touch"), (("collections", "Counter"), "update"),
)


class Gadgets:
    """Random hostile expressions; each pushes one value."""

    def __init__(self, rng):
        self.rng = rng

    def pick(self, seq):
        return seq[self.rng.randrange(len(seq))]

    def callable_(self, depth=0):
        r = self.rng.random()
        if r < 0.45 or depth > 1:
            return op_global(*self.pick(CALLABLES))
        if r < 0.7:
            return launder_max(self.callable_(depth + 1))
        if r < 0.8:
            return op_call(op_global("builtins", "min"), op_tuple(self.callable_(depth + 1)))
        (m, n), attr = self.pick(ATTR_READS)
        return getattr_read(op_global(m, n), attr)

    def holder(self):
        return self.pick(HOLDERS)()

    def planted(self, key=None):
        return plant(self.holder(), key or self.pick(METHOD_NAMES), self.callable_())

    def expression(self):
        k = self.rng.randrange(17)
        c = self.callable_
        if k == 0:   # BUILD calls a planted __setstate__
            return self.planted("__setstate__") + op_dict() + b"b"
        if k == 1:   # APPENDS calls a planted extend
            return self.planted("extend") + b"(" + op_str("a") + b"e"
        if k == 2:   # APPEND (extend first, then append)
            return self.planted(self.pick(("append", "extend"))) + op_str("a") + b"a"
        if k == 3:   # ADDITEMS calls a planted add
            return self.planted("add") + b"(" + op_str("a") + b"\x90"
        if k == 4:   # OrderedDict(x) calls x.keys()
            return op_call(op_global(*self.pick((("collections", "OrderedDict"),
                                                ("builtins", "dict"), ("collections", "Counter"),
                                                ("builtins", "sorted"), ("builtins", "list")))),
                           self.planted(self.pick(("keys", "__iter__", "items", "__getitem__"))))
        if k == 5:   # map/filter call their function when iterated
            it = op_call(op_global("builtins", self.pick(("map", "filter"))), c(),
                         op_list(op_str("a")))
            return op_call(op_global("builtins", self.pick(("sorted", "list", "max", "tuple",
                                                            "set", "any"))), it)
        if k == 6:   # the rebuild function calls its first argument
            return op_call(op_global("torch._tensor", "_rebuild_from_type_v2"), c(),
                           op_global("torch", "Tensor"), op_tuple(op_str("a")), op_dict())
        if k == 7:   # numpy's random-state constructor calls its second argument
            return op_call(op_global("numpy.random._pickle", "__randomstate_ctor"),
                           op_str("MT19937"), c())
        if k == 8:   # a default factory
            return op_call(op_global("collections", "defaultdict"), c())
        if k == 9:   # a module, or a path through one
            m, n = self.pick(MODULE_PATHS)
            return op_stack_global(m, n) if "." in n or self.rng.random() < 0.5 \
                else op_global(m, n)
        if k == 10:  # a laundered call
            return op_call(c(1), op_str("a"))
        if k == 11:  # a reconstructed class of the pickle's choice
            return op_newobj(op_global(*self.pick((("collections", "UserDict"),
                                                  ("logging", "Logger"), ("string", "Template"),
                                                  ("pathlib", "Path"), ("email.message", "Message"))))) \
                + op_dict((op_str(self.pick(METHOD_NAMES)), c())) + b"b"
        if k == 12:  # a class switch through slot state
            return self.holder() + op_tuple(op_none(), op_dict(
                (op_str("__class__"), op_global(*self.pick((("collections", "UserDict"),
                                                           ("types", "SimpleNamespace"),
                                                           ("argparse", "ArgumentParser"))))))) + b"b"
        if k == 13:  # patching an imported object
            return launder_max(op_global(*self.pick((("argparse", "Namespace"),
                                                     ("copyreg", "_extension_registry"),
                                                     ("collections", "OrderedDict"))))) \
                + op_tuple(op_none(), op_dict((op_str(self.pick(METHOD_NAMES)), c()))) + b"b"
        if k == 14:  # an Enum-style read, then used
            (m, n), attr = self.pick(ATTR_READS)
            read = getattr_read(op_global(m, n), attr)
            return op_call(op_global("builtins", "sorted"),
                           op_call(op_global("builtins", "map"), read, op_list(op_str("/tmp/x"))))
        if k == 15:  # the parameter's state is setattr()'d: planted methods, __class__
            key = self.pick(METHOD_NAMES)
            param = op_call(op_global("torch._utils", "_rebuild_parameter_with_state"),
                            op_tensor(), b"\x89", op_call(op_global("collections", "OrderedDict")),
                            op_tuple(op_dict((op_str(key), c())), op_none()))
            return op_call(op_global("collections", self.pick(("OrderedDict", "Counter"))), param) \
                if self.rng.random() < 0.5 else param
        return op_call(op_global("torch._tensor", "_rebuild_from_type_v2"),
                       op_global("torch._utils", "_rebuild_tensor_v2"),
                       op_global(*self.pick((("torch.nn.parameter", "UninitializedBuffer"),
                                             ("torch.nn.parameter", "Buffer"),
                                             ("torch", "Tensor"), ("torch.masked", "MaskedTensor")))),
                       op_tuple(op_storage(), op_int(0), op_tuple(op_int(1)), op_tuple(op_int(1)),
                                b"\x89", op_call(op_global("collections", "OrderedDict"))),
                       op_dict((op_str(self.pick(METHOD_NAMES)), c())))


def split_ops(data):
    """The pickle as a list of [name, arg, raw bytes] up to STOP; None if it does not parse."""
    ops = []
    try:
        for op, arg, pos in pickletools.genops(data):
            ops.append([op.name, arg, pos])
            if op.name == "STOP":
                break
    except Exception:
        return None
    if not ops or ops[-1][0] != "STOP":
        return None
    for i, o in enumerate(ops):
        end = ops[i + 1][2] if i + 1 < len(ops) else o[2] + 1
        o[2] = data[o[2]:end]
    return ops


def _memo_keys(ops, upto):
    keys, count = [], 0
    for name, arg, _ in ops[:upto]:
        if name in ("PUT", "BINPUT", "LONG_BINPUT"):
            keys.append(arg)
            count += 1
        elif name == "MEMOIZE":
            keys.append(count)
            count += 1
    return keys


def _get(key):
    """The opcode that fetches memo `key`: BINGET, LONG_BINGET, or GET's decimal text for a key
    PUT stored outside 32 bits."""
    if 0 <= key < 256:
        return b"h" + bytes([key])
    if 0 <= key < 1 << 32:
        return b"j" + struct.pack("<I", key)
    return b"g" + str(key).encode() + b"\n"


def mutate(data, max_size, seed):
    rng = random.Random(seed)
    import atheris
    if rng.random() < 0.3:
        return atheris.Mutate(data, max_size)
    ops = split_ops(data)
    if ops is None:
        if rng.random() < 0.5 or len(data) < 3:
            return pickle_of([Gadgets(rng).expression()])[:max_size]
        return atheris.Mutate(data, max_size)
    ops = [o for o in ops if o[0] != "FRAME"]  # frames would no longer match
    g = Gadgets(rng)
    start = 1 if ops[0][0] == "PROTO" else 0
    pos = rng.randrange(start, len(ops))  # insert before ops[pos] (STOP at the latest)
    k = rng.randrange(10)
    if k <= 3:     # a hostile expression, evaluated for its effects
        ops.insert(pos, [None, None, g.expression() + b"0"])
    elif k == 4:   # plant a method in an object the pickle made, maybe trigger it
        keys = _memo_keys(ops, pos)
        if keys:
            key = rng.choice(keys)
            seq = _get(key) + op_dict((op_str(g.pick(METHOD_NAMES)), g.callable_())) + b"b"
            seq += rng.choice((b"", op_dict() + b"b", b"(" + op_str("a") + b"e",
                               b"(" + op_str("a") + b"\x90"))
            ops.insert(pos, [None, None, seq + b"0"])
            ops.insert(pos + 1, [None, None, op_call(op_global("collections", "OrderedDict"),
                                                     _get(key)) + b"0"])
    elif k == 5:   # launder a global the pickle imports
        idx = [i for i, o in enumerate(ops) if o[0] in ("GLOBAL", "STACK_GLOBAL")]
        if idx:
            i = rng.choice(idx)
            tmp = 0x7FFF0000 + rng.randrange(1000)
            wrap = rng.choice((launder_max, lambda x: op_call(op_global("builtins", "min"),
                                                              op_tuple(x))))
            ops[i][2] = ops[i][2] + b"r" + struct.pack("<I", tmp) + b"0" + wrap(_get(tmp))
    elif k == 6:   # re-aim a global at another name, a module or a dotted path
        idx = [i for i, o in enumerate(ops) if o[0] == "GLOBAL"]
        if idx:
            m, n = g.pick(CALLABLES + MODULE_PATHS)
            ops[rng.choice(idx)][2] = op_global(m, n)
    elif k == 7:   # a string becomes a method name (BUILD keys, getattr names)
        idx = [i for i, o in enumerate(ops)
               if o[0] in ("BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8")]
        if idx:
            ops[rng.choice(idx)][2] = op_str(g.pick(METHOD_NAMES))
    elif k == 8:   # protocol 4: dotted STACK_GLOBAL names resolve attribute paths
        if ops[0][0] == "PROTO":
            ops[0][2] = b"\x80\x04"
        else:
            ops.insert(0, [None, None, b"\x80\x04"])
    else:          # drop or repeat an opcode
        i = rng.randrange(start, len(ops) - 1) if len(ops) > start + 1 else None
        if i is not None:
            if rng.random() < 0.5:
                del ops[i]
            else:
                ops.insert(i, list(ops[i]))
    out = b"".join(o[2] for o in ops)
    if len(out) > max_size:
        return atheris.Mutate(data, max_size)
    return out


# ---------------------------------------------------------------------------------------------
# Entry points.

_collected = {}


def _collect(data, v, where):
    """ORACLE_COLLECT=DIR: failures are written to DIR (a few of each kind) instead of ending
    the run, so one run finds every kind."""
    import hashlib
    import re
    kind = v.category + ": " + re.sub(r"[0-9]+|'[^']*'|0x[0-9a-f]+", "#", v.message)[:100]
    n = _collected.get(kind, 0)
    _collected[kind] = n + 1
    if n < 3:
        name = f"{v.category}-{hashlib.sha1(data).hexdigest()[:12]}"
        with open(os.path.join(where, name), "wb") as f:
            f.write(data)
        if n == 0:
            print(f"\nsemantic oracle failure #{len(_collected)} ({name}): {v}", flush=True)


def test_one_input(data):
    out = check(data)
    if out.violations:
        v = out.violations[0]
        where = os.environ.get("ORACLE_COLLECT")
        if where:
            _collect(bytes(data), v, where)
            return
        raise RuntimeError(f"semantic oracle failure {v}\nverdict names: "
                           f"{out.verdict['names']}")


def _files(paths):
    for p in paths:
        if os.path.isdir(p):
            for name in sorted(os.listdir(p)):
                f = os.path.join(p, name)
                if os.path.isfile(f):
                    yield f
        else:
            yield p


def replay(paths, verbose=True):
    """Checks every file; returns the number of oracle failures."""
    failures = 0
    for f in _files(paths):
        with open(f, "rb") as fh:
            data = fh.read()
        out = check(data)
        if out.violations:
            failures += 1
        if verbose:
            print(f"{os.path.basename(f)}: {out!r}")
    return failures


def main(argv):
    if len(argv) > 1 and argv[1] == "--replay":
        failures = replay(argv[2:])
        print(f"{failures} oracle failures")
        return 1 if failures else 0
    import atheris
    _init()
    judge(b"\x80\x02}.")
    # Coverage of what the unpickler and the oracle do (torch and the verdict are not
    # instrumented).
    for owner in (pickle._Unpickler, OracleUnpickler, _LoadState):
        for name, f in list(vars(owner).items()):
            if isinstance(f, types.FunctionType):
                setattr(owner, name, atheris.instrument_func(f))
    for f in (_lookup, _audit, check):
        atheris.instrument_func(f)
    atheris.Setup(argv, test_one_input, custom_mutator=mutate)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
