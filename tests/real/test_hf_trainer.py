"""ckptool on what transformers 5.25 itself writes: a real Trainer run of a tiny GPT-2 (9 steps,
save_steps=3, save_total_limit=2: checkpoint-6/ and checkpoint-9/ with model.safetensors,
optimizer.pt, scheduler.pt, rng_state.pth, training_args.bin, trainer_state.json), a sharded
save_pretrained, and a pytorch_model.bin. Every command that applies is run; from_pretrained
loads what export and convert write, and Trainer(resume_from_checkpoint=...) from a processed
checkpoint must give the losses and weights of a resume from the original, bit for bit."""
import json
import os
import shutil
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import real_hf_train as H  # noqa: E402 (sets HF_HUB_OFFLINE before transformers is imported)
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import GPT2LMHeadModel  # noqa: E402

from real_common import (apply, assert_converted, assert_same_object, inspect_one, raw,  # noqa: E402
                         read_json, read_source, sha256, torch_load, tree, walk_tensors,
                         write_policy)
from stacklib import PACKAGE, TempDirTest, fixture, run, run_json  # noqa: E402

FIXTURE = read_source("real_hf_train.py") + """
import sys
make_fixture(sys.argv[1])
"""
TRAINING_FILES = ["optimizer.pt", "rng_state.pth", "scheduler.pt"]


def model_weights(folder):
    """name -> tensor of a model folder as from_pretrained loads it (tied lm_head included)."""
    m = GPT2LMHeadModel.from_pretrained(folder)
    return {k: v.detach() for k, v in m.state_dict().items()}, m


