"""torch.distributed.checkpoint (DCP) folders written the way PyTorch's FileSystemWriter writes
them, byte for byte, for test_dcp.py. torch 1.13 (installed here) has no
torch.distributed.checkpoint, so the writer is re-enacted here from the sources, step by step.

Sources read (public repositories):
- pytorch/pytorch torch/distributed/checkpoint/
  - metadata.py @57ba412974d87ca62f0c7010e5953581587c40c6 (Metadata with storage_meta and
    version, TensorProperties with its tuple __getstate__ and _MEM_FORMAT_ENCODING, MetadataIndex,
    StorageMeta); @03e266fa83db15f9755e8467ade6968d230d3e17 (the earlier 3-field Metadata whose
    TensorProperties lived in torch.distributed._shard.sharded_tensor.metadata);
  - filesystem.py: the current main-branch copy (use_collectives, CURRENT_DCP_VERSION = "1.0.0",
    __<rank>.metadata, _StorageInfo.transform_descriptors dropped from the state when None; the
    index gave no commit for that copy) and @b639d82d83d41b747b1d856e49971674cf7e8fc5 /
    @0140b62d8bab203e4699faeba802b5204fa51d26 (before transforms);
  - _extension.py @6a45ce69279446b43300c3bf378b4f0c12f61e64 (ZStandard: "stream.zstd/1",
    zstandard.ZstdCompressor().stream_writer);
  - _dedup_save_plans.py @646bddd846c0429f88818944f085b43c9b96665f; default_planner.py (main:
    dedup_save_plans, create_default_global_save_plan, ChainMap of planner_data,
    _validate_global_plan); planner.py (WriteItem.tensor_storage_size uses the FULL tensor size);
    planner_helpers.py @55a9611ffad0869300874008c211b536c4627e6c; _traverse.py (main, dicts always
    flattened, lists only when they hold tensors); state_dict.py (_flatten_optim_state_dict);
    state_dict_saver.py (main, _save_state_dict with use_collectives);
  - caffe2/serialize/inline_container.{h,cc} (writeRecord, writeEndOfFile,
    writeSerializationId, ostream_write_func; files_written_ is a std::unordered_set).
- torch 1.13 as installed here: torch/distributed/_shard/checkpoint/{metadata,filesystem,
  default_planner,planner_helpers}.py and _shard/sharded_tensor/metadata.py (the oldest layout).
- NVIDIA/Megatron-LM megatron/core/dist_checkpointing/ @d2bd9fa89fe2fb74f002d68ad17cd5e47181dfcc
  (last commit whose strategies/torch.py pickles MCoreMetadata(Metadata) with mcore_data;
  strategies/filesystem_async.py FileSystemWriterAsync; core.py metadata.json;
  strategies/common.py common.pt) and @d98e8a64ddf34856e74b24714e3bedb2f5a39553 (today
  MCoreMetadata is a dummy class kept only to load those checkpoints).

What is imitated (see the report in test_dcp.py's docstring for the list):
- `.metadata` is `pickle.dump(metadata, f)` (Python 3.11's default protocol 4) of classes with
  the real module paths and qualified names, provided here as stand-in modules in sys.modules.
  The object graph is the one DCP builds: local plans are pickled to the coordinator
  (gather_object), the global plan is pickled back (scatter_object_list), write results are
  pickled to the coordinator (all_reduce), so memo sharing in the pickle matches.
- Each `.distcp` file holds whole `torch.save` archives one after another (bytes items first,
  then tensors in the loader's order). Tensor chunks are compact (a view whose storage is larger
  than the chunk is cloned first), saved as torch >= 2.6 lays out a zip: data.pkl,
  .format_version, .storage_alignment, byteorder, data/0.., version, .data/serialization_id,
  archive folder "archive" (torch.save into a stream).
"""
import collections
import collections.abc
import dataclasses
import enum
import io
import json
import math
import operator
import os
import pathlib
import pickle
import random
import struct
import sys
import types
import uuid
import zipfile
import zlib
from collections import ChainMap
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Optional, Sequence

import torch
import torch.distributed  # noqa: F401 (the stand-in modules hang under the real package)

HERE = os.path.dirname(os.path.abspath(__file__))
STACKS = os.path.join(HERE, "py311_stacks")
if STACKS not in sys.path:
    sys.path.insert(0, STACKS)
sys.dont_write_bytecode = True  # keep py311_stacks/ free of __pycache__ folders

from ckpt_enums import Mode, RunConfig  # noqa: E402 (py311_stacks: a dataclass and an Enum)

try:
    import zstandard
except ImportError:  # python3-zstandard (scripts/setup installs it)
    zstandard = None


# =============================================================================================
# Stand-in modules: the classes DCP pickles, under their real module paths and names
# =============================================================================================

def _module(name):
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__dict__["_dcp_fixture_stand_in"] = True
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(_module(parent), child, mod)
    return mod


def _publish(modname, *objs):
    mod = _module(modname)
    for obj in objs:
        name = obj.__name__
        obj.__module__ = modname
        obj.__qualname__ = name
        setattr(mod, name, obj)
    return mod


def _tensor_properties_class(enum_cls):
    """TensorProperties as both metadata.py (current) and sharded_tensor/metadata.py (old) have it:
    the pickled state is (dtype, layout, requires_grad, memory-format enum member, pin_memory)."""

    @dataclass
    class TensorProperties:
        dtype: torch.dtype = field(default_factory=torch.get_default_dtype)
        layout: torch.layout = field(default=torch.strided)
        requires_grad: bool = False
        memory_format: torch.memory_format = field(default=torch.contiguous_format)
        pin_memory: bool = False

        def __getstate__(self):
            memory_format = self.memory_format
            if memory_format == torch.contiguous_format:
                enc = enum_cls.TORCH_CONTIGUOUS_FORMAT
            elif memory_format == torch.channels_last:
                enc = enum_cls.TORCH_CHANNELS_LAST
            elif memory_format == torch.preserve_format:
                enc = enum_cls.TORCH_PRESERVE_FORMAT
            else:
                raise RuntimeError(f"Invalid torch.memory_format: {memory_format}")
            return (self.dtype, self.layout, self.requires_grad, enc, self.pin_memory)

        def __setstate__(self, state):
            (self.dtype, self.layout, self.requires_grad, enc, self.pin_memory) = state
            self.memory_format = {
                enum_cls.TORCH_CONTIGUOUS_FORMAT: torch.contiguous_format,
                enum_cls.TORCH_CHANNELS_LAST: torch.channels_last,
                enum_cls.TORCH_PRESERVE_FORMAT: torch.preserve_format,
            }[enc]

        @classmethod
        def create_from_tensor(cls, tensor):
            return cls(dtype=tensor.dtype, layout=tensor.layout, requires_grad=tensor.requires_grad,
                       memory_format=torch.contiguous_format, pin_memory=tensor.is_pinned())

    return TensorProperties


def _metadata_index_class():
    @dataclass(frozen=True)
    class MetadataIndex:
        fqn: str
        offset: Optional[torch.Size] = None
        index: Optional[int] = field(hash=False, compare=False, default=None)

        def __init__(self, fqn, offset=None, index=None):
            object.__setattr__(self, "fqn", fqn)
            object.__setattr__(self, "index", index)
            if offset is not None:
                object.__setattr__(self, "offset", torch.Size(offset))

    return MetadataIndex


def _common_metadata_classes():
    @dataclass
    class ChunkStorageMetadata:
        offsets: torch.Size
        sizes: torch.Size

    @dataclass
    class TensorStorageMetadata:
        properties: Any
        size: torch.Size
        chunks: list

    @dataclass
    class BytesStorageMetadata:
        pass

    return ChunkStorageMetadata, TensorStorageMetadata, BytesStorageMetadata


