"""`ckptool prune` on the folder layouts trainers write."""
import json
import os
import random
import signal
import subprocess
import time

import torch

from ckpt_testlib import CKPTOOL, CkptTestCase, run
from zero_fixtures import make_zero_checkpoint


def tiny(path, seed=0, optimizer=False):
    torch.manual_seed(seed)
    obj = {"model": {"w": torch.randn(16, 16)}}
    if optimizer:
        obj["optimizer"] = {"state": {0: {"exp_avg": torch.randn(16, 16)}}}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(obj, path)


class PruneTest(CkptTestCase):
    def prune(self, *args, expect=0):
        return json.loads(run("prune", self.tmp, "--json", *args, expect=expect).stdout)

    def names(self):
        return sorted(os.listdir(self.tmp))

    def test_deepspeed_numeric_order_and_latest(self):
        # ZeRO folders as DeepSpeed writes them (prune verifies the ones that would count).
        for step in (200, 900, 1000, 1100):
            make_zero_checkpoint(self.tmp, 2, 2, tag=f"global_step{step}", seed=step)
        with open(self.path("latest"), "w") as f:
            f.write("global_step200")
        dry = self.prune("--keep-last", "1")
        decisions = {e["name"]: e["keep"] for e in dry["entries"]}
        self.assertEqual(decisions, {"global_step200": True, "global_step900": False,
                                     "global_step1000": False, "global_step1100": True})
        self.assertEqual([e["step"] for e in dry["entries"]], [200, 900, 1000, 1100])
        self.assertIn("global_step900", self.names(), "a dry run deletes nothing")
        self.assertGreater(dry["bytes_freed"], 0)
        self.prune("--keep-last", "1", "--yes")
        self.assertEqual(self.names(), ["global_step1100", "global_step200", "latest", "zero_to_fp32.py"])

    def test_hf_best_model_checkpoint_is_protected(self):
        for step in (500, 1000, 1500):
            d = os.path.join(self.tmp, f"checkpoint-{step}")
            tiny(os.path.join(d, "pytorch_model.bin"), step)
            with open(os.path.join(d, "trainer_state.json"), "w") as f:
                json.dump({"best_model_checkpoint": "out/checkpoint-500", "global_step": step}, f)
        self.prune("--keep-last", "1", "--yes")
        self.assertEqual(self.names(), ["checkpoint-1500", "checkpoint-500"])

    def test_megatron_latest_iteration(self):
        for it in (900, 1000, 1100):
            tiny(os.path.join(self.tmp, f"iter_{it:07d}", "mp_rank_00", "model_optim_rng.pt"), it)
        with open(self.path("latest_checkpointed_iteration.txt"), "w") as f:
            f.write("900")
        self.prune("--keep-last", "1", "--yes")
        self.assertEqual(self.names(), ["iter_0000900", "iter_0001100", "latest_checkpointed_iteration.txt"])

    def test_lightning_files_and_last_symlink(self):
        for epoch, step in enumerate((900, 1000, 1100)):
            tiny(self.path(f"epoch={epoch}-step={step}.ckpt"), step)
        os.symlink("epoch=0-step=900.ckpt", self.path("last.ckpt"))
        self.prune("--keep-last", "1", "--yes")
        self.assertEqual(self.names(), ["epoch=0-step=900.ckpt", "epoch=2-step=1100.ckpt", "last.ckpt"])
        torch.load(self.path("last.ckpt"))

    def test_keep_every_and_keep_glob(self):
        for step in range(100, 1100, 100):
            tiny(self.path(f"model_{step}.pt"), step)
        self.prune("--keep-last", "2", "--keep-every", "500", "--keep", "model_300.pt", "--yes")
        self.assertEqual(self.names(), ["model_1000.pt", "model_300.pt", "model_500.pt", "model_900.pt"])

    def test_incomplete_newer_checkpoint_is_reported_not_counted(self):
        for step in (100, 200):
            tiny(os.path.join(self.tmp, f"global_step{step}", "mp_rank_00_model_states.pt"), step)
        broken = os.path.join(self.tmp, "global_step300", "mp_rank_00_model_states.pt")
        tiny(broken, 300)
        with open(broken, "r+b") as f:
            f.truncate(os.path.getsize(broken) // 2)
        r = self.prune("--keep-last", "1", "--yes")
        entry = {e["name"]: e for e in r["entries"]}
        self.assertFalse(entry["global_step300"]["complete"])
        self.assertIn("incomplete", entry["global_step300"]["reason"])
        self.assertEqual(self.names(), ["global_step200", "global_step300"])

    def test_refusals(self):
        tiny(self.path("model_1.pt"))
        r = run("prune", self.tmp, "--keep-last", "0", expect=2)  # a usage error
        self.assertIn("at least 1", r.stderr)
        empty = self.path("empty")
        os.makedirs(empty)
        r = run("prune", empty, "--keep-last", "1", expect=1)
        self.assertIn("no recognisable checkpoints", r.stderr)

    def test_strip_older(self):
        for step in (100, 200, 300):
            tiny(self.path(f"model_{step}.pt"), step, optimizer=True)
        self.prune("--keep-last", "3", "--strip-older", "1", "--yes")
        self.assertIn("optimizer", torch.load(self.path("model_300.pt")))
        for step in (100, 200):
            self.assertEqual(list(torch.load(self.path(f"model_{step}.pt"))), ["model"])

    def test_interrupted_deletion_never_leaves_a_half_checkpoint(self):
        rng = random.Random(0)
        for attempt in range(4):
            for step in range(1, 9):
                d = os.path.join(self.tmp, f"global_step{step}")
                if os.path.exists(d):
                    continue
                tiny(os.path.join(d, "model.pt"), step)
                for i in range(300):
                    with open(os.path.join(d, f"shard_{i}.txt"), "w") as f:
                        f.write("x" * 100)
            p = subprocess.Popen([CKPTOOL, "prune", self.tmp, "--keep-last", "1", "--yes"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.01, 0.15))
            p.send_signal(signal.SIGKILL)
            p.wait()
            for name in os.listdir(self.tmp):
                if name.startswith("global_step"):
                    files = os.listdir(os.path.join(self.tmp, name))
                    self.assertEqual(len(files), 301, f"{name} is half deleted (attempt {attempt})")
        run("prune", self.tmp, "--keep-last", "1", "--yes")  # cleans leftover trash too
        self.assertEqual(self.names(), ["global_step8"])


if __name__ == "__main__":
    import unittest
    unittest.main()
