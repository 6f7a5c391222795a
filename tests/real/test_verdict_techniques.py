"""The verdict against whole techniques of hiding a call in a checkpoint, not single payloads.

Each case below is a hostile pickle written opcode by opcode (protocol 2, some protocol 4), put
into a real torch zip (a torch 2.13 save whose data.pkl is replaced) and, where that makes
sense, into a legacy torch file. Every hidden call is harmless: it prints a token, prints
Python's credits or copyright, or creates a marker file or folder in the test's temporary
folder. For every file:

  (i)   torch.load(path, weights_only=False) in a child process really makes the hidden call
        (parity: if our view of torch drifts, this fails first);
  (ii)  `ckptool verify FILE` (with --trust PKG too for the trust cases) exits 1 and names what
        would run; `ckptool inspect FILE` does not crash;
  (iii) ckptool.load(FILE) (with trust=[PKG] for the trust cases) in a child process under a
        sys.addaudithook recorder runs nothing: no process, exec, compile, write-open, file
        system change or nested unpickling event, no marker, no printed token; and (a test of
        its own) it either refuses the file with a ckptool error or returns an object (inert
        ckptool.Pickled records for what it did not run), never another exception; for the
        container cases whose tensor bytes differ, it does not return other values than torch.

Techniques (one TestCase each; add a Case row to its table (PLANTED, CALLABLES, ATTRIBUTES,
REBUILT, TRUST, DIVERGENCE) to add a case):
  1 PlantedMethods       BUILD/APPEND(S)/ADDITEMS and dict()/UUID()/ChainMap calling methods
                         that a dict state planted as instance attributes
  2 CallablesAsData      allowlisted functions that call an argument, the callable laundered
                         through max/min/sum/reversed/deque
  3 AttributePaths       modules reached as attributes of allowlisted modules (pathlib.os,
                         uuid.os, argparse._os), getattr reads, dotted STACK_GLOBAL names
  4 RebuiltClasses       classes made without a call whose __setstate__ unpickles or opens
  5 TrustLeaks           os/subprocess/shutil functions reached through a trusted package
  6 ContainerDivergence  zips and legacy files that torch reads differently from a careful
                         reader: case-insensitive duplicate names, two end records, a legacy
                         file that is also an old (V7) tar archive
and BenignFiles, which verify must pass.

All files are built once per module run and every child process and ckptool run happens in
parallel (setUpModule); the test methods only read the results."""
import concurrent.futures
import dataclasses
import io
import json
import os
import pickletools
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import unittest
import zipfile
import zlib
from typing import Callable, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from stacklib import CKPTOOL, PACKAGE  # noqa: E402
from test_scanner_suites import Wrapper  # noqa: E402

import torch  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Pickle opcodes


def X(text):
    """BINUNICODE"""
    b = text.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def U(text):
    """SHORT_BINUNICODE (protocol 4)"""
    b = text.encode()
    return b"\x8c" + bytes([len(b)]) + b


def G(module, name):
    """GLOBAL"""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def SG(module, name):
    """STACK_GLOBAL (protocol 4): a dotted name is walked attribute by attribute."""
    return U(module) + U(name) + b"\x93"


def BYTES(data):
    """BINBYTES (protocol 3; unpicklers accept it whatever PROTO says)"""
    return b"B" + struct.pack("<I", len(data)) + data


def LATIN1(data):
    """bytes the protocol 2 way: _codecs.encode(str, 'latin1')"""
    return CALL(G("_codecs", "encode"), X(data.decode("latin1")), X("latin1"))


def INT(n):
    return b"J" + struct.pack("<i", n)


NONE, TRUE, FALSE, EMPTY_TUPLE = b"N", b"\x88", b"\x89", b")"


def T(*items):
    return b"(" + b"".join(items) + b"t"


def L(*items):
    return b"]" + (b"(" + b"".join(items) + b"e" if items else b"")


def D(*pairs):
    return b"}" + (b"(" + b"".join(k + v for k, v in pairs) + b"u" if pairs else b"")


def CALL(f, *args):
    """REDUCE f(*args); no arguments: EMPTY_TUPLE."""
    return f + (T(*args) if args else EMPTY_TUPLE) + b"R"


def BUILD(obj, *states):
    """obj, then one BUILD per state (BUILD leaves the object on the stack)."""
    return obj + b"".join(s + b"b" for s in states)


def NEWOBJ(cls):
    return cls + EMPTY_TUPLE + b"\x81"


def NEWOBJ_EX(cls):
    return cls + EMPTY_TUPLE + b"}" + b"\x92"


def PLANT(obj, **methods):
    """obj with instance attributes planted by a BUILD with a dict state."""
    return BUILD(obj, D(*[(X(k), v) for k, v in methods.items()]))


def GETATTR(target, attr):
    return CALL(G("builtins", "getattr"), target, X(attr))


def MAX1(callable_):
    """builtins.max([callable_]): the callable, laundered through an allowlisted call."""
    return CALL(G("builtins", "max"), L(callable_))


def PICKLE(value, protocol=2):
    """A whole pickle whose result is {'a': 1, 'x': value}."""
    return b"\x80" + bytes([protocol]) + D((X("a"), b"K\x01"), (X("x"), value)) + b"."


def PATH(p):
    return CALL(G("pathlib", "Path"), X(p))


