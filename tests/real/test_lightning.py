"""ckptool on .ckpt files Lightning 2.6.6 itself writes: a real Trainer.fit (CPU, 4 epochs of 4
steps) with two ModelCheckpoint callbacks (every epoch + save_last=True, which in this version is
a regular file copy; best two by loss + save_last="link", a relative symlink). Every command
that applies is run; outputs are loaded back with torch.load and
LightningModule.load_from_checkpoint, and Trainer.fit(ckpt_path=...) from a processed checkpoint
must give the losses and weights of a resume from the original, bit for bit."""
import os
import shutil
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import real_lit_train as R  # noqa: E402
import torch  # noqa: E402

from real_common import (apply, assert_converted, assert_report_matches, assert_same_object,  # noqa: E402
                         assert_same_sharing, inspect_one, raw, read_json, read_source,
                         sha256, torch_load, tree, write_policy)
from stacklib import TempDirTest, fixture, run, run_json  # noqa: E402

FIXTURE = read_source("real_lit_train.py") + """
import sys
make_fixture(sys.argv[1])
"""
RESUME_STEP = (R.RESUME_EPOCH + 1) * R.STEPS_PER_EPOCH
RESUME_NAME = f"epoch={R.RESUME_EPOCH}-step={RESUME_STEP}.ckpt"
LAST_STEP = R.EPOCHS * R.STEPS_PER_EPOCH
LAST_NAME = f"epoch={R.EPOCHS - 1}-step={LAST_STEP}.ckpt"
WASTE = (R.TABLE - R.ROWS) * R.D_IN * 4  # the positional table's unused rows
TRAINING_KEYS = ["lr_schedulers", "optimizer_states"]


