"""`ckptool convert` against torch's own `.to(torch.bfloat16 / torch.float16)`."""
import json
import os
import struct

import numpy as np
import torch

from ckpt_testlib import (CkptTestCase, assert_same_aliasing, assert_torch_layout, inspect,
                          read_bytes, read_json, read_safetensors, run, walk_tensors)
from shrink_fixtures import deepspeed_like

KERNELS = ["scalar", "avx2+f16c"]


def special_values():
    bits = [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # signed zeros, infinities
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0xFFFFFFFF,  # NaN payloads
        0x7F7FFFFF, 0xFF7FFFFF, 0x00800000, 0x80800000, 0x00000001, 0x807FFFFF,  # extremes
        0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,  # bfloat16 ties
        0x477FE000, 0x477FF000, 0x477FF001, 0xC77FF000, 0x47800000,  # float16 max and overflow
        0x38800000, 0x387FF000, 0x33000000, 0x33000001, 0x33C00000, 0x3A801000,  # float16 subnormals
    ]
    return torch.tensor(np.array(bits, dtype=np.uint32).view(np.float32))


def sample():
    torch.manual_seed(0)
    x = torch.randn(100_003) * torch.exp(torch.randn(100_003) * 8)  # wide exponent range
    return torch.cat([x, special_values()])


def as_bits(t):
    return t.view(torch.int16).numpy().view(np.uint16)