TORCH_TENSOR = G("torch", "Tensor")


def REBUILD_FROM_TYPE(func, *args):
    """torch._tensor._rebuild_from_type_v2(func, torch.Tensor, args, {}): calls func(*args)."""
    return CALL(G("torch._tensor", "_rebuild_from_type_v2"), func, TORCH_TENSOR, T(*args), D())


def LIST_MAP(func, *iterables):
    """builtins.list(builtins.map(func, *iterables)): list() iterates, map() calls."""
    return CALL(G("builtins", "list"), CALL(G("builtins", "map"), func, *iterables))


# ---------------------------------------------------------------------------------------------
# Cases


@dataclasses.dataclass
class Ctx:
    marker: str  # a file or folder the hidden call creates
    token: str   # a string the hidden call prints
    src: str     # an existing file (for copies)

    def touch(self):
        return X(f"touch {self.marker}")


@dataclasses.dataclass
class Case:
    name: str
    pickle: Optional[Callable[[Ctx], bytes]] = None  # the whole data.pkl
    evidence: str = "token"  # "token", "file" (ctx.marker), or "stdout:TEXT" / "value:TEXT"
    containers: Tuple[str, ...] = ("zip", "legacy")
    names: Tuple[str, ...] = ()  # what verify may name (any of these, or a generic word)
    trust: Tuple[str, ...] = ()
    file: Optional[Callable[[Ctx, str], None]] = None  # writes the whole file (container cases)
    note: str = ""


def _p(value, protocol=2):
    return lambda ctx: PICKLE(value(ctx), protocol)


PLANTED = [
    Case("OrderedDict() with __setstate__=print planted, then BUILD(token)",
         _p(lambda c: BUILD(PLANT(CALL(G("collections", "OrderedDict")),
                                  __setstate__=G("builtins", "print")), X(c.token))),
         names=("builtins.print",)),
    Case("argparse.Namespace() with __setstate__=print planted, then BUILD(token)",
         _p(lambda c: BUILD(PLANT(CALL(G("argparse", "Namespace")),
                                  __setstate__=G("builtins", "print")), X(c.token))),
         names=("builtins.print",)),
    Case("SimpleNamespace() with __setstate__=typing.get_type_hints planted: eval of an annotation",
         _p(lambda c: BUILD(
             PLANT(CALL(G("types", "SimpleNamespace")), __setstate__=G("typing", "get_type_hints")),
             PLANT(CALL(G("argparse", "Namespace")), __annotations__=D((X("x"), X(
                 f"[__import__('pathlib').Path({c.marker!r}).write_text('x'), int][1]")))))),
         evidence="file", names=("typing.get_type_hints",)),
    Case("OrderedDict() with __setstate__=getattr(pathlib.Path, 'touch') planted, BUILD(Path(M))",
         _p(lambda c: BUILD(PLANT(CALL(G("collections", "OrderedDict")),
                                  __setstate__=GETATTR(G("pathlib", "Path"), "touch")), PATH(c.marker))),
         evidence="file", names=("touch", "getattr")),
    Case("APPEND Path(M) onto a Namespace whose planted append is getattr(pathlib.Path, 'mkdir')",
         _p(lambda c: PLANT(CALL(G("argparse", "Namespace")), append=GETATTR(G("pathlib", "Path"), "mkdir"))
            + PATH(c.marker) + b"a"),
         evidence="file", names=("mkdir", "getattr")),
    Case("APPENDS onto a Namespace whose planted extend is print",
         _p(lambda c: PLANT(CALL(G("argparse", "Namespace")), extend=G("builtins", "print"))
            + b"(" + X(c.token) + b"e"),
         names=("builtins.print",)),
    Case("APPEND onto an OrderedDict whose planted append is print",
         _p(lambda c: PLANT(CALL(G("collections", "OrderedDict")), append=G("builtins", "print"))
            + X(c.token) + b"a"),
         names=("builtins.print",)),
    Case("ADDITEMS (protocol 4) onto a SimpleNamespace whose planted add is print",
         _p(lambda c: PLANT(CALL(G("types", "SimpleNamespace")), add=G("builtins", "print"))
            + b"(" + X(c.token) + b"\x90", protocol=4),
         names=("builtins.print",)),
    Case("builtins.dict(x), x with a planted keys=builtins.credits",
         _p(lambda c: CALL(G("builtins", "dict"),
                           PLANT(CALL(G("argparse", "Namespace")), keys=G("builtins", "credits")))),
         evidence="stdout:Thanks to CWI", names=("builtins.credits",)),
    Case("uuid.UUID(x), x with a planted replace=print",
         _p(lambda c: CALL(G("uuid", "UUID"),
                           PLANT(CALL(G("types", "SimpleNamespace")), replace=G("builtins", "print")))),
         evidence="stdout:urn:", names=("builtins.print",)),
    Case("dict(ChainMap(defaultdict(builtins.copyright), {...})): __missing__ calls the factory",
         _p(lambda c: CALL(G("builtins", "dict"), CALL(
             G("collections", "ChainMap"),
             CALL(G("collections", "defaultdict"), G("builtins", "copyright")),
             D((X("k"), b"K\x01"))))),
         evidence="stdout:Copyright (c)", names=("builtins.copyright",)),
]