class LightningTest(TempDirTest):
    def setUp(self):
        super().setUp()
        self.fx = fixture("lightning", FIXTURE, into=self.path("fx"))
        self.ckpts = os.path.join(self.fx, "ckpts")
        self.best = os.path.join(self.fx, "best")
        self.losses = read_json(os.path.join(self.fx, "losses.json"))
        self.assertEqual([s for s, _ in self.losses], list(range(1, LAST_STEP + 1)))
        self.final = torch_load(os.path.join(self.fx, "final.pt"))

    def resume(self, ckpt, label):
        model = R.fit(self.path("resumed-" + label), ckpt_path=ckpt)
        return R.hexes(model.step_losses), {k: v.clone() for k, v in model.state_dict().items()}

    def assertResumesExactly(self, ckpt, label):
        losses, sd = self.resume(ckpt, label)
        self.assertEqual(losses, self.losses[RESUME_STEP:], f"{label}: losses after resuming")
        assert_same_object(self, self.final, sd, f"{label}: final weights")

    def copy(self, name, folder=None):
        dst = self.path(name)
        shutil.copyfile(os.path.join(folder or self.ckpts, name), dst)
        return dst

    def test_layout_as_lightning_writes_it(self):
        self.assertEqual(sorted(os.listdir(self.ckpts)),
                         sorted([f"epoch={e}-step={(e + 1) * R.STEPS_PER_EPOCH}.ckpt" for e in range(R.EPOCHS)]
                                + ["last.ckpt"]))
        self.assertFalse(os.path.islink(os.path.join(self.ckpts, "last.ckpt")),
                         "save_last=True writes a copy in lightning 2.6.6")
        self.assertEqual(os.readlink(os.path.join(self.best, "last.ckpt")), f"best-{LAST_NAME}")

    def test_resume_from_original_is_bit_exact(self):
        self.assertResumesExactly(os.path.join(self.ckpts, RESUME_NAME), "original")
        # the comparison can fail: the same checkpoint with AdamW's second moments halved
        ck = torch_load(os.path.join(self.ckpts, RESUME_NAME))
        for st in ck["optimizer_states"][0]["state"].values():
            st["exp_avg_sq"] = st["exp_avg_sq"] / 2
        other = self.path("other.ckpt")
        torch.save(ck, other)
        losses, _ = self.resume(other, "other")
        self.assertNotEqual(losses, self.losses[RESUME_STEP:], "the optimizer state does not matter?")

    def test_latest_skips_damaged_checkpoints_and_resumes_exactly(self):
        """The two newest checkpoints damaged (one cut short as by a crash while writing, one
        with a flipped bit in its biggest record): `latest` names the newest intact one, and
        fit(ckpt_path=...) from it gives the uninterrupted run's losses and final weights."""
        import zipfile
        root = self.path("run")
        shutil.copytree(self.ckpts, root)
        self.assertEqual(run("latest", root).stdout.strip(), os.path.join(root, LAST_NAME))
        newer = [f"epoch={e}-step={(e + 1) * R.STEPS_PER_EPOCH}.ckpt"
                 for e in range(R.RESUME_EPOCH + 1, R.EPOCHS)]
        self.assertEqual(newer[-1], LAST_NAME)
        cut = os.path.join(root, newer[-1])
        os.truncate(cut, os.path.getsize(cut) * 2 // 3)
        flipped = os.path.join(root, newer[0])
        with zipfile.ZipFile(flipped) as z:
            rec = max(z.infolist(), key=lambda i: i.compress_size)
        with open(flipped, "r+b") as f:
            f.seek(rec.header_offset + 26)
            n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
            at = rec.header_offset + 30 + n + m + rec.compress_size // 2
            f.seek(at)
            b = f.read(1)[0]
            f.seek(at)
            f.write(bytes([b ^ 0x10]))
        torch_load(flipped)  # torch.load reads it without a word: only the CRC32 tells
        r = run_json("latest", "--json", root)
        self.assertEqual(r["latest"], os.path.join(root, RESUME_NAME))
        self.assertEqual([s["name"] for s in r["skipped"]], list(reversed(newer)))
        self.assertIn("CRC32", r["skipped"][1]["reason"])
        self.assertResumesExactly(r["latest"], "latest")

    def test_inspect_and_verify(self):
        r = run("verify", self.ckpts, self.best)
        self.assertEqual(r.stdout.count(": OK"), len(os.listdir(self.ckpts)) + 2, r.stdout)
        for name in sorted(os.listdir(self.ckpts)):
            with self.subTest(name=name):
                path = os.path.join(self.ckpts, name)
                ck = torch_load(path)
                rep = inspect_one(path)
                rows = assert_report_matches(self, rep, ck)
                self.assertEqual(rep["wasted_bytes"], WASTE)
                self.assertEqual(rows["state_dict.mid.weight"]["storage"], rows["state_dict.mid2.weight"]["storage"])
                self.assertEqual(rep["unsafe_globals"], [])
                self.assertEqual(rep["weights_only_refused_globals"], [])

    def test_shrink_then_resume(self):
        path = self.copy(RESUME_NAME)
        before = os.path.getsize(path)
        run("shrink", path)
        self.assertLess(os.path.getsize(path), before - WASTE + 4096)
        self.assertEqual(inspect_one(path)["wasted_bytes"], 0)
        run("verify", path)
        orig = torch_load(os.path.join(self.ckpts, RESUME_NAME))
        for mmap in (False, True):
            got = torch_load(path, mmap=mmap)
            assert_same_object(self, orig, got, f"shrunk mmap={mmap}")
            assert_same_sharing(self, orig, got, "shrunk")
        m = R.TinyLit.load_from_checkpoint(path)  # Lightning's own loader (weights_only by default)
        self.assertIs(m.mid.weight, m.mid2.weight)
        self.assertResumesExactly(path, "shrunk")

    def test_shrink_follows_last_symlink(self):
        best = self.path("best")
        shutil.copytree(self.best, best, symlinks=True)
        target = os.path.join(best, f"best-{LAST_NAME}")
        before = os.path.getsize(target)
        run("shrink", os.path.join(best, "last.ckpt"))
        self.assertTrue(os.path.islink(os.path.join(best, "last.ckpt")), "the link was replaced")
        self.assertEqual(os.readlink(os.path.join(best, "last.ckpt")), f"best-{LAST_NAME}")
        self.assertLess(os.path.getsize(target), before - WASTE + 4096)
        assert_same_object(self, torch_load(os.path.join(self.best, "last.ckpt")),
                           torch_load(os.path.join(best, "last.ckpt")))
        m = R.TinyLit.load_from_checkpoint(os.path.join(best, "last.ckpt"))
        for k, v in self.final.items():
            self.assertEqual(raw(m.state_dict()[k]), raw(v), k)

    def test_apply_policy_then_resume(self):
        """shrink + verify + export (bf16) as a policy over ckpts/: every .ckpt loses the unused
        table rows, still resumes exactly, and the export loads into the module."""
        from safetensors.torch import load_file
        root = self.path("ckpts")
        shutil.copytree(self.ckpts, root, symlinks=True)
        write_policy(root, '[shrink]\n[verify]\n[export]\ndtype = "bf16"\n')
        events, _ = apply(root)
        self.assertFalse([e for e in events if e.get("event") == "failed"], events)
        for name in os.listdir(self.ckpts):
            if name == "last.ckpt":
                continue  # see test_apply_covers_last_ckpt_copy
            with self.subTest(name=name):
                self.assertLess(os.path.getsize(os.path.join(root, name)),
                                os.path.getsize(os.path.join(self.ckpts, name)) - WASTE + 4096)
        self.assertResumesExactly(os.path.join(root, RESUME_NAME), "apply")
        exported = os.path.join(root, "export", RESUME_NAME[:-len(".ckpt")], "model.safetensors")
        st = load_file(exported)
        sd = torch_load(os.path.join(self.ckpts, RESUME_NAME))["state_dict"]
        for k, t in st.items():
            assert_converted(self, t, sd[k], torch.bfloat16, k)

    def test_apply_covers_last_ckpt_copy(self):
        """Lightning 2.6.6's save_last=True writes last.ckpt as a full copy (not a symlink): it is
        the file `fit(ckpt_path="last")` resumes from, and a policy's shrink and verify must reach
        it as they reach the epoch=E-step=N.ckpt files beside it."""
        root = self.path("ckpts")
        shutil.copytree(self.ckpts, root, symlinks=True)
        write_policy(root, '[shrink]\n[verify]\n')
        events, _ = apply(root)
        last = os.path.join(root, "last.ckpt")
        self.assertLess(os.path.getsize(last), os.path.getsize(os.path.join(self.ckpts, "last.ckpt")) - WASTE + 4096,
                        f"last.ckpt untouched by apply; events: {[e.get('checkpoint') for e in events]}")
        assert_same_object(self, torch_load(os.path.join(self.ckpts, "last.ckpt")), torch_load(last))

    def test_apply_readme_lightning_policy(self):
        """README's Lightning policy on best/ (last.ckpt a symlink): retention, shrink, strip of
        the older checkpoint, export of bf16 safetensors; the link and its target stay whole."""
        from safetensors.torch import load_file
        root = self.path("best")
        shutil.copytree(self.best, root, symlinks=True)
        write_policy(root, '[retention]\nkeep_last = 2\n[shrink]\n[strip]\nolder_than_newest = 1\n'
                           '[export]\ndtype = "bf16"\n')
        events, _ = apply(root)
        self.assertFalse([e for e in events if e.get("event") == "failed"], events)
        kept = sorted((f for f in os.listdir(self.best) if not os.path.islink(os.path.join(self.best, f))),
                      key=lambda f: int(f.rsplit("step=", 1)[1].split(".")[0]))
        self.assertEqual(len(kept), 2, "save_top_k=2")
        older, newest = (os.path.join(root, f) for f in kept)
        self.assertEqual(os.readlink(os.path.join(root, "last.ckpt")), os.path.basename(newest))
        ck = torch_load(newest)
        for key in TRAINING_KEYS:
            self.assertIn(key, ck, "the newest checkpoint keeps its training state")
        self.assertEqual(inspect_one(newest)["wasted_bytes"], 0)
        old = torch_load(older)
        for key in TRAINING_KEYS:
            self.assertNotIn(key, old, "the older checkpoint is stripped")
        m = R.TinyLit.load_from_checkpoint(older)
        assert_same_object(self, torch_load(os.path.join(self.best, os.path.basename(older)))["state_dict"],
                           old["state_dict"])
        m = R.TinyLit.load_from_checkpoint(os.path.join(root, "last.ckpt"))
        for k, v in self.final.items():
            self.assertEqual(raw(m.state_dict()[k]), raw(v), k)
        st = load_file(os.path.join(root, "export", os.path.basename(newest)[:-len(".ckpt")], "model.safetensors"))
        for k, t in st.items():
            assert_converted(self, t, self.final[k], torch.bfloat16, k)

    def test_prune(self):
        """prune --keep-last 2 --strip-older 1 on ckpts/, --keep-last 1 on best/ (symlinked
        last.ckpt): the right files go, the stripped one still loads, the link's target stays."""
        root = self.path("ckpts")
        shutil.copytree(self.ckpts, root, symlinks=True)
        run("prune", root, "--keep-last", "2", "--strip-older", "1", "--yes")
        self.assertEqual(sorted(os.listdir(root)), sorted(["epoch=2-step=12.ckpt", LAST_NAME, "last.ckpt"]))
        for name in (LAST_NAME, "last.ckpt"):
            self.assertEqual(sha256(os.path.join(root, name)), sha256(os.path.join(self.ckpts, name)), name)
        stripped = torch_load(os.path.join(root, "epoch=2-step=12.ckpt"))
        for key in TRAINING_KEYS:
            self.assertNotIn(key, stripped)
        R.TinyLit.load_from_checkpoint(os.path.join(root, "epoch=2-step=12.ckpt"))
        best = self.path("best")
        shutil.copytree(self.best, best, symlinks=True)
        run("prune", best, "--keep-last", "1", "--yes")
        self.assertEqual(sorted(os.listdir(best)), sorted([f"best-{LAST_NAME}", "last.ckpt"]))
        self.assertEqual(os.readlink(os.path.join(best, "last.ckpt")), f"best-{LAST_NAME}")

    def test_strip_then_load_from_checkpoint(self):
        src = os.path.join(self.ckpts, LAST_NAME)
        out = self.path("stripped.ckpt")
        rep = run_json("strip", src, "-o", out)
        self.assertEqual(sorted(d["path"] for d in rep["files"][0]["dropped"]), TRAINING_KEYS)
        run("verify", out)
        got = torch_load(out)
        orig = torch_load(src)
        self.assertEqual(sorted(got), sorted(set(orig) - set(TRAINING_KEYS)))
        assert_same_object(self, orig["state_dict"], got["state_dict"])
        assert_same_object(self, orig["hyper_parameters"], got["hyper_parameters"])
        for strict in (True, False):
            m = R.TinyLit.load_from_checkpoint(out, strict=strict)
            self.assertEqual(m.hparams.layers, (R.D_IN, R.HIDDEN, 1))
            for k, v in self.final.items():
                self.assertEqual(raw(m.state_dict()[k]), raw(v), k)
            self.assertIs(m.mid.weight, m.mid2.weight)
        m.eval()
        x = torch.randn(3, R.D_IN, generator=torch.Generator().manual_seed(3))
        ref = R.TinyLit()
        ref.load_state_dict(self.final)
        ref.eval()
        with torch.no_grad():
            self.assertTrue(torch.equal(m(x), ref(x)))

    def convert(self, name=RESUME_NAME):
        src = os.path.join(self.ckpts, name)
        out = self.path("bf16.ckpt")
        run("convert", "--dtype", "bf16", src, "-o", out)
        run("verify", out)
        return torch_load(src), out

    def test_convert_state_dict(self):
        orig, out = self.convert()
        for mmap in (False, True):
            got = torch_load(out, mmap=mmap)
            for k, t in orig["state_dict"].items():
                assert_converted(self, got["state_dict"][k], t, torch.bfloat16, k)
            self.assertEqual(got["state_dict"]["mid.weight"].data_ptr(), got["state_dict"]["mid2.weight"].data_ptr())
        m = R.TinyLit.load_from_checkpoint(out).to(torch.bfloat16)
        for k, t in orig["state_dict"].items():
            self.assertEqual(raw(m.state_dict()[k]), raw(t.to(torch.bfloat16)), k)

    def test_convert_keeps_optimizer_state(self):
        orig, out = self.convert()
        got = torch_load(out)
        self.assertEqual(got["optimizer_states"][0]["state"][0]["step"].dtype, torch.float32)
        for key in TRAINING_KEYS + ["callbacks", "loops", "hyper_parameters"]:
            assert_same_object(self, orig[key], got[key], f"{key} after convert")

    def test_convert_then_resume(self):
        """Resuming from convert's bf16 .ckpt trains exactly as resuming from the same checkpoint
        with its state_dict rounded to bf16 by torch (optimizer state as it was)."""
        orig, out = self.convert()
        ref = self.path("reference.ckpt")
        ck = torch_load(os.path.join(self.ckpts, RESUME_NAME))
        ck["state_dict"] = {k: v.to(torch.bfloat16) for k, v in ck["state_dict"].items()}
        torch.save(ck, ref)
        want_losses, want_sd = self.resume(ref, "reference")
        self.assertNotEqual(want_losses, self.losses[RESUME_STEP:], "bf16 weights train like fp32?")
        got_losses, got_sd = self.resume(out, "converted")
        self.assertEqual(got_losses, want_losses, "losses after resuming from ckptool's bf16 convert")
        assert_same_object(self, want_sd, got_sd, "final weights")

    def test_export_then_load_state_dict(self):
        from safetensors import safe_open
        from safetensors.torch import load_file
        src = os.path.join(self.ckpts, LAST_NAME)
        out = self.path("export")
        rep = run_json("export", src, "--to", out)
        self.assertEqual(rep["selected"], "state_dict")
        st_path = os.path.join(out, "model.safetensors")
        st = load_file(st_path)
        with safe_open(st_path, framework="pt") as f:
            meta = f.metadata()
        full = dict(st)
        for alias, kept in meta.items():
            if alias != "format":
                full[alias] = st[kept]
        self.assertEqual(sorted(full), sorted(self.final))
        m = R.TinyLit()
        m.load_state_dict(full, strict=True)
        for k, v in self.final.items():
            self.assertEqual(raw(m.state_dict()[k]), raw(v), k)
            self.assertEqual(tuple(full[k].shape), tuple(v.shape), k)

    def test_compress_decompress_folder_with_symlink(self):
        best = self.path("best")
        shutil.copytree(self.best, best, symlinks=True)
        snapshot = tree(best)
        run("compress", best)
        run("verify", best + ".ckz")
        shutil.rmtree(best)
        run("decompress", best + ".ckz")
        self.assertEqual(tree(best), snapshot)
        self.assertTrue(os.path.islink(os.path.join(best, "last.ckpt")))
        # and a single .ckpt, resumed after the round trip
        path = self.copy(RESUME_NAME)
        digest = sha256(path)
        run("compress", path, "--rm")
        self.assertFalse(os.path.exists(path))
        run("decompress", path + ".ckz")
        self.assertEqual(sha256(path), digest)
        self.assertResumesExactly(path, "decompressed")


if __name__ == "__main__":
    unittest.main()
