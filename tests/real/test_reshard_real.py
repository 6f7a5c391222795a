"""`ckptool reshard --to universal` against the real DeepSpeed 0.19 (CPU, gloo): ZeRO 1, 2 and 3
trained on 2 ranks (fp32, bf16, parameter_alignment; AdamW, and SGD with momentum), every rank fed
the same batches so that the run does not depend on the world size (real_ucp_train.py).

  * every file ckptool writes equals (torch.load, every tensor's dtype, shape and bits, every
    other value) the file of that name DeepSpeed's own ds_to_universal.py --inject_missing_state
    writes for the same checkpoint; what only DeepSpeed writes is the fallback `fp32.pt` of
    buffers, frozen parameters and tied aliases (stages 1/2), which its loader never reads;
  * resuming ckptool's universal checkpoint with "load_universal" on 1 and on 3 ranks gives the
    uninterrupted 2-rank run's next losses and learning rates bit for bit, and every fp32 master
    weight and optimizer state gathered right after the load equals the one gathered right after
    the save (buffers are not: DeepSpeed's universal load never loads the module);
  * SGD's momentum_buffer (which ds_to_universal cannot convert: KeyError 'exp_avg') resumes too;
  * both universal checkpoints (ckptool's and DeepSpeed's) verify and export the model the ZeRO
    checkpoint exports, byte for byte; a missing or cut parameter file fails verify;
  * a damaged rank file is refused with nothing written; an existing output is not replaced
    without --force."""
import json
import os
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import real_ucp_train  # noqa: E402
import torch  # noqa: E402

from stacklib import TempDirTest, fixture, python, run  # noqa: E402

STEPS = real_ucp_train.STEPS
TAG = f"global_step{STEPS}"
# name -> (stage, dtype, parameter_alignment, optimizer)
CONFIGS = {
    "s1_fp32": (1, "fp32", 0, "adamw"),
    "s2_bf16_align": (2, "bf16", 1, "adamw"),
    "s3_fp32": (3, "fp32", 0, "adamw"),
    "s3_bf16": (3, "bf16", 0, "adamw"),
    "s2_sgd": (2, "fp32", 0, "sgd"),
}
WORLDS = (1, 3)


def trained(name, into):
    stage, dtype, align, opt = CONFIGS[name]
    return fixture(f"ucp-{name}", real_ucp_train.script(), "train", stage, dtype, align, 2, opt,
                   into=into)


def load(path):
    return torch.load(path, weights_only=False)


