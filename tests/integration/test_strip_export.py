"""`ckptool strip` and `ckptool export` on training checkpoints made by real torch."""
import copy
import json
import os

import numpy as np
import torch

from ckpt_testlib import (CkptTestCase, assert_same_object, read_bytes, read_json, read_safetensors,
                          run, walk_tensors)


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def trained(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def lightning_ckpt():
    model, opt, sched = trained(1)
    sd = model.state_dict()
    return {"epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.1.0",
            "state_dict": {f"model.{k}": v for k, v in sd.items()},
            "optimizer_states": [opt.state_dict()], "lr_schedulers": [sched.state_dict()],
            "hyper_parameters": {"hidden": 64, "name": "run"}, "loops": {"fit_loop": {"epoch": 3}}}


def deepspeed_states():
    model, opt, sched = trained(2)
    return {"module": model.state_dict(), "optimizer": opt.state_dict(),
            "lr_scheduler": sched.state_dict(), "global_steps": 120, "ds_version": "0.14.0"}


def plain_training_dict():
    model, opt, sched = trained(3)
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "scaler": {"scale": torch.tensor(65536.0)}, "epoch": 7,
            "rng_state": torch.get_rng_state()}


class StripTest(CkptTestCase):
    def check_default_strip(self, name, obj, dropped):
        p = self.path(name)
        torch.save(obj, p)
        before = os.path.getsize(p)
        r = json.loads(run("strip", "--json", p).stdout)
        got = [d["path"] for d in r["files"][0]["dropped"]]
        self.assertEqual(sorted(got), sorted(dropped))
        freed = sum(d["bytes"] for d in r["files"][0]["dropped"])
        self.assertGreater(freed, 0)
        after = os.path.getsize(p)
        self.assertLessEqual(after, before - freed)
        expected = {k: v for k, v in obj.items() if k not in dropped}
        assert_same_object(self, expected, torch.load(p))
        run("verify", p)

    def test_lightning_deepspeed_and_plain_layouts(self):
        self.check_default_strip("last.ckpt", lightning_ckpt(), ["optimizer_states", "lr_schedulers"])
        self.check_default_strip("mp_rank_00_model_states.pt", deepspeed_states(), ["optimizer", "lr_scheduler"])
        self.check_default_strip("checkpoint.pt", plain_training_dict(),
                                 ["optimizer", "scheduler", "scaler", "rng_state"])

    def test_drop_and_keep_globs(self):
        obj = plain_training_dict()
        p = self.path("c.pt")
        torch.save(obj, p)
        run("strip", p, "--drop", "optimizer.state.*.exp_avg_sq", "--keep", "optimizer.state.0.*")
        got = torch.load(p)
        self.assertIn("exp_avg_sq", got["optimizer"]["state"][0])  # protected
        self.assertNotIn("exp_avg_sq", got["optimizer"]["state"][1])
        self.assertIn("exp_avg", got["optimizer"]["state"][1])
        expected = copy.deepcopy(obj)
        for k in list(expected["optimizer"]["state"])[1:]:
            del expected["optimizer"]["state"][k]["exp_avg_sq"]
        assert_same_object(self, expected, got)

    def test_dry_run_and_output_file(self):
        p = self.path("c.pt")
        torch.save(plain_training_dict(), p)
        original = read_bytes(p)
        out = run("strip", "--dry-run", p).stdout
        self.assertIn("would drop optimizer", out)
        self.assertEqual(read_bytes(p), original)
        out = run("strip", p, "-o", self.path("small.pt")).stdout
        self.assertIn("dropped optimizer", out)
        self.assertEqual(read_bytes(p), original)
        self.assertEqual(sorted(torch.load(self.path("small.pt"))), ["epoch", "model"])

    def test_folder_lists_and_deletes_training_only_files(self):
        d = self.path("checkpoint-500")
        os.makedirs(d)
        model, opt, sched = trained(4)
        torch.save(model.state_dict(), os.path.join(d, "pytorch_model.bin"))
        torch.save(opt.state_dict(), os.path.join(d, "optimizer.pt"))
        torch.save(sched.state_dict(), os.path.join(d, "scheduler.pt"))
        torch.save(torch.get_rng_state(), os.path.join(d, "rng_state_0.pth"))
        out = run("strip", d).stdout
        self.assertIn("optimizer.pt: training-only file", out)
        self.assertTrue(os.path.exists(os.path.join(d, "optimizer.pt")))
        run("strip", d, "--delete-files")
        self.assertEqual(sorted(os.listdir(d)), ["pytorch_model.bin"])
        torch.load(os.path.join(d, "pytorch_model.bin"))


