"""ckptool and the safetensors library (0.8) itself: files written by safetensors.torch.save_file /
save_model / save, safetensors.numpy.save_file and huggingface_hub.save_torch_state_dict (sharded,
with an index) are read right by ckptool (inspect --json names, dtypes, shapes, metadata; verify);
every safetensors file ckptool writes (export of torch files, convert of safetensors files and
folders) loads with safetensors.torch.load_file and safe_open and equals its source."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, load_model, save, save_file, save_model  # noqa: E402

from real_common import (assert_converted, dtype_name, inspect_one, raw, read_json,  # noqa: E402
                         safetensors_header, sha256)
from stacklib import TempDirTest, run, run_json  # noqa: E402

# safetensors' dtype codes -> the torch dtype safetensors.torch loads them as
ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2": torch.float8_e5m2, "F8_E5M2FNUZ": torch.float8_e5m2fnuz, "F8_E8M0": torch.float8_e8m0fnu,
    "C64": torch.complex64, "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16,
}


def every_dtype():
    """A tensor of every dtype safetensors.torch writes (F4 has tests of its own), and shapes
    that are easy to get wrong: empty, scalar, 1-D, 4-D, a larger one."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 5, generator=g) * 3
    out = {}
    for code, dt in ST_DTYPES.items():
        if dt == torch.bool:
            t = x > 0
        elif dt.is_complex:
            t = torch.complex(x, -x)
        elif dt.is_floating_point:
            t = (x.abs() if dt == torch.float8_e8m0fnu else x).to(dt)
        else:
            t = torch.randint(0, 100, (3, 5), generator=g, dtype=torch.int64).to(dt)
        out[f"t.{code.lower()}"] = t
    out["empty"] = torch.zeros(0, 4)
    out["scalar"] = torch.tensor(1.5)
    out["vec"] = torch.arange(7, dtype=torch.float32)
    out["four.d"] = torch.randn(2, 3, 4, 5, generator=g)
    out["big"] = torch.randn(256, 1024, generator=g)  # 1 MiB
    out["special"] = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0,
                                   1e-45, 6e-8, 65520.0, 3.3895e38])
    out["naïve/ünïcode name"] = torch.ones(2)
    return out


