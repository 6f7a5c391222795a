"""torch.distributed.checkpoint (DCP) folders: `.metadata` + `__<rank>_<n>.distcp` as written by
FSDP2/torchtitan (torch >= 2.6), older torch (2.0-2.3, 1.13) and Megatron-Core `torch_dist`.

The folders come from dcp_fixtures.py, which re-enacts PyTorch's writer byte for byte. What it
imitates, from the sources named in its docstring:
- `.metadata`: pickle protocol 4 (Python 3.11's default; `pickle.dump(metadata, f)`) of
  Metadata(state_dict_metadata, planner_data, storage_data, storage_meta, version="1.0.0"),
  dataclasses as NEWOBJ + BUILD(dict); TensorProperties' state is the tuple (dtype, layout,
  requires_grad, getattr(_MEM_FORMAT_ENCODING, 'TORCH_CONTIGUOUS_FORMAT'), pin_memory);
  storage_data maps MetadataIndex(fqn, offset, index) to _StorageInfo(relative_path, offset,
  length[, transform_descriptors]) (None fields dropped by its __getstate__); storage_meta
  holds StorageMeta(checkpoint_id=PosixPath, save_id=uuid4). Local plans, the global plan and
  the write results go through pickle (gather/scatter) as in a real run, so memo sharing in the
  pickle is the real one (checked against torch 1.13's own writer: byte-identical).
- `.distcp`: per rank one file per writer thread (`__<rank>_<n>.distcp`); objects (BYTE_IO,
  torch.save'd into a BytesIO) first, then tensor chunks, smallest first on a CUDA machine
  (_OverlappingCpuLoader sorts by the FULL tensor's size); each item a complete torch.save zip
  (archive folder "archive") of the compact chunk (views with larger storages are cloned);
  torch >= 2.6 record layout with .format_version, .storage_alignment, byteorder and
  .data/serialization_id (libstdc++ hash order re-enacted).
- Replicated values (plain tensors, Replicate placements, objects) are written once: each goes to
  the rank whose plan is smallest so far (_dedup_save_plans; sizes are FULL tensor sizes).
- Optimizer state as get_state_dict gives it to dcp.save and DCP flattens it:
  optim.state.<param fqn>.{step,exp_avg,exp_avg_sq}, optim.param_groups.0.<key>.
- zstd: FileSystemWriter(_extensions=[ZStandard()]): every item is one zstd frame of the
  torch.save bytes (zstandard stream_writer), transform_descriptors ["stream.zstd/1"].
- use_collectives=False: every rank writes `__<rank>.metadata` for its own items; values that
  are replicated are then written (and described) by every rank.
- Megatron-Core torch_dist: MCoreMetadata (Metadata + mcore_data) from
  megatron.core.dist_checkpointing.strategies.torch, FileSystemWriterAsync buckets (two files per
  rank), common.pt (torch.save to a path: archive folder "common"), metadata.json.

DcpFixtureTest needs no ckptool: it proves the fixtures and the reference reader. The other
classes test the CLI on them (`ckptool inspect/verify/export/strip DIR`).

Assumed `inspect --json` document for a DCP folder (one document for the folder):
  {"format": "dcp",
   "tensors": [{"name", "dtype": "float32"|"bfloat16"|"int64"..., "shape": [...],
                "chunks": n (distinct chunks), "bytes": numel * element size}],
   "objects": [{"name", "bytes": n}],
   "rollup": [{"key": first fqn component, "bytes": sum of its tensors' and objects' bytes,
               "tensors": n}],
   "files": [{"path": "__0_0.distcp", "bytes": file size, "items": items stored in it}]}
"""
import dataclasses
import io
import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest
import zipfile

import numpy as np
import torch

import dcp_fixtures as dcp
from ckpt_testlib import CKPTOOL, CkptTestCase, read_bytes, read_safetensors, run

ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64", torch.float16: "F16"}
HEALTHY = dcp.standard_cases()
# Some fixtures' extra state holds a dataclass of the test's own module (dcp_fixtures.py).
TRUST = ("--trust", "ckpt_enums")