class ExportTest(CkptTestCase):
    def check_export(self, obj, selection, out_dir, *flags, dtype=None):
        p = self.path("src.ckpt")
        torch.save(obj, p)
        r = json.loads(run("export", p, "--to", out_dir, "--json", *flags).stdout)
        self.assertEqual(r["selected"], selection)
        want = {k[len(selection) + 1:]: v for k, v in walk_tensors(obj).items() if k.startswith(selection + ".")}
        got, meta_all = {}, {}
        index = os.path.join(out_dir, "model.safetensors.index.json")
        files = [f for f in r["files"] if f.endswith(".safetensors")]
        for f in files:
            meta, tensors = read_safetensors(self, f)
            self.assertEqual(meta.get("format"), "pt")
            meta_all.update({k: v for k, v in meta.items() if k != "format"})
            for k, (st_dtype, arr) in tensors.items():
                self.assertNotIn(k, got)
                got[k] = (arr, f)
        names = set(got) | set(meta_all)
        self.assertEqual(names, set(want))
        for alias, kept in meta_all.items():
            self.assertTrue(want[alias] is want[kept] or torch.equal(want[alias], want[kept]))
        for k, (arr, _) in got.items():
            t = want[k]
            if dtype is not None and t.dtype == torch.float32:
                t = t.to(dtype)
            expect = t.contiguous().view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 \
                else t.contiguous().numpy()
            np.testing.assert_array_equal(arr, expect.reshape(arr.shape), k)
        if len(files) > 1:
            idx = read_json(index)
            self.assertEqual(idx["weight_map"], {k: os.path.basename(f) for k, (_, f) in got.items()})
            self.assertEqual(idx["metadata"]["total_size"], sum(a.nbytes for a, _ in got.values()))
        return r, got, meta_all

    def test_lightning_state_dict_with_tied_and_strided(self):
        obj = lightning_ckpt()
        obj["state_dict"]["model.head_tied"] = obj["state_dict"]["model.0.weight"]
        obj["state_dict"]["model.strided"] = torch.randn(8, 8).t()
        r, got, meta = self.check_export(obj, "state_dict", self.path("out"))
        self.assertEqual(meta, {"model.head_tied": "model.0.weight"})
        self.assertEqual(r["aliases"], 1)

    def test_tied_names_keep_the_first_in_the_source_order(self):
        # As Hugging Face's save_pretrained keeps transformer.wte.weight and drops lm_head.weight,
        # and as ZeRO and DCP exports record theirs: the name met first is stored.
        w = torch.randn(16, 8)
        obj = {"transformer.wte.weight": w, "h.0.bias": torch.randn(8), "lm_head.weight": w}
        p = self.path("tied.pt")
        torch.save(obj, p)
        run("export", p, "-o", self.path("out"))
        meta, tensors = read_safetensors(self, self.path("out/model.safetensors"))
        self.assertEqual(meta, {"format": "pt", "lm_head.weight": "transformer.wte.weight"})
        self.assertEqual(sorted(tensors), ["h.0.bias", "transformer.wte.weight"])

    def test_a_latest_link_to_a_model_file_is_no_deepspeed_marker(self):
        # DeepSpeed's `latest` is a small text file naming the tag folder; a `latest` symlink to
        # a model file (a common convention) must not make the folder a ZeRO checkpoint.
        folder = self.path("run")
        os.makedirs(folder)
        model, _, _ = trained(3)
        torch.save(model.state_dict(), os.path.join(folder, "step-10.pt"))
        os.symlink("step-10.pt", os.path.join(folder, "latest"))
        r = run("verify", folder)
        self.assertIn("step-10.pt: OK", r.stdout)
        run("inspect", folder)
        run("export", folder, "-o", self.path("out"))
        meta, tensors = read_safetensors(self, self.path("out/model.safetensors"))
        self.assertEqual(set(tensors), set(model.state_dict()))

    def test_deepspeed_module_to_bf16_in_shards(self):
        obj = deepspeed_states()
        r, got, meta = self.check_export(obj, "module", self.path("out"), "--dtype", "bf16",
                                         "--max-shard-size", "10KB", dtype=torch.bfloat16)
        self.assertGreater(len(r["files"]), 2)
        self.assertTrue(r["files"][-1].endswith("model.safetensors.index.json"))
        for f in r["files"][:-1]:
            self.assertRegex(os.path.basename(f), r"^model-\d{5}-of-\d{5}\.safetensors$")

    def test_hostile_source_exports_safely(self):
        marker = self.path("pwned")
        obj = {"model": trained(5)[0].state_dict(), "payload": Evil(marker)}
        p = self.path("evil.pt")
        torch.save(obj, p)
        r = run("export", p, "--to", self.path("out"))
        self.assertIn("posix.system", r.stderr)
        self.assertFalse(os.path.exists(marker))
        meta, tensors = read_safetensors(self, self.path("out/model.safetensors"))
        self.assertEqual(set(tensors), set(obj["model"]))

    def test_bare_training_dict_leaves_training_state_out_unless_all(self):
        # No model key (state_dict, module, model...): the object is the model less its
        # training state, as strip would leave it; --all keeps everything.
        model, opt, _ = trained(5)
        obj = dict(model.state_dict())
        obj["optimizer"] = opt.state_dict()
        obj["rng_state"] = torch.get_rng_state()
        p = self.path("bare.pt")
        torch.save(obj, p)
        r = run("export", p, "-o", self.path("out"))
        self.assertIn("training-state tensors left out (--all keeps them", r.stderr)
        meta, tensors = read_safetensors(self, self.path("out/model.safetensors"))
        self.assertEqual(set(tensors) | set(meta) - {"format"}, set(model.state_dict()))
        run("export", p, "-o", self.path("everything"), "--all")
        meta, tensors = read_safetensors(self, self.path("everything/model.safetensors"))
        self.assertIn("rng_state", tensors)
        self.assertTrue(any(k.startswith("optimizer.state.") for k in tensors))
        # A bare optimizer state dict is training state as a whole.
        torch.save(opt.state_dict(), self.path("optim.pt"))
        r = run("export", self.path("optim.pt"), "-o", self.path("none"), expect=1)
        self.assertIn("are training state (--all exports them)", r.stderr)
        self.assertFalse(os.path.exists(self.path("none")))

    def test_dtype_warns_when_conversion_changes_more_than_rounding(self):
        torch.manual_seed(0)
        obj = {"model": {"ok": torch.randn(64), "big": torch.full((8,), 2.0 ** 18),
                         "tiny": torch.full((8,), 1e-9), "count": torch.tensor([4097.0])}}
        p = self.path("m.pt")
        torch.save(obj, p)
        r = run("export", p, "-o", self.path("fp16"), "--dtype", "fp16")
        self.assertIn("converting to fp16 changed more than rounding in 3 tensors", r.stderr)
        for name in ("big: 8 values would become infinity", "tiny: 8 of its 8 non-zero",
                     "count: it holds whole numbers"):
            self.assertIn(name, r.stderr)
        self.assertNotIn("ok:", r.stderr)
        r = run("export", p, "-o", self.path("bf16"), "--dtype", "bf16")
        self.assertIn("changed more than rounding in 1 tensor ", r.stderr)  # the counter
        r = run("export", p, "-o", self.path("plain"))
        self.assertNotIn("rounding", r.stderr)


if __name__ == "__main__":
    import unittest
    unittest.main()
