"""ckptool on torch.distributed.checkpoint folders written by the real torch 2.13.

The folders are made at test time by real_dcp_save.py (dcp.save from 2 and 4 processes, gloo on
CPU; run once per content through stacklib.fixture):
- fsdp2_2 / fsdp2_4: an FSDP2 (fully_shard) model with bf16 and fp32 parameters, fp32 and
  int64 buffers, uneven shards (13 rows over 2 and 4 ranks; 3 rows over 4 ranks leaves one
  empty shard), its AdamW state through get_state_dict, an uneven DTensor and non-tensor
  entries; written with 2 writer threads at 2 processes (two .distcp files per rank).
- plain_2 / plain_4: DTensors sharded unevenly by rows and by columns, an empty shard, a 2-D
  mesh at 4 processes, a Replicate DTensor, plain tensors (fp32, bf16, fp16, int64, 0-d),
  special float values, ints, floats, strings; no "model" key.

Every result is checked against torch's own reading of the same folder:
torch.distributed.checkpoint.format_utils.dcp_to_torch_save (the reference for export), and
dcp.load in this single process without a process group (for strip's output).
"""
import io
import os
import shutil
import tempfile
import unittest
import zipfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

import real_dcp_save
from stacklib import TempDirTest, assert_same_tensors, fixture, run, run_json

FIXTURES = {
    "fsdp2_2": ("fsdp2", 2),
    "fsdp2_4": ("fsdp2", 4),
    "plain_2": ("plain", 2),
    "plain_4": ("plain", 4),
}
TRAINING_KEYS = ("optim", "optimizer", "optimizers", "lr_scheduler", "scheduler", "rng", "rng_state")
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
               torch.int64: "int64"}

_ROOT = None
_BUILT = {}


def setUpModule():
    global _ROOT
    _ROOT = tempfile.mkdtemp(prefix="ckpt-real-dcp-")


def tearDownModule():
    if _ROOT:
        shutil.rmtree(_ROOT, ignore_errors=True)


def is_leaf(value):
    """DCP's rule (torch.distributed.checkpoint._traverse): dicts are walked; a list is walked
    when it holds a tensor, a dict or a list that is walked; anything else is one entry."""
    if isinstance(value, dict):
        return False
    if isinstance(value, list):
        return not any(torch.is_tensor(v) or (isinstance(v, (dict, list)) and not is_leaf(v))
                       for v in value)
    return True


def items(value):
    return value.items() if isinstance(value, dict) else enumerate(value)


def flatten(obj, prefix=""):
    """A nested state dict as DCP names its entries: dotted key paths -> leaf values, in order."""
    out = {}
    for k, v in items(obj):
        if is_leaf(v):
            out[f"{prefix}{k}"] = v
        else:
            out.update(flatten(v, f"{prefix}{k}."))
    return out


def built(name):
    """(folder, nested reference, flat reference) of a fixture; the folder is shared by the
    tests that only read it. The reference is what dcp_to_torch_save makes of the folder."""
    if name not in _BUILT:
        mode, world = FIXTURES[name]
        into = fixture(f"dcp-{name}", real_dcp_save.script(), mode, world,
                       into=os.path.join(_ROOT, name))
        folder = os.path.join(into, "ckpt")
        ref_path = os.path.join(_ROOT, f"{name}.ref.pt")
        dcp_to_torch_save(folder, ref_path)
        nested = torch.load(ref_path, weights_only=False)
        _BUILT[name] = (folder, nested, flatten(nested))
    return _BUILT[name]