CALLABLES = [
    Case("_rebuild_from_type_v2(max([print]), torch.Tensor, (token,), {})",
         _p(lambda c: REBUILD_FROM_TYPE(MAX1(G("builtins", "print")), X(c.token))),
         names=("builtins.print",)),
    Case("_rebuild_from_type_v2(max(deque([print])), ...)",
         _p(lambda c: REBUILD_FROM_TYPE(
             CALL(G("builtins", "max"), CALL(G("collections", "deque"), L(G("builtins", "print")))),
             X(c.token))),
         names=("builtins.print",)),
    Case("list(map(max([print]), [token]))",
         _p(lambda c: LIST_MAP(MAX1(G("builtins", "print")), L(X(c.token)))),
         names=("builtins.print",)),
    Case("list(filter(min([print]), [token]))",
         _p(lambda c: CALL(G("builtins", "list"), CALL(
             G("builtins", "filter"), CALL(G("builtins", "min"), L(G("builtins", "print"))),
             L(X(c.token))))),
         names=("builtins.print",)),
    Case("any(map(max(reversed([print])), [token])) (protocol 4)",
         _p(lambda c: CALL(G("builtins", "any"), CALL(
             G("builtins", "map"),
             CALL(G("builtins", "max"), CALL(G("builtins", "reversed"), L(G("builtins", "print")))),
             L(X(c.token)))), protocol=4),
         names=("builtins.print",)),
    Case("sorted(map(sum([], print), [token]))",
         _p(lambda c: CALL(G("builtins", "sorted"), CALL(
             G("builtins", "map"), CALL(G("builtins", "sum"), L(), G("builtins", "print")),
             L(X(c.token))))),
         names=("builtins.print",)),
    Case("numpy.random._pickle.__randomstate_ctor(token, max([print]))",
         _p(lambda c: CALL(G("numpy.random._pickle", "__randomstate_ctor"), X(c.token),
                           MAX1(G("builtins", "print")))),
         names=("builtins.print",),
         note="numpy calls bit_generator_ctor(name); print returns None, RandomState(None) works"),
    Case("numpy.random._pickle.__generator_ctor(token, sum([], print))",
         _p(lambda c: CALL(G("numpy.random._pickle", "__generator_ctor"), X(c.token),
                           CALL(G("builtins", "sum"), L(), G("builtins", "print")))),
         names=("builtins.print",)),
]

ATTRIBUTES = [
    Case("list(map(getattr(GLOBAL pathlib.os, 'system'), ['touch M']))",
         _p(lambda c: LIST_MAP(GETATTR(G("pathlib", "os"), "system"), L(c.touch()))),
         evidence="file", names=("os.system", "pathlib.os", "getattr")),
    Case("list(map(getattr(pathlib.Path, 'write_text'), [Path(M)], ['x']))",
         _p(lambda c: LIST_MAP(GETATTR(G("pathlib", "Path"), "write_text"), L(PATH(c.marker)),
                               L(X("x")))),
         evidence="file", names=("write_text", "getattr")),
    Case("list(map(getattr(pathlib.Path, 'mkdir'), [Path(M)]))",
         _p(lambda c: LIST_MAP(GETATTR(G("pathlib", "Path"), "mkdir"), L(PATH(c.marker)))),
         evidence="file", names=("mkdir", "getattr")),
    Case("_rebuild_from_type_v2(getattr(uuid.os, 'system'), torch.Tensor, ('touch M',), {})",
         _p(lambda c: REBUILD_FROM_TYPE(GETATTR(G("uuid", "os"), "system"), c.touch())),
         evidence="file", names=("os.system", "uuid.os", "getattr")),
    Case("__randomstate_ctor('touch M', getattr(argparse._os, 'system'))",
         _p(lambda c: CALL(G("numpy.random._pickle", "__randomstate_ctor"), c.touch(),
                           GETATTR(G("argparse", "_os"), "system"))),
         evidence="file", names=("os.system", "argparse._os", "getattr")),
    Case("STACK_GLOBAL 'pathlib' 'os.system' (protocol 4), called",
         _p(lambda c: CALL(SG("pathlib", "os.system"), c.touch()), protocol=4),
         evidence="file", names=("os.system",)),
    Case("list(map(STACK_GLOBAL 'argparse' '_os.system', ['touch M'])) (protocol 4)",
         _p(lambda c: LIST_MAP(SG("argparse", "_os.system"), L(c.touch())), protocol=4),
         evidence="file", names=("os.system",)),
]

DATAPIPE = "torch.utils.data.datapipes.datapipe"


def _inner_print(c):
    return b"\x80\x02" + CALL(G("builtins", "print"), X(c.token)) + b"."


def _inner_touch(c):
    return b"\x80\x02" + CALL(G("posix", "system"), c.touch()) + b"."


def _mmap_state(c):
    return D((X("size"), INT(16)), (X("location"), X(c.marker)), (X("blocksize"), INT(8)))


