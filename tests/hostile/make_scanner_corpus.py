#!/usr/bin/env python3
"""Builds tests/hostile/scanner_corpus/ (the malicious and benign pickle payloads of the public
pickle scanners' own test suites, with the verdict each suite's tests expect) and
tests/hostile/frame_cases/ (FRAME-straddling pickles that CPython's C unpickler and a
straight-through reader read differently), plus scanner_corpus/manifest.json describing both.

Only payload bytes and the manifest are written: never the suites' code. Where a suite makes its
payloads with Python code, the equivalent code is here; where it commits bytes, they are read
from the suite's git history at the pinned commit. fickling's payloads are built by fickling's
own opcode API in its tests: they are recorded by running those test modules (at the pinned
commit, with that commit's fickling) with fickling's check_safety wrapped to keep the bytes of
every pickle it is asked to judge, and the verdict the test expects is fickling's own verdict
on it (all those tests pass at that commit; the recording checks it).

Run once, with the project's .venv (torch 2.13, numpy, picklescan, modelscan, fickling) and
dill importable (only modelscan's dill payloads need it):

    PYTHONPATH=/somewhere/with/dill .venv/bin/python tests/hostile/make_scanner_corpus.py \\
        --picklescan GIT_DIR --modelscan GIT_DIR --fickling GIT_DIR

where each GIT_DIR is a clone (bare or not) of the suite holding the pinned commit below.
Payloads over 256 KiB are left out (listed on stdout). The script never unpickles a payload
with a real unpickler except the FRAME cases, whose hidden call is builtins.print.
"""
import argparse
import ast
import base64
import contextlib
import hashlib
import io
import json
import os
import pickle
import pickletools
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "scanner_corpus")
FRAMES = os.path.join(HERE, "frame_cases")
MAX_BYTES = 256 * 1024

PINS = {
    "picklescan": ("mmaitre314/picklescan", "f15d54da3dec9aa28a87ede82f87882bb80f1023"),
    "modelscan": ("protectai/modelscan", "8b8ed4bf78a863fcf3b664888dc7ff6ae22f5230"),
    "fickling": ("trailofbits/fickling", "854c99acd2637f97162dd2e1aa2dab4e8d55d77d"),
}


def origin(scanner, path, test=None):
    repo, commit = PINS[scanner]
    s = f"github.com/{repo} {path} @{commit[:12]}"
    return s + (f" {test}" if test else "")


# ---------------------------------------------------------------------------------------------
# Small pickle helpers (no unpickling)

def first_pickle_end(data, start=0):
    """Offset just past the STOP of the pickle starting at `start`, or None if it does not parse
    to a STOP."""
    try:
        for op, _arg, pos in pickletools.genops(io.BytesIO(data[start:])):
            if op.name == "STOP":
                return start + pos + 1
    except Exception:
        return None
    return None


def split_pickles(data, limit=None):
    out, pos = [], 0
    while pos < len(data) and (limit is None or len(out) < limit):
        end = first_pickle_end(data, pos)
        if end is None:
            break
        out.append(data[pos:end])
        pos = end
    return out, pos


def npy_pickle(data):
    """The pickle inside an object-dtype .npy, or None."""
    if not data.startswith(b"\x93NUMPY"):
        return None
    major = data[6]
    if major == 1:
        hlen, hstart = struct.unpack("<H", data[8:10])[0], 10
    else:
        hlen, hstart = struct.unpack("<I", data[8:12])[0], 12
    header = ast.literal_eval(data[hstart:hstart + hlen].decode("latin1"))
    if "O" not in str(header.get("descr")):
        return None
    return data[hstart + hlen:]


def zip_members(data):
    """(name, bytes) of every member: through zipfile when it can read the archive, else by
    walking the local headers (the suites' zips with lying flags, CRCs or directories)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return [(i.filename, z.read(i)) for i in z.infolist()]
    except Exception:
        pass
    out, off = [], 0
    while data[off:off + 4] == b"PK\x03\x04":
        (_v, _flag, method, _t, _d, _crc, csize, _usize, nlen, elen) = struct.unpack(
            "<HHHHHIIIHH", data[off + 4:off + 30])
        name = data[off + 30:off + 30 + nlen].decode("utf-8", "replace")
        start = off + 30 + nlen + elen
        body = data[start:start + csize]
        if method == 8:
            try:
                body = zlib.decompress(body, -15)
            except zlib.error:
                body = b""
        out.append((name, body))
        off = start + csize
    return out


def storages_from_zip(members):
    """[{key, nbytes}] of a torch zip's data/<key> records."""
    out = []
    for name, body in members:
        m = re.match(r"^[^/]+/data/([^/]+)$", name)
        if m:
            out.append({"key": m.group(1), "nbytes": len(body)})
    return sorted(out, key=lambda s: s["key"])


def storages_from_legacy_object_pickle(obj_pickle):
    """[{key, numel, nbytes}] named by a benign legacy object pickle: read with an unpickler that
    resolves nothing outside torch and collections (so it cannot run a payload) and records the
    persistent ids instead of loading storages."""
    import torch
    found = {}

    class Reader(pickle.Unpickler):
        def find_class(self, module, name):
            if module.split(".")[0] in ("torch", "collections"):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"{module}.{name} refused")

        def persistent_load(self, pid):
            _typename, storage_type, key, _location, numel = pid[:5]
            dtype = storage_type(0).dtype
            nbytes = numel * torch._utils._element_size(dtype)
            found[key] = {"key": key, "numel": numel, "nbytes": nbytes}
            return torch.storage.TypedStorage(wrap_storage=torch.UntypedStorage(nbytes),
                                              dtype=dtype, _internal=True)

    Reader(io.BytesIO(obj_pickle)).load()
    return sorted(found.values(), key=lambda s: s["key"])


# ---------------------------------------------------------------------------------------------