def snapshot(folder):
    """relative path -> (mode, bytes) of every file below folder (hidden ones included)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            out[os.path.relpath(p, folder) + "/"] = (os.lstat(p).st_mode, None)
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = (os.lstat(p).st_mode, fh.read())
    return out


def load_safetensors_dir(folder):
    from safetensors.torch import load_file
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            part = load_file(os.path.join(folder, f))
            for k in part:
                assert k not in out, k
            out.update(part)
    return out


def safetensors_metadata(path):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return f.metadata()


def assert_converted(case, got, source, dtype, msg):
    """`export --dtype`: every floating tensor stored as `dtype`, rounded as torch's .to(dtype)
    rounds, bit for bit, except NaNs, which ckptool documents as "a quiet NaN of the same sign"
    (torch 2.13 turns the float32 NaN 0x7fc00000 into the bfloat16 0xffff, sign flipped); the
    other tensors as they are."""
    case.assertEqual(sorted(got), sorted(source), msg)
    for k, src in source.items():
        want = src.to(dtype) if src.is_floating_point() else src
        x = got[k]
        case.assertEqual((x.dtype, tuple(x.shape)), (want.dtype, tuple(want.shape)), f"{msg} {k}")
        if not src.is_floating_point():
            case.assertTrue(torch.equal(x, want), f"{msg} {k}")
            continue
        nan = torch.isnan(src)
        case.assertTrue(torch.equal(torch.isnan(x), nan), f"{msg} {k}: NaNs")
        case.assertTrue(torch.equal(torch.signbit(x[nan]), torch.signbit(src[nan])), f"{msg} {k}")
        case.assertTrue(torch.equal(x[~nan].view(torch.int16), want[~nan].view(torch.int16)),
                        f"{msg} {k}: bytes differ")


class _DcpTests:
    NAME = None

    @classmethod
    def setUpClass(cls):
        cls.folder, cls.nested, cls.flat = built(cls.NAME)
        cls.metadata = FileSystemReader(cls.folder).read_metadata()

    # --- what the reference says ckptool should produce -------------------------------------

    def prefix(self):
        return "model" if "model" in self.nested else None

    def expected_export(self):
        """export's default selection: the tensors under `model` with the prefix dropped, or
        (no such key) every tensor outside the training-state keys; in metadata order."""
        if self.prefix():
            return {k[len("model."):]: v for k, v in self.flat.items()
                    if k.startswith("model.") and torch.is_tensor(v)}
        return {k: v for k, v in self.flat.items()
                if torch.is_tensor(v) and k.split(".")[0] not in TRAINING_KEYS}

    def copy(self, name="ckpt"):
        dest = self.path(name)
        shutil.copytree(self.folder, dest)
        return dest

    def assert_pt_export(self, path, expected, msg):
        got = torch.load(path, weights_only=True)
        self.assertEqual(list(got), list(expected), f"{msg}: names or their order")
        assert_same_tensors(self, got, expected, msg)
        for k, v in got.items():
            self.assertTrue(v.is_contiguous(), f"{msg} {k}")

    # --- the fixture itself ------------------------------------------------------------------

    def test_fixture_is_what_torch_wrote(self):
        mode, world = FIXTURES[self.NAME]
        files = sorted(f for f in os.listdir(self.folder) if f.endswith(".distcp"))
        ranks = sorted({f.split("_")[2] for f in files})
        self.assertEqual(ranks, [str(r) for r in range(world)], files)
        self.assertEqual(self.metadata.version, "1.0.0")
        uneven = [k for k, md in self.metadata.state_dict_metadata.items()
                  if isinstance(md, TensorStorageMetadata)
                  and len({tuple(c.sizes) for c in md.chunks}) > 1]
        self.assertTrue(uneven, "no tensor with uneven chunks")
        empty = [k for k, md in self.metadata.state_dict_metadata.items()
                 if isinstance(md, TensorStorageMetadata) and any(0 in c.sizes for c in md.chunks)]
        self.assertEqual(bool(empty), world == 4, f"empty chunks: {empty}")
        objects = [k for k, md in self.metadata.state_dict_metadata.items()
                   if isinstance(md, BytesStorageMetadata)]
        self.assertIn("step", objects)

    # --- inspect / verify --------------------------------------------------------------------

    def test_inspect_describes_the_metadata(self):
        doc = run_json("inspect", self.folder)
        self.assertEqual(len(doc["dcp"]), 1, doc.keys())
        rep = doc["dcp"][0]
        self.assertEqual(rep["format"], "dcp")
        self.assertEqual(rep["problems"], [])
        self.assertEqual(rep["unsafe"], [])
        self.assertEqual(rep["metadata"]["class"], "torch.distributed.checkpoint.metadata.Metadata")
        want = {}
        for fqn, md in self.metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                numel = 1
                for s in md.size:
                    numel *= s
                elsize = torch.empty((), dtype=md.properties.dtype).element_size()
                want[fqn] = (DTYPE_NAMES[md.properties.dtype], list(md.size),
                             len({tuple(c.offsets) for c in md.chunks}), numel * elsize)
        got = {t["name"]: (t["dtype"], t["shape"], t["chunks"], t["bytes"]) for t in rep["tensors"]}
        self.assertEqual(got, want)
        objects = sorted(k for k, md in self.metadata.state_dict_metadata.items()
                         if isinstance(md, BytesStorageMetadata))
        self.assertEqual(sorted(o["name"] for o in rep["objects"]), objects)
        on_disk = {f: os.path.getsize(os.path.join(self.folder, f))
                   for f in os.listdir(self.folder) if f.endswith(".distcp")}
        self.assertEqual({f["path"]: f["bytes"] for f in rep["files"]}, on_disk)
        per_file = {}
        for info in self.metadata.storage_data.values():
            per_file[info.relative_path] = per_file.get(info.relative_path, 0) + 1
        self.assertEqual({f["path"]: f["items"] for f in rep["files"]}, per_file)
        text = run("inspect", self.folder).stdout
        self.assertIn("torch.distributed.checkpoint folder", text)

    def test_verify_ok(self):
        p = run("verify", self.folder)
        self.assertIn("OK", p.stdout)
        self.assertIn(f"{len(self.metadata.storage_data)} items", p.stdout)

    def test_verify_flags_a_flipped_tensor_byte(self):
        folder = self.copy()
        fqn = next(k for k, md in self.metadata.state_dict_metadata.items()
                   if isinstance(md, TensorStorageMetadata) and md.properties.dtype == torch.float32
                   and len(md.size) == 2)
        index, info = next((i, s) for i, s in self.metadata.storage_data.items() if i.fqn == fqn)
        path = os.path.join(folder, info.relative_path)
        with open(path, "rb") as f:
            data = bytearray(f.read())
        item = bytes(data[info.offset:info.offset + info.length])
        with zipfile.ZipFile(io.BytesIO(item)) as z:
            zi = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
        local = zi.header_offset
        name_len = int.from_bytes(item[local + 26:local + 28], "little")
        extra_len = int.from_bytes(item[local + 28:local + 30], "little")
        at = info.offset + local + 30 + name_len + extra_len
        data[at] ^= 0x40
        with open(path, "wb") as f:
            f.write(data)
        p = run("verify", folder, expect=1)
        self.assertIn(info.relative_path, p.stdout + p.stderr)

    def test_truncated_distcp_is_refused(self):
        folder = self.copy()
        victim = sorted(f for f in os.listdir(folder) if f.endswith(".distcp"))[-1]
        path = os.path.join(folder, victim)
        os.truncate(path, os.path.getsize(path) - 100)
        p = run("verify", folder, expect=1)
        self.assertIn(victim, p.stdout + p.stderr)
        out = self.path("out.pt")
        p = run("export", folder, "--to", out, expect=1)
        self.assertIn(victim, p.stderr)
        self.assertFalse(os.path.exists(out))

    # --- export ------------------------------------------------------------------------------

    def test_export_pt_matches_dcp_to_torch_save(self):
        out = self.path("out.pt")
        run("export", self.folder, "--to", out)
        self.assert_pt_export(out, self.expected_export(), "export --to .pt")
        run("verify", out)

    def test_export_safetensors_file_and_folder(self):
        from safetensors.torch import load_file
        out = self.path("out.safetensors")
        run("export", self.folder, "--to", out)
        assert_same_tensors(self, load_file(out), self.expected_export(), "export --to .safetensors")
        self.assertEqual(safetensors_metadata(out), {"format": "pt"})
        folder = self.path("hf")
        run("export", self.folder, "--to", folder)
        self.assertEqual(sorted(os.listdir(folder)), ["model.safetensors"])
        assert_same_tensors(self, load_safetensors_dir(folder), self.expected_export(), "folder")
        run("verify", folder)

    def test_export_sharded_safetensors(self):
        import json
        folder = self.path("shards")
        run("export", self.folder, "--to", folder, "--max-shard-size", "200B")
        files = sorted(os.listdir(folder))
        shards = [f for f in files if f.endswith(".safetensors")]
        self.assertGreater(len(shards), 1, files)
        self.assertIn("model.safetensors.index.json", files)
        got = load_safetensors_dir(folder)
        expected = self.expected_export()
        assert_same_tensors(self, got, expected, "shards")
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            index = json.load(f)
        self.assertEqual(sorted(index["weight_map"]), sorted(expected))
        self.assertEqual(index["metadata"]["total_size"],
                         sum(v.numel() * v.element_size() for v in expected.values()))
        from safetensors import safe_open
        for name, shard in index["weight_map"].items():
            with safe_open(os.path.join(folder, shard), "pt") as f:
                self.assertIn(name, list(f.keys()))

    def test_export_dtype_bf16_and_fp16(self):
        for dtype, flag in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            out = self.path(f"out-{flag}.pt")
            run("export", self.folder, "--to", out, "--dtype", flag)
            got = torch.load(out, weights_only=True)
            self.assertEqual(list(got), list(self.expected_export()))
            assert_converted(self, got, self.expected_export(), dtype, f"--dtype {flag} .pt")
            st = self.path(f"out-{flag}.safetensors")
            run("export", self.folder, "--to", st, "--dtype", flag)
            from safetensors.torch import load_file
            assert_converted(self, load_file(st), self.expected_export(), dtype, f"{flag} .st")

    def test_export_select(self):
        top = "extra" if "extra" in self.nested else "nested"
        out = self.path("sel.pt")
        run("export", self.folder, "--to", out, "--select", top)
        expected = {k[len(top) + 1:]: v for k, v in self.flat.items()
                    if k.startswith(top + ".") and torch.is_tensor(v)}
        self.assertTrue(expected)
        self.assert_pt_export(out, expected, f"--select {top}")

    # --- strip, loaded back by dcp.load ------------------------------------------------------

    def assert_loads_as(self, folder, expected):
        """dcp.load (one process, no process group) into a state dict naming exactly the
        entries of `expected` (fqn -> value; zeros where tensors go, None where objects go)
        fills it with `expected`'s values."""
        sd = {k: (torch.zeros_like(v) if torch.is_tensor(v) else None) for k, v in expected.items()}
        dcp.load(sd, checkpoint_id=folder)
        self.assertEqual(list(sd), list(expected))
        for k, v in expected.items():
            if torch.is_tensor(v):
                assert_same_tensors(self, {k: sd[k]}, {k: v}, f"dcp.load {k}")
            else:
                self.assertEqual(sd[k], v, k)

    def test_strip_output_loads_with_dcp_load(self):
        before = snapshot(self.folder)
        out = self.path("stripped")
        p = run("strip", self.folder, "-o", out)
        self.assertEqual(snapshot(self.folder), before, "strip -o changed its input")
        self.assertTrue(os.path.isfile(os.path.join(out, ".metadata")),
                        f"strip -o exited 0 but wrote no folder at {out}:\n{p.stdout}{p.stderr}")
        kept = {k: v for k, v in self.flat.items() if k.split(".")[0] not in TRAINING_KEYS}
        self.assertEqual(sorted(FileSystemReader(out).read_metadata().state_dict_metadata),
                         sorted(kept))
        if len(kept) < len(self.flat):
            self.assertIn("dropped optim", p.stdout)
        self.assert_loads_as(out, kept)
        ref = self.path("stripped.ref.pt")
        dcp_to_torch_save(out, ref)
        again = flatten(torch.load(ref, weights_only=False))
        self.assertEqual(sorted(again), sorted(kept))
        assert_same_tensors(self, {k: v for k, v in again.items() if torch.is_tensor(v)},
                            {k: v for k, v in kept.items() if torch.is_tensor(v)}, "strip")
        run("verify", out)
        if len(kept) < len(self.flat):
            with self.assertRaises(BaseException) as cm:   # CheckpointException: the optimizer state is gone
                self.assert_loads_as(out, self.flat)
            self.assertIn("Missing key", f"{cm.exception} {getattr(cm.exception, 'failures', '')}")

    def test_strip_in_place_and_drop_keep(self):
        folder = self.copy()
        run("strip", folder)
        kept = {k: v for k, v in self.flat.items() if k.split(".")[0] not in TRAINING_KEYS}
        self.assert_loads_as(folder, kept)
        self.assertFalse([f for f in os.listdir(self.path()) if f != "ckpt"],
                         "strip in place left something beside the folder")
        # --drop replaces the default list; what it names goes, the rest stays
        out = self.path("dropped")
        run("strip", self.folder, "-o", out, "--drop", "step")
        rest = {k: v for k, v in self.flat.items() if k != "step"}
        self.assertEqual(sorted(FileSystemReader(out).read_metadata().state_dict_metadata),
                         sorted(rest))
        self.assert_loads_as(out, rest)
        if "optim" in self.nested:
            out = self.path("kept")
            run("strip", self.folder, "-o", out, "--keep", "optim.param_groups*")
            names = sorted(FileSystemReader(out).read_metadata().state_dict_metadata)
            self.assertEqual(names, sorted(k for k in self.flat
                                           if not k.startswith("optim.state.")))

    # --- the commands that do not apply -------------------------------------------------------

    def test_convert_refuses_and_leaves_the_folder(self):
        folder = self.copy()
        before = snapshot(folder)
        p = run("convert", "--dtype", "bf16", folder, expect=1)
        self.assertIn("export", p.stderr)
        self.assertEqual(snapshot(folder), before)

    def test_shrink_leaves_the_folder(self):
        folder = self.copy()
        before = snapshot(folder)
        run("shrink", folder)
        run("shrink", "--checkpoint_dir", folder)
        self.assertEqual(snapshot(folder), before)

    # --- compress / decompress ---------------------------------------------------------------

    def test_compress_roundtrip_and_export_from_archive(self):
        archive = self.path("ckpt.ckz")
        run("compress", self.folder, "-o", archive)
        run("verify", archive)
        doc = run_json("inspect", archive)
        self.assertTrue(doc)
        restored = self.path("restored")
        run("decompress", archive, "-o", restored)
        self.assertEqual(snapshot(restored), snapshot(self.folder))
        out = self.path("from-archive.pt")
        run("export", archive, "--to", out)
        self.assert_pt_export(out, self.expected_export(), "export X.ckz")
        self.assert_loads_as(restored, self.flat)


class Fsdp2World2(_DcpTests, TempDirTest):
    NAME = "fsdp2_2"


class Fsdp2World4(_DcpTests, TempDirTest):
    NAME = "fsdp2_4"


class PlainWorld2(_DcpTests, TempDirTest):
    NAME = "plain_2"


class PlainWorld4(_DcpTests, TempDirTest):
    NAME = "plain_4"


if __name__ == "__main__":
    unittest.main()