def assert_same(case, a, b, where):
    """The same value: tensors by dtype, shape and bits; containers member by member; DeepSpeed's
    objects (LossScaler) by their attributes."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        case.assertIsInstance(a, torch.Tensor, where)
        case.assertIsInstance(b, torch.Tensor, where)
        case.assertEqual((a.dtype, tuple(a.shape)), (b.dtype, tuple(b.shape)), where)
        bits = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
        case.assertTrue(torch.equal(*bits), where)
    elif isinstance(a, dict):
        case.assertIsInstance(b, dict, where)
        case.assertEqual(list(a), list(b), where)
        for k in a:
            assert_same(case, a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        case.assertEqual((type(a), len(a)), (type(b), len(b)), where)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(case, x, y, f"{where}[{i}]")
    elif type(a).__module__.startswith("deepspeed"):
        case.assertIs(type(a), type(b), where)
        case.assertEqual(vars(a), vars(b), where)
    else:
        case.assertEqual(a, b, where)


def files_under(root):
    return sorted(os.path.relpath(os.path.join(d, n), root)
                  for d, _, ns in os.walk(root) for n in ns)


class ReshardRealTest(TempDirTest):
    def setUp(self):
        super().setUp()
        self.env = dict(os.environ, DS_ACCELERATOR="cpu")

    def reshard(self, name):
        """A fresh copy of the trained checkpoint, resharded by ckptool; returns (root, ucp)."""
        src = trained(name, self.path("fx", name))
        root = self.path(name, "ckpt")
        shutil.copytree(os.path.join(src, "ckpt"), root)
        before = {f: open(os.path.join(root, f), "rb").read() for f in files_under(root)}
        r = run("reshard", root, "--to", "universal", "--json")
        report = json.loads(r.stdout)
        ucp = os.path.join(root, TAG + "_universal")
        self.assertEqual(os.path.realpath(report["output"]), os.path.realpath(ucp))
        with open(os.path.join(root, "latest_universal")) as f:
            self.assertEqual(f.read(), TAG + "_universal")
        for f, data in before.items():  # the checkpoint itself is untouched
            with open(os.path.join(root, f), "rb") as fh:
                self.assertEqual(fh.read(), data, f)
        return src, root, ucp, report

    def deepspeed_universal(self, root):
        """What DeepSpeed's own converter writes for the same checkpoint."""
        out = self.path("ds", os.path.basename(os.path.dirname(root)), TAG + "_universal")
        os.makedirs(os.path.dirname(out))
        subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                        "--input_folder", os.path.join(root, TAG), "--output_folder", out,
                        "--inject_missing_state", "--num_extract_workers", "1",
                        "--num_merge_workers", "1"],
                       check=True, env=self.env, capture_output=True, timeout=600)
        return out

    def resume(self, name, root, world):
        stage, dtype, align, opt = CONFIGS[name]
        out = self.path("resume", f"{name}-w{world}")
        os.makedirs(out)
        spec = [{"name": name, "dir": root, "stage": stage, "dtype": dtype, "align": align,
                 "opt": opt, "universal": True}]
        with open(os.path.join(out, "spec.json"), "w") as f:
            json.dump(spec, f)
        python(real_ucp_train.script(), out, "resume", os.path.join(out, "spec.json"), world,
               timeout=900)
        with open(os.path.join(out, f"resume_w{world}.json")) as f:
            return json.load(f)[name], load(os.path.join(out, f"state_{name}_w{world}.pt"))

    def test_every_file_equals_deepspeeds_own_conversion(self):
        for name, (stage, _, _, opt) in CONFIGS.items():
            if opt != "adamw":
                continue  # ds_to_universal knows Adam's keys only
            with self.subTest(config=name):
                _, root, ucp, report = self.reshard(name)
                self.assertEqual(report["stage"], stage)
                self.assertEqual(report["optimizer_state"], ["exp_avg", "exp_avg_sq"])
                theirs = self.deepspeed_universal(root)
                ours_files, their_files = files_under(ucp), files_under(theirs)
                for f in ours_files:
                    self.assertIn(f, their_files)
                    assert_same(self, load(os.path.join(ucp, f)), load(os.path.join(theirs, f)), f)
                only_theirs = set(their_files) - set(ours_files)
                # Buffers, frozen parameters and the tied alias: stages 1/2 fallback files.
                self.assertEqual({os.path.dirname(f) for f in only_theirs},
                                 set() if stage == 3 else
                                 {"zero/count", "zero/ids", "zero/scale", "zero/frozen.weight",
                                  "zero/frozen.bias", "zero/head.weight"})
                self.assertTrue(all(f.endswith("/fp32.pt") for f in only_theirs), only_theirs)
                self.assertGreaterEqual(len(ours_files), 20)
                # Both universal checkpoints verify, and export the model the ZeRO checkpoint
                # exports (zero_to_fp32's state dict: test_deepspeed_real), byte for byte.
                exports = []
                for i, folder in enumerate((os.path.join(root, TAG), ucp, theirs)):
                    self.assertIn("OK", run("verify", folder).stdout)
                    out = self.path(name, f"export-{i}.safetensors")
                    run("export", folder, "--to", out)
                    with open(out, "rb") as f:
                        exports.append(f.read())
                self.assertEqual(exports[1], exports[0], "export of ckptool's universal checkpoint")
                self.assertEqual(exports[2], exports[0], "export of DeepSpeed's universal checkpoint")

    def test_resume_on_one_and_three_ranks_is_bit_exact(self):
        for name, (stage, _, _, opt) in CONFIGS.items():
            src, root, ucp, report = self.reshard(name)
            if opt == "sgd":
                self.assertEqual(report["optimizer_state"], ["momentum_buffer"])
                self.assertFalse(any(f.endswith("step.pt") for f in files_under(ucp)))
            with open(os.path.join(src, "train.json")) as f:
                record = json.load(f)
            saved = load(os.path.join(src, "state_train.pt"))
            for world in WORLDS:
                with self.subTest(config=name, world=world):
                    ranks, state = self.resume(name, root, world)
                    self.assertEqual(len(ranks), world)
                    for rank, r in enumerate(ranks):
                        self.assertNotIn("error", r, r.get("error"))
                        self.assertEqual(r["losses"], record[0]["losses"][STEPS:], f"rank {rank}")
                        self.assertEqual(r["lrs"], record[0]["lrs"][STEPS:], f"rank {rank}")
                        self.assertEqual(r["global_steps"], STEPS)
                    self.assertEqual(sorted(state), sorted(saved))
                    for k in saved:
                        # DeepSpeed's universal load never loads the module: buffers keep the
                        # fresh model's values (as with ds_to_universal's output).
                        if not k.startswith("buffer:"):
                            assert_same(self, state[k], saved[k], k)

    def test_a_manifest_of_the_root_stays_true(self):
        """The universal checkpoint lands in a folder with a manifest: its files are recorded
        (not reported as added, nor recorded under the temp folder's name)."""
        src = trained("s2_sgd", self.path("fx-m"))
        root = self.path("m", "ckpt")
        shutil.copytree(os.path.join(src, "ckpt"), root)
        run("manifest", root)
        run("reshard", root, "--to", "universal")
        self.assertIn("matches", run("verify", root).stdout)
        with open(os.path.join(root, "ckptool-manifest.json")) as f:
            names = [r["name"] for r in json.load(f)["resources"]]
        self.assertIn(f"{TAG}_universal/zero/optimizer_state.pt", names)
        self.assertIn("latest_universal", names)
        self.assertFalse(any("ckptool-tmp" in n for n in names), names)

    def test_a_damaged_universal_checkpoint_fails_verify(self):
        _, root, ucp, _ = self.reshard("s3_fp32")
        self.assertIn("universal checkpoint", run("verify", ucp).stdout)
        param = sorted(os.listdir(os.path.join(ucp, "zero")))[0]
        cases = {
            "fp32.pt deleted": ("fp32.pt", None, "has no zero/"),
            "a state file deleted": ("exp_avg.pt", None, "holds"),
            "fp32.pt cut short": ("fp32.pt", 200, "fp32.pt"),
        }
        for what, (name, size, needle) in cases.items():
            with self.subTest(what):
                copy = self.path("damaged-" + what.replace(" ", "-"))
                shutil.copytree(ucp, copy)
                target = os.path.join(copy, "zero", param if param != "optimizer_state.pt"
                                      else sorted(os.listdir(os.path.join(copy, "zero")))[1], name)
                if size is None:
                    os.remove(target)
                else:
                    os.truncate(target, size)
                r = run("verify", copy, expect=1)
                self.assertIn(needle, r.stdout + r.stderr)

    def test_refuses_damage_and_existing_output(self):
        _, root, ucp, _ = self.reshard("s1_fp32")
        r = run("reshard", root, "--to", "universal", expect=1)
        self.assertIn("exists", r.stderr)
        run("reshard", root, "--to", "universal", "--force")
        # --force never swaps out the checkpoint itself, nor a folder holding it.
        before = {f: open(os.path.join(root, f), "rb").read() for f in files_under(root)}
        for out in (os.path.join(root, TAG), root, os.path.join(root, TAG, "u")):
            r = run("reshard", root, "--to", "universal", "-o", out, "--force", expect=1)
            self.assertIn("the checkpoint", r.stderr)
        self.assertEqual({f: open(os.path.join(root, f), "rb").read() for f in files_under(root)},
                         before)
        damaged = self.path("damaged")
        shutil.copytree(os.path.join(trained("s1_fp32", self.path("fx2")), "ckpt"), damaged)
        rank1 = next(os.path.join(damaged, TAG, n) for n in os.listdir(os.path.join(damaged, TAG))
                     if "rank_1" in n and "optim" in n)
        with open(rank1, "r+b") as f:  # one bit of tensor data: only the CRC32 tells
            f.seek(os.path.getsize(rank1) // 2)
            b = f.read(1)[0]
            f.seek(os.path.getsize(rank1) // 2)
            f.write(bytes([b ^ 1]))
        r = run("reshard", damaged, "--to", "universal", expect=1)
        self.assertIn("refusing a damaged input", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(damaged, TAG + "_universal")))
        self.assertFalse(os.path.exists(os.path.join(damaged, "latest_universal")))
        self.assertEqual([n for n in os.listdir(damaged) if n.startswith(".")], [])


if __name__ == "__main__":
    unittest.main()