class _Classes:
    """The classes one writer generation pickles."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _build_current():
    mod = "torch.distributed.checkpoint.metadata"

    class _MEM_FORMAT_ENCODING(enum.Enum):
        TORCH_CONTIGUOUS_FORMAT = 0
        TORCH_CHANNELS_LAST = 1
        TORCH_PRESERVE_FORMAT = 2

    Chunk, TensorMD, BytesMD = _common_metadata_classes()

    @dataclass
    class StorageMeta:
        checkpoint_id: Any = None
        save_id: Optional[str] = None
        load_id: Optional[str] = None
        modules: list = field(default_factory=list)

    @dataclass
    class Metadata:
        state_dict_metadata: dict
        planner_data: Any = None
        storage_data: Any = None
        storage_meta: Optional[StorageMeta] = None
        version: Optional[str] = None

    TP = _tensor_properties_class(_MEM_FORMAT_ENCODING)
    _publish(mod, _MEM_FORMAT_ENCODING)
    Index = _metadata_index_class()
    _publish(mod, Chunk, TP, TensorMD, BytesMD, StorageMeta, Metadata, Index)

    @dataclass
    class _StorageInfo:
        relative_path: str
        offset: int
        length: int
        transform_descriptors: Optional[Sequence[str]] = None

        def __getstate__(self):
            return {k: v for k, v in self.__dict__.items() if v is not None}

    _publish("torch.distributed.checkpoint.filesystem", _StorageInfo)

    @dataclass
    class MCoreMetadata(Metadata):
        """Megatron-Core <= 0.15: Metadata with mcore specific data."""
        mcore_data: Optional[dict] = None

    _publish("megatron.core.dist_checkpointing.strategies.torch", MCoreMetadata)
    return _Classes(Chunk=Chunk, TensorMD=TensorMD, BytesMD=BytesMD, StorageMeta=StorageMeta,
                    Metadata=Metadata, Index=Index, TP=TP, MemFormat=_MEM_FORMAT_ENCODING,
                    StorageInfo=_StorageInfo, MCoreMetadata=MCoreMetadata, name="current",
                    metadata_fields=("state_dict_metadata", "planner_data", "storage_data",
                                     "storage_meta", "version"))


def _build_shard_tensor_properties():
    class MEM_FORMAT_ENCODING(enum.Enum):
        TORCH_CONTIGUOUS_FORMAT = 0
        TORCH_CHANNELS_LAST = 1
        TORCH_PRESERVE_FORMAT = 2

    TP = _tensor_properties_class(MEM_FORMAT_ENCODING)
    _publish("torch.distributed._shard.sharded_tensor.metadata", MEM_FORMAT_ENCODING, TP)
    return TP, MEM_FORMAT_ENCODING


def _build_shard_113(TP, MemFormat):
    mod = "torch.distributed._shard.checkpoint.metadata"
    Chunk, TensorMD, BytesMD = _common_metadata_classes()

    @dataclass
    class Metadata:
        state_dict_metadata: dict
        planner_data: Any = None
        storage_data: Any = None

    Index = _metadata_index_class()
    _publish(mod, Chunk, TensorMD, BytesMD, Metadata, Index)

    @dataclass
    class _StorageInfo:
        relative_path: str
        offset: int
        length: int

    _publish("torch.distributed._shard.checkpoint.filesystem", _StorageInfo)
    return _Classes(Chunk=Chunk, TensorMD=TensorMD, BytesMD=BytesMD, StorageMeta=None, Metadata=Metadata,
                    Index=Index, TP=TP, MemFormat=MemFormat, StorageInfo=_StorageInfo, MCoreMetadata=None,
                    name="shard-1.13", metadata_fields=("state_dict_metadata", "planner_data", "storage_data"))


CURRENT = _build_current()
_SHARD_TP, _SHARD_MEMFORMAT = _build_shard_tensor_properties()
# torch.distributed.checkpoint before storage_meta/version: the current module's classes with a
# 3-field Metadata state, and TensorProperties from torch.distributed._shard.sharded_tensor.
DCP_EARLY = _Classes(**{**CURRENT.__dict__, "TP": _SHARD_TP, "MemFormat": _SHARD_MEMFORMAT, "name": "dcp-early",
                        "MCoreMetadata": None,
                        "metadata_fields": ("state_dict_metadata", "planner_data", "storage_data")})
SHARD_113 = _build_shard_113(_SHARD_TP, _SHARD_MEMFORMAT)
FLAVORS = {c.name: c for c in (CURRENT, DCP_EARLY, SHARD_113)}

CURRENT_DCP_VERSION = "1.0.0"
ZSTD_DESCRIPTOR_NAME = "stream.zstd"


# =============================================================================================
# torch.save as torch >= 2.6 lays it out (miniz calls re-enacted, serialization id included)
# =============================================================================================

_M64 = (1 << 64) - 1


def std_hash_bytes(data, seed=0xC70F6907):
    """libstdc++ std::hash<std::string> (_Hash_bytes, 64-bit), which c10::hash uses."""
    mul = (0xC6A4A793 << 32) + 0x5BD1E995
    shift_mix = lambda v: v ^ (v >> 47)  # noqa: E731
    n = len(data)
    aligned = n & ~7
    h = (seed ^ (n * mul)) & _M64
    for p in range(0, aligned, 8):
        d = (shift_mix((int.from_bytes(data[p:p + 8], "little") * mul) & _M64) * mul) & _M64
        h = ((h ^ d) * mul) & _M64
    if n & 7:
        h = ((h ^ int.from_bytes(data[aligned:], "little")) * mul) & _M64
    h = (shift_mix(h) * mul) & _M64
    return shift_mix(h)


def hash_combine(seed, value):
    """c10::hash_combine (size_t)."""
    return (seed ^ ((value + 0x9E3779B9 + (seed << 6) + (seed >> 2)) & _M64)) & _M64


# libstdc++ __prime_list, the head used by small tables (_Prime_rehash_policy::_M_next_bkt).
_PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89,
           97, 103, 109, 113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257]
_FAST_BKT = [2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13]


class StdUnorderedSet:
    """Iteration order of a libstdc++ std::unordered_set<std::string> after inserts (what
    PyTorchStreamWriter::files_written_ is; writeSerializationId iterates it)."""
    _BEFORE = object()

    def __init__(self):
        self.nxt = {self._BEFORE: None}
        self.buckets = {}
        self.bucket_count = 1
        self.next_resize = 0
        self.codes = {}

    def _next_bkt(self, n):
        if n < len(_FAST_BKT):
            if n == 0:
                return 1
            self.next_resize = _FAST_BKT[n]
            return _FAST_BKT[n]
        for p in _PRIMES[6:]:
            if p >= n:
                self.next_resize = p
                return p
        raise NotImplementedError("more records than this emulation's prime list covers")

    def _rehash(self, count):
        p = self.nxt[self._BEFORE]
        self.nxt[self._BEFORE] = None
        buckets, bbegin = {}, 0
        while p is not None:
            nxt = self.nxt[p]
            b = self.codes[p] % count
            if b not in buckets:
                self.nxt[p] = self.nxt[self._BEFORE]
                self.nxt[self._BEFORE] = p
                buckets[b] = self._BEFORE
                if self.nxt[p] is not None:
                    buckets[bbegin] = p
                bbegin = b
            else:
                self.nxt[p] = self.nxt[buckets[b]]
                self.nxt[buckets[b]] = p
            p = nxt
        self.buckets, self.bucket_count = buckets, count

    def add(self, name):
        if name in self.codes:
            return
        n_elt = len(self.codes)
        if n_elt + 1 > self.next_resize:
            min_bkts = max(n_elt + 1, 0 if self.next_resize else 11)
            if min_bkts >= self.bucket_count:
                self._rehash(self._next_bkt(max(min_bkts + 1, self.bucket_count * 2)))
            else:
                self.next_resize = self.bucket_count
        code = std_hash_bytes(name.encode())
        self.codes[name] = code
        b = code % self.bucket_count
        if b in self.buckets:
            prev = self.buckets[b]
            self.nxt[name] = self.nxt[prev]
            self.nxt[prev] = name
        else:
            self.nxt[name] = self.nxt[self._BEFORE]
            self.nxt[self._BEFORE] = name
            if self.nxt[name] is not None:
                self.buckets[self.codes[self.nxt[name]] % self.bucket_count] = name
            self.buckets[b] = self._BEFORE

    def __iter__(self):
        p = self.nxt[self._BEFORE]
        while p is not None:
            yield p
            p = self.nxt[p]


class TorchZipWriter:
    """caffe2 PyTorchStreamWriter over miniz, as torch.save(obj, stream) drives it: every miniz
    write is one call of stream.write (`calls`), records are STORED, 64-byte aligned by an 'FB'
    local extra field, each followed by a 16-byte data descriptor, zip64 end records always."""

    def __init__(self, archive_name="archive", alignment=64, recent=True):
        self.prefix = archive_name + "/"
        self.alignment = alignment
        self.recent = recent  # torch >= 2.2: byteorder at the end if missing, serialization id
        self.calls = []
        self.pos = 0
        self.central = []
        self.written = []  # files_written_ insertion order
        self.combined_crc = 0

    def _write(self, b):
        b = bytes(b)
        if not b:
            return
        self.calls.append(b)
        self.pos += len(b)
        if len(b) >= 8 and b[:4] == b"PK\x07\x08":  # ostream_write_func: a data descriptor
            self.combined_crc = hash_combine(self.combined_crc, struct.unpack_from("<I", b, 4)[0])

    def write_record(self, name, data):
        data = bytes(data)
        full = (self.prefix + name).encode()
        if len(data) >= 0xFFFFFFFF or self.pos >= 0xFFFFFFFF:
            raise NotImplementedError("zip64 local extras: fixtures stay small")
        start = self.pos + 30 + len(full) + 4
        pad = (self.alignment - start % self.alignment) % self.alignment
        crc = zlib.crc32(data) & 0xFFFFFFFF
        offset = self.pos
        self._write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, 0x0808, 0, 0, 0, 0, 0, 0, len(full), 4 + pad))
        self._write(full)
        self._write(b"FB" + struct.pack("<H", pad) + b"Z" * pad)
        self._write(data)
        self._write(struct.pack("<IIII", 0x08074B50, crc, len(data), len(data)))
        self.central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, 0x0808, 0, 0, 0, crc,
                                        len(data), len(data), len(full), 0, 0, 0, 0, 0, offset) + full)
        self.written.append(name)

    def serialization_id(self):
        names = StdUnorderedSet()
        for n in self.written:
            names.add(n)
        h = 0
        for n in names:
            h = hash_combine(h, names.codes[n])
        return f"{h:020d}{self.combined_crc:020d}"

    def finish(self):
        if "version" not in self.written and ".data/version" not in self.written:
            self.write_record("version", b"3\n")
        if self.recent:
            if "byteorder" not in self.written:
                self.write_record("byteorder", b"little")
            self.write_record(".data/serialization_id", self.serialization_id().encode())
        cd = b"".join(self.central)
        cd_ofs, n = self.pos, len(self.central)
        self._write(cd)
        eocd64 = self.pos
        self._write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 0x2D, 0, 0, n, n, len(cd), cd_ofs))
        self._write(struct.pack("<IIQI", 0x07064B50, 0, eocd64, 1))
        self._write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(cd), cd_ofs, 0))
        return b"".join(self.calls)


def _torch113_records(obj):
    """data.pkl and the storages of obj, from real torch.save (its pickler is torch's own)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        names = [i.filename for i in z.infolist()]
        prefix = names[0].split("/")[0] + "/"
        data_pkl = z.read(prefix + "data.pkl")
        keys = sorted((n[len(prefix) + 5:] for n in names if n.startswith(prefix + "data/")), key=int)
        storages = [(k, z.read(prefix + "data/" + k)) for k in keys]
    return buf.getvalue(), data_pkl, storages


def torch_save_calls(obj, archive_name="archive", torch_version="2.6"):
    """The stream.write calls torch.save(obj, stream) makes: torch >= 2.6 ("2.6", the default),
    or torch 1.13 ("1.13": data.pkl, data/<k> in sorted key order, version)."""
    raw113, data_pkl, storages = _torch113_records(obj)
    if torch_version == "1.13":
        w = TorchZipWriter(archive_name, recent=False)
        w.write_record("data.pkl", data_pkl)
        for k, data in sorted(storages, key=lambda s: s[0]):
            w.write_record("data/" + k, data)
        w.finish()
        return w.calls
    w = TorchZipWriter(archive_name)
    w.write_record("data.pkl", data_pkl)
    w.write_record(".format_version", b"1")
    w.write_record(".storage_alignment", b"64")
    w.write_record("byteorder", b"little")
    for k, data in storages:
        w.write_record("data/" + k, data)
    w.finish()
    return w.calls


def torch_save_bytes(obj, archive_name="archive", torch_version="2.6"):
    return b"".join(torch_save_calls(obj, archive_name, torch_version))


class _NoCloseWriter(io.RawIOBase):
    """filesystem.py's NoCloseWriter around the .distcp stream."""

    def __init__(self, raw):
        self.raw = raw

    def writable(self):
        return True

    def write(self, b):
        return self.raw.write(b)

    def close(self):
        self.flush()


def zstd_stream(calls):
    """What _extension.ZStandard.transform_to writes for these stream.write calls, closed as
    _write_item closes it (frame end)."""
    if zstandard is None:
        raise RuntimeError("python3-zstandard is needed for zstd items (apt-get install python3-zstandard)")
    out = io.BytesIO()
    w = zstandard.ZstdCompressor().stream_writer(_NoCloseWriter(out))
    for c in calls:
        w.write(c)
    w.close()
    return out.getvalue()


def zstd_decompress(data):
    if zstandard is None:
        raise RuntimeError("python3-zstandard is needed for zstd items (apt-get install python3-zstandard)")
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()


# =============================================================================================
# Placements: how a global tensor is split over ranks (DTensor / ShardedTensor semantics)
# =============================================================================================

def _local_shard_size_and_offset(size, num_chunks, rank):
    """DTensor Shard._local_shard_size_and_offset: torch.chunk semantics."""
    if size % num_chunks == 0:
        full = size // num_chunks
        return full, full * rank
    full = (size + num_chunks - 1) // num_chunks
    start = full * rank
    if size < start:
        return 0, size
    return min(size, start + full) - start, start


class DT:
    """A DTensor: `tensor` is the global value, `mesh` the device mesh shape (ranks row-major),
    `placements` one entry per mesh dim: ("S", dim) to shard, "R" to replicate."""

    def __init__(self, tensor, mesh, placements):
        self.tensor = tensor
        self.mesh = tuple(mesh)
        self.placements = [tuple(p) if isinstance(p, (list, tuple)) else p for p in placements]
        assert len(self.mesh) == len(self.placements)

    def coordinate(self, rank):
        if rank >= math.prod(self.mesh):
            return None
        coord = []
        for n in reversed(self.mesh):
            coord.append(rank % n)
            rank //= n
        return list(reversed(coord))

    def local_chunk(self, rank):
        """(sizes, offsets) as compute_local_shape_and_global_offset gives them, or None."""
        coord = self.coordinate(rank)
        if coord is None:
            return None
        shape, offset = list(self.tensor.shape), [0] * self.tensor.dim()
        for mesh_dim, p in enumerate(self.placements):
            if p == "R":
                continue
            _, dim = p
            size, off = _local_shard_size_and_offset(shape[dim], self.mesh[mesh_dim], coord[mesh_dim])
            shape[dim] = size
            offset[dim] += off
        return shape, offset


def Shard(tensor, world_size, dim=0):
    return DT(tensor, (world_size,), [("S", dim)])


def Grid(tensor, mesh=(2, 2), dims=(0, 1)):
    return DT(tensor, mesh, [("S", d) for d in dims])


class Chunks:
    """Explicit chunks: [(rank, offsets, sizes), ...] (ShardedTensor local shards). Chunks that
    overlap or leave holes make checkpoints torch would refuse to write (validate=False)."""

    def __init__(self, tensor, chunks):
        self.tensor = tensor
        self.chunks = [(r, list(o), list(s)) for r, o, s in chunks]

    def local_chunks(self, rank):
        return [(s, o) for r, o, s in self.chunks if r == rank]


def _chunks_of(value, rank):
    if isinstance(value, DT):
        c = value.local_chunk(rank)
        return [] if c is None else [c]
    return value.local_chunks(rank)


def _narrow(tensor, offsets, sizes):
    out = tensor
    for d, (o, s) in enumerate(zip(offsets, sizes)):
        out = out.narrow(d, o, s)
    return out


# =============================================================================================
# The save: planner (flatten, local plans, dedup, global plan) and FileSystemWriter
# =============================================================================================

@dataclass(frozen=True)
class _TensorWriteData:
    chunk: Any
    properties: Any
    size: torch.Size


@dataclass(frozen=True)
class _WriteItem:
    index: Any
    type: str  # "TENSOR" | "SHARD" | "BYTE_IO"
    tensor_data: Optional[_TensorWriteData] = None

    def tensor_storage_size(self):
        if self.tensor_data is None:
            return None
        return reduce(operator.mul, self.tensor_data.size, 1) * _element_size(self.tensor_data.properties.dtype)


@dataclass(frozen=True)
class _SavePlan:
    items: list
    storage_data: Any = None
    planner_data: Any = None
    usable: bool = True


@dataclass(frozen=True)
class _StoragePrefix:
    prefix: str


@dataclass
class _WriteResult:
    index: Any
    size_in_bytes: int
    storage_data: Any


def _element_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _is_tensorish(v):
    return isinstance(v, (torch.Tensor, DT, Chunks))


def flatten_state_dict(state_dict, v2_3=False):
    """_nested_dict.flatten_state_dict: mappings fqn -> path. torch >= 2.4 (_traverse.
    traverse_state_dict) always walks dicts and walks lists only when they hold tensors; torch
    <= 2.3 (traverse_state_dict_v_2_3, `v2_3`) keeps any dict or list without tensors whole."""
    flattened, mappings = {}, {}

    def flat_copy(path, value):
        new_fqn = ".".join(map(str, path))
        if new_fqn in flattened:
            raise ValueError(f"duplicated flatten key {new_fqn}")
        flattened[new_fqn] = value
        mappings[new_fqn] = path

    def is_terminal(value):
        if isinstance(value, collections.abc.Mapping):
            if not v2_3:
                return False
            values = value.values()
        elif isinstance(value, list):
            values = value
        else:
            return True
        for entry in values:
            if isinstance(entry, (collections.abc.Mapping, list)) and not is_terminal(entry):
                return False
            if _is_tensorish(entry):
                return False
        return True

    def traverse(path, value):
        if v2_3:
            if is_terminal(value):
                flat_copy(path, value)
            elif isinstance(value, collections.abc.Mapping):
                for k, v in value.items():
                    traverse(path + (str(k),), v)
            elif isinstance(value, list):
                for i, v in enumerate(value):
                    traverse(path + (i,), v)
            return
        if isinstance(value, collections.abc.Mapping):
            for k, v in value.items():
                traverse(path + (str(k),), v)
        elif is_terminal(value):
            flat_copy(path, value)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                traverse(path + (i,), v)

    for key, value in state_dict.items():
        traverse((str(key),), value)
    return flattened, mappings


def _roundtrip(obj):
    """An object sent through gather_object / scatter_object_list: pickled and unpickled."""
    return pickle.loads(pickle.dumps(obj))


class RankOnly:
    """A non-tensor value that one rank alone holds (a Megatron ShardedObject)."""

    def __init__(self, rank, value):
        self.rank = rank
        self.value = value


class _Rank:
    """One rank's view of the state dict: its local tensors and the planner's resolve_data."""

    def __init__(self, rank, flat, classes, writer):
        self.rank = rank
        self.flat = flat
        self.C = classes
        self.writer = writer  # "current" | "dcp-early" | "shard-1.13" | "megatron"
        self.local = {}  # (fqn, offsets) -> local tensor

    def write_items(self, fqn, value, is_coordinator):
        """planner_helpers._create_write_items for what create_(default_)local_save_plan keeps:
        torch >= 2.4 and Megatron every value on every rank; torch <= 2.3 objects on the
        coordinator only; torch 1.13 tensors and objects on the coordinator only."""
        C = self.C
        if isinstance(value, RankOnly):
            return [_WriteItem(index=C.Index(fqn), type="BYTE_IO")] if value.rank == self.rank else []
        if isinstance(value, (DT, Chunks)):
            items = []
            for sizes, offsets in _chunks_of(value, self.rank):
                local = _narrow(value.tensor, offsets, sizes).contiguous().clone()
                self.local[(fqn, tuple(offsets))] = local
                sizes, offsets = torch.Size(sizes), torch.Size(offsets)
                items.append(_WriteItem(index=C.Index(fqn, offsets), type="SHARD", tensor_data=_TensorWriteData(
                    chunk=C.Chunk(offsets=offsets, sizes=sizes), properties=C.TP.create_from_tensor(local),
                    size=value.tensor.size())))
            return items
        if isinstance(value, torch.Tensor):
            if self.writer == "shard-1.13" and not is_coordinator:
                return []
            self.local[(fqn, (0,) * value.dim())] = value
            offsets = torch.Size([0] * len(value.size()))
            return [_WriteItem(index=C.Index(fqn, offsets), type="TENSOR", tensor_data=_TensorWriteData(
                chunk=C.Chunk(offsets=offsets, sizes=value.size()),
                properties=C.TP.create_from_tensor(value), size=value.size()))]
        if self.writer in ("shard-1.13", "dcp-early") and not is_coordinator:
            return []
        return [_WriteItem(index=C.Index(fqn), type="BYTE_IO")]

    def resolve_bytes(self, fqn):
        """transform_object: torch.save(obj, BytesIO) (Megatron's are torch.save'd lists already)."""
        obj = self.flat[fqn]
        if isinstance(obj, RankOnly):
            obj = obj.value
        return torch_save_calls(obj, torch_version="1.13" if self.writer == "shard-1.13" else "2.6")

    def resolve_tensor(self, index):
        """The loader: detach, cpu, clone when the storage is larger than the tensor."""
        t = self.local[(index.fqn, tuple(index.offset))].detach()
        if t.storage().size() != t.numel():
            t = t.clone()
        return t


def dedup_save_plans(all_plans, save_to_lowest_rank=False):
    """_dedup_save_plans.dedup_save_plans."""
    item_to_plans = collections.defaultdict(set)
    item_by_index = {}
    for plan_idx, plan in enumerate(all_plans):
        for wi in plan.items:
            item_to_plans[wi.index].add(plan_idx)
            item_by_index[wi.index] = wi
    to_remove = [set() for _ in all_plans]
    plan_to_size = [0] * len(all_plans)
    for idx, plan_indices in item_to_plans.items():
        if save_to_lowest_rank:
            select = min(plan_indices)
        else:
            select = min(plan_indices, key=lambda i: plan_to_size[i])
        plan_to_size[select] += item_by_index[idx].tensor_storage_size() or 1
        plan_indices.remove(select)
        for i in plan_indices:
            to_remove[i].add(idx)
    return [dataclasses.replace(p, items=[wi for wi in p.items if wi.index not in to_remove[i]])
            for i, p in enumerate(all_plans)]


def create_default_global_save_plan(all_plans, C):
    md = {}
    new_plans = []
    for plan in all_plans:
        new_items = []
        for item in plan.items:
            if item.type != "SHARD":
                assert item.index.fqn not in md, item.index.fqn
            if item.type == "BYTE_IO":
                md[item.index.fqn] = C.BytesMD()
                new_items.append(item)
            else:
                tensor_md = md.setdefault(item.index.fqn, C.TensorMD(
                    properties=item.tensor_data.properties, size=item.tensor_data.size, chunks=[]))
                new_index = dataclasses.replace(item.index, index=len(tensor_md.chunks))
                new_items.append(dataclasses.replace(item, index=new_index))
                tensor_md.chunks.append(item.tensor_data.chunk)
        new_plans.append(dataclasses.replace(plan, items=new_items))
    return new_plans, C.Metadata(md)


def _check_box_overlap(b0, b1):
    for i in range(len(b0.offsets)):
        if b0.offsets[i] >= b1.offsets[i] + b1.sizes[i] or b1.offsets[i] >= b0.offsets[i] + b0.sizes[i]:
            return False
    return True


def chunk_problems(md_entry):
    """_validate_global_plan's checks for one TensorStorageMetadata: bounds, overlap, volume."""
    problems = []
    size = md_entry.size
    volume = 0
    for i, c0 in enumerate(md_entry.chunks):
        for d in range(len(size)):
            if c0.offsets[d] < 0 or c0.sizes[d] < 0 or c0.offsets[d] + c0.sizes[d] > size[d]:
                problems.append(f"chunk {list(c0.offsets)}+{list(c0.sizes)} out of bounds")
        volume += reduce(operator.mul, c0.sizes, 1)
        for c1 in md_entry.chunks[i + 1:]:
            if _check_box_overlap(c0, c1):
                problems.append(f"chunks {list(c0.offsets)} and {list(c1.offsets)} overlap")
    if volume != reduce(operator.mul, size, 1):
        problems.append(f"chunks cover {volume} of {reduce(operator.mul, size, 1)} elements")
    return problems


def _item_size_full(wi):  # filesystem._item_size: the FULL tensor size (tensor_data.size)
    return reduce(operator.mul, wi.tensor_data.size, 1) * _element_size(wi.tensor_data.properties.dtype)


def _item_size_chunk(wi):  # Megatron filesystem_async._item_size: the chunk size
    return reduce(operator.mul, wi.tensor_data.chunk.sizes, 1) * _element_size(wi.tensor_data.properties.dtype)


def _split_by_size_and_type(bins, items):
    """filesystem._split_by_size_and_type."""
    if bins == 1:
        return [items]
    bytes_w = [wi for wi in items if wi.type == "BYTE_IO"]
    tensor_w = [wi for wi in items if wi.type != "BYTE_IO"]
    buckets = [[] for _ in range(bins)]
    sizes = [0] * bins
    tensor_w.sort(key=_item_size_full, reverse=True)
    for i, wi in enumerate(bytes_w):
        buckets[i % bins].append(wi)
    for wi in tensor_w:
        idx = min(enumerate(sizes), key=operator.itemgetter(1))[0]
        buckets[idx].append(wi)
        sizes[idx] += _item_size_full(wi)
    return buckets


def _split_megatron(bins, items):
    """Megatron filesystem_async._split_by_size_and_type (chunk sizes, a min-heap)."""
    import heapq
    if bins == 1:
        return [items]
    bytes_items = [wi for wi in items if wi.type == "BYTE_IO"]
    tensor_items = [wi for wi in items if wi.type != "BYTE_IO"]
    buckets = [[] for _ in range(bins)]
    for i, wi in enumerate(bytes_items):
        buckets[i % bins].append(wi)
    sized = [(wi, _item_size_chunk(wi)) for wi in tensor_items]
    sized.sort(key=operator.itemgetter(1), reverse=True)
    heap = [(0, i) for i in range(bins)]
    for wi, size in sized:
        total, b = heapq.heappop(heap)
        buckets[b].append(wi)
        heapq.heappush(heap, (total + size, b))
    return buckets


def _descriptor(name):
    return f"{name}/1"  # ZStandard.get_descriptor: a new string each call


@dataclass
class ItemInfo:
    """Where one item landed: for tests and corruption makers."""
    fqn: str
    offsets: Optional[tuple]  # None for BYTE_IO
    sizes: Optional[tuple]
    file: str
    offset: int
    length: int
    rank: int
    transform: Optional[list]

    @property
    def kind(self):
        return "bytes" if self.offsets is None else "tensor"


@dataclass
class DcpFixture:
    folder: str
    world_size: int
    flavor: str
    tensors: dict  # fqn -> global tensor (what reference_assemble must give)
    objects: dict  # fqn -> value (BYTE_IO items)
    items: list  # ItemInfo, in file write order
    files: dict  # .distcp name -> size
    metadata_files: list
    megatron: bool = False

    def items_of(self, fqn):
        return [i for i in self.items if i.fqn == fqn]

    def tensors_in_file(self, name):
        return sorted({i.fqn for i in self.items if i.file == name and i.kind == "tensor"})

    def model_tensors(self):
        return {k: v for k, v in self.tensors.items() if not k.split(".")[0] in ("optim", "optimizer")}


def _uuid4(rng):
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def make_dcp_checkpoint(folder, state, *, world_size, flavor="current", legacy_module_paths=False, zstd=False,
                        megatron=False, per_rank_metadata=False, thread_count=1, cuda=True,
                        single_file_per_rank=None, no_dist=None, checkpoint_id="checkpoints/step-10", seed=0,
                        validate=True, mcore_data=None, common_state=None):
    """Writes `state` as dcp.save(state, storage_writer=FileSystemWriter(folder)) does on
    `world_size` ranks and returns a DcpFixture. In `state` (nested, as given to dcp.save) DT and
    Chunks values are sharded tensors, plain tensors are on every rank (replicated), RankOnly
    values are one rank's object, anything else is an object (BYTE_IO).

    flavor: "current" (torch >= 2.6's writer), "dcp-early" (torch.distributed.checkpoint before
    storage_meta/version: 3-field Metadata, TensorProperties from torch.distributed._shard,
    objects on the coordinator, duplicates kept on the lowest rank, torch <= 2.3 flattening),
    "shard-1.13" (= legacy_module_paths: torch.distributed._shard.checkpoint of torch 1.13, no
    flattening, so give a flat state; the coordinator writes every non-sharded value; one file
    per item unless single_file_per_rank; items written by torch 1.13's torch.save).
    zstd: FileSystemWriter(_extensions=[ZStandard()]) (every item compressed).
    per_rank_metadata: dcp.save(use_collectives=False): every rank writes __<rank>.metadata for
    its own writes, and replicated values are written by every rank.
    megatron: Megatron-Core torch_dist (flat state; MCoreMetadata; FileSystemWriterAsync with
    `thread_count` files per rank; common.pt and metadata.json).
    thread_count: files per rank. cuda: the writer ran where CUDA is available, so a one-thread
    writer used _OverlappingCpuLoader (tensors written smallest first) instead of plan order.
    validate=False writes chunks that torch's _validate_global_plan would refuse."""
    if legacy_module_paths:
        flavor = "shard-1.13"
    C = FLAVORS[flavor]
    writer = "megatron" if megatron else flavor
    if flavor == "shard-1.13":
        assert not zstd and not per_rank_metadata and not megatron
    if megatron:
        assert flavor == "current"
    if single_file_per_rank is None:
        single_file_per_rank = flavor != "shard-1.13"
    if no_dist is None:
        no_dist = world_size == 1
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)

    # --- every rank: planner.set_up_planner, create_local_plan, storage_writer.prepare_local_plan
    flatten = writer in ("current", "dcp-early")
    ranks, plans = [], []
    for r in range(world_size):
        if flatten:
            flat, mappings = flatten_state_dict(state, v2_3=(writer == "dcp-early"))
        else:
            flat, mappings = dict(state), ({} if megatron else None)
        rk = _Rank(r, flat, C, writer)
        items = []
        for fqn, value in flat.items():
            items += rk.write_items(fqn, value, r == 0)
        ranks.append(rk)
        prefix = _StoragePrefix(f"__{r}_") if per_rank_metadata else None
        plans.append(_SavePlan(items, storage_data=prefix, planner_data=mappings))

    # --- the coordinator: planner.create_global_plan, storage_writer.prepare_global_plan
    def global_step(all_plans):
        if writer != "shard-1.13":
            all_plans = dedup_save_plans(all_plans, save_to_lowest_rank=(writer == "dcp-early"))
        global_plan, metadata = create_default_global_save_plan(all_plans, C)
        if flatten:
            merged = dict(ChainMap(*[p.planner_data for p in global_plan]))
            metadata = dataclasses.replace(metadata, planner_data=merged)
        if validate:
            for fqn, md in metadata.state_dict_metadata.items():
                if not isinstance(md, C.TensorMD) or len(md.size) == 0:
                    continue
                problems = [p for p in chunk_problems(md) if len(global_plan) > 1 or "cover" not in p]
                if problems:
                    raise ValueError(f"Failed to validate global plan: {fqn}: {problems}")
        if megatron:
            metadata = C.MCoreMetadata(mcore_data=dict(mcore_data or {}), **vars(metadata))
        return [p if p.storage_data is not None else
                dataclasses.replace(p, storage_data=_StoragePrefix(f"__{i}_"))
                for i, p in enumerate(global_plan)], metadata

    if per_rank_metadata:  # no collectives: every rank plans alone
        steps = [global_step([plans[r]]) for r in range(world_size)]
        central = [st[0][0] for st in steps]
        metadatas = [st[1] for st in steps]
    else:
        central, metadata = global_step(plans if no_dist else [_roundtrip(p) for p in plans])
        if not no_dist:
            central = [_roundtrip(p) for p in central]

    # --- every rank: storage_writer.write_data
    infos, results, files = [], [], {}
    for r, plan in enumerate(central):
        rk = ranks[r]
        count = 0

        def gen_file():
            nonlocal count
            name = f"{plan.storage_data.prefix}{count}.distcp"
            count += 1
            return name

        queue = []
        if megatron:  # FileSystemWriterAsync.prepare_write_data: no file for an empty bucket
            queue = [(gen_file(), b) for b in _split_megatron(thread_count, plan.items) if b]
        elif single_file_per_rank:
            queue = [(gen_file(), b) for b in _split_by_size_and_type(thread_count, plan.items)]
        else:
            queue = [(gen_file(), [item]) for item in plan.items]
        rank_results = []
        for file_name, bucket in queue:
            storage_key = file_name
            bytes_w = [wi for wi in bucket if wi.type == "BYTE_IO"]
            tensor_w = [wi for wi in bucket if wi.type != "BYTE_IO"]
            if writer in ("current", "dcp-early") and thread_count == 1 and cuda:
                tensor_w.sort(key=_item_size_full)  # _OverlappingCpuLoader.start_loading
            stream = io.BytesIO()
            for wi in (bytes_w + tensor_w) if single_file_per_rank or megatron else bucket:
                offset = stream.tell()
                if wi.type == "BYTE_IO":
                    calls = [b"".join(rk.resolve_bytes(wi.index.fqn))]  # one write of getbuffer()
                else:
                    calls = torch_save_calls(rk.resolve_tensor(wi.index),
                                             torch_version="1.13" if writer == "shard-1.13" else "2.6")
                descriptors = [_descriptor(ZSTD_DESCRIPTOR_NAME)] if zstd else []
                stream.write(zstd_stream(calls) if zstd else b"".join(calls))
                length = stream.tell() - offset
                if writer == "shard-1.13":
                    info = C.StorageInfo(storage_key, offset, length)
                else:
                    info = C.StorageInfo(storage_key, offset, length,
                                         transform_descriptors=None if len(descriptors) == 0 else descriptors)
                rank_results.append(_WriteResult(index=wi.index, size_in_bytes=length, storage_data=info))
                infos.append(ItemInfo(wi.index.fqn, None if wi.type == "BYTE_IO" else tuple(wi.index.offset),
                                      None if wi.type == "BYTE_IO" else tuple(wi.tensor_data.chunk.sizes),
                                      file_name, offset, length, r, descriptors or None))
            with open(os.path.join(folder, file_name), "wb") as f:
                f.write(stream.getvalue())
            files[file_name] = len(stream.getvalue())
        results.append(rank_results)

    # --- storage_writer.finish (the coordinator, or every rank without collectives)
    def finish(md, all_results, rank=None):
        if C is CURRENT:
            md.version = CURRENT_DCP_VERSION
        storage_md = {}
        for wr_list in all_results:
            storage_md.update({wr.index: wr.storage_data for wr in wr_list})
        md.storage_data = storage_md
        if C is CURRENT:  # FileSystemWriter.checkpoint_id is a Path; Megatron's is a str
            md.storage_meta = C.StorageMeta(checkpoint_id=checkpoint_id if megatron else pathlib.Path(checkpoint_id),
                                            save_id=_uuid4(rng))
        if C is DCP_EARLY:
            for k in ("storage_meta", "version"):
                md.__dict__.pop(k, None)
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(md, f)
        return name

    if per_rank_metadata:
        metadata_files = [finish(metadatas[r], [results[r]], rank=r) for r in range(world_size)]
    else:
        metadata_files = [finish(metadata, results if no_dist else [_roundtrip(res) for res in results])]

    if megatron:
        common = common_state if common_state is not None else {
            "iteration": 10, "checkpoint_version": 3.0, "num_floating_point_operations_so_far": 0}
        with open(os.path.join(folder, "common.pt"), "wb") as f:  # torch.save(common, path)
            f.write(torch_save_bytes(common, archive_name="common"))
        with open(os.path.join(folder, "metadata.json"), "w") as f:  # json.dump(asdict(config), f)
            json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                       "common_backend": "torch", "common_backend_version": 1}, f)

    tensors, objects = {}, {}
    for rk in ranks:
        for fqn, v in rk.flat.items():
            if isinstance(v, (DT, Chunks)):
                tensors.setdefault(fqn, v.tensor)
            elif isinstance(v, torch.Tensor):
                tensors.setdefault(fqn, v)
            elif isinstance(v, RankOnly):
                objects.setdefault(fqn, v.value)
            else:
                objects.setdefault(fqn, v)
    return DcpFixture(folder, world_size, flavor, tensors, objects, infos, files, metadata_files, megatron)