class ConvertTest(CkptTestCase):
    def assertMatchesTorch(self, source, got, dtype):
        want = source.to(dtype)
        self.assertEqual(got.dtype, dtype)
        nan = torch.isnan(source)
        self.assertTrue(torch.equal(torch.isnan(got), nan))
        g, w = as_bits(got), as_bits(want)
        keep = ~nan.numpy()
        np.testing.assert_array_equal(g[keep], w[keep])
        # NaN stays NaN of the same sign.
        sign = source.view(torch.int32).numpy()[nan.numpy()] < 0
        np.testing.assert_array_equal((g[nan.numpy()] >> 15).astype(bool), sign)

    def test_bitwise_like_torch_for_every_kernel(self):
        x = sample()
        p = self.path("x.pt")
        torch.save({"x": x}, p)
        for kernel in KERNELS:
            for flag, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
                with self.subTest(kernel=kernel, dtype=flag):
                    out = self.path(f"x_{flag}_{kernel}.pt")
                    env = dict(os.environ, CKPT_KERNEL=kernel)
                    import subprocess
                    from ckpt_testlib import CKPTOOL
                    # --lossy: the sample has values float16 cannot hold; converted anyway here.
                    r = subprocess.run([CKPTOOL, "convert", "--lossy", "--dtype", flag, p, "-o", out],
                                       capture_output=True, text=True, env=env)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertMatchesTorch(x, torch.load(out)["x"], dtype)
                    if flag == "fp16":
                        self.assertIn("beyond float16's range became infinity", r.stderr)

    def test_training_checkpoint_keeps_aliasing(self):
        obj = deepspeed_like(seed=3)
        p = self.path("train.pt")
        torch.save(obj, p)
        out = self.path("train_bf16.pt")
        report = json.loads(run("convert", "--json", "--dtype", "bf16", p, "-o", out).stdout)["files"][0]
        original, converted = torch.load(p), torch.load(out)
        a, b = walk_tensors(original), walk_tensors(converted)
        # The model (the "module" key, as DeepSpeed saves it) is converted; the optimizer state
        # beside it stays as it is, and the report counts it.
        self.assertGreater(report["kept_training_state_tensors"], 0)
        for name, t in a.items():
            with self.subTest(tensor=name):
                if t.dtype == torch.float32 and name.startswith("module."):
                    self.assertEqual(b[name].dtype, torch.bfloat16)
                    self.assertTrue(torch.equal(t.to(torch.bfloat16), b[name]))
                else:
                    self.assertEqual(b[name].dtype, t.dtype)
                    self.assertTrue(torch.equal(t, b[name]))
                self.assertEqual(b[name].stride(), t.stride())
                self.assertEqual(b[name].requires_grad, t.requires_grad)
        assert_same_aliasing(self, original, converted)
        self.assertIs(converted["module"]["head.w"], converted["module"]["layers.0.w"])
        self.assertEqual(converted["args"].lr, original["args"].lr)
        assert_torch_layout(self, out)
        run("verify", out)
        self.assertLess(os.path.getsize(out), inspect(p)["used_bytes"])

    def test_keep_only_and_keep_1d(self):
        torch.manual_seed(4)
        obj = {"model": {"w": torch.randn(4, 4), "norm.weight": torch.randn(4), "b": torch.randn(4)},
               "optimizer": {"m": torch.randn(4, 4)}}
        p = self.path("m.pt")
        torch.save(obj, p)
        # The optimizer's state stays float32 unless asked for (--include-optimizer, or by name).
        cases = [
            (["--keep", "*norm*"], {"model.w": True, "model.norm.weight": False, "model.b": True, "optimizer.m": False}),
            (["--keep-1d"], {"model.w": True, "model.norm.weight": False, "model.b": False, "optimizer.m": False}),
            (["--only", "model.*"], {"model.w": True, "model.norm.weight": True, "model.b": True, "optimizer.m": False}),
            (["--include-optimizer"], {"model.w": True, "model.norm.weight": True, "model.b": True, "optimizer.m": True}),
            (["--only", "optimizer.*"], {"model.w": False, "model.norm.weight": False, "model.b": False, "optimizer.m": True}),
        ]
        for i, (flags, expect) in enumerate(cases):
            out = self.path(f"o{i}.pt")
            run("convert", "--dtype", "fp16", *flags, p, "-o", out)
            got = walk_tensors(torch.load(out))
            for name, converted in expect.items():
                self.assertEqual(got[name].dtype, torch.float16 if converted else torch.float32, (flags, name))

    def test_shared_storage_with_a_kept_tensor_stays_float32(self):
        base = torch.randn(10)
        p = self.path("s.pt")
        torch.save({"norm": base[0:6], "w": base[4:10]}, p)  # overlapping: one component
        out = self.path("s16.pt")
        r = run("convert", "--dtype", "bf16", "--keep", "norm", p, "-o", out)
        self.assertIn("share a storage", r.stderr)
        got = torch.load(out)
        self.assertEqual(got["w"].dtype, torch.float32)
        self.assertEqual(got["w"].storage().data_ptr(), got["norm"].storage().data_ptr())

    def write_safetensors(self, path, tensors, metadata=None):
        header, blobs, off = {}, [], 0
        if metadata:
            header["__metadata__"] = metadata
        for name, t in tensors.items():
            raw = t.contiguous().numpy().tobytes()
            header[name] = {"dtype": {torch.float32: "F32", torch.int64: "I64"}[t.dtype],
                            "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
            blobs.append(raw)
            off += len(raw)
        text = json.dumps(header).encode()
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))

    def test_hf_folder_with_indexes(self):
        torch.manual_seed(5)
        folder = self.path("model")
        os.makedirs(folder)
        shards = {
            "pytorch_model-00001-of-00002.bin": {"model.embed.weight": torch.randn(32, 8), "model.norm.weight": torch.randn(8)},
            "pytorch_model-00002-of-00002.bin": {"lm_head.weight": torch.randn(32, 8), "model.pos": torch.arange(5)},
        }
        wm = {}
        for fname, sd in shards.items():
            torch.save(sd, os.path.join(folder, fname))
            wm.update({k: fname for k in sd})
        with open(os.path.join(folder, "pytorch_model.bin.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 1}, "weight_map": wm}, f)
        st = {
            "model-00001-of-00002.safetensors": {"a.weight": sample()[:1000].reshape(100, 10), "a.ids": torch.arange(7)},
            "model-00002-of-00002.safetensors": {"b.weight": torch.randn(3, 5)},
        }
        swm = {}
        for fname, sd in st.items():
            self.write_safetensors(os.path.join(folder, fname), sd, {"source": "test"})
            swm.update({k: fname for k in sd})
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 1}, "weight_map": swm}, f)
        for name, text in (("config.json", '{"hidden_size": 8}'), ("tokenizer.json", '{"v": 1}'),
                           ("tokenizer.model", "binary-ish")):
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        before = {n: read_bytes(os.path.join(folder, n)) for n in os.listdir(folder)}
        run("convert", "--dtype", "bf16", folder)
        out = os.path.join(folder, "bf16")
        self.assertEqual(sorted(os.listdir(out)), sorted(before))
        for n, data in before.items():  # inputs never modified
            self.assertEqual(read_bytes(os.path.join(folder, n)), data)
        for n in ("config.json", "tokenizer.json", "tokenizer.model"):
            self.assertEqual(read_bytes(os.path.join(out, n)), before[n])
        total = 0
        for fname, sd in shards.items():
            got = torch.load(os.path.join(out, fname), weights_only=True)
            for k, t in sd.items():
                want = t.to(torch.bfloat16) if t.dtype == torch.float32 else t
                self.assertTrue(torch.equal(got[k], want), k)
                total += want.numel() * want.element_size()
        index = read_json(os.path.join(out, "pytorch_model.bin.index.json"))
        self.assertEqual(index["weight_map"], wm)
        self.assertEqual(index["metadata"]["total_size"], total)
        st_total = 0
        for fname, sd in st.items():
            meta, got = read_safetensors(self, os.path.join(out, fname))
            self.assertEqual(meta, {"source": "test", "format": "pt"})
            for k, t in sd.items():
                dtype, arr = got[k]
                if t.dtype == torch.float32:
                    self.assertEqual(dtype, "BF16")
                    want = as_bits(t.to(torch.bfloat16))
                    nan = np.isnan(t.numpy()).reshape(-1)
                    np.testing.assert_array_equal(arr.reshape(-1)[~nan], want.reshape(-1)[~nan])
                else:
                    np.testing.assert_array_equal(arr, t.numpy())
                st_total += arr.nbytes
        sindex = read_json(os.path.join(out, "model.safetensors.index.json"))
        self.assertEqual(sindex["weight_map"], swm)
        self.assertEqual(sindex["metadata"]["total_size"], st_total)
        self.assertFalse([n for n in os.listdir(out) if n.startswith(".")], "temp files left")

    def test_single_file_needs_an_output_and_never_overwrites(self):
        p = self.path("a.pt")
        torch.save({"w": torch.randn(3)}, p)
        r = run("convert", "--dtype", "bf16", p, expect=1)
        self.assertIn("--output-dir", r.stderr)
        r = run("convert", "--dtype", "bf16", p, "-o", p, expect=1)
        self.assertIn("--force", r.stderr)
        r = run("convert", "--dtype", "bf16", p, "-o", p, "--force", expect=1)
        self.assertIn("never overwrites its input", r.stderr)
        self.assertNotIn("Done", r.stdout)


if __name__ == "__main__":
    import unittest
    unittest.main()
