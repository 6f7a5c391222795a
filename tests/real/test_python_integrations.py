"""The package's trainer integrations with the real libraries: ckptool.lightning's CheckpointIO
in a real Lightning Trainer.fit (resume bit-identical to a plain torch.save run; a policy
applied as checkpoints land), and ckptool.hf's TrainerCallback in a real transformers Trainer
(the run ends as `ckptool apply` would leave it)."""
import dataclasses
import hashlib
import os
import shutil
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from stacklib import PACKAGE  # noqa: E402

sys.path.insert(0, PACKAGE)

import torch  # noqa: E402

import ckptool  # noqa: E402
import real_lit_train as R  # noqa: E402
from real_common import assert_same_object, read_json, read_source, torch_load  # noqa: E402
from stacklib import TempDirTest, fixture, run  # noqa: E402

LIT_FIXTURE = read_source("real_lit_train.py") + """
import sys
make_fixture(sys.argv[1])
"""
RESUME_STEP = (R.RESUME_EPOCH + 1) * R.STEPS_PER_EPOCH
RESUME_NAME = f"epoch={R.RESUME_EPOCH}-step={RESUME_STEP}.ckpt"


@dataclasses.dataclass
class RunConfig:
    """A user's own class in a checkpoint: in save_hyperparameters() and on_save_checkpoint."""
    name: str = "tiny"
    warmup: int = 3


class ConfiguredLit(R.TinyLit):
    def __init__(self, cfg=RunConfig()):
        super().__init__()
        self.save_hyperparameters()
        self.loaded = None

    def on_save_checkpoint(self, checkpoint):
        checkpoint["run_config"] = RunConfig("saved", self.global_step)

    def on_load_checkpoint(self, checkpoint):
        self.loaded = checkpoint["run_config"]


def fit_configured(root, plugins, epochs, ckpt_path=None, **fit_kwargs):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    torch.set_num_threads(1)
    L.seed_everything(0, workers=True, verbose=False)
    model = ConfiguredLit(RunConfig("hp", 5))
    every = ModelCheckpoint(dirpath=os.path.join(root, "ckpts"), filename="{epoch}-{step}",
                            every_n_epochs=1, save_top_k=-1)
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[every], num_sanity_val_steps=0, plugins=plugins)
    trainer.fit(model, R.loader(), ckpt_path=ckpt_path, **fit_kwargs)
    return model