# =============================================================================================
# Reference reader: restricted unpickling of .metadata, assembly of every tensor
# =============================================================================================

def _safe_getattr(cls, name):
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and cls in _ALLOWED_ENUMS and name in cls.__members__:
        return getattr(cls, name)
    raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not allowed")


_ALLOWED_ENUMS = {CURRENT.MemFormat, _SHARD_MEMFORMAT}
_ALLOWED = {}
for _c in (CURRENT, SHARD_113):
    for _k in ("Chunk", "TensorMD", "BytesMD", "StorageMeta", "Metadata", "Index", "TP", "MemFormat",
               "StorageInfo", "MCoreMetadata"):
        _obj = getattr(_c, _k)
        if _obj is not None:
            _ALLOWED[(_obj.__module__, _obj.__qualname__)] = _obj
_ALLOWED[(_SHARD_TP.__module__, "TensorProperties")] = _SHARD_TP
_ALLOWED[(_SHARD_MEMFORMAT.__module__, "MEM_FORMAT_ENCODING")] = _SHARD_MEMFORMAT
for _name in ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
              "complex64", "complex128"):
    _ALLOWED[("torch", _name)] = getattr(torch, _name)
_ALLOWED[("torch", "Size")] = torch.Size
_ALLOWED[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
_ALLOWED[("pathlib", "PosixPath")] = pathlib.PosixPath
_ALLOWED[("builtins", "getattr")] = _safe_getattr


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles .metadata: only the DCP classes (stand-ins), torch dtypes/Size/layouts, PosixPath
    and getattr on DCP's memory-format enums. Anything else (os.system...) raises, unrun."""

    def find_class(self, module, name):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in .metadata") from None


def load_metadata(path):
    with open(path, "rb") as f:
        return RestrictedUnpickler(f).load()


def metadata_paths(folder):
    if os.path.exists(os.path.join(folder, ".metadata")):
        return [os.path.join(folder, ".metadata")]
    names = [n for n in os.listdir(folder) if n.startswith("__") and n.endswith(".metadata")]
    names.sort(key=lambda n: int(n[2:-len(".metadata")]))
    if not names:
        raise FileNotFoundError(f"{folder}: no .metadata")
    return [os.path.join(folder, n) for n in names]


def read_metadata(folder):
    """[(metadata object, path)] for .metadata, or for every __<rank>.metadata."""
    return [(load_metadata(p), p) for p in metadata_paths(folder)]


def _is_tensor_md(md):
    return hasattr(md, "chunks") and hasattr(md, "properties")


def read_item(folder, info):
    """The bytes of one item (a torch.save archive), undoing its transforms."""
    with open(os.path.join(folder, info.relative_path), "rb") as f:
        f.seek(info.offset)
        data = f.read(info.length)
    if len(data) != info.length:
        raise ValueError(f"{info.relative_path}: item at {info.offset} is cut short")
    for d in reversed(list(getattr(info, "transform_descriptors", None) or ())):
        name, _, version = d.partition("/")
        if name == ZSTD_DESCRIPTOR_NAME and version.partition(".")[0] == "1":
            data = zstd_decompress(data)
        else:
            raise ValueError(f"unknown transform {d!r}")
    return data


def _storage_lookup(storage_data):
    out = {}
    for idx, info in storage_data.items():
        key = (idx.fqn, None if idx.offset is None else tuple(idx.offset))
        out.setdefault(key, []).append(info)
    return out


def reference_assemble(folder, strict=True):
    """fqn -> full tensor: full[chunk slices] = torch.load(item). With strict, every chunk must
    load with its metadata's dtype and shape and the chunks must tile each tensor exactly
    (identical duplicates, as per-rank metadata files have for replicated values, are allowed)."""
    out = {}
    sizes, dtypes, chunks = {}, {}, {}
    for md, _ in read_metadata(folder):
        lookup = _storage_lookup(md.storage_data)
        for fqn, entry in md.state_dict_metadata.items():
            if not _is_tensor_md(entry):
                continue
            if fqn in sizes and (sizes[fqn] != tuple(entry.size) or dtypes[fqn] != entry.properties.dtype):
                raise ValueError(f"{fqn}: metadata files disagree")
            sizes[fqn], dtypes[fqn] = tuple(entry.size), entry.properties.dtype
            for c in entry.chunks:
                key = (fqn, tuple(c.offsets))
                infos = lookup.get(key)
                if not infos:
                    raise ValueError(f"{fqn}: chunk {list(c.offsets)} has no storage entry")
                chunks.setdefault(fqn, {}).setdefault(key[1], (tuple(c.sizes), infos[0]))
    for fqn, size in sizes.items():
        full = torch.empty(size, dtype=dtypes[fqn])
        seen = torch.zeros(size, dtype=torch.int32)
        for offsets, (csizes, info) in chunks.get(fqn, {}).items():
            t = torch.load(io.BytesIO(read_item(folder, info)), weights_only=True)
            if strict and (t.dtype != dtypes[fqn] or tuple(t.shape) != csizes):
                raise ValueError(f"{fqn}: item {list(offsets)} is {t.dtype} {list(t.shape)}, metadata says "
                                 f"{dtypes[fqn]} {list(csizes)}")
            _narrow(full, offsets, csizes).copy_(t)
            _narrow(seen, offsets, csizes).add_(1)
        if strict and not bool((seen == 1).all()):
            raise ValueError(f"{fqn}: chunks do not tile the tensor (hole or overlap)")
        out[fqn] = full
    return out


def reference_objects(folder):
    """fqn -> value of every BYTE_IO item (torch.load, not weights_only: they are objects)."""
    out = {}
    for md, _ in read_metadata(folder):
        lookup = _storage_lookup(md.storage_data)
        for fqn, entry in md.state_dict_metadata.items():
            if _is_tensor_md(entry) or fqn in out:
                continue
            (info, *_) = lookup[(fqn, None)]
            out[fqn] = torch.load(io.BytesIO(read_item(folder, info)))
    return out


def storage_entries(folder):
    """[(fqn, offsets or None, _StorageInfo)] of every metadata file."""
    out = []
    for md, _ in read_metadata(folder):
        for idx, info in md.storage_data.items():
            out.append((idx.fqn, None if idx.offset is None else tuple(idx.offset), info))
    return out


# =============================================================================================
# Corruption makers
# =============================================================================================

def _rewrite_metadata(folder, edit, path=None):
    path = path or metadata_paths(folder)[0]
    md = load_metadata(path)
    edit(md)
    with open(path, "wb") as f:
        pickle.dump(md, f)
    return md


def _find_entry(md, fqn, offsets=None):
    for idx, info in md.storage_data.items():
        if idx.fqn == fqn and (offsets is None or (idx.offset is not None and tuple(idx.offset) == tuple(offsets))):
            return idx, info
    raise KeyError(fqn)


def truncate_distcp(folder, name, keep=None):
    """Cuts a .distcp file (by default in the middle of its last item); returns the fqns of the
    items that no longer fit."""
    path = os.path.join(folder, name)
    size = os.path.getsize(path)
    entries = [(f, o, i) for f, o, i in storage_entries(folder) if i.relative_path == name]
    if keep is None:
        last = max(entries, key=lambda e: e[2].offset)[2]
        keep = last.offset + last.length // 2
    assert keep < size
    with open(path, "r+b") as f:
        f.truncate(keep)
    return sorted({f for f, _, i in entries if i.offset + i.length > keep})


def delete_distcp(folder, name):
    """Removes a .distcp file; returns the fqns whose items it held."""
    os.remove(os.path.join(folder, name))
    return sorted({f for f, _, i in storage_entries(folder) if i.relative_path == name})


def _record_offsets(item_bytes):
    """[(name, data offset, size)] of the zip records inside one (untransformed) item."""
    out = []
    with zipfile.ZipFile(io.BytesIO(item_bytes)) as z:
        for zi in z.infolist():
            n, e = struct.unpack_from("<HH", item_bytes, zi.header_offset + 26)
            out.append((zi.filename.split("/", 1)[1], zi.header_offset + 30 + n + e, zi.file_size))
    return out


def flip_byte_in_item(folder, fqn, offsets=None, record=None):
    """Flips one byte inside an item of `fqn` (its first storage record for a tensor, data.pkl
    for an object, or the named record); returns (file name, absolute offset)."""
    md = load_metadata(metadata_paths(folder)[0]) if len(metadata_paths(folder)) == 1 else None
    if md is not None:
        _, info = _find_entry(md, fqn, offsets)
    else:
        info = next(i for f, o, i in storage_entries(folder) if f == fqn and (offsets is None or o == tuple(offsets)))
    path = os.path.join(folder, info.relative_path)
    with open(path, "r+b") as f:
        f.seek(info.offset)
        item = f.read(info.length)
        if getattr(info, "transform_descriptors", None):
            pos = info.offset + info.length // 2  # inside the compressed stream
        else:
            recs = {name: (off, size) for name, off, size in _record_offsets(item)}
            name = record or ("data/0" if "data/0" in recs else "data.pkl")
            off, size = recs[name]
            pos = info.offset + off + size // 2
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x5A]))
    return info.relative_path, pos