class HFTrainerTest(TempDirTest):
    def setUp(self):
        super().setUp()
        torch.use_deterministic_algorithms(True)
        self.fx = fixture("hf-trainer", FIXTURE, into=self.path("fx"))
        self.run_dir = os.path.join(self.fx, "run")
        self.losses = read_json(os.path.join(self.fx, "losses.json"))
        self.assertEqual([s for s, _ in self.losses], list(range(1, H.MAX_STEPS + 1)))
        self.assertEqual(sorted(os.listdir(self.run_dir)), ["checkpoint-6", "checkpoint-9"],
                         "save_total_limit=2 keeps the last two")
        self.ck6 = os.path.join(self.run_dir, f"checkpoint-{H.RESUME_AT}")
        self.ck9 = os.path.join(self.run_dir, f"checkpoint-{H.MAX_STEPS}")

    def resume(self, checkpoint, label):
        out = self.path("resumed-" + label)
        losses, tr = H.train(out, resume=checkpoint)
        final = load_file(os.path.join(out, f"checkpoint-{H.MAX_STEPS}", "model.safetensors"))
        return H.hexes(losses), final

    def assertResumesExactly(self, checkpoint, label):
        losses, final = self.resume(checkpoint, label)
        self.assertEqual(losses, self.losses[H.RESUME_AT:], f"{label}: losses after resuming")
        want = load_file(os.path.join(self.ck9, "model.safetensors"))
        assert_same_object(self, want, final, f"{label}: final weights")

    def copy_run(self):
        dst = self.path("run")
        shutil.copytree(self.run_dir, dst, symlinks=True)
        return dst

    def test_export_of_a_checkpoint_folder_is_a_model_folder(self):
        """export checkpoint-N -o DIR takes config.json and generation_config.json (and any
        tokenizer files) along: from_pretrained(DIR) loads the same model, and an existing
        config in DIR is replaced by the checkpoint's."""
        out = self.path("hf")
        run("export", self.ck9, "-o", out)
        names = sorted(os.listdir(out))
        self.assertIn("config.json", names)
        for n in ("config.json", "generation_config.json"):
            if os.path.exists(os.path.join(self.ck9, n)):
                with open(os.path.join(self.ck9, n), "rb") as a, open(os.path.join(out, n), "rb") as b:
                    self.assertEqual(a.read(), b.read(), n)
        want, _ = model_weights(self.ck9)
        got, _ = model_weights(out)
        assert_same_object(self, want, got, "from_pretrained of the export")
        with open(os.path.join(out, "config.json"), "w") as f:
            f.write("{}")
        run("export", self.ck6, "-o", out, "--force")
        with open(os.path.join(self.ck6, "config.json"), "rb") as a, open(os.path.join(out, "config.json"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_latest_skips_a_damaged_checkpoint_and_resumes_exactly(self):
        """The newest checkpoint's weights cut short (a crash while copying, a full disk):
        ckptool.latest names the one before, and resuming from it gives the run's own losses."""
        sys.path.insert(0, PACKAGE)
        import ckptool
        run_dir = self.copy_run()
        self.assertEqual(ckptool.latest(run_dir), os.path.join(run_dir, "checkpoint-9"))
        shard = os.path.join(run_dir, "checkpoint-9", "model.safetensors")
        os.truncate(shard, os.path.getsize(shard) - 4096)
        got = ckptool.latest(run_dir)
        self.assertEqual(got, os.path.join(run_dir, "checkpoint-6"))
        skipped = ckptool.run("latest", run_dir).report["skipped"]
        self.assertEqual([s["name"] for s in skipped], ["checkpoint-9"])
        self.assertIn("model.safetensors", skipped[0]["reason"])
        self.assertResumesExactly(got, "latest")

    # -- the premise -------------------------------------------------------------------------

    def test_resume_from_original_is_bit_exact(self):
        self.assertResumesExactly(self.ck6, "original")
        # the comparison can fail: resuming from checkpoint-6 with another RNG state differs
        ck = self.path("other-rng")
        shutil.copytree(self.ck6, ck)
        state = torch.load(os.path.join(ck, "rng_state.pth"), weights_only=False)
        torch.manual_seed(99)
        state["cpu"] = torch.get_rng_state()
        torch.save(state, os.path.join(ck, "rng_state.pth"))
        losses, _ = self.resume(ck, "other-rng")
        self.assertNotEqual(losses, self.losses[H.RESUME_AT:], "dropout's RNG state does not matter?")

    # -- reading -------------------------------------------------------------------------------

    def test_inspect_and_verify_checkpoint_folder(self):
        r = run("verify", self.ck6)
        for name in ["model.safetensors", "training_args.bin"] + TRAINING_FILES:
            self.assertIn(f"{name}: OK", r.stdout)
        doc = run_json("inspect", self.ck6)
        files = {os.path.basename(f["path"]): f for f in doc["files"]}
        self.assertEqual(sorted(files), sorted(["model.safetensors", "training_args.bin"] + TRAINING_FILES))
        for name, f in files.items():
            self.assertEqual(f["problems"], [], name)
            self.assertEqual(f["unsafe_globals"], [], name)
            self.assertEqual(f["unsafe_calls"], [], name)
        # the optimizer's tensors, as torch sees them
        opt = torch_load(os.path.join(self.ck6, "optimizer.pt"))
        rows = {r["name"]: r for r in files["optimizer.pt"]["tensors"]}
        want = walk_tensors(opt)
        self.assertEqual(sorted(rows), sorted(want))
        for k, t in want.items():
            self.assertEqual(rows[k]["dtype"], str(t.dtype).replace("torch.", ""), k)
            self.assertEqual(rows[k]["shape"], list(t.shape), k)
        self.assertEqual(opt["state"][0]["step"].item(), float(H.RESUME_AT))
        # model.safetensors: every tensor from_pretrained reads (lm_head is tied, not stored)
        st = load_file(os.path.join(self.ck6, "model.safetensors"))
        rows = {r["name"]: r for r in files["model.safetensors"]["tensors"]}
        self.assertEqual(sorted(rows), sorted(st))
        # training_args.bin: TrainingArguments with Python 3.11 enum members (getattr calls)
        args_globals = set(files["training_args.bin"]["globals"])
        self.assertIn("transformers.training_args.TrainingArguments", args_globals)

    # -- shrink / apply / compress, then resume --------------------------------------------------

    def test_shrink_then_resume(self):
        root = self.copy_run()
        before = tree(root)
        rep = run_json("shrink", "--checkpoint_dir", root)
        self.assertEqual(rep["saved"], 0, "nothing in a Trainer checkpoint is a view")
        self.assertEqual(tree(root), before, "files with nothing to drop are left byte for byte")
        self.assertResumesExactly(os.path.join(root, f"checkpoint-{H.RESUME_AT}"), "shrunk")

    def test_apply_policy_then_resume(self):
        """A policy that shrinks, writes a bf16 copy beside and verifies: the checkpoints still
        resume exactly, and from_pretrained loads the bf16 copy."""
        root = self.copy_run()
        write_policy(root, '[retention]\nkeep_last = 2\n[shrink]\n[convert]\ndtype = "bf16"\n[verify]\n')
        events, _ = apply(root)
        self.assertTrue(events)
        ck6 = os.path.join(root, f"checkpoint-{H.RESUME_AT}")
        for name in ["model.safetensors"] + TRAINING_FILES:
            self.assertEqual(sha256(os.path.join(ck6, name)), sha256(os.path.join(self.ck6, name)), name)
        bf16 = os.path.join(ck6, "bf16")
        for name in TRAINING_FILES:
            self.assertFalse(os.path.exists(os.path.join(bf16, name)), f"{name} in the bf16 copy")
        got, _ = model_weights(bf16)
        want, _ = model_weights(self.ck6)
        for k, t in want.items():
            self.assertEqual(raw(got[k].to(torch.bfloat16)), raw(t.to(torch.bfloat16)), k)
        self.assertResumesExactly(ck6, "apply")
        # a second apply changes nothing
        snapshot = tree(root)
        apply(root)
        after = tree(root)
        for t in (snapshot, after):
            t.pop(os.path.join(".ckptool", "lock"), None)  # holds the pid of the run
        self.assertEqual(after, snapshot, "the second apply changed files (README: not even the ledger)")

    def test_apply_readme_hf_policy(self):
        """README's HF Trainer policy: retention, convert, verify, and strip (delete_files) of the
        older checkpoint. checkpoint-6 loses its optimizer, scheduler and RNG files and still
        loads with from_pretrained; apply succeeds."""
        root = self.copy_run()
        write_policy(root, '[retention]\nkeep_last = 3\n[convert]\ndtype = "bf16"\nkeep = ["*norm*", "*.bias"]\n'
                           '[verify]\n[strip]\nolder_than_newest = 1\ndelete_files = true\n')
        events, p = apply(root, expect=None)
        failed = [e for e in events if e.get("event") == "failed"]
        self.assertEqual((p.returncode, failed), (0, []), p.stdout + p.stderr)
        ck6 = os.path.join(root, f"checkpoint-{H.RESUME_AT}")
        for name in TRAINING_FILES:
            self.assertFalse(os.path.exists(os.path.join(ck6, name)), f"{name} not deleted")
        got, _ = model_weights(ck6)
        want, _ = model_weights(self.ck6)
        assert_same_object(self, want, got, "stripped checkpoint-6")
        ck9 = os.path.join(root, f"checkpoint-{H.MAX_STEPS}")
        for name in ["model.safetensors"] + TRAINING_FILES:  # the newest is left whole
            self.assertEqual(sha256(os.path.join(ck9, name)), sha256(os.path.join(self.ck9, name)), name)

    def test_compress_decompress_then_resume(self):
        src = self.path("checkpoint-6")
        shutil.copytree(self.ck6, src)
        want = tree(src)
        run("compress", src)
        run("verify", src + ".ckz")
        shutil.rmtree(src)
        run("decompress", src + ".ckz")
        self.assertEqual(tree(src), want, "restored folder differs (bytes or modes)")
        self.assertResumesExactly(src, "decompressed")

    # -- prune ---------------------------------------------------------------------------------

    def test_prune_keep_last(self):
        root = self.copy_run()
        before = tree(root)
        r = run("prune", root, "--keep-last", "1")
        self.assertIn("checkpoint-6", r.stdout)
        self.assertEqual(tree(root), before, "a dry run changed files")
        run("prune", root, "--keep-last", "1", "--yes")
        self.assertEqual(sorted(os.listdir(root)), [f"checkpoint-{H.MAX_STEPS}"])
        self.assertEqual(tree(os.path.join(root, f"checkpoint-{H.MAX_STEPS}")), tree(self.ck9))

    def test_prune_strip_older(self):
        """prune --strip-older on the Trainer's output_dir: the older checkpoint keeps only what
        from_pretrained needs, the newest stays whole, and prune succeeds."""
        root = self.copy_run()
        r = run("prune", root, "--keep-last", "2", "--strip-older", "1", "--yes", expect=None)
        ck6 = os.path.join(root, f"checkpoint-{H.RESUME_AT}")
        self.assertEqual(sorted(os.listdir(ck6)), sorted(set(os.listdir(self.ck6)) - set(TRAINING_FILES)))
        self.assertEqual(tree(os.path.join(root, f"checkpoint-{H.MAX_STEPS}")), tree(self.ck9))
        got, _ = model_weights(ck6)
        want, _ = model_weights(self.ck6)
        assert_same_object(self, want, got, "stripped by prune")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("checkpoint-6", r.stdout, "no plan printed")

    # -- strip ---------------------------------------------------------------------------------

    def test_strip_checkpoint_folder_succeeds(self):
        """`strip checkpoint-9 --delete-files` on the folder the Trainer wrote exits 0."""
        ck = self.path("checkpoint-9")
        shutil.copytree(self.ck9, ck)
        run("strip", ck, "--delete-files")

    def test_strip_checkpoint_folder_then_from_pretrained(self):
        ck = self.path("checkpoint-9")
        shutil.copytree(self.ck9, ck)
        run("strip", ck, "--delete-files", expect=None)
        self.assertEqual(sorted(os.listdir(ck)), sorted(set(os.listdir(self.ck9)) - set(TRAINING_FILES)))
        self.assertEqual(sha256(os.path.join(ck, "model.safetensors")),
                         sha256(os.path.join(self.ck9, "model.safetensors")))
        got, m = model_weights(ck)
        want, _ = model_weights(self.ck9)
        assert_same_object(self, want, got, "stripped")
        self.assertEqual(m.lm_head.weight.data_ptr(), m.transformer.wte.weight.data_ptr(), "tie lost")

    # -- convert ---------------------------------------------------------------------------------

    def convert_ck6(self):
        ck = self.path("checkpoint-6")
        shutil.copytree(self.ck6, ck)
        run("convert", "--dtype", "bf16", ck)
        return ck, os.path.join(ck, "bf16")

    def test_convert_checkpoint_model(self):
        _, out = self.convert_ck6()
        st = load_file(os.path.join(out, "model.safetensors"))
        src = load_file(os.path.join(self.ck6, "model.safetensors"))
        self.assertEqual(sorted(st), sorted(src))
        for k, t in src.items():
            assert_converted(self, st[k], t, torch.bfloat16, k)
        got, _ = model_weights(out)
        want, _ = model_weights(self.ck6)
        for k, t in want.items():
            self.assertEqual(raw(got[k].to(torch.bfloat16)), raw(t.to(torch.bfloat16)), k)
        for name in ("generation_config.json", "trainer_state.json"):
            self.assertEqual(sha256(os.path.join(out, name)), sha256(os.path.join(self.ck6, name)), name)
        # config.json says what the weights now are; nothing else in it changes.
        with open(os.path.join(self.ck6, "config.json")) as f:
            before = json.load(f)
        with open(os.path.join(out, "config.json")) as f:
            after = json.load(f)
        self.assertEqual(after.pop("dtype"), "bfloat16")
        before.pop("dtype")
        self.assertEqual(after, before)
        from transformers import AutoConfig
        self.assertEqual(AutoConfig.from_pretrained(out).dtype, torch.bfloat16)

    def test_convert_checkpoint_keeps_optimizer_state(self):
        """convert of a Trainer checkpoint keeps optimizer/scheduler/RNG state as they were (AdamW's
        step counters and exp_avg_sq stay float32, bit for bit)."""
        _, out = self.convert_ck6()
        for name in TRAINING_FILES:
            with self.subTest(name=name):
                self.assertTrue(os.path.exists(os.path.join(out, name)), f"{name} missing from the copy")
                a = torch.load(os.path.join(self.ck6, name), weights_only=False)
                b = torch.load(os.path.join(out, name), weights_only=False)
                assert_same_object(self, a, b, f"{name} after convert")

    def test_convert_checkpoint_then_resume(self):
        """Resuming from convert's bf16 folder trains exactly as resuming from the same folder
        with its model.safetensors rounded to bf16 by torch (everything else as it was)."""
        from safetensors.torch import save_file
        _, out = self.convert_ck6()
        ref = self.path("reference")
        shutil.copytree(self.ck6, ref)
        src = load_file(os.path.join(self.ck6, "model.safetensors"))
        save_file({k: v.to(torch.bfloat16) for k, v in src.items()}, os.path.join(ref, "model.safetensors"),
                  metadata={"format": "pt"})
        want_losses, want_final = self.resume(ref, "reference")
        self.assertNotEqual(want_losses, self.losses[H.RESUME_AT:], "bf16 weights train like fp32?")
        got_losses, got_final = self.resume(out, "converted")
        self.assertEqual(got_losses, want_losses, "losses after resuming from ckptool's bf16 convert")
        assert_same_object(self, want_final, got_final, "final weights")

    # -- pretrained folders --------------------------------------------------------------------

    def test_sharded_save_pretrained(self):
        folder = self.path("sharded")
        shutil.copytree(os.path.join(self.fx, "sharded"), folder)
        index = read_json(os.path.join(folder, "model.safetensors.index.json"))
        self.assertGreater(len(set(index["weight_map"].values())), 2)
        run("verify", folder)
        doc = run_json("inspect", folder)
        names = sorted(r["name"] for f in doc["files"] for r in f["tensors"])
        self.assertEqual(names, sorted(index["weight_map"]))
        rep = run_json("convert", "--dtype", "bf16", folder)
        out = os.path.join(folder, "bf16")
        new_index = read_json(os.path.join(out, "model.safetensors.index.json"))
        self.assertEqual(new_index["weight_map"], index["weight_map"])
        self.assertEqual(new_index["metadata"]["total_size"], index["metadata"]["total_size"] // 2)
        self.assertGreaterEqual(rep["copied_files"], 2)
        got, _ = model_weights(out)
        want, _ = model_weights(folder)
        for k, t in want.items():
            self.assertEqual(raw(got[k].to(torch.bfloat16)), raw(t.to(torch.bfloat16)), k)
        # compress / decompress the whole folder
        snapshot = tree(folder)
        run("compress", folder)
        shutil.rmtree(folder)
        run("decompress", folder + ".ckz")
        self.assertEqual(tree(folder), snapshot)

    def test_pytorch_model_bin(self):
        """pytorch_model.bin (torch.save of the state dict, tied lm_head sharing wte's storage):
        inspect/verify/shrink/convert/export, and from_pretrained loads each output."""
        self.assertEqual(read_json(os.path.join(self.fx, "bin_save_pretrained.json")),
                         ["config.json", "generation_config.json", "model.safetensors"],
                         "transformers 5 ignores safe_serialization=False (if this changes, use it)")
        folder = self.path("bin")
        shutil.copytree(os.path.join(self.fx, "bin"), folder)
        binf = os.path.join(folder, "pytorch_model.bin")
        sd = torch_load(binf)
        rep = inspect_one(binf)
        rows = {r["name"]: r for r in rep["tensors"]}
        self.assertEqual(sorted(rows), sorted(sd))
        self.assertEqual(rows["lm_head.weight"]["storage"], rows["transformer.wte.weight"]["storage"])
        run("verify", binf)
        digest = sha256(binf)
        run("shrink", binf)
        self.assertEqual(sha256(binf), digest, "nothing to drop: untouched")
        want, _ = model_weights(folder)
        # convert the folder
        report = run_json("convert", "--dtype", "fp16", folder)
        got16 = torch_load(os.path.join(folder, "fp16", "pytorch_model.bin"), mmap=True)
        # A tensor float16 would flush (most of a freshly trained bias is below 2^-14) stays
        # float32; the report names each one and why.
        kept = {k.split(":")[0]: k for f in report["files"] for k in f["kept"]}
        for k, t in sd.items():
            if k in kept:
                self.assertEqual(got16[k].dtype, torch.float32, k)
                self.assertTrue(torch.equal(got16[k], t), k)
                self.assertIn("zero or subnormal in float16", kept[k])
                self.assertGreater(((t != 0) & (t.abs() < 2.0 ** -14)).float().mean().item(), 0.01, k)
            else:
                assert_converted(self, got16[k], t, torch.float16, k)
                lost = ((t != 0) & (t.abs() < 2.0 ** -14)).sum().item()
                self.assertLessEqual(lost * 100, max(1, (t != 0).sum().item()), k)
        self.assertLess(len(kept), len(sd) // 2, kept)
        self.assertEqual(got16["lm_head.weight"].data_ptr(), got16["transformer.wte.weight"].data_ptr())
        got, _ = model_weights(os.path.join(folder, "fp16"))
        for k, t in want.items():
            self.assertEqual(raw(got[k].to(torch.float16)), raw(t.to(torch.float16)), k)
        # export: one file, then shards + index; from_pretrained reads both
        for label, extra in (("single", []), ("shards", ["--max-shard-size", "100KB"])):
            with self.subTest(export=label):
                out = self.path("export-" + label)
                rep = run_json("export", binf, "--to", out, *extra)
                self.assertEqual(rep["aliases"], 1)
                shutil.copyfile(os.path.join(folder, "config.json"), os.path.join(out, "config.json"))
                got, m = model_weights(out)
                assert_same_object(self, want, got, f"export {label}")
                self.assertEqual(m.lm_head.weight.data_ptr(), m.transformer.wte.weight.data_ptr())

    def test_export_checkpoint_folder_exports_the_model(self):
        """`export checkpoint-6 --to OUT` on a Trainer checkpoint: OUT's model.safetensors holds
        the model (what from_pretrained needs), never the optimizer's state.N.exp_avg tensors."""
        out = self.path("export")
        run("export", self.ck6, "--to", out)
        st = load_file(os.path.join(out, "model.safetensors"))
        self.assertFalse([k for k in st if k.startswith("state.")], f"optimizer state exported: {sorted(st)[:4]}")
        # Exactly the model's tensors: those of the Trainer's own model.safetensors.
        self.assertEqual(sorted(st), sorted(load_file(os.path.join(self.ck6, "model.safetensors"))))
        # --all takes the training state too, and only with --force over the first export.
        r = run("export", self.ck6, "--to", out, "--all", expect=1)
        self.assertIn("--force", r.stderr)
        run("export", self.ck6, "--to", out, "--all", "--force")
        everything = load_file(os.path.join(out, "model.safetensors"))
        self.assertGreater(len(everything), len(st))
        self.assertTrue(any(k.startswith("optimizer.") or ".exp_avg" in k for k in everything), sorted(everything)[:8])
        run("export", self.ck6, "--to", out, "--force")
        shutil.copyfile(os.path.join(self.ck6, "config.json"), os.path.join(out, "config.json"))
        got, _ = model_weights(out)
        want, _ = model_weights(self.ck6)
        assert_same_object(self, want, got, "export of a checkpoint folder")

    def test_export_again_replaces_the_whole_set(self):
        """A second export into the same folder (different shard count) leaves exactly the new
        set: no stale shard, an index naming only the new shards, config.json kept."""
        out = self.path("sharded")
        run("export", self.ck6, "--to", out, "--max-shard-size", "100KB")
        first = sorted(os.listdir(out))
        self.assertGreater(len([f for f in first if f.endswith(".safetensors")]), 2, first)
        shutil.copyfile(os.path.join(self.ck6, "config.json"), os.path.join(out, "config.json"))
        run("export", self.ck6, "--to", out, "--max-shard-size", "300KB", "--force")
        second = sorted(os.listdir(out))
        shards = [f for f in second if f.endswith(".safetensors")]
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        self.assertEqual(sorted(set(index["weight_map"].values())), shards)
        # The checkpoint's config files come along with the weights (export's model folder).
        companions = [n for n in ("config.json", "generation_config.json")
                      if os.path.exists(os.path.join(self.ck6, n))]
        self.assertEqual(second, sorted(shards + companions + ["model.safetensors.index.json"]))
        self.assertNotEqual(len(shards), len([f for f in first if f.endswith(".safetensors")]))
        got, _ = model_weights(out)
        want, _ = model_weights(self.ck6)
        assert_same_object(self, want, got, "second export")
        # A size without a unit is a usage error (not 5 bytes, one tensor per shard).
        r = run("export", self.ck6, "--to", self.path("five"), "--max-shard-size", "5", expect=2)
        self.assertIn("unit", r.stderr)
        self.assertFalse(os.path.exists(self.path("five")))


if __name__ == "__main__":
    unittest.main()