class Corpus:
    def __init__(self):
        self.entries = []
        self.by_bytes = {}
        self.skipped = []
        self.names_used = set()

    def add(self, scanner, name, data, where, expect, why, names=None, containers=None,
            storages=None, folder=None, extra=None):
        assert expect in ("malicious", "benign"), expect
        if len(data) > MAX_BYTES:
            self.skipped.append(f"{scanner} {name}: {len(data)} bytes > 256 KiB ({where})")
            return None
        digest = hashlib.sha256(data).hexdigest()
        key = (scanner, digest, tuple(containers or ()))
        if key in self.by_bytes:
            e = self.by_bytes[key]
            if e["expect"] != expect:
                e.setdefault("conflicting_verdicts", []).append(f"{expect}: {where}")
                if expect == "malicious":
                    e["expect"] = expect
            e.setdefault("same_bytes_also_at", []).append(where)
            return e
        base = re.sub(r"[^A-Za-z0-9._+-]+", "_", re.sub(r"\.(pkl|pickle)$", "", name)).strip("_")
        fname = base
        n = 2
        while (scanner, fname) in self.names_used:
            fname, n = f"{base}_{n}", n + 1
        self.names_used.add((scanner, fname))
        rel = (f"frame_cases/{fname}.pkl" if folder == "frames"
               else f"scanner_corpus/{scanner}/{fname}.pkl")
        e = {"file": rel, "scanner": scanner, "origin": where, "expect": expect, "why": why,
             "sha256": digest}
        if names is not None:
            e["names"] = names
        if containers:
            e["containers"] = list(containers)
        if storages:
            e["storages"] = storages
        if extra:
            e.update(extra)
        e["_bytes"] = data
        self.entries.append(e)
        self.by_bytes[key] = e
        return e