class _Evil:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def hostile_metadata(folder, marker):
    """Replaces .metadata with the real one plus an object whose unpickling would call
    os.system('touch <marker>') (in planner_data). Pickling it runs nothing; loading it would."""
    path = metadata_paths(folder)[0]
    md = load_metadata(path)
    md.planner_data = dict(md.planner_data or {})
    md.planner_data["__evil__"] = _Evil(f"touch {marker}")
    with open(path, "wb") as f:
        pickle.dump(md, f)
    return path


def make_hole(folder, fqn, chunk=-1):
    """Drops one chunk of `fqn` from the metadata (and its storage entry): a hole; the item's
    bytes stay in their file, referenced by nothing."""
    removed = {}

    def edit(md):
        entry = md.state_dict_metadata[fqn]
        c = entry.chunks.pop(chunk)
        idx, info = _find_entry(md, fqn, c.offsets)
        del md.storage_data[idx]
        removed["offsets"], removed["file"] = tuple(c.offsets), info.relative_path

    _rewrite_metadata(folder, edit)
    return removed


def set_metadata_dtype(folder, fqn, dtype):
    """The metadata says `dtype` for `fqn` while its items hold another dtype."""
    def edit(md):
        md.state_dict_metadata[fqn].properties.dtype = dtype
    _rewrite_metadata(folder, edit)