REBUILT = [
    Case("NEWOBJ _DataPipeSerializationWrapper, BUILD (nested pickle, False): pickle.loads",
         _p(lambda c: BUILD(NEWOBJ(G(DATAPIPE, "_DataPipeSerializationWrapper")),
                            T(LATIN1(_inner_print(c)), FALSE))),
         names=("_DataPipeSerializationWrapper",)),
    Case("copyreg._reconstructor(_IterDataPipeSerializationWrapper, object, None) + BUILD",
         _p(lambda c: BUILD(CALL(G("copyreg", "_reconstructor"),
                                 G(DATAPIPE, "_IterDataPipeSerializationWrapper"),
                                 G("builtins", "object"), NONE),
                            T(BYTES(_inner_touch(c)), FALSE)), protocol=4),
         evidence="file", names=("_IterDataPipeSerializationWrapper",)),
    Case("copyreg.__newobj__(_MapDataPipeSerializationWrapper) + BUILD",
         _p(lambda c: BUILD(CALL(G("copyreg", "__newobj__"),
                                 G(DATAPIPE, "_MapDataPipeSerializationWrapper")),
                            T(LATIN1(_inner_print(c)), FALSE))),
         names=("_MapDataPipeSerializationWrapper",)),
    Case("NEWOBJ fsspec.caching.MMapCache, BUILD {size, location}: opens location for writing",
         _p(lambda c: BUILD(NEWOBJ(G("fsspec.caching", "MMapCache")), _mmap_state(c))),
         evidence="file", names=("MMapCache",)),
    Case("copyreg._reconstructor(fsspec.caching.MMapCache, object, None) + BUILD",
         _p(lambda c: BUILD(CALL(G("copyreg", "_reconstructor"), G("fsspec.caching", "MMapCache"),
                                 G("builtins", "object"), NONE), _mmap_state(c))),
         evidence="file", names=("MMapCache",)),
    Case("NEWOBJ_EX (protocol 4) fsspec.caching.MMapCache + BUILD",
         _p(lambda c: BUILD(NEWOBJ_EX(SG("fsspec.caching", "MMapCache")), _mmap_state(c)),
            protocol=4),
         evidence="file", names=("MMapCache",)),
]

SIGNAL_CONNECTOR = "lightning.pytorch.trainer.connectors.signal_connector"  # from subprocess import call
UPGRADE_CHECKPOINT = "lightning.pytorch.utilities.upgrade_checkpoint"  # from shutil import copyfile

TRUST = [
    Case("--trust tqdm: list(map(getattr(tqdm.utils.os, 'mkdir'), [M]))",
         _p(lambda c: LIST_MAP(GETATTR(G("tqdm.utils", "os"), "mkdir"), L(X(c.marker)))),
         evidence="file", trust=("tqdm",), names=("os.mkdir", "tqdm.utils.os", "mkdir")),
    Case("--trust tqdm: STACK_GLOBAL 'tqdm.utils' 'os.mkdir' (protocol 4), called",
         _p(lambda c: CALL(SG("tqdm.utils", "os.mkdir"), X(c.marker)), protocol=4),
         evidence="file", trust=("tqdm",), names=("os.mkdir", "mkdir")),
    Case("--trust safetensors: _rebuild_from_type_v2(getattr(safetensors.torch.os, 'system'), ...)",
         _p(lambda c: REBUILD_FROM_TYPE(GETATTR(G("safetensors.torch", "os"), "system"), c.touch())),
         evidence="file", trust=("safetensors",), names=("os.system", "safetensors.torch.os")),
    Case(f"--trust lightning: {SIGNAL_CONNECTOR}.call(['touch', M]) is subprocess.call",
         _p(lambda c: CALL(G(SIGNAL_CONNECTOR, "call"), L(X("touch"), X(c.marker)))),
         evidence="file", trust=("lightning",), names=("subprocess.call", f"{SIGNAL_CONNECTOR}.call")),
    Case(f"--trust lightning: {UPGRADE_CHECKPOINT}.copyfile(src, M) is shutil.copyfile",
         _p(lambda c: CALL(G(UPGRADE_CHECKPOINT, "copyfile"), X(c.src), X(c.marker))),
         evidence="file", trust=("lightning",), names=("shutil.copyfile", f"{UPGRADE_CHECKPOINT}.copyfile")),
]


# --- container divergence ---------------------------------------------------------------------

def _float_records():
    """The records of a torch 2.13 save of {'w': [0., 1., 2., 3.]} (7 records)."""
    buf = io.BytesIO()
    torch.save({"w": torch.arange(4, dtype=torch.float32)}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def _write_zip(path, records):
    """records in this order, stored, data 64-byte aligned as torch writes them."""
    with open(path, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
        for name, data in records:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            pad = -(f.tell() + 30 + len(name.encode()) + 4) % 64
            info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
            z.writestr(info, data)


def case_twin(name, position, payload):
    """torch's records, plus `name` (a case variant of an existing record) inserted at
    `position` of the central directory. miniz (torch's reader) looks names up case-
    insensitively by binary search over a sorted index: which twin it finds depends on where
    the twin sits (positions found by trying, torch 2.13)."""
    def write(c, path):
        records = _float_records()
        records.insert(position, (name, payload(c)))
        _write_zip(path, records)
    return write


def _local(out, name, data):
    nb = name.encode()
    off = len(out)
    pad = -(off + 30 + len(nb) + 4) % 64
    extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
    crc = zlib.crc32(data)
    out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, crc, len(data), len(data),
                       len(nb), len(extra)) + nb + extra + data
    return nb, crc, len(data), off


def _central(entries):
    return b"".join(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0x21, crc, n, n,
                                len(nb), 0, 0, 0, 0, 0, off) + nb
                    for nb, crc, n, off in entries)