def raw(t):
    """A tensor's bytes (0-d and bf16 included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def output(p):
    return p.stdout + p.stderr


class _Cases:
    """Every healthy fixture, built once per test class, copied before a test changes one."""
    root = None
    built = {}

    @classmethod
    def build_all(cls):
        if cls.root is None:
            cls.root = tempfile.mkdtemp(prefix="dcp_cases_")
            for name, make in HEALTHY.items():
                cls.built[name] = make(os.path.join(cls.root, name))
        return cls.built

    @classmethod
    def cleanup(cls):
        if cls.root:
            shutil.rmtree(cls.root, ignore_errors=True)
            cls.root, cls.built = None, {}


def tearDownModule():
    _Cases.cleanup()


def copy_case(test, name, dest=None):
    fx = _Cases.build_all()[name]
    dest = dest or test.path(name)
    shutil.copytree(fx.folder, dest)
    return fx, dest


def expected_chunks(folder):
    """fqn -> set of chunk offsets over every metadata file."""
    out = {}
    for md, _ in dcp.read_metadata(folder):
        for fqn, e in md.state_dict_metadata.items():
            if hasattr(e, "chunks"):
                out.setdefault(fqn, set()).update(tuple(c.offsets) for c in e.chunks)
    return out


def pickle_globals(data):
    """(module, name) of every GLOBAL / STACK_GLOBAL in a pickle."""
    import pickletools
    out, pushed, memo = set(), [], {}
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            pushed.append(arg)
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            pushed.append(memo.get(int(arg)))
        elif op.name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[int(arg)] = pushed[-1] if pushed else None
        elif op.name == "STACK_GLOBAL":
            out.add((pushed[-2], pushed[-1]))
            pushed.append(None)
        elif op.name == "GLOBAL":
            out.add(tuple(arg.split(" ", 1)))
            pushed.append(None)
        elif op.name not in ("FRAME", "PROTO", "STOP", "MARK"):
            pushed.append(None)
    return out


# =============================================================================================
# The fixtures and the reference reader (no ckptool)
# =============================================================================================

class DcpFixtureTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)

    def test_zip_writer_reproduces_torch_save(self):
        """The miniz re-enactment gives torch 1.13's torch.save bytes exactly; the torch >= 2.6
        layout adds its records in torch's order, 64-byte aligned, and loads."""
        objs = [torch.arange(4.0), torch.tensor(2.5), torch.zeros(3, 5, dtype=torch.bfloat16),
                {"a": torch.ones(2, dtype=torch.int64), "b": [1, "x", None]}, {"lr": 3e-4}]
        for obj in objs:
            buf = io.BytesIO()
            torch.save(obj, buf)
            self.assertEqual(dcp.torch_save_bytes(obj, torch_version="1.13"), buf.getvalue())
            data = dcp.torch_save_bytes(obj)
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                self.assertIsNone(z.testzip())
                names = [i.filename for i in z.infolist()]
                storages = [n for n in names if n.startswith("archive/data/")]
                self.assertEqual(names, ["archive/data.pkl", "archive/.format_version", "archive/.storage_alignment",
                                         "archive/byteorder", *storages, "archive/version",
                                         "archive/.data/serialization_id"])
                self.assertEqual(z.read("archive/.storage_alignment"), b"64")
                self.assertEqual(len(z.read("archive/.data/serialization_id")), 40)
                for i in z.infolist():
                    n, e = struct.unpack_from("<HH", data, i.header_offset + 26)
                    self.assertEqual((i.header_offset + 30 + n + e) % 64, 0, i.filename)
            loaded = torch.load(io.BytesIO(data))
            if isinstance(obj, torch.Tensor):
                self.assertEqual(raw(loaded), raw(obj))

    def test_serialization_id_follows_libstdcxx(self):
        """std::hash<std::string> and unordered_set iteration order, against the C++ library."""
        cxx = shutil.which("c++") or shutil.which("g++")
        if cxx is None:
            self.skipTest("no C++ compiler")
        src = self.path("h.cpp")
        with open(src, "w") as f:
            f.write('#include <iostream>\n#include <string>\n#include <unordered_set>\n'
                    'int main(int c, char** v) { std::unordered_set<std::string> s;\n'
                    '  for (int i = 1; i < c; ++i) s.insert(v[i]);\n'
                    '  for (auto& n : s) std::cout << n << " " << std::hash<std::string>{}(n) << "\\n"; }\n')
        subprocess.run([cxx, "-O0", "-o", self.path("h"), src], check=True)
        for names in (["data.pkl", ".format_version", ".storage_alignment", "byteorder", "data/0", "version"],
                      ["data.pkl", ".format_version", ".storage_alignment", "byteorder", "version"],
                      ["x" * i for i in range(1, 20)] + [f"data/{i}" for i in range(12)]):
            out = subprocess.run([self.path("h"), *names], capture_output=True, text=True, check=True).stdout
            s = dcp.StdUnorderedSet()
            for n in names:
                s.add(n)
            self.assertEqual([line.split() for line in out.splitlines()], [[n, str(s.codes[n])] for n in s])

    def test_byte_identical_to_torch_113_writer(self):
        """torch 1.13's own torch.distributed._shard.checkpoint writer (one process, and three
        gloo ranks with ShardedTensors) writes exactly the emulation's files."""
        for ws in (1, 3):
            with self.subTest(world_size=ws):
                real, mine = self.path(f"real{ws}"), self.path(f"mine{ws}")
                dcp.real_torch113_save(real, ws, self.tmp)
                dcp.emulated_torch113_save(mine, ws)
                names = sorted(os.listdir(real))
                self.assertEqual(names, sorted(os.listdir(mine)))
                for n in names:
                    with open(os.path.join(real, n), "rb") as a, open(os.path.join(mine, n), "rb") as b:
                        self.assertEqual(a.read(), b.read(), n)

    def test_reference_reader_gives_back_the_inputs(self):
        for name, fx in _Cases.build_all().items():
            with self.subTest(case=name):
                dcp.assert_fixture_consistent(fx)
                got = dcp.reference_assemble(fx.folder)
                self.assertEqual(set(got), set(fx.tensors))
                for k, t in fx.tensors.items():
                    self.assertEqual((got[k].dtype, tuple(got[k].shape)), (t.dtype, tuple(t.shape)), k)
                    self.assertEqual(raw(got[k]), raw(t), k)
                self.assertEqual(dcp.reference_objects(fx.folder), fx.objects)

    def test_items_fill_each_file_and_are_compact_torch_saves(self):
        for name, fx in _Cases.build_all().items():
            with self.subTest(case=name):
                by_file = {}
                for fqn, offsets, info in dcp.storage_entries(fx.folder):
                    by_file.setdefault(info.relative_path, {})[info.offset] = (fqn, offsets, info)
                self.assertEqual(set(by_file), {f for f, size in fx.files.items() if size})
                for fname, entries in by_file.items():
                    pos = 0
                    for off in sorted(entries):
                        self.assertEqual(off, pos, f"{fname}: gap or overlap at {off}")
                        fqn, offsets, info = entries[off]
                        pos = off + info.length
                        item = dcp.read_item(fx.folder, info)
                        self.assertEqual(item[:4], b"PK\x03\x04")
                        with zipfile.ZipFile(io.BytesIO(item)) as z:
                            self.assertIsNone(z.testzip())
                            prefix = z.infolist()[0].filename.split("/")[0]
                            self.assertEqual(prefix, "archive")
                            if offsets is not None:  # one storage of exactly the chunk's bytes
                                t = torch.load(io.BytesIO(item), weights_only=True)
                                data = [i for i in z.infolist() if i.filename.startswith("archive/data/")]
                                self.assertEqual(len(data), 1)
                                self.assertEqual(data[0].file_size, t.numel() * t.element_size())
                                self.assertTrue(t.is_contiguous() and t.storage_offset() == 0)
                    self.assertEqual(pos, os.path.getsize(os.path.join(fx.folder, fname)))

    def test_chunking(self):
        cases = _Cases.build_all()
        chunks = expected_chunks(cases["uneven_fp32"].folder)
        md = dcp.read_metadata(cases["uneven_fp32"].folder)[0][0].state_dict_metadata
        sizes = lambda fqn, d: sorted((tuple(c.offsets)[d], tuple(c.sizes)[d]) for c in md[fqn].chunks)  # noqa: E731
        self.assertEqual(sizes("model.embed.weight", 0), [(0, 4), (4, 4), (8, 2)])  # 10 rows on 3 ranks
        self.assertEqual(sizes("model.proj.weight", 1), [(0, 4), (4, 4), (8, 2)])  # 10 columns
        self.assertEqual(sizes("model.bias", 0), [(0, 4), (4, 4), (8, 3)])
        self.assertEqual(chunks["optim.state.model.embed.weight.step"], {()})  # 0-d, written once
        grid = dcp.read_metadata(cases["fsdp_tp_bf16"].folder)[0][0].state_dict_metadata
        emb = grid["model.tok_embeddings.weight"]
        self.assertEqual(sorted((tuple(c.offsets), tuple(c.sizes)) for c in emb.chunks),
                         [((0, 0), (20, 12)), ((0, 12), (20, 12)), ((20, 0), (20, 12)), ((20, 12), (20, 12))])
        self.assertEqual(sorted(tuple(c.offsets) for c in grid["model.layers.0.attn.wq.weight"].chunks),
                         [(0, 0), (6, 0), (12, 0), (18, 0)])  # [Shard(0), Shard(0)]
        self.assertEqual(sorted(tuple(c.offsets) for c in grid["model.norm.weight"].chunks), [(0,), (12,)])
        self.assertEqual(emb.properties.dtype, torch.bfloat16)
        self.assertEqual(grid["optim.state.model.tok_embeddings.weight.exp_avg"].properties.dtype, torch.float32)
        self.assertEqual(grid["model.freqs_idx"].properties.dtype, torch.int64)

    def test_replicated_values_are_written_once_spread_over_ranks(self):
        fx = _Cases.build_all()["fsdp_tp_bf16"]
        writers = {}
        for item in fx.items:
            writers.setdefault((item.fqn, item.offsets), []).append(item.rank)
        self.assertTrue(all(len(r) == 1 for r in writers.values()), writers)
        replicated = [k for k in writers if k[0].endswith((".step", "attention_norm.weight", "freqs_idx"))
                      or k[1] is None]
        self.assertGreater(len({writers[k][0] for k in replicated}), 1, "dedup spreads them over ranks")
        for fqn in ("optim.param_groups.0.lr", "optim.param_groups.0.betas", "optim.param_groups.0.params",
                    "lr_scheduler.last_epoch", "train_state.step", "extra.run_config", "extra.mode"):
            self.assertIn(fqn, fx.objects)
        self.assertEqual(fx.objects["optim.param_groups.0.betas"], (0.9, 0.95))

    def test_write_order_in_files(self):
        """Objects first; then tensors smallest first (CUDA loader) or in plan order (CPU)."""
        for name in ("fsdp_tp_bf16", "uneven_fp32"):
            fx = _Cases.build_all()[name]
            for fname in fx.files:
                items = [i for i in fx.items if i.file == fname]
                kinds = [i.kind for i in items]
                self.assertEqual(kinds, sorted(kinds, key=lambda k: k != "bytes"), fname)
                if name == "fsdp_tp_bf16":
                    full = [fx.tensors[i.fqn].numel() * fx.tensors[i.fqn].element_size()
                            for i in items if i.kind == "tensor"]
                    self.assertEqual(full, sorted(full), fname)

    def test_zstd_items_are_frames_of_the_same_bytes(self):
        cases = _Cases.build_all()
        plain = dcp.make_dcp_checkpoint(self.path("plain"), dcp.fsdp_tp_state(seed=3), world_size=4)
        zst = cases["zstd"]
        plain_items = {(i.fqn, i.offsets): i for i in plain.items}
        for item in zst.items:
            self.assertEqual(item.transform, ["stream.zstd/1"])
            with open(os.path.join(zst.folder, item.file), "rb") as f:
                f.seek(item.offset)
                frame = f.read(item.length)
            self.assertEqual(frame[:4], b"\x28\xb5\x2f\xfd")
            p = plain_items[(item.fqn, item.offsets)]
            with open(os.path.join(plain.folder, p.file), "rb") as f:
                f.seek(p.offset)
                want = f.read(p.length)
            self.assertEqual(dcp.zstd_decompress(frame), want, item.fqn)
        entries = dcp.storage_entries(zst.folder)
        self.assertTrue(all(list(i.transform_descriptors) == ["stream.zstd/1"] for _, _, i in entries))
        plain_entries = dcp.storage_entries(plain.folder)
        self.assertTrue(all("transform_descriptors" not in i.__getstate__() for _, _, i in plain_entries))

    def test_metadata_pickles(self):
        """Protocol 4 and exactly the classes each writer generation pickles."""
        cases = _Cases.build_all()
        base = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("builtins", "getattr")}
        cur = "torch.distributed.checkpoint.metadata"
        expected = {
            "fsdp_tp_bf16": base | {(cur, n) for n in ("Metadata", "TensorStorageMetadata", "TensorProperties",
                                                       "_MEM_FORMAT_ENCODING", "ChunkStorageMetadata",
                                                       "BytesStorageMetadata", "MetadataIndex", "StorageMeta")}
            | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("pathlib", "PosixPath"),
               ("torch", "float32"), ("torch", "bfloat16"), ("torch", "int64")},
            "dcp_early": base | {(cur, n) for n in ("Metadata", "TensorStorageMetadata", "ChunkStorageMetadata",
                                                    "BytesStorageMetadata", "MetadataIndex")}
            | {("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"),
               ("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
               ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
               ("torch", "float32"), ("torch", "bfloat16"), ("torch", "int64")},
            "legacy_shard_113": base | {("torch.distributed._shard.checkpoint.metadata", n)
                                        for n in ("Metadata", "TensorStorageMetadata", "ChunkStorageMetadata",
                                                  "BytesStorageMetadata", "MetadataIndex")}
            | {("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"),
               ("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
               ("torch.distributed._shard.checkpoint.filesystem", "_StorageInfo"),
               ("torch", "float32"), ("torch", "bfloat16"), ("torch", "int64")},
        }
        for name, want in expected.items():
            with self.subTest(case=name):
                with open(os.path.join(cases[name].folder, ".metadata"), "rb") as f:
                    data = f.read()
                self.assertEqual(data[:2], b"\x80\x04")
                self.assertEqual(pickle_globals(data), want)
        md = dcp.read_metadata(cases["fsdp_tp_bf16"].folder)[0][0]
        self.assertEqual(list(vars(md)), ["state_dict_metadata", "planner_data", "storage_data", "storage_meta",
                                          "version"])
        self.assertEqual(md.version, "1.0.0")
        self.assertEqual(md.planner_data["optim.state.model.norm.weight.exp_avg"],
                         ("optim", "state", "model.norm.weight", "exp_avg"))
        self.assertEqual(md.planner_data["optim.param_groups.0.lr"], ("optim", "param_groups", 0, "lr"))
        hints = {(k.fqn, tuple(k.offset)): k.index for k in md.storage_data if k.offset is not None}
        for fqn, e in md.state_dict_metadata.items():
            for i, c in enumerate(getattr(e, "chunks", [])):
                self.assertEqual(hints[(fqn, tuple(c.offsets))], i)

    def test_per_rank_metadata_and_megatron(self):
        cases = _Cases.build_all()
        pr = cases["per_rank_metadata"].folder
        self.assertEqual(sorted(n for n in os.listdir(pr) if n.endswith(".metadata")),
                         ["__0.metadata", "__1.metadata", "__2.metadata"])
        step = "optim.state.model.embed.weight.step"
        self.assertEqual(sum(step in md.state_dict_metadata for md, _ in dcp.read_metadata(pr)), 3)
        mg = cases["megatron"]
        self.assertEqual(sorted(mg.files), ["__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp"])
        with open(os.path.join(mg.folder, ".metadata"), "rb") as f:
            globs = pickle_globals(f.read())
        self.assertIn(("megatron.core.dist_checkpointing.strategies.torch", "MCoreMetadata"), globs)
        md = dcp.read_metadata(mg.folder)[0][0]
        self.assertEqual(list(vars(md))[-1], "mcore_data")
        self.assertIsInstance(md.storage_meta.checkpoint_id, str)
        with open(os.path.join(mg.folder, "metadata.json")) as f:
            self.assertEqual(f.read(), '{"sharded_backend": "torch_dist", "sharded_backend_version": 1, '
                                       '"common_backend": "torch", "common_backend_version": 1}')
        with zipfile.ZipFile(os.path.join(mg.folder, "common.pt")) as z:
            self.assertEqual(z.infolist()[0].filename, "common/data.pkl")
        self.assertEqual(torch.load(os.path.join(mg.folder, "common.pt"))["iteration"], 10)
        self.assertEqual(mg.objects["rng_state/shard_0.1_1.2"], [{"random_rng_state": [1, 7], "iteration": 10}])

    def test_corruption_makers_break_what_they_say(self):
        fx, d = copy_case(self, "fsdp_tp_bf16")
        lost = dcp.truncate_distcp(d, "__1_0.distcp")
        self.assertEqual(len(lost), 1)
        with self.assertRaises(ValueError):
            dcp.reference_assemble(d)

        fx, d = copy_case(self, "fsdp_tp_bf16", self.path("flip"))
        fname, _ = dcp.flip_byte_in_item(d, "model.layers.1.ffn.w1.weight", (0, 0))
        with self.assertRaises(AssertionError):
            dcp.assert_fixture_consistent(dataclasses.replace(fx, folder=d))

        fx, d = copy_case(self, "fsdp_tp_bf16", self.path("hostile"))
        marker = self.path("PWNED")
        dcp.hostile_metadata(d, marker)
        with self.assertRaises(Exception) as cm:
            dcp.load_metadata(os.path.join(d, ".metadata"))
        self.assertIn("system", str(cm.exception))
        self.assertFalse(os.path.exists(marker))

        for make, args in ((dcp.make_hole, ("model.output.weight",)),
                           (dcp.set_metadata_dtype, ("model.output.weight", torch.float64)),
                           (dcp.set_transform, ("model.output.weight", ["stream.lz4/1"]))):
            fx, d = copy_case(self, "fsdp_tp_bf16", self.path(make.__name__))
            make(d, *args)
            with self.assertRaises(ValueError):
                dcp.reference_assemble(d)
        d = self.path("overlap")
        make_overlap(d)
        with self.assertRaisesRegex(ValueError, "tile"):
            dcp.reference_assemble(d)
        fx, d = copy_case(self, "uneven_fp32", self.path("replace"))
        item = fx.items_of("model.embed.weight")[0]
        t = fx.tensors["model.embed.weight"]
        dcp.replace_item(d, "model.embed.weight", item.offsets, dcp._narrow(t, item.offsets, item.sizes).double())
        with self.assertRaisesRegex(ValueError, "float64"):
            dcp.reference_assemble(d)
        self.assertEqual(set(dcp.reference_assemble(d, strict=False)), set(fx.tensors))


def make_overlap(folder):
    """model.a.weight: rows 0-4 on rank 0 and 4-7 on rank 1 (row 4 twice, same values)."""
    g = torch.Generator().manual_seed(9)
    a = torch.randn(8, 6, generator=g)
    state = {"model.a.weight": dcp.Chunks(a, [(0, (0, 0), (5, 6)), (1, (4, 0), (4, 6))]),
             "model.b.weight": dcp.Shard(torch.randn(6, 2, generator=g), 2, 0)}
    return dcp.make_dcp_checkpoint(folder, state, world_size=2, validate=False)


# =============================================================================================
# ckptool on DCP folders
# =============================================================================================

# What `export` writes without --select: the fqns under the first of these prefixes that has
# any, prefix dropped (as for torch files); else everything but training state.
TRAINING_TOPS = {"optim", "optimizer", "optimizer_states", "optimizer_state_dict", "optim_state",
                 "opt_state", "lr_scheduler", "lr_schedulers", "scheduler", "schedulers", "scaler",
                 "grad_scaler", "amp", "amp_scaler", "rng_state", "rng_states", "torch_rng_state",
                 "cuda_rng_state", "numpy_rng_state", "python_rng_state", "random_state"}


def default_export(ref):
    for prefix in ("state_dict", "module", "model_state_dict", "model"):
        sel = {k[len(prefix) + 1:]: v for k, v in ref.items() if k.startswith(prefix + ".")}
        if sel:
            return sel
    return {k: v for k, v in ref.items() if k.split(".")[0] not in TRAINING_TOPS}


class DcpCliTest(CkptTestCase):
    @classmethod
    def setUpClass(cls):
        cls.cases = _Cases.build_all()

    def read_export(self, out):
        """name -> (safetensors dtype, raw bytes, shape) over model.safetensors or its shards."""
        files = sorted(os.listdir(out))
        if "model.safetensors.index.json" in files:
            with open(os.path.join(out, "model.safetensors.index.json")) as f:
                index = json.load(f)
            shards = sorted(set(index["weight_map"].values()))
            self.assertEqual(sorted(f for f in files if f.endswith(".safetensors")), shards)
        else:
            self.assertEqual(files, ["model.safetensors"])
            index, shards = None, ["model.safetensors"]
        got = {}
        for s in shards:
            meta, tensors = read_safetensors(self, os.path.join(out, s))
            self.assertEqual(meta.get("format"), "pt")
            for name, (dt, arr) in tensors.items():
                self.assertNotIn(name, got)
                got[name] = (dt, arr.tobytes(), list(arr.shape))
                if index:
                    self.assertEqual(index["weight_map"][name], s)
        if index:
            self.assertEqual(set(index["weight_map"]), set(got))
        return got, index

    def assert_export_equals(self, got, expected):
        self.assertEqual(set(got), set(expected))
        for name, t in expected.items():
            dt, data, shape = got[name]
            self.assertEqual(dt, ST_DTYPES[t.dtype], name)
            self.assertEqual(shape, list(t.shape), name)
            self.assertEqual(data, raw(t), name)

    def test_export_to_safetensors_equals_reference(self):
        for name, fx in self.cases.items():
            with self.subTest(case=name):
                out = self.path(f"{name}_out")
                run("export", fx.folder, "--to", out)
                got, _ = self.read_export(out)
                self.assert_export_equals(got, default_export(dcp.reference_assemble(fx.folder)))
                self.assertFalse(set(got) & set(fx.objects), "objects are not tensors")

    def test_export_in_shards(self):
        fx = self.cases["fsdp_tp_bf16"]
        ref = default_export(dcp.reference_assemble(fx.folder))
        for size in ("4KiB", "1MB"):
            with self.subTest(max_shard_size=size):
                out = self.path(f"shards_{size}")
                run("export", fx.folder, "--to", out, "--max-shard-size", size)
                got, index = self.read_export(out)
                self.assert_export_equals(got, ref)
                if size == "4KiB":
                    self.assertIsNotNone(index)
                    n = len(set(index["weight_map"].values()))
                    self.assertGreater(n, 2)
                    self.assertEqual(set(index["weight_map"].values()),
                                     {f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)})
                    self.assertEqual(index["metadata"]["total_size"],
                                     sum(t.numel() * t.element_size() for t in ref.values()))

    def test_export_select_model_and_dtype(self):
        for name in ("fsdp_tp_bf16", "uneven_fp32", "zstd"):
            fx = self.cases[name]
            ref = dcp.reference_assemble(fx.folder)
            model = {k[len("model."):]: v for k, v in ref.items() if k.startswith("model.")}
            with self.subTest(case=name, option="--select model"):
                out = self.path(f"{name}_model")
                run("export", fx.folder, "--to", out, "--select", "model")
                got, _ = self.read_export(out)
                self.assert_export_equals(got, model)
            with self.subTest(case=name, option="--dtype bf16"):
                out = self.path(f"{name}_bf16")
                run("export", fx.folder, "--to", out, "--dtype", "bf16")
                got, _ = self.read_export(out)
                self.assert_export_equals(got, {k: v.to(torch.bfloat16) if v.is_floating_point() else v
                                                for k, v in default_export(ref).items()})

    def test_export_to_torch_file(self):
        for name in ("fsdp_tp_bf16", "megatron", "per_rank_metadata"):
            with self.subTest(case=name):
                fx = self.cases[name]
                ref = default_export(dcp.reference_assemble(fx.folder))
                out = self.path(f"{name}.pt")
                run("export", fx.folder, "--to", out)
                sd = torch.load(out, weights_only=True)
                self.assertEqual(set(sd), set(ref))
                for k, t in ref.items():
                    self.assertEqual((sd[k].dtype, tuple(sd[k].shape)), (t.dtype, tuple(t.shape)), k)
                    self.assertEqual(raw(sd[k]), raw(t), k)

    def test_verify_passes_every_healthy_variant(self):
        for name, fx in self.cases.items():
            with self.subTest(case=name):
                run("verify", fx.folder, *TRUST)

    def test_objects_of_a_projects_own_classes_need_trust(self):
        """The extra state of some fixtures holds a dataclass of the test's own module: rebuilt
        without a call, its __setstate__ would run under torch.load, so verify and strip refuse
        it until the module is trusted."""
        fx = self.cases["fsdp_tp_bf16"]
        p = run("verify", fx.folder, expect=1)
        self.assertIn("makes ckpt_enums.RunConfig without calling it", output(p))
        self.assertIn("--trust ckpt_enums", output(p))
        out = self.path("untrusted_strip")
        self.assertIn("refusing to copy it", output(run("strip", fx.folder, "-o", out, expect=1)))
        self.assertFalse(os.path.exists(out))

    def assert_verify_names(self, folder, *needles):
        p = run("verify", folder, expect=None)
        self.assertNotEqual(p.returncode, 0, output(p))
        for n in needles:
            self.assertIn(n, output(p))
        return output(p)

    def test_verify_names_damaged_items_and_files(self):
        fx, d = copy_case(self, "fsdp_tp_bf16", self.path("trunc"))
        lost = dcp.truncate_distcp(d, "__2_0.distcp")
        self.assert_verify_names(d, "__2_0.distcp", *lost)

        fx, d = copy_case(self, "fsdp_tp_bf16", self.path("flip"))
        fname, _ = dcp.flip_byte_in_item(d, "model.layers.0.attn.wo.weight", (12, 12))
        self.assert_verify_names(d, fname, "model.layers.0.attn.wo.weight")

        fx, d = copy_case(self, "fsdp_tp_bf16", self.path("object"))
        obj = next(i for i in fx.items if i.fqn == "optim.param_groups.0.lr")
        fname, _ = dcp.flip_byte_in_item(d, obj.fqn)
        self.assert_verify_names(d, fname, obj.fqn)

        fx, d = copy_case(self, "fsdp_tp_bf16", self.path("missing"))
        gone = dcp.delete_distcp(d, "__3_0.distcp")
        tensors = [f for f in gone if f in fx.tensors]
        self.assertTrue(tensors)
        self.assert_verify_names(d, "__3_0.distcp", *tensors)

        fx, d = copy_case(self, "megatron", self.path("mg_missing"))
        gone = dcp.delete_distcp(d, "__1_1.distcp")
        self.assert_verify_names(d, "__1_1.distcp", *[f for f in gone if f in fx.tensors])

    def test_items_read_on_every_thread_are_reported_as_read_one_by_one(self):
        # The reader parses items on every thread, then reports them in metadata order: the
        # same problems in the same order as on one CPU.
        fx, d = copy_case(self, "fsdp_tp_bf16", self.path("many_bad"))
        names = sorted(fx.tensors)[:8]
        self.assertEqual(len(names), 8)
        for k, fqn in enumerate(names):
            dcp.flip_byte_in_item(d, fqn, record="data.pkl" if k % 2 else None)
        one_cpu = lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        got = {}
        for args in (("verify", d), ("inspect", "--json", d)):
            every = run(*args, expect=None)
            one = subprocess.run([CKPTOOL, *args], capture_output=True, text=True, timeout=300,
                                 preexec_fn=one_cpu)
            self.assertEqual(output(every), output(one), args)
            self.assertEqual(every.returncode, one.returncode, args)
            got[args[0]] = every
        self.assertNotEqual(got["verify"].returncode, 0)
        for fqn in names:
            self.assertIn(fqn, output(got["verify"]))

    def test_verify_names_chunk_problems(self):
        fx, d = copy_case(self, "fsdp_tp_bf16", self.path("hole"))
        dcp.make_hole(d, "model.layers.1.attn.wq.weight")
        out = self.assert_verify_names(d, "model.layers.1.attn.wq.weight")
        self.assertRegex(out.lower(), "hole|not covered|missing|cover")

        d = self.path("overlap")
        make_overlap(d)
        out = self.assert_verify_names(d, "model.a.weight")
        self.assertIn("overlap", out.lower())

        fx, d = copy_case(self, "uneven_fp32", self.path("dtype"))
        dcp.set_metadata_dtype(d, "model.head.weight", torch.bfloat16)
        out = self.assert_verify_names(d, "model.head.weight")
        self.assertRegex(out, "float32|bfloat16")

        fx, d = copy_case(self, "uneven_fp32", self.path("shape"))
        item = fx.items_of("model.embed.weight")[0]
        chunk = dcp._narrow(fx.tensors["model.embed.weight"], item.offsets, item.sizes)
        dcp.replace_item(d, "model.embed.weight", item.offsets, chunk[:-1].clone())
        self.assert_verify_names(d, "model.embed.weight", item.file)

        fx, d = copy_case(self, "uneven_fp32", self.path("item_dtype"))
        dcp.replace_item(d, "model.embed.weight", item.offsets, chunk.double())
        out = self.assert_verify_names(d, "model.embed.weight")
        self.assertIn("float64", out)

    def test_hostile_metadata_is_refused_never_run(self):
        fx, d = copy_case(self, "fsdp_tp_bf16", self.path("hostile"))
        marker = self.path("PWNED")
        dcp.hostile_metadata(d, marker)
        out = self.assert_verify_names(d, ".metadata")
        self.assertIn("system", out)
        for args in (["inspect", d], ["inspect", "--json", d], ["export", d, "--to", self.path("h_out")],
                     ["strip", d, "-o", self.path("h_strip")]):
            run(*args, expect=None)
        self.assertFalse(os.path.exists(marker), "the pickle ran")
        self.assertFalse(os.path.exists(os.path.join(self.path("h_out"), "model.safetensors")))

    def test_inspect_json(self):
        for name, fx in self.cases.items():
            with self.subTest(case=name):
                doc = json.loads(run("inspect", "--json", fx.folder).stdout)
                self.assertEqual(len(doc.get("dcp", [])), 1, sorted(doc))
                doc = doc["dcp"][0]
                self.assertEqual(doc.get("format"), "dcp", sorted(doc))
                ref = dcp.reference_assemble(fx.folder)
                chunks = expected_chunks(fx.folder)
                rows = {t["name"]: t for t in doc["tensors"]}
                self.assertEqual(set(rows), set(ref))
                for k, t in ref.items():
                    self.assertEqual(rows[k]["dtype"], str(t.dtype).replace("torch.", ""), k)
                    self.assertEqual(rows[k]["shape"], list(t.shape), k)
                    self.assertEqual(rows[k]["chunks"], len(chunks[k]), k)
                    self.assertEqual(rows[k]["bytes"], t.numel() * t.element_size(), k)
                objects = {o["name"]: o for o in doc["objects"]}
                self.assertEqual(set(objects), set(fx.objects))
                self.assertTrue(all(o["bytes"] > 0 for o in objects.values()))
                rollup = {r["key"]: r for r in doc["rollup"]}
                keys = {k.split(".")[0] for k in list(ref) + list(objects)}
                self.assertEqual(set(rollup), keys)
                for key, r in rollup.items():
                    mine = [k for k in ref if k.split(".")[0] == key]
                    self.assertEqual(r["tensors"], len(mine), key)
                    self.assertEqual(r["bytes"], sum(rows[k]["bytes"] for k in mine)
                                     + sum(o["bytes"] for n, o in objects.items() if n.split(".")[0] == key), key)
                files = {f["path"]: f for f in doc["files"]}
                distcp = {n for n in os.listdir(fx.folder) if n.endswith(".distcp")}
                self.assertEqual({p for p in files if p.endswith(".distcp")}, distcp)
                items = {}
                for _, _, info in dcp.storage_entries(fx.folder):
                    items.setdefault(info.relative_path, set()).add(info.offset)
                for path, f in files.items():  # other files (.metadata, common.pt) may be listed too
                    self.assertEqual(f["bytes"], os.path.getsize(os.path.join(fx.folder, path)), path)
                    if path in distcp:
                        self.assertEqual(f["items"], len(items.get(path, ())), path)
                if name == "fsdp_tp_bf16":
                    self.assertIn("model", rollup)
                    self.assertIn("optim", rollup)

    def assert_strip(self, src, out, keep_glob=None):
        ref = dcp.reference_assemble(src)
        ref_objects = dcp.reference_objects(src)
        dropped = lambda k: k.split(".")[0] in ("optim", "optimizer")  # noqa: E731
        if keep_glob:
            import fnmatch
            kept = lambda k: not dropped(k) or fnmatch.fnmatchcase(k, keep_glob)  # noqa: E731
        else:
            kept = lambda k: not dropped(k)  # noqa: E731
        got = dcp.reference_assemble(out)
        self.assertEqual(set(got), {k for k in ref if kept(k)})
        for k, t in got.items():
            self.assertEqual(raw(t), raw(ref[k]), k)
            self.assertEqual(t.dtype, ref[k].dtype, k)
        self.assertEqual(dcp.reference_objects(out), {k: v for k, v in ref_objects.items() if kept(k)})
        for md, _ in dcp.read_metadata(out):  # the restricted unpickler reads it: nothing new in it
            self.assertFalse([k for k in md.state_dict_metadata if not kept(k)])
            self.assertFalse([k for k in md.storage_data if not kept(k.fqn)])
        run("verify", out, *TRUST)

    def test_strip_to_a_new_folder(self):
        for name in ("fsdp_tp_bf16", "zstd", "legacy_shard_113", "megatron", "per_rank_metadata"):
            with self.subTest(case=name):
                fx = self.cases[name]
                out = self.path(f"{name}_stripped")
                run("strip", fx.folder, "-o", out, *TRUST)
                self.assert_strip(fx.folder, out)
                total = lambda d: sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))  # noqa: E731
                self.assertLess(total(out), total(fx.folder))
                if name == "megatron":
                    for n in ("common.pt", "metadata.json"):
                        with open(os.path.join(fx.folder, n), "rb") as a, open(os.path.join(out, n), "rb") as b:
                            self.assertEqual(a.read(), b.read(), n)

    def test_strip_in_place_and_keep(self):
        fx, d = copy_case(self, "fsdp_tp_bf16", self.path("inplace"))
        run("strip", d, *TRUST)
        self.assert_strip(fx.folder, d)
        out = self.path("keep_steps")
        run("strip", fx.folder, "-o", out, "--keep", "optim.state.*.step", *TRUST)
        self.assert_strip(fx.folder, out, keep_glob="optim.state.*.step")
        kept = [k for k in dcp.reference_assemble(out) if k.startswith("optim.")]
        self.assertTrue(kept and all(k.endswith(".step") for k in kept))

    def test_unknown_transform_is_a_clear_error(self):
        fx, d = copy_case(self, "uneven_fp32", self.path("lz4"))
        dcp.set_transform(d, "model.proj.weight", ["stream.lz4/1"])
        for target in ("out_dir", "out.pt"):
            with self.subTest(to=target):
                to = self.path(target)
                p = run("export", d, "--to", to, expect=None)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("model.proj.weight", p.stderr)
                self.assertIn("stream.lz4", p.stderr)
                self.assertFalse(os.path.exists(to) and (os.path.isfile(to) or os.listdir(to)),
                                 "nothing written to the --to path")
        self.assert_verify_names(d, "model.proj.weight")