def set_transform(folder, fqn, descriptors, offsets=None):
    """Gives one item of `fqn` these transform_descriptors (e.g. an unknown one)."""
    def edit(md):
        _, info = _find_entry(md, fqn, offsets)
        info.transform_descriptors = list(descriptors)
    _rewrite_metadata(folder, edit)


def replace_item(folder, fqn, offsets, value):
    """Rewrites the .distcp holding this chunk with torch.save(value) in its place (e.g. another
    dtype or shape than the metadata says); later items move and their entries follow."""
    def edit(md):
        idx, info = _find_entry(md, fqn, offsets)
        path = os.path.join(folder, info.relative_path)
        with open(path, "rb") as f:
            old = f.read()
        new = torch_save_bytes(value)
        delta = len(new) - info.length
        with open(path, "wb") as f:
            f.write(old[:info.offset] + new + old[info.offset + info.length:])
        for other in md.storage_data.values():
            if other.relative_path == info.relative_path and other.offset > info.offset:
                other.offset += delta
        info.length = len(new)
    _rewrite_metadata(folder, edit)


# =============================================================================================
# Example state dicts (FSDP2 + TP as torchtitan lays them out, get_state_dict naming)
# =============================================================================================

def _adamw_group(names, lr=3e-4):
    return {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-08, "weight_decay": 0.1, "amsgrad": False,
            "foreach": None, "maximize": False, "capturable": False, "differentiable": False,
            "fused": None, "initial_lr": lr, "params": list(names)}


