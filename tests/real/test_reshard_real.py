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

from stacklib import SANITIZED, TempDirTest, fixture, python, run  # noqa: E402

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
# The resumes run DeepSpeed (Python) on the files ckptool wrote, which are the same bytes in the
# sanitizer build: there, where every process group runs alone and costs the suite its whole
# wall time, only the 3-rank resumes run (a world size the checkpoint was not saved on, larger
# than its own); every file is still written, verified and exported under the sanitizers.
WORLDS = (3,) if SANITIZED else (1, 3)


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


def zero_stage3_padding(osd, param_shapes, rank, world):
    """Zeroes, in a stage-3 optimizer_state_dict of `rank` of `world`, the fp32 elements past
    each parameter's end (DeepSpeed leaves them uninitialised)."""
    for g, shapes in enumerate(param_shapes):
        flat = osd["fp32_flat_groups"][g]
        at = 0
        for shape in shapes.values():
            numel = 1
            for d in shape:
                numel *= d
            size = -(-numel // world)
            valid = max(0, min(size, numel - rank * size))
            flat.data[at + valid:at + size] = 0
            at += size


def contents(root):
    """Every file below `root` by relative path, with its bytes."""
    out = {}
    for f in files_under(root):
        with open(os.path.join(root, f), "rb") as fh:
            out[f] = fh.read()
    return out


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
        before = contents(root)
        r = run("reshard", root, "--to", "universal", "--json")
        report = json.loads(r.stdout)
        ucp = os.path.join(root, TAG + "_universal")
        self.assertEqual(os.path.realpath(report["output"]), os.path.realpath(ucp))
        with open(os.path.join(root, "latest_universal")) as f:
            self.assertEqual(f.read(), TAG + "_universal")
        after = contents(root)  # the checkpoint itself is untouched
        self.assertEqual({f: after.get(f) for f in before}, before)
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

    def resume(self, name, world, **dirs):
        """Resumes `name` on `world` ranks from each folder of `dirs` (kind -> folder: "universal"
        loads with load_universal, "zero" as native rank files), one process group for all;
        returns kind -> (per-rank results, the state gathered right after the load)."""
        stage, dtype, align, opt = CONFIGS[name]
        out = self.path("resume", f"{name}-w{world}")
        os.makedirs(out)
        spec = [{"name": f"{name}-{kind}", "dir": folder, "stage": stage, "dtype": dtype,
                 "align": align, "opt": opt, "universal": kind == "universal"}
                for kind, folder in dirs.items()]
        with open(os.path.join(out, "spec.json"), "w") as f:
            json.dump(spec, f)
        python(real_ucp_train.script(), out, "resume", os.path.join(out, "spec.json"), world,
               timeout=900)
        with open(os.path.join(out, f"resume_w{world}.json")) as f:
            results = json.load(f)
        resumed = {}
        for kind in dirs:
            state = os.path.join(out, f"state_{name}-{kind}_w{world}.pt")
            resumed[kind] = (results[f"{name}-{kind}"],
                             load(state) if os.path.exists(state) else None)  # None: it failed
        return resumed

    def verify_and_export(self, name, *folders):
        """Each folder passes verify; the bytes of its export to safetensors, in order."""
        exports = []
        for i, folder in enumerate(folders):
            self.assertIn("OK", run("verify", folder).stdout)
            out = self.path(name, f"export-{i}.safetensors")
            run("export", folder, "--to", out)
            with open(out, "rb") as f:
                exports.append(f.read())
        return exports

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
                exports = self.verify_and_export(name, os.path.join(root, TAG), ucp, theirs)
                self.assertEqual(exports[1], exports[0], "export of ckptool's universal checkpoint")
                self.assertEqual(exports[2], exports[0], "export of DeepSpeed's universal checkpoint")

    def test_resume_on_one_and_three_ranks_is_bit_exact(self):
        """Both targets: the universal checkpoint (load_universal) and native rank files written
        for the resuming world size (--to zero --world-size M)."""
        for name, (stage, _, _, opt) in CONFIGS.items():
            src, root, ucp, report = self.reshard(name)
            if opt == "sgd":
                self.assertEqual(report["optimizer_state"], ["momentum_buffer"])
                self.assertFalse(any(f.endswith("step.pt") for f in files_under(ucp)))
            with open(os.path.join(src, "train.json")) as f:
                record = json.load(f)
            saved = load(os.path.join(src, "state_train.pt"))
            for world in WORLDS:
                zero = self.path(name, f"zero-w{world}")
                rz = json.loads(run("reshard", root, "--to", "zero", "--world-size", world,
                                    "-o", zero, "--json").stdout)
                self.assertEqual((rz["world_size"], rz["to_world_size"], rz["tag"]),
                                 (2, world, TAG))
                resumed = self.resume(name, world, universal=root, zero=zero)
                for kind, (ranks, state) in resumed.items():
                    with self.subTest(config=name, world=world, kind=kind):
                        self.assertEqual(len(ranks), world)
                        for rank, r in enumerate(ranks):
                            self.assertNotIn("error", r, r.get("error"))
                            self.assertEqual(r["losses"], record[0]["losses"][STEPS:],
                                             f"rank {rank}")
                            self.assertEqual(r["lrs"], record[0]["lrs"][STEPS:], f"rank {rank}")
                            self.assertEqual(r["global_steps"], STEPS)
                        self.assertEqual(sorted(state), sorted(saved))
                        for k in saved:
                            # DeepSpeed's universal load never loads the module: buffers keep
                            # the fresh model's values (as with ds_to_universal's output). The
                            # native rank files restore them (stages 1/2; stage 3 never saves
                            # them apart from the module either way).
                            if not k.startswith("buffer:") or kind == "zero":
                                assert_same(self, state[k], saved[k], k)

    def test_rank_files_for_two_ranks_are_deepspeeds_own(self):
        """--to zero --world-size 2 of a 2-rank checkpoint writes the files DeepSpeed wrote, value
        for value (stage 3's fp32 padding apart: DeepSpeed leaves it uninitialised, ckptool
        writes zeros); 2 -> 3 -> 2 ranks gives them back; on 1 and 3 ranks every output verifies
        and exports the model the checkpoint exports, byte for byte, and DeepSpeed's own
        zero_to_fp32 reads it as it reads the checkpoint."""
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        for name, (stage, _, _, _) in CONFIGS.items():
            with self.subTest(config=name):
                src = trained(name, self.path("fx", name))
                root = os.path.join(src, "ckpt")
                outs = {}
                for world in (1, 2, 3):
                    outs[world] = self.path(name, f"w{world}")
                    run("reshard", root, "--to", "zero", "--world-size", world, "-o", outs[world])
                    with open(os.path.join(outs[world], "latest")) as f:
                        self.assertEqual(f.read(), TAG)
                    self.assertIn("zero_to_fp32.py", os.listdir(outs[world]))
                back = self.path(name, "w3-w2")
                run("reshard", outs[3], "--to", "zero", "--world-size", 2, "-o", back)
                theirs = os.path.join(root, TAG)
                for folder in (outs[2], back):
                    self.assertEqual(sorted(os.listdir(os.path.join(folder, TAG))),
                                     sorted(os.listdir(theirs)))
                    for f in os.listdir(theirs):
                        a, b = (load(os.path.join(d, f)) for d in (theirs, os.path.join(folder, TAG)))
                        if stage == 3 and "optim" in f:
                            shapes = load(os.path.join(theirs, f.replace("bf16_", "").replace(
                                "optim_states", "model_states")))["param_shapes"]
                            rank = int(f.split("zero_pp_rank_")[1].split("_")[0])
                            for x in (a, b):
                                zero_stage3_padding(x["optimizer_state_dict"], shapes, rank, 2)
                        assert_same(self, b, a, f"{folder}: {f}")
                files = {w: sorted(os.listdir(os.path.join(outs[w], TAG))) for w in (1, 3)}
                self.assertEqual(len(files[1]), 2, files[1])  # model and optimizer states
                self.assertEqual(sum("optim_states" in n for n in files[3]), 3)
                self.assertEqual(sum("model_states" in n for n in files[3]), 1 if stage < 3 else 3)
                exports = self.verify_and_export(name, root, outs[1], outs[3])
                self.assertEqual(exports[1], exports[0], "1 rank")
                self.assertEqual(exports[2], exports[0], "3 ranks")
                want = get_fp32_state_dict_from_zero_checkpoint(root)
                for world in (1, 3):
                    got = get_fp32_state_dict_from_zero_checkpoint(outs[world])
                    assert_same(self, dict(got), dict(want), f"zero_to_fp32 of {world} ranks")

    def test_zero_refusals(self):
        src = trained("s2_sgd", self.path("fx"))
        root = os.path.join(src, "ckpt")
        out = self.path("w3")
        run("reshard", root, "--to", "zero", "--world-size", 3, "-o", out)
        r = run("reshard", root, "--to", "zero", "--world-size", 3, "-o", out, expect=1)
        self.assertIn("exists", r.stderr)
        run("reshard", root, "--to", "zero", "--world-size", 1, "-o", out, "--force")
        self.assertEqual(sum("optim_states" in n for n in os.listdir(os.path.join(out, TAG))), 1)
        before = contents(root)
        for bad in (root, os.path.join(root, TAG), os.path.join(root, TAG, "x")):
            r = run("reshard", root, "--to", "zero", "--world-size", 3, "-o", bad, "--force",
                    expect=1)
            self.assertIn("the checkpoint", r.stderr)
        self.assertEqual(contents(root), before)
        # Options that do not fit together: usage errors (exit 2).
        r = run("reshard", root, "--to", "zero", expect=2)
        self.assertIn("--world-size", r.stderr)
        r = run("reshard", root, "--to", "zero", "--world-size", 0, expect=2)
        self.assertIn("--world-size", r.stderr)
        # The default output: the root's name + "-<M>ranks", beside it.
        run("reshard", root, "--to", "zero", "--world-size", 4)
        self.assertTrue(os.path.isfile(os.path.join(src, "ckpt-4ranks", "latest")))
        self.assertEqual(sum("optim_states" in n for n in
                             os.listdir(os.path.join(src, "ckpt-4ranks", TAG))), 4)
        # A universal checkpoint loads on any world size as it is.
        run("reshard", root, "--to", "universal")
        r = run("reshard", os.path.join(root, TAG + "_universal"), "--to", "zero",
                "--world-size", 3, "-o", self.path("u3"), expect=1)
        self.assertIn("universal checkpoint", r.stderr)
        self.assertFalse(os.path.exists(self.path("u3")))

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
        before = contents(root)
        for out in (os.path.join(root, TAG), root, os.path.join(root, TAG, "u")):
            r = run("reshard", root, "--to", "universal", "-o", out, "--force", expect=1)
            self.assertIn("the checkpoint", r.stderr)
        self.assertEqual(contents(root), before)
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