class LightningPlugin(TempDirTest):
    def setUp(self):
        super().setUp()
        fx = fixture("lightning", LIT_FIXTURE, into=self.path("fx"))
        self.losses = read_json(os.path.join(fx, "losses.json"))
        self.final = torch_load(os.path.join(fx, "final.pt"))

    def plugin(self, **kwargs):
        from ckptool.lightning import CkptoolCheckpointIO
        return CkptoolCheckpointIO(**kwargs)

    def assertResumesExactly(self, ckpt, label):
        model = R.fit(self.path("resumed-" + label), ckpt_path=ckpt, plugins=[self.plugin()])
        self.assertEqual(R.hexes(model.step_losses), self.losses[RESUME_STEP:], label)
        assert_same_object(self, self.final,
                           {k: v.clone() for k, v in model.state_dict().items()}, label)

    def test_saves_and_resumes_bit_identically(self):
        model = R.fit(self.path("plug"), plugins=[self.plugin()])
        # saving through the plugin changes nothing in training
        self.assertEqual(R.hexes(model.step_losses), self.losses)
        ckpt = self.path("plug", "ckpts", RESUME_NAME)
        self.assertTrue(ckptool.verify(ckpt).ok)
        # what the plugin wrote is a torch.save file: torch.load reads it the same way
        assert_same_object(self, torch.load(ckpt, weights_only=False)["state_dict"],
                           ckptool.load(ckpt)["state_dict"])
        leftovers = [f for f in os.listdir(self.path("plug", "ckpts")) if "ckptool-tmp" in f]
        self.assertEqual(leftovers, [])
        self.assertResumesExactly(ckpt, "plugin")

    def test_a_users_dataclass_resumes_as_lightning_resumes_it(self):
        """Lightning's own CheckpointIO: fit(weights_only=False) gives the dataclass back; the
        default (weights_only) refuses the file, naming the class. The plugin does the same:
        never an inert record in the user's hands without a word."""
        fit_configured(self.path("run"), [self.plugin()], epochs=1)
        ckpt = self.path("run", "ckpts", f"epoch=0-step={R.STEPS_PER_EPOCH}.ckpt")
        self.assertTrue(os.path.exists(ckpt))
        for label, plugins in (("lightning", None), ("plugin", [self.plugin()])):
            with self.subTest(io=label):
                model = fit_configured(self.path("resumed-" + label), plugins, epochs=2,
                                       ckpt_path=ckpt, weights_only=False)
                self.assertIsInstance(model.loaded, RunConfig)
                self.assertEqual(model.loaded, RunConfig("saved", R.STEPS_PER_EPOCH))
                with self.assertRaises(Exception) as refused:
                    fit_configured(self.path("refused-" + label), plugins, epochs=2,
                                   ckpt_path=ckpt)
                self.assertIn("RunConfig", str(refused.exception))
                if label == "plugin":
                    self.assertIn("weights_only=True", str(refused.exception))
                    self.assertIn("trust=", str(refused.exception))
        # The plugin's trust=[module] accepts the user's own classes and nothing else.
        model = fit_configured(self.path("trusted"), [self.plugin(trust=[__name__])], epochs=2,
                               ckpt_path=ckpt)
        self.assertEqual(model.loaded, RunConfig("saved", R.STEPS_PER_EPOCH))
        hp = ckptool.load(ckpt, weights_only=False)["hyper_parameters"]["cfg"]
        self.assertEqual(hp, RunConfig("hp", 5))

    def test_policy_runs_as_checkpoints_land(self):
        ckpts = self.path("pol", "ckpts")
        os.makedirs(ckpts)
        with open(os.path.join(ckpts, "ckptool.toml"), "w") as f:
            f.write('layout = "lightning"\n[shrink]\n[compress]\nolder_than_newest = 2\n')
        R.fit(self.path("pol"), plugins=[self.plugin(policy=True)])
        names = sorted(os.listdir(ckpts))
        archives = [n for n in names if n.endswith(".ckpt.ckz")]
        self.assertIn(RESUME_NAME + ".ckz", archives)
        self.assertNotIn(RESUME_NAME, names)
        # the newest ones stay plain; the plain ones were shrunk (the table's unused rows)
        self.assertIn(f"epoch={R.EPOCHS - 1}-step={R.EPOCHS * R.STEPS_PER_EPOCH}.ckpt", names)
        # a compressed checkpoint resumes by its own name, bit-identically
        self.assertResumesExactly(os.path.join(ckpts, RESUME_NAME), "compressed")


def tree_digest(root):
    """relative path -> sha256 of every file under root, but the ledger (times, inodes)."""
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != ".ckptool"]
        for f in files:
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
                continue
            with open(p, "rb") as fh:
                out[rel] = hashlib.sha256(fh.read()).hexdigest()
    return out