def training_state(params, place, *, seed=0, model_dtype=torch.bfloat16, step=10, extra=True):
    """{**model, 'optim': get_optimizer_state_dict(...), 'lr_scheduler': ..., 'train_state': ...}:
    model fqns are `model.<name>`; the optimizer's state is keyed by the same fqns, with fp32
    exp_avg/exp_avg_sq placed like their parameter and a replicated 0-d fp32 `step`.
    `params` maps name -> shape (or a tensor), `place(name, tensor)` gives DT/Chunks/tensor."""
    g = torch.Generator().manual_seed(seed)
    model, optim_state, names = {}, {}, []
    for name, shape in params.items():
        fqn = f"model.{name}"
        if isinstance(shape, torch.Tensor):
            model[fqn] = place(name, shape)
            continue
        w = torch.randn(*shape, generator=g).to(model_dtype)
        model[fqn] = place(name, w)
        if not w.is_floating_point():
            continue
        names.append(fqn)
        optim_state[fqn] = {
            "step": torch.tensor(float(step)),
            "exp_avg": place(name, torch.randn(*shape, generator=g) * 1e-3),
            "exp_avg_sq": place(name, torch.rand(*shape, generator=g) * 1e-6),
        }
    state = dict(model)
    state["optim"] = {"state": optim_state, "param_groups": [_adamw_group(names)]}
    state["lr_scheduler"] = {"base_lrs": [3e-4], "last_epoch": step, "verbose": False, "_step_count": step + 1,
                             "_get_lr_called_within_step": False, "_last_lr": [3e-4 * step / 100],
                             "lr_lambdas": [None]}
    state["train_state"] = {"step": step, "tokens_seen": torch.tensor(step * 4096, dtype=torch.int64)}
    if extra:
        state["extra"] = {"run_config": RunConfig(), "mode": Mode.EVAL}
    return state


