"""`ckptool export` of DeepSpeed ZeRO 1/2/3 checkpoints (laid out by zero_fixtures.py exactly as
DeepSpeed's engine writes them): the consolidated model equals zero_to_fp32's, bit for bit."""
import json
import os

import numpy as np
import torch

import zero_fixtures as zf
from ckpt_testlib import CkptTestCase, read_bytes, read_safetensors, run

NP_TO_TORCH = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64}


def as_torch(dtype, array):
    if dtype == "BF16":  # numpy has no bfloat16: the reader gives its bits as uint16
        return torch.from_numpy(np.array(array.astype(np.int16), copy=True)).view(torch.bfloat16)
    return torch.from_numpy(np.array(array, copy=True))


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


class ZeroExportTest(CkptTestCase):
    def export(self, root, *args):
        out = self.path(f"out{len(os.listdir(self.tmp))}")
        run("export", root, "--to", out, *args)
        files = sorted(os.listdir(out))
        tensors, meta = {}, {}
        for name in files:
            if name.endswith(".safetensors"):
                m, t = read_safetensors(self, os.path.join(out, name))
                meta.update(m)
                tensors.update({k: as_torch(d, a) for k, (d, a) in t.items()})
        return out, files, tensors, meta

    def assert_consolidated(self, tensors, meta, expected):
        """Every name zero_to_fp32 returns is there, bit for bit; tied names are aliases."""
        for name, t in expected.items():
            kept = meta.get(name, name)
            self.assertIn(kept, tensors, name)
            got = tensors[kept]
            self.assertEqual(got.dtype, t.dtype, name)
            self.assertEqual(tuple(got.shape), tuple(t.shape), name)
            self.assertTrue(torch.equal(raw(got), raw(t)), name)
        self.assertEqual(set(tensors) - set(expected), set())

    def test_every_stage_and_world_size_equals_zero_to_fp32(self):
        for stage in (1, 2, 3):
            for ws in (1, 2, 3, 5, 11):
                with self.subTest(stage=stage, world_size=ws):
                    root = self.path(f"s{stage}w{ws}")
                    fx = zf.make_zero_checkpoint(root, stage, ws, python311_enum=(ws % 2 == 1))
                    expected = zf.reference_consolidate(root)
                    _, files, tensors, meta = self.export(root)
                    self.assertEqual(files, ["model.safetensors"])
                    self.assert_consolidated(tensors, meta, expected)
                    self.assertEqual(meta.get("format"), "pt")
                    self.assertTrue(fx.aliases, "the fixture ties a weight")
                    for alias, owner in fx.aliases.items():
                        self.assertEqual(meta[alias], owner)

    def test_torch_file_output_is_zero_to_fp32s_state_dict(self):
        """`--to model.pt` writes what zero_to_fp32.py's torch.save(state_dict) gives: the same
        keys in the same order, bit-identical tensors, tied names one tensor object."""
        for stage in (1, 2, 3):
            with self.subTest(stage=stage):
                root = self.path(f"pt{stage}")
                fx = zf.make_zero_checkpoint(root, stage, 3, python311_enum=True)
                expected = zf.reference_consolidate(root)
                out = self.path(f"pt{stage}.pt")
                run("export", root, "--to", out)
                sd = torch.load(out, weights_only=True)
                self.assertEqual(list(sd.keys()), list(expected.keys()))
                for name, t in expected.items():
                    self.assertEqual(sd[name].dtype, t.dtype, name)
                    self.assertEqual(tuple(sd[name].shape), tuple(t.shape), name)
                    self.assertTrue(torch.equal(raw(sd[name]), raw(t)), name)
                self.assertTrue(fx.aliases)
                for alias, owner in fx.aliases.items():
                    self.assertIs(sd[alias], sd[owner])
                # The same through --dtype bf16, and verify calls the new file healthy.
                out16 = self.path(f"pt{stage}-bf16.pt")
                run("export", root, "--to", out16, "--dtype", "bf16")
                sd16 = torch.load(out16, weights_only=True)
                for name, t in expected.items():
                    want = t.to(torch.bfloat16) if t.is_floating_point() else t
                    self.assertTrue(torch.equal(raw(sd16[name]), raw(want)), name)
                self.assertEqual(run("verify", out16).returncode, 0)
        p = run("export", self.path("pt1"), "--to", self.path("x.pt"), "--max-shard-size", "1MB", expect=None)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--max-shard-size", p.stderr)
        self.assertFalse(os.path.exists(self.path("x.pt")))

    def test_dtype_frozen_shards_and_tags(self):
        root = self.path("run")
        zf.make_zero_checkpoint(root, 3, 4, dtype=torch.float16)
        expected = zf.reference_consolidate(root)
        # --dtype bf16: what torch's .to(torch.bfloat16) makes of zero_to_fp32's result.
        _, _, tensors, meta = self.export(root, "--dtype", "bf16")
        self.assert_consolidated(tensors, meta, {k: v.to(torch.bfloat16) if v.is_floating_point() else v
                                                 for k, v in expected.items()})
        # --exclude-frozen, as zero_to_fp32's exclude_frozen_parameters.
        _, _, tensors, meta = self.export(root, "--exclude-frozen")
        self.assert_consolidated(tensors, meta, zf.reference_consolidate(root, exclude_frozen_parameters=True))
        # Shards and index as Hugging Face names them.
        out, files, tensors, meta = self.export(root, "--max-shard-size", "1KiB")
        self.assertIn("model.safetensors.index.json", files)
        self.assertGreater(len(files), 2)
        self.assertTrue(all(f.startswith("model-0000") for f in files if f.endswith(".safetensors")))
        self.assert_consolidated(tensors, meta, expected)
        # The tag folder itself, and --tag, give the same model.
        _, _, tensors, meta = self.export(os.path.join(root, "global_step14"))
        self.assert_consolidated(tensors, meta, expected)
        other = zf.make_zero_checkpoint(root, 3, 4, tag="global_step20", dtype=torch.float16, seed=7)
        self.assertEqual(read_bytes(os.path.join(root, "latest")), b"global_step20")
        _, _, tensors, meta = self.export(root, "--tag", "global_step14")
        self.assert_consolidated(tensors, meta, expected)
        _, _, tensors, meta = self.export(root)
        self.assert_consolidated(tensors, meta, zf.reference_consolidate(root))
        self.assertTrue(other.aliases)

    def test_checkpoints_zero_to_fp32_refuses_are_clear_errors(self):
        cases = [
            (zf.make_bf16_optimizer_checkpoint, (2,), "no zero_stage"),
            (zf.make_tensor_parallel_checkpoint, (2, 2), "tensor parallel"),
            (zf.make_moe_checkpoint, (2, 2), "Mixture-of-Experts"),
        ]
        for make, args, reason in cases:
            with self.subTest(reason=reason):
                root = self.path(make.__name__)
                fx = make(root, *args)
                out = self.path(make.__name__ + "_out")
                r = run("export", root, "--to", out, expect=1)
                self.assertIn(reason, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertFalse(os.path.exists(os.path.join(out, "model.safetensors")))
                self.assertTrue(fx.error_message)
        # A universal checkpoint (ds_to_universal's layout) is read as the model it holds: its
        # export is the export of the ZeRO checkpoint it was made from.
        for stage in (2, 3):
            root = self.path(f"universal{stage}")
            fx = zf.make_universal_checkpoint(root, stage, 2)
            run("export", root, "--tag", fx.tag, "--to", self.path(f"u{stage}_out"))
            run("export", root, "--to", self.path(f"z{stage}_out"))
            with open(os.path.join(self.path(f"u{stage}_out"), "model.safetensors"), "rb") as a, \
                    open(os.path.join(self.path(f"z{stage}_out"), "model.safetensors"), "rb") as b:
                self.assertEqual(a.read(), b.read(), f"stage {stage}")

    def test_inspect_and_verify_see_one_model(self):
        root = self.path("run")
        fx = zf.make_zero_checkpoint(root, 3, 5)
        expected = zf.reference_consolidate(root)
        doc = json.loads(run("inspect", "--json", root).stdout)
        (zero,) = doc["zero"]
        self.assertEqual((zero["stage"], zero["world_size"], zero["tag"]), (3, 5, "global_step14"))
        names = {t["name"]: t for t in zero["tensors"]}
        self.assertEqual(set(names) | set(zero["aliases"]), set(expected))
        for name, t in names.items():
            self.assertEqual(t["shape"], list(expected[name].shape), name)
            self.assertEqual(t["bytes"], expected[name].numel() * expected[name].element_size(), name)
        self.assertEqual(zero["aliases"], fx.aliases)
        text = run("inspect", root).stdout
        self.assertIn("DeepSpeed ZeRO stage 3, 5 ranks", text)
        self.assertIn("optimizer state files: 5", text)
        r = run("verify", root)
        self.assertIn("OK (DeepSpeed ZeRO stage 3, 5 ranks", r.stdout)
        victim = os.path.join(root, "global_step14", fx.optim_files[-1])
        os.remove(victim)
        r = run("verify", root, expect=1)
        self.assertIn("partition_count says 5 ranks but there are 4", r.stdout)

    def test_a_folders_rank_files_are_described_as_each_file_alone(self):
        # inspect describes each rank file from the parse the ZeRO reader makes of it: the
        # reports must be those of the file inspected by itself, in the same order, also
        # when a damaged file stops the ZeRO reader part way (the rest are then read alone).
        root = self.path("run")
        fx = zf.make_zero_checkpoint(root, 3, 3)
        folder = os.path.join(root, "global_step14")
        for damaged in (False, True):
            with self.subTest(damaged=damaged):
                if damaged:
                    victim = os.path.join(folder, fx.optim_files[0])
                    data = read_bytes(victim)
                    with open(victim, "wb") as f:
                        f.write(data[: len(data) // 2])
                r = run("inspect", "--json", root, expect=1 if damaged else 0)
                doc = json.loads(r.stdout)
                paths = [f["path"] for f in doc["files"]]
                self.assertEqual(len(paths), 6)
                self.assertEqual(len(doc["zero"]), 1)
                self.assertEqual("error" in doc["zero"][0], damaged)
                for f in doc["files"]:
                    (alone,) = json.loads(run("inspect", "--json", f["path"],
                                              expect=1 if "error" in f else 0).stdout)["files"]
                    self.assertEqual(f, alone, f["path"])
                self.assertEqual(sum("error" in f for f in doc["files"]), 1 if damaged else 0)
                text = run("inspect", root, expect=1 if damaged else 0).stdout
                outs = [run("inspect", p, expect=None).stdout for p in paths]
                alone = "\n".join(o for o in outs if o)
                self.assertTrue(text.startswith(alone), "per-file reports first, in order")
                self.assertEqual("DeepSpeed ZeRO stage 3" in text, not damaged)

    def test_missing_or_truncated_rank_file_is_named(self):
        root = self.path("run")
        fx = zf.make_zero_checkpoint(root, 2, 3)
        folder = os.path.join(root, "global_step14")
        victim = os.path.join(folder, fx.optim_files[1])
        data = read_bytes(victim)
        with open(victim, "wb") as f:
            f.write(data[: len(data) // 2])
        r = run("export", root, "--to", self.path("o1"), expect=1)
        self.assertIn(victim, r.stderr)
        os.remove(victim)
        r = run("export", root, "--to", self.path("o2"), expect=1)
        self.assertIn("partition_count says 3 ranks but there are 2", r.stderr)
        self.assertFalse(os.path.exists(self.path("o2")) and os.listdir(self.path("o2")))

    def test_a_tag_folder_without_rank_files_is_named_not_passed_over(self):
        # What a crash before the first rank file was written leaves: `latest` names a tag
        # folder that holds nothing. inspect and verify say what is missing, and fail.
        root = self.path("empty-run")
        os.makedirs(os.path.join(root, "global_step1"))
        with open(os.path.join(root, "latest"), "w") as f:
            f.write("global_step1")
        for command in ("verify", "inspect"):
            r = run(command, root, expect=1)
            said = r.stdout + r.stderr  # verify's problem lines are its report (stdout)
            self.assertIn("global_step1: no *_model_states.pt files", said, command)
            self.assertNotIn("OK", said, command)


if __name__ == "__main__":
    import unittest
    unittest.main()