def _end(count, cd_size, cd_offset, comment):
    return struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, cd_size, cd_offset, comment)


def two_end_records(tail):
    """Local records for both the real data.pkl and a hostile one; central directory 1 lists
    the real one, central directory 2 the hostile one. End record 1 (-> CD 1) has a comment
    reaching exactly to the end of the file and holding end record 2 (-> CD 2), whose own
    comment length does not fit: `tail` is what follows end record 2 and its claimed comment
    length. miniz takes the last end-record signature; a reader that wants the comment to
    reach the end of the file takes end record 1."""
    extra, claimed = tail

    def write(c, path):
        records = _float_records()
        out = bytearray()
        real = [_local(out, n, d) for n, d in records]
        evil = _local(out, records[0][0], PICKLE(CALL(G("builtins", "print"), X(c.token))))
        cd1_off, cd1 = len(out), _central(real)
        out += cd1
        cd2_entries = [evil] + real[1:]
        cd2_off, cd2 = len(out), _central(cd2_entries)
        out += cd2
        end2 = _end(len(cd2_entries), len(cd2), cd2_off, claimed)
        out += _end(len(real), len(cd1), cd1_off, len(end2) + len(extra)) + end2 + extra
        with open(path, "wb") as f:
            f.write(out)
    return write


def _tar_header(name, size, prefix=b""):
    """A V7 tar header (no 'ustar' magic); `prefix` overrides its first bytes (the name
    field; everything up to the first NUL is the member's name)."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = b"0"
    h[0:len(prefix)] = prefix
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _tar_member(name, data):
    return _tar_header(name, len(data)) + data + bytes(-len(data) % 512)


def legacy_tar(hostile_member):
    """A legacy torch file (magic number, protocol, sys_info, the pickle of {'w': uint8[8192]},
    storage keys, storage bytes) that is also an old-style tar archive: sys_info's pickle
    starts with a string (popped) whose bytes make the file's first 512 bytes a valid V7 tar
    header; that first member's data runs to a 512-byte boundary inside the storage bytes,
    where the members torch's pre-0.4 reader extracts (storages, tensors, pickle) follow.
    torch.load tries the tar reading first (its legacy_load) and unpickles `hostile_member`
    ('pickle' or 'storages') with the regular unpickler."""
    def write(c, path):
        n = 8192
        buf = io.BytesIO()
        torch.save({"w": torch.zeros(n, dtype=torch.uint8)}, buf, _use_new_zipfile_serialization=False)
        raw = buf.getvalue()
        f = io.BytesIO(raw)
        pieces = []
        for _ in range(5):  # magic, protocol, sys_info, the object, storage keys
            start = f.tell()
            for _op in pickletools.genops(f):
                pass
            pieces.append(raw[start:f.tell()])
        storages = raw[f.tell():]
        assert len(storages) == 8 + n and pieces[0].startswith(b"\x80\x02\x8a\x0a"), pieces[0]
        head = pieces[0] + pieces[1] + b"\x80\x02X"
        fill = 512 - len(head) - 4  # the string's bytes run to the end of the first block
        before_storage = len(head) + 4 + fill + 1 + len(pieces[2]) - 2 + len(pieces[3]) + len(pieces[4]) + 8
        second = -(-before_storage // 512) * 512  # the next tar header: inside the storage bytes
        header = _tar_header(b"", second - 512, prefix=head + struct.pack("<I", fill))
        content = header[len(head) + 4:]
        assert len(content) == fill and b"\x80" not in content
        sys_info = b"\x80\x02" + X(content.decode("ascii")) + b"0" + pieces[2][2:]
        evil = PICKLE(CALL(G("builtins", "print"), X(c.token)))
        members = {"storages": b"\x80\x02K\x00.\x80\x02].", "tensors": b"\x80\x02K\x00.",
                   "pickle": b"\x80\x02}."}
        members[hostile_member] = evil
        tail = b"".join(_tar_member(k.encode(), v) for k, v in members.items()) + bytes(1024)
        data = bytearray(n)
        at = second - before_storage
        data[at:at + len(tail)] = tail
        assert at + len(tail) <= n
        out = pieces[0] + pieces[1] + sys_info + pieces[3] + pieces[4] + storages[:8] + bytes(data)
        assert out[:512] == header and len(out) == before_storage + n
        with open(path, "wb") as g:
            g.write(out)
    return write


def _print_pickle(c):
    return PICKLE(CALL(G("builtins", "print"), X(c.token)))


def _touch_pickle(c):
    return PICKLE(CALL(G("posix", "system"), c.touch()))


def _other_floats(c):
    return struct.pack("<4f", 1234.5, 1234.5, 1234.5, 1234.5)


DIVERGENCE_NAMES = ("DATA.PKL", "Data.pkl", "DATA/0", "Data/0", "duplicate", "case", "central director",
                    "end record", "end-of-central", "tar")

DIVERGENCE = [
    Case("zip: archive/DATA.PKL (hostile) next to archive/data.pkl; torch reads DATA.PKL",
         file=case_twin("archive/DATA.PKL", 1, _print_pickle), containers=("zip",),
         names=DIVERGENCE_NAMES + ("builtins.print",)),
    Case("zip: archive/Data.pkl (hostile, runs touch) last in the central directory",
         file=case_twin("archive/Data.pkl", 7, _touch_pickle), containers=("zip",), evidence="file",
         names=DIVERGENCE_NAMES + ("os.system", "posix.system")),
    Case("zip: archive/DATA/0 (other tensor bytes) next to archive/data/0; torch reads DATA/0",
         file=case_twin("archive/DATA/0", 2, _other_floats), containers=("zip",), evidence="value:1234.5",
         names=DIVERGENCE_NAMES),
    Case("zip: archive/Data/0 (other tensor bytes) after the version record",
         file=case_twin("archive/Data/0", 5, _other_floats), containers=("zip",), evidence="value:1234.5",
         names=DIVERGENCE_NAMES),
    Case("zip: two end records; the last one's comment length runs short of the file's end",
         file=two_end_records((b"\0\0", 0)), containers=("zip",), names=DIVERGENCE_NAMES + ("builtins.print",)),
    Case("zip: two end records; the last one claims a comment longer than the file",
         file=two_end_records((b"abc", 40)), containers=("zip",), names=DIVERGENCE_NAMES + ("builtins.print",)),
    Case("legacy file that is also a V7 tar: torch unpickles its 'pickle' member",
         file=legacy_tar("pickle"), containers=("legacy",), names=DIVERGENCE_NAMES + ("builtins.print",)),
    Case("legacy file that is also a V7 tar: torch unpickles its 'storages' member first",
         file=legacy_tar("storages"), containers=("legacy",), names=DIVERGENCE_NAMES + ("builtins.print",)),
]

TECHNIQUES = {"planted": PLANTED, "callables": CALLABLES, "attributes": ATTRIBUTES,
              "rebuilt": REBUILT, "trust": TRUST, "divergence": DIVERGENCE}

# Words a refusal may use instead of naming the global.
GENERIC = ("UNSAFE", "unsafe", "can run code", "runs code", "run code", "planted", "callable")

# ---------------------------------------------------------------------------------------------
# Child processes

TORCH_CHILD = textwrap.dedent("""
    import contextlib, io, json, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    out = {}
    for path in sys.argv[1:]:
        buf, res = io.StringIO(), {}
        try:
            with contextlib.redirect_stdout(buf):
                obj = torch.load(path, weights_only=False)
            try:
                res["result"] = repr(obj)[:400]
            except BaseException as e:
                res["result"] = f"<{type(obj).__name__}: repr failed: {e}>"
        except BaseException as e:
            res["error"] = f"{type(e).__name__}: {e}"[:400]
        res["stdout"] = buf.getvalue()[-3000:]
        out[path] = res
    sys.stdout.write("\\n" + json.dumps(out) + "\\n")
    """)

LOAD_CHILD = textwrap.dedent("""
    import contextlib, io, json, os, sys, warnings
    warnings.simplefilter("ignore")
    sys.path.insert(0, sys.argv[1])
    try:
        import ckptool
    except ImportError as e:
        print(json.dumps({"unavailable": str(e)}))
        raise SystemExit(0)
    import torch, numpy, numpy.random, collections, argparse, uuid, pathlib, types, typing
    import datetime, decimal, fractions, copyreg, codecs, re
    jobs = json.loads(sys.argv[2])
    for path in sys.argv[3:]:  # benign files: whatever load() sets up lazily happens now
        ckptool.load(path)
    BAD = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
           "subprocess.Popen", "ctypes.dlopen", "os.mkdir", "os.rmdir", "os.remove", "os.rename",
           "os.chmod", "os.symlink", "os.link", "os.truncate", "shutil.copyfile", "shutil.rmtree",
           "shutil.move", "pickle.find_class", "tempfile.mkstemp", "builtins.input"}
    WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    events = []
    def is_source_file(name):
        return isinstance(name, str) and name.endswith(".py") and os.path.exists(name)
    def importing():
        f = sys._getframe(1)
        while f is not None:
            if f.f_code.co_filename.startswith("<frozen importlib"):
                return True
            f = f.f_back
        return False
    def hook(event, args):
        if event not in BAD and event not in ("open", "exec", "compile"):
            return
        if importing():  # a module being imported (a trusted package): not the payload
            return
        if event in BAD:
            events.append([event, repr(args)[:200]])
        elif event == "open":
            path, mode, flags = (list(args) + [None, None, 0])[:3]
            writes = (isinstance(mode, str) and any(ch in mode for ch in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & WRITE)
            if writes:
                events.append([event, repr(args)[:200]])
        elif event == "exec":
            code = args[0]
            if not (getattr(code, "co_name", "") == "<module>" and is_source_file(code.co_filename)):
                events.append([event, repr(args)[:200]])
        elif event == "compile":
            if not is_source_file(args[1] if len(args) > 1 else None):
                events.append([event, repr(args)[:200]])
    sys.addaudithook(hook)
    out = {}
    for path, trust, marker in jobs:
        key = path + "|" + ",".join(trust)
        del events[:]
        buf, res = io.StringIO(), {}
        try:
            with contextlib.redirect_stdout(buf):
                obj = ckptool.load(path, trust=trust)
            res["result"] = "loaded"
            res["repr"] = repr(obj)[:400]
        except ckptool.Error as e:
            res["result"] = "refused"
            res["error"] = str(e)[:400]
        except BaseException as e:
            res["result"] = "other error"
            res["error"] = f"{type(e).__name__}: {e}"[:400]
        res["events"] = list(events)
        res["stdout"] = buf.getvalue()[-2000:]
        res["marker"] = os.path.exists(marker)
        if os.path.isdir(marker):
            os.rmdir(marker)
        elif res["marker"]:
            os.remove(marker)
        out[key] = res
    sys.stdout.write("\\n" + json.dumps(out) + "\\n")
    """)


def _last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def _python(script, *args, timeout=300):
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    if p.returncode != 0:
        raise AssertionError(f"child failed ({p.returncode})\nstdout:\n{p.stdout[-3000:]}\n"
                             f"stderr:\n{p.stderr[-3000:]}")
    return p.stdout


def _ckptool(*args):
    p = subprocess.run([CKPTOOL, *map(str, args)], capture_output=True, text=True, timeout=120)
    return {"rc": p.returncode, "out": p.stdout + p.stderr}


def _chunks(items, n):
    n = max(1, min(n, len(items)))
    return [items[i::n] for i in range(n)]


def _remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


# ---------------------------------------------------------------------------------------------
# One run for the whole module: build every file, then run torch.load, ckptool and
# ckptool.load on all of them in parallel.


@dataclasses.dataclass
class Built:
    technique: str
    case: Case
    container: str
    path: str
    ctx: Ctx
    torch: dict = dataclasses.field(default_factory=dict)
    verify: dict = dataclasses.field(default_factory=dict)        # trust label -> result
    inspect: dict = dataclasses.field(default_factory=dict)
    load: dict = dataclasses.field(default_factory=dict)          # trust label -> result

    @property
    def label(self):
        return f"[{self.container}] {self.case.name}"


STATE = {}


def setUpModule():
    tmp = tempfile.mkdtemp(prefix="ckpt-verdict-")
    STATE["tmp"] = tmp
    src = os.path.join(tmp, "copy-source.txt")
    with open(src, "w") as f:
        f.write("copied\n")
    warm = []
    for i, zip_format in enumerate((True, False)):
        warm.append(os.path.join(tmp, f"warm{i}.pt"))
        torch.save({"w": torch.arange(6.0).view(2, 3)[:, 1:], "n": 3}, warm[-1],
                   _use_new_zipfile_serialization=zip_format)
    wrap = Wrapper()
    built = []
    for technique, cases in TECHNIQUES.items():
        for i, case in enumerate(cases):
            for container in case.containers:
                tag = f"{technique}{i}-{container}"
                ctx = Ctx(marker=os.path.join(tmp, f"MARKER-{tag}"), token=f"CKPT-RAN-{tag}", src=src)
                path = os.path.join(tmp, f"{tag}.pt")
                if case.file is not None:
                    case.file(ctx, path)
                elif container == "zip":
                    wrap.zip(path, case.pickle(ctx))
                else:
                    wrap.legacy(path, case.pickle(ctx))
                built.append(Built(technique, case, container, path, ctx))
    STATE["built"] = built
    by_path = {b.path: b for b in built}
    workers = os.cpu_count() or 2

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(4, workers * 2)) as pool:
        # (i) torch.load, a few children side by side
        torch_jobs = [pool.submit(_python, TORCH_CHILD, *chunk)
                      for chunk in _chunks([b.path for b in built], min(4, workers + 1))]
        # (ii) ckptool verify / inspect
        cli = {}
        for b in built:
            cli[(b.path, "verify", "")] = pool.submit(_ckptool, "verify", b.path)
            cli[(b.path, "inspect", "")] = pool.submit(_ckptool, "inspect", b.path)
            for t in b.case.trust:
                cli[(b.path, "verify", t)] = pool.submit(_ckptool, "verify", "--trust", t, b.path)
        for job in torch_jobs:
            for path, res in _last_json(job.result()).items():
                b = by_path[path]
                b.torch = dict(res, marker=os.path.exists(b.ctx.marker))
        for (path, what, trust), fut in cli.items():
            getattr(by_path[path], what)[trust] = fut.result()
    for b in built:
        _remove(b.ctx.marker)

    # (iii) ckptool.load under an audit hook, after torch's markers are gone
    # (every trust of one file in the same child, one after the other: the child removes the
    # marker after each)
    def jobs(files):
        return [[b.path, list(trust), b.ctx.marker]
                for b in files for trust in [()] + [(t,) for t in b.case.trust]]
    STATE["load_unavailable"] = None
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        outs = list(pool.map(lambda chunk: _python(LOAD_CHILD, PACKAGE, json.dumps(jobs(chunk)), *warm),
                             _chunks(built, 2)))
    for out in outs:
        doc = _last_json(out)
        if "unavailable" in doc:
            STATE["load_unavailable"] = doc["unavailable"]
            continue
        for key, res in doc.items():
            path, _, trust = key.partition("|")
            by_path[path].load[trust] = res
    for b in built:
        _remove(b.ctx.marker)


def tearDownModule():
    shutil.rmtree(STATE.get("tmp", ""), ignore_errors=True)


def _ran(b):
    """What torch.load showed of the hidden call, or None if it did not make it."""
    r = b.torch
    ev = b.case.evidence
    if ev == "file":
        return "marker created" if r.get("marker") else None
    if ev == "token":
        return "token printed" if b.ctx.token in r.get("stdout", "") else None
    kind, _, text = ev.partition(":")
    where = r.get("stdout", "") if kind == "stdout" else r.get("result", "")
    return f"{text!r} seen" if text in where else None


class TechniqueTest:
    """The checks every technique's files get (a mixin: each technique is a TestCase)."""
    technique = None

    def files(self):
        return [b for b in STATE["built"] if b.technique == self.technique]

    def test_torch_load_runs_the_hidden_call(self):
        for b in self.files():
            with self.subTest(b.label):
                self.assertTrue(_ran(b), f"torch.load(weights_only=False) did not make the hidden "
                                         f"call ({b.case.evidence}): {b.torch}")

    def test_verify_refuses_and_names_it(self):
        for b in self.files():
            for trust, r in sorted(b.verify.items()):
                with self.subTest(b.label, trust=trust or None):
                    self.assertEqual(r["rc"], 1, f"verify{' --trust ' + trust if trust else ''} "
                                                 f"exited {r['rc']}:\n{r['out'][-1500:]}")
                    words = b.case.names + GENERIC
                    self.assertTrue(any(w in r["out"] for w in words),
                                    f"verify names none of {words}:\n{r['out'][-1500:]}")

    def test_inspect_does_not_crash(self):
        for b in self.files():
            with self.subTest(b.label):
                r = b.inspect[""]
                self.assertIn(r["rc"], (0, 1), r["out"][-1500:])
                self.assertNotIn("internal error", r["out"].lower())

    def test_ckptool_load_runs_nothing(self):
        if STATE["load_unavailable"]:
            self.skipTest(f"no Python package in this build: {STATE['load_unavailable']}")
        for b in self.files():
            for trust in [""] + list(b.case.trust):
                with self.subTest(b.label, trust=trust or None):
                    r = b.load[trust]
                    self.assertEqual(r["events"], [], f"load() ran something: {r}")
                    self.assertFalse(r["marker"], f"load() made the marker: {r}")
                    for text in (b.ctx.token, "Thanks to CWI", "Copyright (c)", "urn:"):
                        self.assertNotIn(text, r["stdout"], f"load() printed the payload: {r}")

    def test_ckptool_load_refuses_clearly_or_gives_inert_records(self):
        if STATE["load_unavailable"]:
            self.skipTest(f"no Python package in this build: {STATE['load_unavailable']}")
        for b in self.files():
            for trust in [""] + list(b.case.trust):
                with self.subTest(b.label, trust=trust or None):
                    r = b.load[trust]
                    self.assertIn(r["result"], ("loaded", "refused"),
                                  f"load() failed with something other than a ckptool error: {r}")
                    kind, _, text = b.case.evidence.partition(":")
                    if kind == "value" and r["result"] == "loaded":
                        # the container is read two ways: load() must not give other values
                        self.assertIn(text, r["repr"], f"load() returns other data than torch.load: {r}")


class PlantedMethods(TechniqueTest, unittest.TestCase):
    technique = "planted"


class CallablesAsData(TechniqueTest, unittest.TestCase):
    technique = "callables"


class AttributePaths(TechniqueTest, unittest.TestCase):
    technique = "attributes"


class RebuiltClasses(TechniqueTest, unittest.TestCase):
    technique = "rebuilt"


class TrustLeaks(TechniqueTest, unittest.TestCase):
    technique = "trust"

    def test_every_case_is_checked_with_and_without_trust(self):
        for b in self.files():
            self.assertTrue(b.case.trust)
            self.assertEqual(set(b.verify), {""} | set(b.case.trust), b.label)


class ContainerDivergence(TechniqueTest, unittest.TestCase):
    technique = "divergence"


class BenignFiles(unittest.TestCase):
    """What real checkpoints hold: verify must pass them."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ckpt-benign-")
        torch.manual_seed(0)
        q = torch.quantize_per_channel(torch.randn(4, 3), torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.double),
                                       torch.tensor([0, 1, 2, 3]), axis=0, dtype=torch.qint8)
        from torch.torch_version import TorchVersion
        cls.files = {}
        for name, obj, zip_format in (
                ("per-channel quantized, legacy", {"q": q}, False),
                ("per-channel quantized, zip", {"q": q}, True),
                ("TorchVersion('2.13.0') in a dict", {"torch_version": TorchVersion("2.13.0"), "w": torch.ones(2)}, True),
                ("torch.__version__ in a dict", {"version": torch.__version__, "w": torch.ones(2)}, True),
                ("torch.__version__ in a dict, legacy", {"version": torch.__version__}, False)):
            path = os.path.join(cls.tmp, name.replace(" ", "_").replace("'", "").replace(",", "") + ".pt")
            torch.save(obj, path, _use_new_zipfile_serialization=zip_format)
            cls.files[name] = path

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_verify_passes(self):
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            results = dict(zip(self.files, pool.map(lambda p: _ckptool("verify", p), self.files.values())))
        for name, r in results.items():
            with self.subTest(name):
                self.assertEqual(r["rc"], 0, r["out"][-1500:])

    def test_torch_loads_them(self):
        for name, path in self.files.items():
            with self.subTest(name):
                torch.load(path, weights_only=False)


if __name__ == "__main__":
    unittest.main()