def fsdp_tp_state(seed=0, model_dtype=torch.bfloat16, layers=2, hidden=24, vocab=40, ffn=40):
    """4 ranks on a (dp=2, tp=2) mesh: 2-D grid shards [Shard(0), Shard(1)], nested row shards
    [Shard(0), Shard(0)], [Shard(0), Replicate] (each chunk on two ranks: deduplicated), plain
    replicated tensors (int64 buffer, 0-d steps), BYTE_IO objects."""
    mesh = (2, 2)
    params = {"tok_embeddings.weight": (vocab, hidden)}
    for i in range(layers):
        params[f"layers.{i}.attention_norm.weight"] = (hidden,)
        params[f"layers.{i}.attn.wq.weight"] = (hidden, hidden)
        params[f"layers.{i}.attn.wo.weight"] = (hidden, hidden)
        params[f"layers.{i}.ffn.w1.weight"] = (ffn, hidden)
    params["norm.weight"] = (hidden,)
    params["output.weight"] = (vocab, hidden)
    params["freqs_idx"] = torch.arange(16, dtype=torch.int64)

    def place(name, t):
        if name.endswith("attention_norm.weight") or t.dtype == torch.int64:
            return t  # a plain tensor on every rank
        if name == "norm.weight":
            return DT(t, mesh, [("S", 0), "R"])
        if name.endswith(("wo.weight", "tok_embeddings.weight")):
            return DT(t, mesh, [("S", 0), ("S", 1)])
        return DT(t, mesh, [("S", 0), ("S", 0)])

    return training_state(params, place, seed=seed, model_dtype=model_dtype)


def uneven_state(world_size=3, seed=1, model_dtype=torch.float32):
    """A 1-D mesh of 3 ranks: uneven rows (10 -> 4,4,2), uneven columns (7x10 -> 4,4,2 cols),
    fp32 and bf16 weights."""
    params = {"embed.weight": (10, 6), "proj.weight": (7, 10), "head.weight": (5, 9), "bias": (11,)}

    def place(name, t):
        if name == "proj.weight":
            return Shard(t, world_size, dim=1)
        return Shard(t, world_size, dim=0)

    state = training_state(params, place, seed=seed, model_dtype=model_dtype, extra=False)
    g = torch.Generator().manual_seed(seed + 1)
    state["model.lm_bf16.weight"] = Shard(torch.randn(10, 4, generator=g).to(torch.bfloat16), world_size, 0)
    return state