if __name__ == "__main__":
    unittest.main()


class DcpFolderDiscoveryTest(CkptTestCase):
    """Every command finds a DCP folder the same way and never reads a .distcp as a torch file."""

    def snapshot(self, folder):
        return {n: read_bytes(os.path.join(folder, n)) for n in sorted(os.listdir(folder))}

    def test_commands_on_a_run_folder_holding_a_dcp_step_and_a_plain_file(self):
        run_dir = self.path("run")
        fx, step = copy_case(self, "uneven_fp32", os.path.join(run_dir, "step-10"))
        torch.save({"w": torch.ones(3)}, os.path.join(run_dir, "extra.pt"))
        before = self.snapshot(step)
        # inspect and verify see one DCP checkpoint and one file, no .distcp as a file.
        doc = json.loads(run("inspect", "--json", run_dir).stdout)
        self.assertEqual([os.path.basename(f["path"]) for f in doc["files"]], ["extra.pt"])
        self.assertEqual(len(doc["dcp"]), 1)
        p = run("verify", run_dir)
        self.assertNotIn(".distcp:", p.stdout)
        self.assertIn("torch.distributed.checkpoint", p.stdout)
        # shrink has nothing to cut in a DCP folder (chunks are saved compact) and says so.
        p = run("shrink", step)
        self.assertIn("nothing to shrink", p.stdout)
        self.assertEqual(self.snapshot(step), before)
        # convert rewrites files: it refuses the folder and names what does the job.
        p = run("convert", "--dtype", "bf16", step, expect=1)
        self.assertIn("export", p.stderr)
        self.assertEqual(self.snapshot(step), before)
        self.assertFalse(os.path.exists(os.path.join(step, "bf16")))
        # export needs the folder itself; a .distcp given alone is not a checkpoint file.
        p = run("inspect", os.path.join(step, "__0_0.distcp"), expect=None)
        self.assertNotIn("bad zip64", output(p))

    def test_a_stopped_strips_temp_folder_is_not_a_checkpoint(self):
        run_dir = self.path("run")
        copy_case(self, "uneven_fp32", os.path.join(run_dir, "step-10"))
        # What a strip killed mid-way leaves: a full folder under ckptool's temp name.
        shutil.copytree(os.path.join(run_dir, "step-10"), os.path.join(run_dir, ".step-10.ckptool-tmp-999999-1"))
        doc = json.loads(run("inspect", "--json", run_dir).stdout)
        self.assertEqual([os.path.basename(d["folder"]) for d in doc["dcp"]], ["step-10"])

    def test_export_warns_about_tensors_the_selection_leaves_out(self):
        import torch as _t
        folder = self.path("hf_like")
        state = {"model.embed.weight": dcp.Shard(_t.randn(6, 4), 2, 0), "lm_head.weight": _t.randn(3, 4),
                 "optim.state.lm_head.weight.exp_avg": _t.randn(3, 4)}
        dcp.make_dcp_checkpoint(folder, state, world_size=2, cuda=False)
        p = run("export", folder, "--to", self.path("out"))
        self.assertIn("1 tensor outside 'model'", output(p))
        _, got = read_safetensors(self, os.path.join(self.path("out"), "model.safetensors"))
        self.assertEqual(sorted(got), ["embed.weight"])
        # --select with the whole name space exports what the user names, without the warning.
        p = run("export", folder, "--to", self.path("out2"), "--select", "lm_head")
        self.assertNotIn("outside", output(p))