class HuggingFaceCallback(TempDirTest):
    POLICY = ('layout = "hf-trainer"\n[retention]\nkeep_last = 2\ndelete = true\n'
              '[strip]\nolder_than_newest = 1\ndelete_files = true\n')

    def train(self, parent, callback):
        """Trains in PARENT/run (output_dir "run", relative: training_args.bin holds it);
        returns the losses."""
        import real_hf_train as H
        out = os.path.join(parent, "run")
        os.makedirs(out)
        with open(os.path.join(out, "ckptool.toml"), "w") as f:
            f.write(self.POLICY)
        cwd = os.getcwd()
        os.chdir(parent)
        try:
            tr = H.trainer("run")
            tr.args.save_total_limit = None  # the policy rotates
            if callback:
                from ckptool.hf import CkptoolCallback
                tr.add_callback(CkptoolCallback())
            tr.train()
        finally:
            os.chdir(cwd)
        return H.hexes(tr.step_losses)

    def test_run_ends_as_apply_leaves_it(self):
        losses = self.train(self.path("with"), True)
        self.assertEqual(self.train(self.path("without"), False), losses)
        with_cb, without = self.path("with", "run"), self.path("without", "run")
        run("apply", without, "--settle", "0")
        got, want = tree_digest(with_cb), tree_digest(without)
        self.assertEqual(sorted(got), sorted(want))
        self.assertEqual(got, want)
        kept = sorted(n for n in os.listdir(with_cb) if n.startswith("checkpoint-"))
        self.assertEqual(len(kept), 2, kept)
        # the older kept checkpoint lost its training-only files; the newest kept them
        self.assertFalse(os.path.exists(os.path.join(with_cb, kept[0], "optimizer.pt")))
        self.assertTrue(os.path.exists(os.path.join(with_cb, kept[-1], "optimizer.pt")))


    def test_best_checkpoint_is_held_until_training_ends(self):
        """load_best_model_at_end with a compressing policy: the checkpoint trainer_state.json
        names as best is held (kept as it is, no step) while training runs, so the Trainer ends
        on its weights; once training ends the policy runs over it too."""
        import real_hf_train as H
        import ckptool
        from ckptool.hf import CkptoolCallback
        parent = self.path("best")
        out = os.path.join(parent, "run")
        os.makedirs(out)
        with open(os.path.join(out, "ckptool.toml"), "w") as f:
            f.write('layout = "hf-trainer"\n[compress]\nolder_than_newest = 1\n')
        cwd = os.getcwd()
        os.chdir(parent)
        try:
            tr = H.trainer("run")
            tr.args.save_total_limit = None
            tr.args.eval_strategy = "steps"
            tr.args.eval_steps = H.SAVE_STEPS
            tr.args.load_best_model_at_end = True
            tr.args.metric_for_best_model = "eval_loss"
            tr.args.greater_is_better = True  # the highest loss: the first checkpoint, not the last
            tr.eval_dataset = H.Tokens()
            cb = CkptoolCallback()
            tr.add_callback(cb)
            tr.train()
        finally:
            os.chdir(cwd)
        best = os.path.basename(tr.state.best_model_checkpoint)
        self.assertEqual(best, f"checkpoint-{H.SAVE_STEPS}")
        last = os.path.join(out, f"checkpoint-{H.MAX_STEPS}")
        # The Trainer ended on the best checkpoint's weights...
        final = {k: v for k, v in tr.model.state_dict().items()}
        names = sorted(os.listdir(out))
        self.assertIn(best + ".ckz", names)  # ...and the policy archived it once training ended
        saved = ckptool.load(os.path.join(out, best + ".ckz"))
        for k, v in saved.items():
            self.assertTrue(torch.equal(final[k], v), k)
        # (and not on the last one's: the two differ, so the check above can fail)
        newest = ckptool.load(last)
        self.assertTrue(any(not torch.equal(final[k], v) for k, v in newest.items()))


    def test_missing_policy_is_reported_when_training_starts(self):
        """CkptoolCallback() with no ckptool.toml in output_dir: an error naming the file before
        the first step, not a failure at the first save."""
        import real_hf_train as H
        from ckptool.hf import CkptoolCallback
        parent = self.path("nopolicy")
        os.makedirs(parent)
        cwd = os.getcwd()
        os.chdir(parent)
        try:
            tr = H.trainer("run")
            tr.add_callback(CkptoolCallback())
            with self.assertRaises(FileNotFoundError) as e:
                tr.train()
        finally:
            os.chdir(cwd)
        self.assertIn(os.path.join("run", "ckptool.toml"), str(e.exception))
        self.assertEqual(tr.step_losses, [])  # not one step ran
        self.assertFalse([n for n in os.listdir(os.path.join(parent, "run"))
                          if n.startswith("checkpoint-")] if os.path.isdir(os.path.join(parent, "run")) else [])


if __name__ == "__main__":
    unittest.main()