def megatron_state(world_size=2, seed=2):
    """Megatron-Core's torch_dist view: flat keys (ShardedTensor keys, layers stacked on dim 0),
    TP shards on a 1-D mesh, per-rank ShardedObjects (BYTE_IO lists), optimizer states."""
    g = torch.Generator().manual_seed(seed)
    L, h, v = 2, 16, 24
    shapes = {"embedding.word_embeddings.weight": ((v, h), 0),
              "decoder.layers.self_attention.linear_qkv.weight": ((L, 3 * h, h), 1),
              "decoder.layers.self_attention.linear_proj.weight": ((L, h, h), 2),
              "decoder.final_layernorm.weight": ((h,), None),
              "output_layer.weight": ((v, h), 0)}
    state = {}
    for key, (shape, dim) in shapes.items():
        w = torch.randn(*shape, generator=g).to(torch.bfloat16)
        state[key] = w if dim is None else Shard(w, world_size, dim)
    for key, (shape, dim) in shapes.items():
        for s in ("exp_avg", "exp_avg_sq", "fp32_param"):
            t = torch.randn(*shape, generator=g)
            state[f"optimizer.state.{s}.{key}"] = t if dim is None else Shard(t, world_size, dim)
    return state


def make_megatron_checkpoint(folder, world_size=2, thread_count=2, seed=2, **kw):
    """A Megatron-Core torch_dist folder: common.pt, metadata.json, .metadata (MCoreMetadata) and
    up to thread_count files per rank; every rank holds one ShardedObject (a torch.save'd list
    under its unique key)."""
    state = megatron_state(world_size, seed)
    for r in range(world_size):
        state[f"rng_state/shard_0.{r}_1.{world_size}"] = RankOnly(r, [{"random_rng_state": [r, 7], "iteration": 10}])
    return make_dcp_checkpoint(folder, state, world_size=world_size, megatron=True, thread_count=thread_count,
                               seed=seed, **kw)


def standard_cases():
    """name -> function(folder) -> DcpFixture: every healthy variant the tests run."""
    def flat_113(folder):  # ShardedTensors (no replication), a flat state as torch 1.13 wants
        flat, _ = flatten_state_dict(uneven_state(seed=5))
        return make_dcp_checkpoint(folder, flat, world_size=3, legacy_module_paths=True, cuda=False)

    return {
        "fsdp_tp_bf16": lambda d: make_dcp_checkpoint(d, fsdp_tp_state(), world_size=4),
        "uneven_fp32": lambda d: make_dcp_checkpoint(d, uneven_state(), world_size=3, cuda=False),
        "zstd": lambda d: make_dcp_checkpoint(d, fsdp_tp_state(seed=3), world_size=4, zstd=True),
        "two_threads": lambda d: make_dcp_checkpoint(d, uneven_state(seed=4), world_size=3, thread_count=2),
        "per_rank_metadata": lambda d: make_dcp_checkpoint(d, uneven_state(seed=6), world_size=3,
                                                           per_rank_metadata=True),
        "dcp_early": lambda d: make_dcp_checkpoint(d, fsdp_tp_state(seed=7), world_size=4, flavor="dcp-early"),
        "legacy_shard_113": flat_113,
        "single_process": lambda d: make_dcp_checkpoint(d, uneven_state(world_size=1, seed=8), world_size=1),
        "megatron": lambda d: make_megatron_checkpoint(d),
    }


# =============================================================================================
# Cross-check: torch 1.13's own writer (torch.distributed._shard.checkpoint, on disk here)
# =============================================================================================

# torch 1.13's _shard package does not import on Python 3.11 (a dataclass whose default is a
# TensorProperties instance); the runner lets that one default through, then runs the real
# save_state_dict. With world_size > 1 every rank is a process of a gloo group (file store,
# loopback), so plans and results really go through gather/scatter.
REAL_TORCH_113_SAVE = r"""
import dataclasses, sys
_orig = dataclasses._get_field
_patched = []
def _get_field(cls, a_name, a_type, *rest):
    try:
        return _orig(cls, a_name, a_type, *rest)
    except ValueError as e:
        if "mutable default" not in str(e):
            raise
        d = cls.__dict__[a_name]
        klass = (d.default if isinstance(d, dataclasses.Field) else d).__class__
        klass.__hash__ = object.__hash__
        _patched.append(klass)
        return _orig(cls, a_name, a_type, *rest)
dataclasses._get_field = _get_field
import torch
import torch.distributed as dist
import torch.distributed._shard.checkpoint as dcp
from torch.distributed._shard.sharded_tensor import init_from_local_shards, Shard
from torch.distributed._shard.metadata import ShardMetadata
dataclasses._get_field = _orig
for k in _patched:
    k.__hash__ = None
rank, ws, out, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if ws > 1:
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=ws)

def sharded(full, dim):
    pieces = list(torch.chunk(full, ws, dim))
    off, mds = 0, []
    for p in pieces:
        o = [0] * full.dim()
        o[dim] = off
        off += p.shape[dim]
        mds.append((o, list(p.shape)))
    o, s = mds[rank]
    return init_from_local_shards([Shard(pieces[rank].contiguous().clone(), ShardMetadata(o, s, f"rank:{rank}/cpu"))],
                                  *full.shape)

@@STATE@@
dcp.save_state_dict(state, dcp.FileSystemWriter(out, single_file_per_rank=ws > 1), no_dist=ws == 1)
if ws > 1:
    dist.destroy_process_group()
"""

# The same state on both sides: `sharded(full, dim)` is a ShardedTensor there and Shard() here.
REAL_TORCH_113_STATE = r"""
g = torch.Generator().manual_seed(0)
w = torch.randn(10, 3, generator=g)
v = torch.randn(4, 7, generator=g).to(torch.bfloat16)
if ws > 1:
    state = {"model.w": sharded(w, 0), "model.v": sharded(v, 1), "optim.step": torch.tensor(3.0),
             "idx": torch.arange(6), "lr": 0.5, "names": ["a", "b"]}
else:
    state = {"model.w": w, "model.v": v, "optim.step": torch.tensor(10.0), "idx": torch.arange(6),
             "lr": 0.001, "name": "run", "groups": [1, 2]}
"""


def real_torch113_save(out, world_size, workdir, timeout=120):
    """Runs torch 1.13's real DCP writer on REAL_TORCH_113_STATE with world_size processes."""
    import subprocess
    script = os.path.join(workdir, "real_torch113_dcp.py")
    with open(script, "w") as f:
        f.write(REAL_TORCH_113_SAVE.replace("@@STATE@@", REAL_TORCH_113_STATE))
    store = os.path.join(workdir, f"gloo_store_{world_size}_{os.getpid()}")
    if os.path.exists(store):
        os.remove(store)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONDONTWRITEBYTECODE="1")
    procs = [subprocess.Popen([sys.executable, script, str(r), str(world_size), out, store], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(world_size)]
    logs = [p.communicate(timeout=timeout)[0].decode(errors="replace") for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("torch 1.13's writer failed:\n" + "\n".join(logs))


def emulated_torch113_save(out, world_size):
    """make_dcp_checkpoint of REAL_TORCH_113_STATE, as torch 1.13 would write it."""
    ns = {"torch": torch, "ws": world_size, "sharded": lambda full, dim: Shard(full, world_size, dim)}
    exec(REAL_TORCH_113_STATE, ns)
    return make_dcp_checkpoint(out, ns["state"], world_size=world_size, legacy_module_paths=True, cuda=False,
                               single_file_per_rank=world_size > 1)


def assert_fixture_consistent(fx):
    """The reference reader gives back exactly what was written."""
    got = reference_assemble(fx.folder)
    assert set(got) == set(fx.tensors), (sorted(got), sorted(fx.tensors))
    for k, want in fx.tensors.items():
        have = got[k]
        assert have.dtype == want.dtype and have.shape == want.shape, k
        assert torch.equal(have.view(-1).view(torch.uint8) if have.numel() else have,
                           want.contiguous().view(-1).view(torch.uint8) if want.numel() else want), k
    objs = reference_objects(fx.folder)
    assert set(objs) == set(fx.objects), (sorted(objs), sorted(fx.objects))
    for k, v in fx.objects.items():
        assert objs[k] == v, (k, objs[k], v)
    for name, size in fx.files.items():
        assert os.path.getsize(os.path.join(fx.folder, name)) == size


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else "dcp_example"
    for case, make in standard_cases().items():
        fx = make(os.path.join(root, case))
        assert_fixture_consistent(fx)
        print(f"{fx.folder}: {len(fx.tensors)} tensors, {len(fx.objects)} objects, "
              f"{len(fx.items)} items in {len(fx.files)} files, {sum(fx.files.values())} bytes")