def float4(rows=3, cols=4):
    return torch.arange(rows * cols, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(rows, cols)


class SafetensorsLibTest(TempDirTest):
    def assertSameTensors(self, want, got, msg=""):
        self.assertEqual(sorted(want), sorted(got), msg)
        for k, t in want.items():
            self.assertEqual(got[k].dtype, t.dtype, f"{msg} {k}")
            self.assertEqual(tuple(got[k].shape), tuple(t.shape), f"{msg} {k}")
            self.assertEqual(raw(got[k]), raw(t), f"{msg} {k}")

    def read_all(self, path):
        """load_file and safe_open (get_tensor and get_slice) agree; returns (tensors, metadata)."""
        a = load_file(path)
        with safe_open(path, framework="pt") as f:
            meta = f.metadata()
            b = {k: f.get_tensor(k) for k in f.keys()}
            for k in f.keys():
                if b[k].dim() >= 1 and b[k].shape[0] > 1 and b[k].dtype != torch.float4_e2m1fn_x2:
                    self.assertEqual(raw(f.get_slice(k)[1:2]), raw(b[k][1:2]), k)
        self.assertSameTensors(a, b, f"{path}: load_file vs safe_open")
        return a, meta

    def assertReportMatches(self, path, tensors, metadata):
        """inspect --json of a safetensors file: every name with torch's dtype name and the shape
        safetensors.torch loads; bytes add up; the metadata as written."""
        rep = inspect_one(path)
        self.assertEqual(rep["format"], "safetensors")
        rows = {r["name"]: r for r in rep["tensors"]}
        self.assertEqual(sorted(rows), sorted(tensors))
        for k, t in tensors.items():
            self.assertEqual(rows[k]["dtype"], dtype_name(t.dtype), k)
            self.assertEqual(rows[k]["shape"], list(t.shape), k)
            self.assertEqual(rows[k]["bytes"], t.numel() * t.element_size(), k)
        self.assertEqual(rep["metadata"] or None, metadata or None)
        self.assertEqual(rep["problems"], [])
        self.assertEqual(sum(b["bytes"] for b in rep["byte_map"]), os.path.getsize(path))
        self.assertEqual(rep["tensor_bytes"], sum(t.numel() * t.element_size() for t in tensors.values()))
        return rep

    def test_save_file_every_dtype(self):
        tensors = every_dtype()
        meta = {"format": "pt", "written_by": "safetensors.torch.save_file", "json": '{"a": [1, 2]}'}
        p = self.path("every.safetensors")
        save_file(tensors, p, metadata=meta)
        header = safetensors_header(p)
        self.assertLessEqual(set(ST_DTYPES), {v["dtype"] for k, v in header.items() if k != "__metadata__"})
        self.assertReportMatches(p, tensors, meta)
        r = run("verify", p)
        self.assertIn("OK", r.stdout)
        # the same bytes through safetensors.torch.save (in memory) and numpy's writer
        p2 = self.path("bytes.safetensors")
        with open(p2, "wb") as f:
            f.write(save(tensors, metadata=meta))
        self.assertReportMatches(p2, tensors, meta)
        run("verify", p2)

    def test_numpy_writer(self):
        from safetensors.numpy import save_file as np_save_file
        arrays = {"f32": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
                  "f16": np.arange(6, dtype=np.float16), "i64": np.arange(5, dtype=np.int64),
                  "u16": np.arange(4, dtype=np.uint16), "b": np.array([True, False])}
        p = self.path("np.safetensors")
        np_save_file(arrays, p)
        tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
        self.assertReportMatches(p, tensors, None if "__metadata__" not in safetensors_header(p)
                                 else safetensors_header(p)["__metadata__"])
        run("verify", p)
        out = self.path("np-bf16.safetensors")
        run("convert", "--dtype", "bf16", p, "-o", out)
        got, meta = self.read_all(out)
        self.assertEqual(meta.get("format"), "pt")
        for k, t in tensors.items():
            assert_converted(self, got[k], t, torch.bfloat16, k)

    def test_convert_every_dtype(self):
        tensors = every_dtype()
        meta = {"format": "pt", "keep": "me"}
        src = self.path("every.safetensors")
        save_file(tensors, src, metadata=meta)
        before = sha256(src)
        for dtype, tdtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            with self.subTest(dtype=dtype):
                out = self.path(f"every-{dtype}.safetensors")
                rep = run_json("convert", "--dtype", dtype, src, "-o", out)
                n32 = sum(1 for t in tensors.values() if t.dtype == torch.float32)
                # A float32 tensor whose values the conversion would change (overflow, flush)
                # stays float32 and is named in the report with the reason.
                kept = {k.split(":")[0]: k for k in rep["files"][0]["kept"]}
                self.assertEqual(rep["files"][0]["converted_tensors"] + len(kept), n32)
                self.assertLessEqual(len(kept), 1, kept)
                run("verify", out)
                got, got_meta = self.read_all(out)
                self.assertEqual(got_meta, meta)
                self.assertEqual(sorted(got), sorted(tensors))
                for k, t in tensors.items():
                    if k in kept:
                        self.assertIn("would become", kept[k])
                        self.assertEqual(got[k].dtype, torch.float32, k)
                        self.assertTrue(torch.equal(got[k].view(torch.int32), t.view(torch.int32)), k)
                    else:
                        assert_converted(self, got[k], t, tdtype, k)
                self.assertReportMatches(out, got, meta)
        self.assertEqual(sha256(src), before, "convert modified its input")

    def test_convert_keep_and_only(self):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
        sd = {k: v.contiguous() for k, v in m.state_dict().items()}
        src = self.path("m.safetensors")
        save_file(sd, src)
        out = self.path("m-keep.safetensors")
        run("convert", "--dtype", "fp16", src, "-o", out, "--keep", "1.*", "--keep-1d")
        got, _ = self.read_all(out)
        for k, t in sd.items():
            keep = k.startswith("1.") or t.dim() == 1
            assert_converted(self, got[k], t, torch.float32 if keep else torch.float16, k)
        # a model loads the converted file
        m2 = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
        m2.load_state_dict(got, strict=True)

    def test_save_model_shared_tensors(self):
        """save_model drops tied duplicates and records them in __metadata__; ckptool reads and
        converts such a file and load_model still restores the tie."""
        torch.manual_seed(1)
        emb = torch.nn.Embedding(32, 8)
        model = torch.nn.ModuleDict({"emb": emb, "head": torch.nn.Linear(8, 32, bias=False),
                                     "norm": torch.nn.LayerNorm(8)})
        model["head"].weight = emb.weight
        p = self.path("model.safetensors")
        save_model(model, p, metadata={"format": "pt"})
        header = safetensors_header(p)
        names = sorted(k for k in header if k != "__metadata__")
        self.assertEqual(len(names), len(model.state_dict()) - 1)
        tensors, meta = self.read_all(p)
        self.assertReportMatches(p, tensors, meta)
        run("verify", p)
        out = self.path("model-bf16.safetensors")
        run("convert", "--dtype", "bf16", p, "-o", out)
        got, got_meta = self.read_all(out)
        self.assertEqual(got_meta, meta, "the alias records are metadata and must stay")
        m2 = torch.nn.ModuleDict({"emb": torch.nn.Embedding(32, 8), "head": torch.nn.Linear(8, 32, bias=False),
                                  "norm": torch.nn.LayerNorm(8)})
        m2["head"].weight = m2["emb"].weight
        m2 = m2.to(torch.bfloat16)
        missing, unexpected = load_model(m2, out)
        self.assertEqual(unexpected, [])
        for k, t in model.state_dict().items():
            assert_converted(self, m2.state_dict()[k], t, torch.bfloat16, k)

    def test_export_torch_files(self):
        """export of torch.save files: one file, a folder, shards with an index; everything loads
        with safetensors and equals the torch file's tensors."""
        g = torch.Generator().manual_seed(2)
        big = torch.randn(64, 512, generator=g)
        shared = torch.randn(16, 8, generator=g)
        sd = {
            "a.weight": big[:8],                     # a slice of a bigger storage
            "a.bias": big[9, :16],
            "t.weight": big[10:26, :8].t(),          # non-contiguous
            "emb.weight": shared, "head.weight": shared,  # tied
            "bf": torch.randn(8, 8, generator=g).bfloat16(), "ids": torch.arange(10),
            "mask": torch.tensor([True, False, True]), "scalar": torch.tensor(3.0),
            "empty": torch.zeros(0, 2), "f8": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
            **{f"layers.{i}.w": torch.randn(32, 32, generator=g) for i in range(6)},
        }
        src = self.path("sd.pt")
        torch.save({"state_dict": sd, "epoch": 3}, src)
        loaded = torch.load(src, weights_only=True)["state_dict"]

        def check(tensors, meta, msg):
            self.assertEqual(meta.get("format"), "pt", msg)
            full = dict(tensors)
            for alias, kept in meta.items():
                if alias in sd:
                    full[alias] = tensors[kept]
            self.assertSameTensors(loaded, full, msg)
            self.assertIn(meta.get("emb.weight", meta.get("head.weight")), ("emb.weight", "head.weight"), msg)

        one = self.path("one.safetensors")
        rep = run_json("export", src, "--to", one)
        self.assertEqual(rep["selected"], "state_dict")
        check(*self.read_all(one), "single file")
        folder = self.path("folder")
        run("export", src, "--to", folder)
        self.assertEqual(sorted(os.listdir(folder)), ["model.safetensors"])
        check(*self.read_all(os.path.join(folder, "model.safetensors")), "folder")
        sharded = self.path("sharded")
        run("export", src, "--to", sharded, "--max-shard-size", "10KB")
        index = read_json(os.path.join(sharded, "model.safetensors.index.json"))
        shards = sorted(f for f in os.listdir(sharded) if f.endswith(".safetensors"))
        self.assertGreater(len(shards), 2)
        self.assertEqual(sorted(set(index["weight_map"].values())), shards)
        merged, meta = {}, {}
        total = 0
        for s in shards:
            t, m = self.read_all(os.path.join(sharded, s))
            self.assertFalse(set(t) & set(merged), "a tensor in two shards")
            merged.update(t)
            meta.update(m or {})
            total += sum(x.numel() * x.element_size() for x in t.values())
            for k in t:
                self.assertEqual(index["weight_map"][k], s, k)
        self.assertEqual(index["metadata"]["total_size"], total)
        check(merged, meta, "shards")
        # --dtype on the way out
        half = self.path("half.safetensors")
        run("export", src, "--to", half, "--dtype", "fp16")
        got, _ = self.read_all(half)
        for k, t in got.items():
            assert_converted(self, t, loaded[k], torch.float16, k, every_float=True)

    def test_hub_sharded_folder_convert(self):
        """huggingface_hub.save_torch_state_dict shards + index; `convert FOLDER` writes a folder
        whose index has the new total_size and whose shards load back."""
        from huggingface_hub import load_torch_model, save_torch_state_dict
        torch.manual_seed(3)
        model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
        folder = self.path("hub")
        os.makedirs(folder)
        save_torch_state_dict(model.state_dict(), folder, max_shard_size="40KB", metadata={"format": "pt"})
        index_name = "model.safetensors.index.json"
        index = read_json(os.path.join(folder, index_name))
        shards = sorted(set(index["weight_map"].values()))
        self.assertGreater(len(shards), 2)
        for s in shards:
            tensors, meta = self.read_all(os.path.join(folder, s))
            self.assertReportMatches(os.path.join(folder, s), tensors, meta)
        run("verify", folder)
        with open(os.path.join(folder, "README.md"), "w") as f:
            f.write("copied as it is\n")
        rep = run_json("convert", "--dtype", "bf16", folder)
        out = os.path.join(folder, "bf16")
        self.assertEqual(rep["copied_files"], 1)
        new_index = read_json(os.path.join(out, index_name))
        self.assertEqual(new_index["weight_map"], index["weight_map"])
        self.assertEqual(new_index["metadata"]["total_size"], index["metadata"]["total_size"] // 2)
        with open(os.path.join(out, "README.md")) as f:
            self.assertEqual(f.read(), "copied as it is\n")
        m2 = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)]).to(torch.bfloat16)
        load_torch_model(m2, out, strict=True)
        for k, t in model.state_dict().items():
            assert_converted(self, m2.state_dict()[k], t, torch.bfloat16, k)

    def test_compress_decompress(self):
        tensors = every_dtype()
        src = self.path("every.safetensors")
        save_file(tensors, src, metadata={"format": "pt"})
        digest = sha256(src)
        run("compress", src)
        run("verify", src + ".ckz")
        doc = run_json("inspect", src + ".ckz")
        self.assertTrue(doc.get("archives"), doc.keys())
        os.remove(src)
        run("decompress", src + ".ckz")
        self.assertEqual(sha256(src), digest)
        self.assertSameTensors(tensors, load_file(src))

    def test_commands_that_do_not_apply(self):
        """shrink and strip have nothing to do on a safetensors file: it stays byte for byte."""
        src = self.path("s.safetensors")
        save_file({"w": torch.randn(4, 4)}, src)
        digest = sha256(src)
        run("shrink", src, expect=None)
        run("strip", src, expect=None)
        self.assertEqual(sha256(src), digest)

    def test_float4_roundtrips(self):
        """F4 (float4_e2m1fn_x2): convert leaves it alone, compress restores it, verify is OK."""
        tensors = {"fp4": float4(), "w": torch.randn(3, 3)}
        src = self.path("f4.safetensors")
        save_file(tensors, src)
        self.assertEqual(safetensors_header(src)["fp4"]["shape"], [3, 8])  # safetensors counts 4-bit elements
        run("verify", src)
        out = self.path("f4-bf16.safetensors")
        run("convert", "--dtype", "bf16", src, "-o", out)
        got, _ = self.read_all(out)
        self.assertEqual(raw(got["fp4"]), raw(tensors["fp4"]))
        self.assertEqual(got["fp4"].dtype, torch.float4_e2m1fn_x2)
        self.assertEqual(tuple(got["fp4"].shape), (3, 4))
        assert_converted(self, got["w"], tensors["w"], torch.bfloat16, "w")
        run("compress", src, "-o", self.path("f4.ckz"))
        run("decompress", self.path("f4.ckz"), "-o", self.path("f4-back.safetensors"))
        self.assertEqual(sha256(self.path("f4-back.safetensors")), sha256(src))

    def test_float4_inspect_names_torch_dtype(self):
        """inspect names every safetensors dtype by the torch dtype safetensors.torch loads it as
        (F8_E8M0 -> float8_e8m0fnu, ...), with the shape it loads: F4 is float4_e2m1fn_x2 [3, 4]."""
        tensors = {"fp4": float4()}
        src = self.path("f4.safetensors")
        save_file(tensors, src)
        self.assertReportMatches(src, load_file(src), None)


if __name__ == "__main__":
    unittest.main()