class Git:
    def __init__(self, git_dir, commit):
        self.git_dir, self.commit = git_dir, commit
        subprocess.run(["git", "--git-dir", git_dir, "cat-file", "-e", commit + "^{commit}"],
                       check=True)

    def ls(self, folder):
        out = subprocess.run(["git", "--git-dir", self.git_dir, "ls-tree", "-r", "--name-only",
                              self.commit, folder], check=True, capture_output=True, text=True)
        return out.stdout.split()

    def show(self, path):
        return subprocess.run(["git", "--git-dir", self.git_dir, "show", f"{self.commit}:{path}"],
                              check=True, capture_output=True).stdout

    def export(self, into, *pathspecs):
        arch = subprocess.run(["git", "--git-dir", self.git_dir, "archive", self.commit,
                               *pathspecs], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", into], input=arch, check=True)


# ---------------------------------------------------------------------------------------------
# picklescan: every committed file under tests/data and tests/data2

PICKLESCAN_BENIGN = {
    # test_scan_file_path / test_scan_pytorch / test_scan_numpy / test_scan_file_path_npz:
    # ScanResult with issues_count=0
    "benign0_v0.pkl", "benign0_v3.pkl", "benign0_v4.pkl", "pytorch_model.bin",
    "new_pytorch_model.bin", "object_array.npy", "object_arrays.npz",
    "object_arrays_compressed.npz",
}
PICKLESCAN_NOT_PICKLES = {
    "bad_pytorch.pt": "a PNG signature, not a pickle (the suite: scanned, no issue)",
    "not_a_pickle.bin": "b'cmod\\n\\xf8\\n': invalid UTF-8, not a pickle (the suite: no issue, no error)",
    "benign_password_protected.zip": "its member is encrypted: no pickle to read",
    "int_array.npy": "int array: no pickle inside",
    "int_arrays.npz": "int arrays: no pickle inside",
    "int_arrays_compressed.npz": "int arrays: no pickle inside",
}
PICKLESCAN_WHY = {
    "benign0_v0.pkl": "a list of three strings (protocol 0)",
    "benign0_v3.pkl": "a list of three strings (protocol 3)",
    "benign0_v4.pkl": "a list of three strings (protocol 4)",
    "new_pytorch_model.bin": "torch zip state dict (FloatStorage, OrderedDict, _rebuild_tensor_v2)",
    "object_array.npy": "object .npy: numpy _reconstruct of an array of tuples",
    "object_arrays.npz": "object arrays in an .npz (numpy _reconstruct)",
    "object_arrays_compressed.npz": "object arrays in a compressed .npz (numpy _reconstruct)",
    "malicious0.pkl": "Sour Pickles chain: globals, compile, eval, getattr(dict,'get'), apply",
    "malicious1_v0.pkl": "calls __builtin__.eval (protocol 0)",
    "malicious1_v3.pkl": "calls builtins.eval (protocol 3)",
    "malicious1_v4.pkl": "calls builtins.eval (protocol 4, STACK_GLOBAL)",
    "malicious2_v0.pkl": "calls posix.system (protocol 0)",
    "malicious2_v3.pkl": "calls posix.system (protocol 3)",
    "malicious2_v4.pkl": "calls posix.system (protocol 4)",
    "malicious3.pkl": "calls httplib.HTTPSConnection (Python 2 name of http.client)",
    "malicious4.pickle": "calls requests.api.get (network)",
    "malicious5.pickle": "calls aiohttp.client.ClientSession (network)",
    "malicious6.pkl": "a benign list pickle, then a second pickle calling requests.api.get",
    "malicious7.pkl": "calls socket.create_connection",
    "malicious8.pkl": "calls subprocess.run",
    "malicious9.pkl": "calls sys.exit",
    "malicious10.pkl": "INST opcode calling __builtin__.exec",
    "malicious11.pkl": "memo GETs feed STACK_GLOBAL os.system (PUT slots named torch/LongStorage as decoys)",
    "malicious-invalid-bytes.pkl": "os.system via memo STACK_GLOBAL, then junk after STOP",
    "malicious12.pkl": "operator.attrgetter('system')(__import__('os'))('echo pwned')",
    "malicious13a.pkl": "nested pickle.loads (protocol 0: cPickle spelling)",
    "malicious13b.pkl": "nested _pickle.loads",
    "malicious14.pkl": "calls runpy._run_code",
    "malicious15a.pkl": "calls bdb.Bdb.run (protocol 2)",
    "malicious15b.pkl": "calls bdb.Bdb.run (protocol 4)",
    "malicious16.pkl": "calls pip.main(['install', ...])",
    "malicious17.pkl": "calls torch._inductor.codecache.compile_file (runs a command)",
    "malicious18.pkl": "calls pydoc.pipepager (runs a command)",
    "malicious19.pkl": "functools.partial(torch.load, path, weights_only=False)() nested load",
    "malicious20.pkl": "calls venv.create with a shell-injected prompt",
    "malicious21.pkl": "calls timeit.timeit with an os.system setup string",
    "malicious22.pkl": "calls numpy.testing._private.utils.runstring (exec)",
    "malicious23.pkl": "STRING (protocol 0) operands for STACK_GLOBAL os.system",
    "broken_model.pkl": "__builtin__.exec with a truncated BINUNICODE: broken, exec named before the break",
    "sys_module_override_sploit.pkl": "BUILD into torch._utils/module __dict__ to reach builtins.eval and exec",
    "keyerror-exploit.pkl": "os.system call, then a STACK_GLOBAL reading a missing memo slot",
    "type-confusion-exploit.pkl": "os.system call, then STACK_GLOBAL with an int module name",
    "cloudpickle_codeinjection.pkl": "cloudpickle _make_function/_builtin_type(CodeType): arbitrary bytecode",
    "types_CodeType.pkl": "builds a types.CodeType from raw bytecode",
    "dns_exfiltration.npy": "object .npy: ssl.get_server_certificate on a host named from /etc/passwd",
    "io_FileIO.pkl": "opens /etc/hosts with _io.FileIO",
    "urllib_request_urlopen.pkl": "calls urllib.request.urlopen",
    "logging_FileHandler.pkl": "logging.FileHandler creates a file",
    "pytorch_magic_bypass.pt": "legacy file whose magic number comes from eval(), then an os.system pickle",
    "malicious1.zip": "builtins.eval in a zip member (also the suite's 7z, flag 0x1/0x20/0x40, "
                      "bad CRC, bad central directory and wrong-extension zips)",
}


def picklescan_why(base, names):
    if base in PICKLESCAN_WHY:
        return PICKLESCAN_WHY[base]
    m = re.match(r"(GHSA-[0-9a-z-]+?)(?:-(uuid|osx-support|aix-support|imaplib|pyrepl-pager|test))?\.(pkl|bin)$", base)
    called = ", ".join(".".join(n) for n in (names or [])) or "a gadget"
    if m:
        return f"advisory {m.group(1)}: calls {called}"
    return f"calls {called}"


def collect_picklescan(c, git):
    zip_pickles = {}
    for path in git.ls("tests/data") + git.ls("tests/data2"):
        base = os.path.basename(path)
        data = git.show(path)
        where = origin("picklescan", path)
        expect = "benign" if base in PICKLESCAN_BENIGN else "malicious"
        if base in PICKLESCAN_NOT_PICKLES:
            c.skipped.append(f"picklescan {path}: {PICKLESCAN_NOT_PICKLES[base]}")
            continue
        if base.endswith(".7z"):
            # py7zr content: initialize_7z_file writes pickle.dumps(Malicious1(), protocol=4),
            # the bytes of data/malicious1.zip's data.pkl.
            c.skipped.append(f"picklescan {path}: 7z of pickle.dumps(Malicious1(), protocol=4), "
                             "the same bytes as malicious1.zip:data.pkl")
            continue
        if data.startswith(b"PK"):
            members = zip_members(data)
            storages = storages_from_zip(members)
            for name, body in members:
                if name.endswith(".npy"):
                    body = npy_pickle(body)
                    if body is None:
                        continue
                elif first_pickle_end(body) is None or "/data/" in name:
                    continue
                if name.endswith(("version", "byteorder")):
                    continue
                is_torch = name.endswith("/data.pkl") and storages
                key = "malicious1.zip" if base.startswith("malicious1") else base
                c.add("picklescan", f"{base}.{os.path.basename(name)}", body, f"{where}:{name}", expect, picklescan_why(key, None),
                      containers=["zip"] if is_torch else None,
                      storages=storages if is_torch else None, extra={"_key": key})
            continue
        if data.startswith(b"\x93NUMPY"):
            body = npy_pickle(data)
            if body is None:
                continue
            c.add("picklescan", base, body, where, expect, picklescan_why(base, None),
                  extra={"_key": base})
            continue
        pickles, end = split_pickles(data, limit=5)
        magic = None
        if pickles:
            for op, arg, _ in pickletools.genops(pickles[0]):
                if op.name in ("LONG1", "LONG4", "LONG", "INT") and arg == 0x1950a86a20f9469cfc6c:
                    magic = True
        if magic and base == "pytorch_model.bin":
            obj = pickles[3]
            c.add("picklescan", base + ".object", obj, where + " (legacy torch: the object pickle)",
                  expect, "legacy torch state dict (FloatStorage, OrderedDict, _rebuild_tensor_v2)",
                  containers=["legacy"], storages=storages_from_legacy_object_pickle(obj),
                  extra={"_key": base})
            continue
        c.add("picklescan", base, data, where, expect, picklescan_why(base, None),
              extra={"_key": base})

    # Payloads test_scanner.py makes in memory.
    class Suspicious:
        def __reduce__(self):
            import collections
            return collections.Counter, ([1, 2, 3],)
    c.add("picklescan", "Suspicious_Counter", pickle.dumps(Suspicious()),
          origin("picklescan", "tests/test_scanner.py", "test_scan_pickle_bytes_strict"), "benign",
          "collections.Counter([1, 2, 3]): 'suspicious' only, issues_count 0 unless strict",
          extra={"_key": "Suspicious"})
    c.add("picklescan", "mock_pickle_benign", pickle.dumps({"a": 0, "b": 1, "c": 2}),
          origin("picklescan", "tests/test_scanner.py", "test_scan_url (mock/pickle/benign)"),
          "benign", "a plain dict", extra={"_key": "mock_benign"})


# ---------------------------------------------------------------------------------------------
# modelscan: tests/test_modelscan.py's fixtures (file_path, zip_file_path, pytorch_file_path,
# numpy_file_path) and tests/data/unsafe_zip_pytorch.pt. The Keras/TensorFlow fixtures are
# models of those libraries (not installed here), not pickles a torch checkpoint could carry.

@contextlib.contextmanager
def stub_module(name, **attrs):
    """A stand-in module for pickling references to a library that is not installed: pickle
    writes only obj.__module__ and obj.__qualname__, so the bytes are those the real library
    gives."""
    import types
    parts = name.split(".")
    made = []
    for i in range(1, len(parts) + 1):
        mod = ".".join(parts[:i])
        if mod not in sys.modules:
            sys.modules[mod] = types.ModuleType(mod)
            made.append(mod)
    m = sys.modules[name]
    for k, v in attrs.items():
        v.__module__ = name
        v.__qualname__ = k
        setattr(m, k, v)
    try:
        yield m
    finally:
        for mod in made:
            del sys.modules[mod]


def modelscan_payloads():
    import bdb
    import http.client
    import socket
    import numpy as np
    import torch
    import torch.nn as nn

    class Malicious1:
        def __reduce__(self):
            return eval, ("print('456')",)

    class Malicious2:
        def __reduce__(self):
            return os.system, ("ls -la",)

    class Malicious3:
        def __reduce__(self):
            return http.client.HTTPSConnection, ("github.com",)

    def requests_get(*a, **k):
        raise RuntimeError("stub")

    class Malicious4:
        def __reduce__(self):
            return sys.modules["requests.api"].get, ("https://github.com",)

    class Malicious5:
        def __reduce__(self):
            import aiohttp
            return aiohttp.ClientSession, tuple()

    class Malicious6:
        def __reduce__(self):
            return socket.create_connection, (("github.com", 80),)

    class Malicious7:
        def __reduce__(self):
            return subprocess.run, (["ls", "-l"],)

    class Malicious8:
        def __reduce__(self):
            return sys.exit, (0,)

    class Malicious15:
        def __reduce__(self):
            return bdb.Bdb.run, (bdb.Bdb(), 'import os\nos.system("whoami")')

    def malicious12_gen():
        p = pickle.PROTO + b"\x05" + pickle.GLOBAL + b"pickle\nloads\n"
        p2 = (pickle.PROTO + b"\x05" + pickle.GLOBAL + b"os\nsystem\n" + pickle.UNICODE
              + b"echo pwned!!!\n" + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP)
        p += pickle.BINBYTES + len(p2).to_bytes(4, "little") + p2
        return p + pickle.TUPLE1 + pickle.REDUCE + pickle.POP + pickle.NONE + pickle.STOP

    def malicious13_gen():
        return (pickle.PROTO + b"\x05" + pickle.GLOBAL + b"builtins\neval.__call__\n"
                + pickle.UNICODE + b'__import__("os").system("echo pwned!!!")\n'
                + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP)

    def ctf_memo(trailer):
        return b"".join([
            pickle.UNICODE + b"os\n", pickle.PUT + b"2\n", pickle.POP,
            pickle.UNICODE + b"system\n", pickle.PUT + b"3\n", pickle.POP,
            pickle.UNICODE + b"torch\n", pickle.PUT + b"0\n", pickle.POP,
            pickle.UNICODE + b"LongStorage\n", pickle.PUT + b"1\n", pickle.POP,
            pickle.GET + b"2\n", pickle.GET + b"3\n", pickle.STACK_GLOBAL, pickle.MARK,
            pickle.UNICODE + b"cat flag.txt\n", pickle.TUPLE, pickle.REDUCE, pickle.STOP, trailer])

    out = []  # (name, bytes, expect, why, test, extra kwargs)
    fx = "tests/test_modelscan.py"
    with stub_module("requests.api", get=requests_get):
        for v in (0, 3, 4):
            out.append((f"benign0_v{v}.pkl", pickle.dumps(["a", "b", "c"], protocol=v), "benign",
                        f"a list of three strings (protocol {v})", "file_path fixture", {}))
            out.append((f"malicious1_v{v}.pkl", pickle.dumps(Malicious1(), protocol=v), "malicious",
                        f"calls eval (protocol {v})", "file_path fixture", {}))
            out.append((f"malicious2_v{v}.pkl", pickle.dumps(Malicious2(), protocol=v), "malicious",
                        f"calls os.system (protocol {v})", "file_path fixture", {}))
        out.append(("malicious0.pkl",
                    b'c__builtin__\nglobals\n(tRp100\n0c__builtin__\ncompile\n(S\'fl=open("/etc/passwd");picklesmashed=fl.read();'
                    + b"'\nS''\nS'exec'\ntRp101\n0c__builtin__\neval\n(g101\ng100\ntRp102\n0c__builtin__\ngetattr\n(c__builtin__\n"
                    + b"dict\nS'get'\ntRp103\n0c__builtin__\napply\n(g103\n(g100\nS'picklesmashed'\nltRp104\n0g104\n.",
                    "malicious", "Sour Pickles chain: globals, compile, eval, getattr, apply",
                    "file_path fixture", {}))
        out.append(("malicious3.pkl", pickle.dumps(Malicious3(), protocol=0), "malicious",
                    "calls httplib.HTTPSConnection", "file_path fixture", {}))
        out.append(("malicious4.pickle", pickle.dumps(Malicious4(), protocol=4), "malicious",
                    "calls requests.api.get", "file_path fixture", {}))
        out.append(("malicious5.pickle", pickle.dumps(Malicious5(), protocol=4), "malicious",
                    "calls aiohttp.client.ClientSession", "file_path fixture", {}))
        out.append(("malicious6.pkl", pickle.dumps(["a", "b", "c"]) + pickle.dumps(Malicious4()),
                    "malicious", "a benign pickle, then a second one calling requests.api.get",
                    "file_path fixture", {}))
    out.append(("malicious7.pkl", pickle.dumps(Malicious6(), protocol=4), "malicious",
                "calls socket.create_connection", "file_path fixture", {}))
    out.append(("malicious8.pkl", pickle.dumps(Malicious7(), protocol=4), "malicious",
                "calls subprocess.run", "file_path fixture", {}))
    out.append(("malicious9.pkl", pickle.dumps(Malicious8(), protocol=4), "malicious",
                "calls sys.exit", "file_path fixture", {}))
    out.append(("malicious15.pkl", pickle.dumps(Malicious15(), protocol=4), "malicious",
                "calls bdb.Bdb.run on Python source", "file_path fixture", {}))
    out.append(("malicious11.pkl", ctf_memo(b""), "malicious",
                "memo GETs feed STACK_GLOBAL os.system", "file_path fixture", {}))
    out.append(("malicious1.zip.data.pkl", pickle.dumps(Malicious1(), protocol=4), "malicious",
                "calls eval (zip member data.pkl)", "file_path / zip_file_path fixtures", {}))
    out.append(("malicious10.pkl", b"(S'print(\"Injection running\")'\ni__builtin__\nexec\n.",
                "malicious", "INST opcode calling __builtin__.exec", "file_path fixture", {}))
    out.append(("malicious12.pkl", malicious12_gen(), "malicious",
                "pickle.loads of a nested pickle calling os.system", "malicious12_gen", {}))
    out.append(("malicious13.pkl", malicious13_gen(), "malicious",
                "GLOBAL builtins 'eval.__call__' (dotted name)", "malicious13_gen", {}))
    out.append(("malicious14.pkl", ctf_memo(b"\n\n\t\t"), "malicious",
                "memo STACK_GLOBAL os.system, then junk after STOP", "malicious14_gen", {}))

    # dill: initialize_dill_file(path, obj, version) is dill.dump(obj, file, protocol=version).
    import dill
    for v in (0, 3, 4):
        out.append((f"benign0_v{v}.dill", dill.dumps(["a", "b", "c"], protocol=v), "benign",
                    f"dill: a list of three strings (protocol {v})", "file_path fixture", {}))
        out.append((f"malicious1_v{v}.dill", dill.dumps(Malicious1(), protocol=v), "malicious",
                    f"dill: calls eval (protocol {v})", "file_path fixture", {}))

    # pytorch_file_path: torch.save(nn.Module().state_dict()) in both formats.
    for zipped in (True, False):
        buf = io.BytesIO()
        torch.save(nn.Module().state_dict(), buf, _use_new_zipfile_serialization=zipped)
        data = buf.getvalue()
        if zipped:
            members = zip_members(data)
            body = [b for n, b in members if n.endswith("/data.pkl")][0]
            out.append(("safe_zip_pytorch.data.pkl", body, "benign",
                        "torch.save of an empty state dict (OrderedDict)", "pytorch_file_path fixture",
                        {"containers": ["zip"]}))
        else:
            pickles, _ = split_pickles(data, limit=5)
            out.append(("safe_old_format_pytorch.object.pkl", pickles[3], "benign",
                        "legacy torch.save of an empty state dict", "pytorch_file_path fixture",
                        {"containers": ["legacy"]}))

    # numpy_file_path: PickleInject's pickler (protocol 4, framed) saves an exec payload first,
    # then the array np.load returned.
    class Exec:
        def __init__(self, args):
            self.args = args

        def __reduce__(self):
            return exec, (self.args,)

    class InjectPickler(pickle._Pickler):
        def __init__(self, file, protocol, inj_objs):
            super().__init__(file, protocol)
            self.inj_objs = inj_objs

        def dump(self, obj):
            self.write(pickle.PROTO + struct.pack("<B", self.proto))
            self.framer.start_framing()
            for inj in self.inj_objs:
                self.save(inj)
            self.save(obj)
            self.write(pickle.STOP)
            self.framer.end_framing()

    tmp = tempfile.mkdtemp()
    try:
        np.save(os.path.join(tmp, "safe_numpy.npy"), [[1, 2, 3], [4, 5, 6]])
        safe = np.load(os.path.join(tmp, "safe_numpy.npy"), allow_pickle=True)
    finally:
        shutil.rmtree(tmp)
    buf = io.BytesIO()
    InjectPickler(buf, 4, [Exec('print("Malicious code!")')]).dump(safe)
    out.append(("unsafe_numpy.npy", buf.getvalue(), "malicious",
                "exec injected before a numpy array (PickleInject)", "numpy_file_path fixture", {}))
    return out


def collect_modelscan(c, git):
    for name, data, expect, why, test, kw in modelscan_payloads():
        c.add("modelscan", name, data, origin("modelscan", "tests/test_modelscan.py", f"{test}: {name}"),
              expect, why, extra={"_key": name}, **kw)
    path = "tests/data/unsafe_zip_pytorch.pt"
    members = zip_members(git.show(path))
    for name, body in members:
        if name.endswith("/data.pkl"):
            c.add("modelscan", "unsafe_zip_pytorch.data.pkl", body,
                  origin("modelscan", path) + f":{name}", "malicious",
                  "torch.save of a model with an injected posix.system call",
                  containers=["zip"], storages=storages_from_zip(members),
                  extra={"_key": "unsafe_zip_pytorch.pt"})


# ---------------------------------------------------------------------------------------------
# fickling: record what its tests judge.

FICKLING_TEST_MODULES = [
    "test.test_bypasses", "test.test_analysis", "test.test_crashes",
    "test.test_expansion_attack_analysis", "test.test_pickle", "test.test_scan_api",
    "test.test_scanner_deactivation_analysis",
]

RECORDER = r'''
import base64, contextlib, io, json, pickletools, sys, unittest
root, out_path, modules = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
sys.path.insert(0, root)
import fickling, fickling.analysis as A, fickling.fickle as F
assert fickling.__file__.startswith(root), fickling.__file__
records, state = [], {"test": None, "sub": None}
orig_check, orig_load = A.check_safety, F.Pickled.load

def load(pickled, *a, **k):
    if isinstance(pickled, (bytes, bytearray, memoryview)):
        p = orig_load(pickled, *a, **k)
        p._ckpt_raw = bytes(pickled)
        return p
    try:
        start = pickled.tell()
    except Exception:
        return orig_load(pickled, *a, **k)
    p = orig_load(pickled, *a, **k)
    end = pickled.tell()
    pickled.seek(start)
    p._ckpt_raw = pickled.read(end - start)
    pickled.seek(end)
    return p
F.Pickled.load = staticmethod(load)

def parses(b):
    try:
        for op, _a, _p in pickletools.genops(b):
            if op.name == "STOP":
                return True
    except Exception:
        return False
    return False

def encode(pickled):
    """The bytes of an opcode list, as fickling writes them when those parse; else with STRING
    and UNICODE written the way pickle writes them (at this commit fickling's STRING encoder
    leaves out the newline and its UNICODE encoder fails on a str)."""
    try:
        data = pickled.dumps()
        if parses(data):
            return data, "fickling"
    except Exception:
        pass
    out = b""
    for o in pickled:
        kind = type(o).__name__
        arg = o.arg.decode("latin1") if isinstance(getattr(o, "arg", None), bytes) else getattr(o, "arg", None)
        if kind == "Unicode":
            out += b"V" + arg.encode("raw_unicode_escape") + b"\n"
        elif kind == "String":
            out += b"S" + repr(arg).encode("ascii") + b"\n"
        else:
            out += o.data
    return out, "fixed"

def check(pickled, *a, **k):
    res = orig_check(pickled, *a, **k)
    raw = getattr(pickled, "_ckpt_raw", None)
    try:
        # an edited Pickled (test_duplicate_proto inserts opcodes) no longer has its input bytes
        if raw is not None and pickled.dumps(reframe=False) == raw:
            data, how = raw, "raw"
        else:
            data, how = encode(pickled)
    except Exception as e:
        data, how = None, None
    records.append({"test": state["test"], "sub": state["sub"],
                    "bytes": base64.b64encode(data).decode() if data is not None else None,
                    "severity": res.severity.name, "encoded": how, "custom_analyzer": bool(a or k.get("analyzer")),
                    "detail": {k2: str(v) for k2, v in res.detailed_results().get("AnalysisResult", {}).items()}})
    return res

orig_subtest = unittest.TestCase.subTest
@contextlib.contextmanager
def subtest(self, msg=None, **params):
    prev = state["sub"]
    state["sub"] = " ".join(([str(msg)] if msg is not None else []) + [f"{k}={v}" for k, v in params.items()])
    try:
        with orig_subtest(self, msg, **params):
            yield
    finally:
        state["sub"] = prev
unittest.TestCase.subTest = subtest

class Result(unittest.TextTestResult):
    def startTest(self, test):
        state["test"] = test.id(); state["sub"] = None
        super().startTest(test)

suite = unittest.defaultTestLoader.loadTestsFromNames(modules)
for mod in list(sys.modules.values()):
    if getattr(mod, "check_safety", None) is orig_check:
        mod.check_safety = check
A.check_safety = check
stream = io.StringIO()
result = unittest.TextTestRunner(stream=stream, resultclass=Result, verbosity=2).run(suite)
failed = [t.id() for t, _ in result.failures + result.errors]
json.dump({"records": records, "failed": failed, "ran": result.testsRun, "log": stream.getvalue()[-4000:]},
          open(out_path, "w"))
'''

FICKLING_WHY = {
    "test_missing_pty_unsafe_imports_ghsa": "pty.spawn('id') then BUILD",
    "test_missing_pty_unsafe_imports_pr": "OBJ opcode calling pty.spawn('id')",
    "test_missing_marshal_and_types": "marshal.loads of code + types.FunctionType: arbitrary bytecode",
    "test_missing_runpy": "runpy.run_path",
    "test_missing_cprofile": "cProfile.run of Python source",
    "test_missing_ctypes": "getattr(ctypes.CDLL('libc.dylib'), 'system')(b'id')",
    "test_missing_pydoc": "pydoc.locate('os.system')('id'): a computed callable",
    "test_missing_importlib": "getattr(importlib.import_module('os'), 'system')('id')",
    "test_missing_code": "getattr(code.InteractiveInterpreter(), 'runsource')(...)",
    "test_missing_multiprocessing": "multiprocessing gadget",
    "test_builtins_import_bypass": "builtins.__import__ / getattr gadget",
    "test_safe_builtins_not_flagged": "builtins.len([]): a safe builtin call",
    "test_safe_builtin_dict_not_flagged": "builtins.dict(): a safe builtin call",
    "test_unsafe_builtins_still_flagged": "builtins.getattr('os', 'system')",
    "test_unsafe_builtin_eval_still_flagged": "builtins.eval(\"print('hello')\")",
    "test_operator_methodcaller": "_operator.methodcaller('system', ...)(__import__('os'))",
    "test_distutils_write_file": "distutils.file_util.write_file",
    "test_io_fileio": "_io.FileIO opens a file",
    "test_numpy_f2py_getlincoef": "numpy.f2py.crackfortran.getlincoef evaluates its argument",
    "test_network_protocol_ssrf": "network client class called with a host and port (SSRF)",
    "test_asyncio_subprocess": "asyncio.unix_events._UnixSubprocessTransport._start('whoami')",
    "test_obj_pop_call_invisibility": "OBJ calls smtplib.SMTP, result POPped",
    "test_missing_uuid": "uuid._get_command_stdout runs a command",
    "test_missing_aix_support": "_aix_support._read_cmd_output runs a command",
    "test_missing_osx_support": "_osx_support._find_build_tool: command injection",
    "test_dotted_attr_via_stdlib_module": "STACK_GLOBAL pathlib 'os.system' (dotted path)",
    "test_ml_allowlist_not_shadowed_by_unsafe_imports_ml": "imports ast.parse (off the ML allowlist; no call)",
    "test_private_stdlib_interpreters_blocklisted": "calls the private subinterpreter module's create()",
    "test_private_stdlib_allowlist": "import only: an allowlisted private stdlib name, or a dotted name under one",
    "test_frame_boundary_divergence": "FRAME trick: BINBYTES straddles a 2-byte frame; the C unpickler runs a hidden os.system",
    "test_frame_boundary_straddle_variants": "FRAME whose declared length ends inside an opcode",
    "test_well_formed_frames_are_not_flagged": "well-formed (un)framed data",
    "test_all_unsafe_modules_detected": "calls a function of a module on fickling's unsafe list",
    "test_all_unsafe_imports_detected": "calls a function on fickling's unsafe import list",
    "test_benign_pickle": "imports a harmless collections class",
    "test_missing_mark_before_tuple": "TUPLE with no MARK: malformed",
    "test_cyclic_pickle": "a list containing itself",
    "test_impossible_cyclic_pickle": "dict keyed by itself / set containing itself: cannot unpickle",
    "test_unused_variables": "an eval whose result is never used",
    "test_duplicate_proto": "PROTO opcodes repeated inside the pickle",
    "test_memo_expansion_detection": "memo GET expansion (billion laughs)",
    "test_dup_expansion_detection": "DUP expansion (billion laughs)",
    "test_legitimate_data_not_flagged": "ordinary data",
    "test_check_safety_catches_resource_exhaustion": "exhausts the analyser's resource limits",
    "test_fickling_remove_hook": "calls fickling.hook.remove_hook (scanner deactivation)",
    "test_fickling_deactivate_safe_ml": "calls fickling.hook.deactivate_safe_ml_environment",
    "test_fickling_remove_hook_via_global_opcode": "calls fickling.hook.remove_hook via GLOBAL",
    "test_benign_import_not_flagged": "collections.OrderedDict()",
    "test_all_scanner_modules_covered": "calls into a scanner module (deactivation)",
    "test_detects_malicious_payload": "calls os.system",
    "test_safe_data": "ordinary data",
}


# Benign by the suite's verdict, but CPython's unpickler refuses them (torch.load fails too):
# verify may pass them or refuse them as broken.
UNLOADABLE = {
    "test_variable_used_only_inside_a_tuple":
        "BUILD with a 1-tuple state on a list: CPython raises 'state is not a dictionary'",
}


def collect_fickling(c, git, tmp):
    work = os.path.join(tmp, "fickling")
    os.makedirs(work)
    git.export(work, "fickling", "test/__init__.py",
               *[f"test/{m.split('.')[1]}.py" for m in FICKLING_TEST_MODULES])
    out = os.path.join(tmp, "fickling-records.json")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    subprocess.run([sys.executable, "-c", RECORDER, work, out, ",".join(FICKLING_TEST_MODULES)],
                   cwd=work, check=True, env=env, stdout=subprocess.DEVNULL)
    rec = json.load(open(out))
    if rec["failed"]:
        raise SystemExit(f"fickling tests fail at the pinned commit: {rec['failed']}\n{rec['log']}")
    print(f"fickling: {rec['ran']} tests ran at the pinned commit, all passed; "
          f"{len(rec['records'])} check_safety calls recorded")
    for r in rec["records"]:
        if r["bytes"] is None:
            c.skipped.append(f"fickling {r['test']}: pickle could not be serialised")
            continue
        data = base64.b64decode(r["bytes"])
        mod, cls, test = r["test"].split(".")[-3:]
        name = test[5:] if test.startswith("test_") else test
        if r["sub"]:
            name += "-" + r["sub"]
        expect = "benign" if r["severity"] == "LIKELY_SAFE" else "malicious"
        why = FICKLING_WHY.get(test, test.replace("_", " "))
        if r["sub"]:
            why += f" ({r['sub']})"
        if r["custom_analyzer"]:
            why += "; flagged only by the test's own analyzer (UnsafeImportsML + MLAllowlist)"
        extra = {"_key": test, "fickling_head_severity": r["severity"], "_fickling_detail": r["detail"]}
        if r["encoded"] == "fixed":
            extra["note"] = ("fickling's opcode API writes STRING without its newline (or cannot "
                             "write UNICODE) at this commit: written here the way pickle writes them")
        if test in UNLOADABLE:
            extra["unloadable"] = UNLOADABLE[test]
        c.add("fickling", name, data,
              origin("fickling", f"test/{mod}.py", f"{cls}.{test}" + (f" [{r['sub']}]" if r["sub"] else "")),
              expect, why, extra=extra)

    # Inputs of tests that assert no verdict but are plainly code-running payloads.
    crashes = git.show("test/test_crashes.py").decode()
    m = re.search(r'io\.BytesIO\(\s*b"(\\x80\\x04\\x95\\x82.*?)"\s*\)', crashes, re.S)
    pop_mark = ast.literal_eval('b"' + m.group(1) + '"')
    c.add("fickling", "crashes-pop_mark", pop_mark,
          origin("fickling", "test/test_crashes.py", "TestCrashes.test_pop_mark"), "malicious",
          "numpy.__builtins__ eval of __import__('os').system('id') via POP_MARK (mindspore #183)",
          extra={"_key": "test_pop_mark"})
    c.add("fickling", "crashes-obj", b'(cos\nsystem\nS"whoami"\no.',
          origin("fickling", "test/test_crashes.py", "TestCrashes.test_obj"), "malicious",
          "OBJ opcode calling os.system('whoami')", extra={"_key": "test_obj"})

    # test_unpickler.py: nested payload, pickle.loads -> torch.storage._load_from_bytes -> os.system.
    import torch

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo 'I should have been stopped by the hook'",))

    class OuterPayload:
        def __init__(self, data):
            self.data = data

        def __reduce__(self):
            return (pickle.loads, (self.data,))

    class Bypass:
        def __init__(self, data):
            self.data = data

        def __reduce__(self):
            return (torch.storage._load_from_bytes, (self.data,))

    inner = pickle.dumps(Payload())
    c.add("fickling", "unpickler-nested_unsafe", pickle.dumps(OuterPayload(pickle.dumps(Bypass(inner)))),
          origin("fickling", "test/test_unpickler.py", "TestUnpickler.setUp nested_unsafe_bytes"),
          "malicious", "pickle.loads -> torch.storage._load_from_bytes (torch.load) -> os.system",
          extra={"_key": "test_unpickler_nested"})


# ---------------------------------------------------------------------------------------------
# FRAME-straddling cases (ours).

MARKER = "ckptool-frame-marker"


def _frame(n):
    return b"\x95" + struct.pack("<Q", n)


def _X(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


HIDDEN_BIN = b"cbuiltins\nprint\n" + _X(MARKER) + b"\x85R"          # GLOBAL, BINUNICODE, TUPLE1, REDUCE
HIDDEN_TEXT = b"cbuiltins\nprint\n(V" + MARKER.encode() + b"\ntR"    # ASCII only: valid UTF-8


def straddled_length(opcode, width, hidden):
    """PROTO 4, MARK, FRAME 2 holding `opcode` and the first byte of its `width`-byte length.
    A straight-through reader takes the length L = 0x100 + low as written; CPython's C unpickler
    reading a file object drops the unread length byte left in the frame and reads the whole
    length again from the bytes after the frame: 1. It then runs `hidden`, which the
    straight-through reader sees inside the data of length L. Both end at POP_MARK, None, STOP."""
    c_len = (1).to_bytes(width, "little")           # what the C unpickler reads after the frame
    tail = c_len[width - 1:] + b"\x00" + hidden       # data as the straight-through reader sees it
    L = (len(tail) + 16) & 0xFF | 1 << 8               # byte 1 of L is 1, the rest 0 (= c_len[:-1])
    Lb = L.to_bytes(width, "little")
    assert Lb[1:] == c_len[:width - 1] and L >= len(tail)
    data = tail + b"N" * (L - len(tail))
    framed = opcode + Lb[:1]
    return b"\x80\x04(" + _frame(len(framed)) + framed + Lb[1:] + data + b"1N."


FRAME_CASES = {
    "frame_binbytes_hidden_print": (
        straddled_length(b"B", 4, HIDDEN_BIN),
        "FRAME 2 ends inside BINBYTES' 4-byte length: the C unpickler re-reads the length after "
        "the frame and runs builtins.print hidden in what a straight reader sees as bytes"),
    "frame_binunicode_hidden_print": (
        straddled_length(b"X", 4, HIDDEN_TEXT),
        "FRAME 2 ends inside BINUNICODE's length: builtins.print hidden in a straight reader's str"),
    "frame_binbytes8_hidden_print": (
        straddled_length(b"\x8e", 8, HIDDEN_BIN),
        "FRAME 2 ends inside BINBYTES8's 8-byte length: builtins.print hidden in its bytes"),
    "frame_global_module_straddle": (
        b"\x80\x04" + _frame(4) + b"cmac" + b"builtins\nprint\n" + _X(MARKER) + b"\x85R.",
        "FRAME 4 = 'cmac': a straight reader sees GLOBAL macbuiltins.print, the C unpickler "
        "drops 'mac' and imports builtins.print"),
    "frame_global_name_straddle": (
        b"\x80\x04" + _frame(11) + b"cbuiltins\nx" + b"print\n" + _X(MARKER) + b"\x85R.",
        "FRAME ends inside GLOBAL's name line: a straight reader sees builtins.xprint, the C "
        "unpickler drops 'x' and calls builtins.print"),
}


def check_frame_case(name, data):
    """The C unpickler reading io.BytesIO calls print(MARKER); a straight-through opcode walk
    (pickletools) never sees GLOBAL 'builtins print'."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        pickle.Unpickler(io.BytesIO(data)).load()
    assert out.getvalue() == MARKER + "\n", (name, out.getvalue())
    try:
        straight = [(op.name, arg) for op, arg, _ in pickletools.genops(data)]
    except Exception:
        straight = []
    assert ("GLOBAL", "builtins print") not in straight, name


def collect_frames(c):
    for name, (data, why) in FRAME_CASES.items():
        check_frame_case(name, data)
        c.add("ckptool", name, data, "tests/hostile/make_scanner_corpus.py FRAME_CASES", "malicious",
              why, names=[["builtins", "print"]], folder="frames",
              extra={"torch_load_runs": MARKER, "_key": name})


# ---------------------------------------------------------------------------------------------
# What each payload would run: the dangerous globals the suites' own tools name in it.

def picklescan_dangerous(data):
    from picklescan.scanner import SafetyLevel, scan_pickle_bytes
    try:
        r = scan_pickle_bytes(io.BytesIO(data), "payload.pkl")
    except Exception:
        return []
    return [[g.module, g.name] for g in r.globals if g.safety == SafetyLevel.Dangerous]


def modelscan_dangerous(data):
    import modelscan.modelscan  # noqa: F401 (imports the package in the order its tests do)
    from modelscan.model import Model
    from modelscan.settings import DEFAULT_SETTINGS
    from modelscan.tools.picklescanner import scan_pickle_bytes
    try:
        r = scan_pickle_bytes(Model("payload.pkl", io.BytesIO(data)), DEFAULT_SETTINGS)
    except Exception:
        return []
    return [[i.details.module, i.details.operator] for i in r.issues]


def fickling_dangerous(detail):
    out = []
    for key, text in (detail or {}).items():
        if key in ("UnsafeImports", "UnsafeImportsML", "ScannerDeactivation", "BadCalls"):
            for mod, names in re.findall(r"from (\S+) import ([^\n;]+)", text):
                for n in names.split(","):
                    out.append([mod, n.strip().split(" ")[0]])
    return out


NAME_OVERRIDES = {
    # Dangerous per picklescan only as placeholders ('unknown', an int): name what runs.
    "keyerror-exploit.pkl": [["os", "system"]],
    "type-confusion-exploit.pkl": [["os", "system"]],
    "sys_module_override_sploit.pkl": [["builtins", "eval"], ["builtins", "exec"]],
    "test_frame_boundary_divergence": [["os", "system"]],
    # The C unpickler imports something else than a straight reader sees (os.tem, or nothing
    # called): the refusal is all there is to check.
    "test_frame_boundary_straddle_variants": [],
    "test_pop_mark": [["numpy", "__builtins__"], ["builtins", "eval"]],
    "test_unpickler_nested": [["pickle", "loads"]],
    "malicious13.pkl": [["builtins", "eval.__call__"], ["builtins", "eval"]],
}


def finish_names(c):
    for e in c.entries:
        if "names" in e:
            continue
        key = e.get("_key")
        if key in NAME_OVERRIDES:
            e["names"] = NAME_OVERRIDES[key]
            continue
        if e["expect"] == "benign":
            continue
        data = e["_bytes"]
        names = []
        own = {"picklescan": picklescan_dangerous(data), "modelscan": modelscan_dangerous(data),
               "fickling": fickling_dangerous(e.get("_fickling_detail"))}
        names = own.get(e["scanner"]) or []
        if not names:
            names = own["picklescan"] + own["modelscan"] + own["fickling"]
        names = [n for n in names if n[0] not in ("unknown",) and not n[0].isdigit()]
        uniq = []
        for n in names:
            if n not in uniq:
                uniq.append(n)
        e["names"] = uniq
        if e["scanner"] == "picklescan" and e["why"].startswith(("calls a gadget", "advisory")):
            e["why"] = picklescan_why(key, uniq)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--picklescan", required=True, help="git dir of mmaitre314/picklescan")
    ap.add_argument("--modelscan", required=True, help="git dir of protectai/modelscan")
    ap.add_argument("--fickling", required=True, help="git dir of trailofbits/fickling")
    args = ap.parse_args()

    gits = {k: Git(getattr(args, k), PINS[k][1]) for k in PINS}
    c = Corpus()
    tmp = tempfile.mkdtemp(prefix="scanner-corpus-")
    try:
        collect_picklescan(c, gits["picklescan"])
        collect_modelscan(c, gits["modelscan"])
        collect_fickling(c, gits["fickling"], tmp)
        collect_frames(c)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish_names(c)

    for d in (CORPUS, FRAMES):
        shutil.rmtree(d, ignore_errors=True)
    manifest = []
    for e in c.entries:
        path = os.path.join(HERE, e["file"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(e["_bytes"])
        manifest.append({k: v for k, v in e.items() if not k.startswith("_")})
    with open(os.path.join(CORPUS, "manifest.json"), "w") as f:
        text = json.dumps(manifest, indent=1)
        # one line per [module, name] pair
        text = re.sub(r'\[\s*("(?:[^"\\]|\\.)*"),\s*("(?:[^"\\]|\\.)*")\s*\]', r"[\1, \2]", text)
        f.write(text + "\n")
    counts = {}
    for e in manifest:
        counts.setdefault(e["scanner"], {"malicious": 0, "benign": 0})[e["expect"]] += 1
    print(json.dumps(counts))
    for s in c.skipped:
        print("left out:", s)


if __name__ == "__main__":
    main()
