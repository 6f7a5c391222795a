"""Nothing laundered, with checkpoints the real libraries write: a safetensors shard of a model
transformers saved (sharded, with its index) cut short, and a torch.distributed.checkpoint chunk
file shorter than its metadata says, are refused by every command that would write from them
(shrink, convert, strip, export, compress): exit 1, a message naming the damaged file, the
input byte-identical, no output. A policy (apply) over Trainer-style and DCP run folders reports
the damaged checkpoint, keeps it as it is, does not count it among the newest kept (the good one
before it is the one kept and processed) and runs no step on it. The torch zip whose record
fails its CRC32: tests/integration/test_damaged_inputs.py."""
import json
import os
import unittest
import warnings

import torch

from real_common import tree
from stacklib import TempDirTest, run


def sharded_model(folder):
    """A GPT-2 saved by transformers in three safetensors shards with an index."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500, n_positions=64,
                     bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(cfg).save_pretrained(folder, max_shard_size="200KB")
    shards = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    assert len(shards) >= 2, shards
    return shards


def truncate_shard(folder, shards):
    p = os.path.join(folder, shards[1])
    os.truncate(p, os.path.getsize(p) - 1000)
    return shards[1]


def dcp_folder(folder):
    import torch.distributed.checkpoint as dcp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"w": torch.randn(1000), "b": torch.randn(10)}, checkpoint_id=folder)


def truncate_chunk(folder):
    name = next(f for f in sorted(os.listdir(folder)) if f.endswith(".distcp"))
    p = os.path.join(folder, name)
    os.truncate(p, os.path.getsize(p) - 100)
    return name


class DamagedCheckpointTest(TempDirTest):
    def assertRefused(self, src, args, outputs, needle):
        before = tree(src)
        r = run(*args, expect=1)
        self.assertIn(needle, r.stderr)
        self.assertNotIn("Done", r.stdout)
        self.assertNotIn("Wrote", r.stdout)
        self.assertEqual(tree(src), before, "the input changed")
        for out in outputs:
            self.assertFalse(os.path.exists(out), out)

    def test_every_writer_refuses_a_truncated_safetensors_shard(self):
        src = self.path("model")
        shard = truncate_shard(src, sharded_model(src))
        self.assertIn("bytes of data but the file has", run("verify", src, expect=1).stdout)
        cases = {
            "shrink": (["shrink", src], []),
            "convert": (["convert", "--dtype", "bf16", src], [os.path.join(src, "bf16")]),
            "convert --output-dir": (["convert", "--dtype", "bf16", src, "--output-dir",
                                      self.path("c")], [self.path("c")]),
            "strip -o": (["strip", src, "-o", self.path("s")], [self.path("s")]),
            "export": (["export", src, "-o", self.path("e.safetensors")], [self.path("e.safetensors")]),
            "compress": (["compress", src], [src + ".ckz"]),
        }
        for what, (args, outs) in cases.items():
            with self.subTest(command=what):
                self.assertRefused(src, args, outs, shard)

    def test_every_writer_refuses_a_dcp_chunk_shorter_than_its_metadata(self):
        src = self.path("dcp")
        dcp_folder(src)
        chunk = truncate_chunk(src)
        self.assertIn("the file is truncated", run("verify", src, expect=1).stdout)
        cases = {
            "shrink": (["shrink", src], []),
            "convert": (["convert", "--dtype", "bf16", src], [os.path.join(src, "bf16")]),
            "strip": (["strip", src], []),
            "strip -o": (["strip", src, "-o", self.path("s")], [self.path("s")]),
            "export": (["export", src, "-o", self.path("e.safetensors")], [self.path("e.safetensors")]),
            "compress": (["compress", src], [src + ".ckz"]),
        }
        for what, (args, outs) in cases.items():
            with self.subTest(command=what):
                # convert names DCP folders as export's job; the others name the damage.
                self.assertRefused(src, args, outs, "export" if what == "convert" else chunk)

    def check_policy_skips(self, root, good, bad, policy):
        with open(os.path.join(root, "ckptool.toml"), "w") as f:
            f.write(policy)
        before = tree(os.path.join(root, bad))
        for attempt in range(2):  # the second pass reads the verdict from the ledger
            r = run("apply", root, "--yes", "--settle", "0", expect=1)
            self.assertIn(f"{bad}: damaged: fails verify", r.stdout)
            self.assertIn("1 damaged", r.stdout)
            self.assertEqual(tree(os.path.join(root, bad)), before)
        names = os.listdir(root)
        self.assertIn(bad, names)
        self.assertFalse(any(n.startswith(bad) and n != bad for n in names), names)
        return names

    def test_apply_skips_a_damaged_checkpoint(self):
        policy = "[retention]\nkeep_last = 1\n[compress]\nolder_than_newest = 0\n"
        with self.subTest(kind="HF checkpoint with a truncated shard"):
            root = self.path("hf")
            for step in (10, 20):
                d = os.path.join(root, f"checkpoint-{step}")
                shards = sharded_model(d)
                with open(os.path.join(d, "trainer_state.json"), "w") as f:
                    json.dump({"global_step": step, "best_model_checkpoint": None}, f)
            truncate_shard(os.path.join(root, "checkpoint-20"), shards)
            names = self.check_policy_skips(root, "checkpoint-10", "checkpoint-20", policy)
            self.assertIn("checkpoint-10.ckz", names)  # the newest good one, compressed
        with self.subTest(kind="DCP with a short chunk"):
            root = self.path("dcps")
            for step in (10, 20):
                dcp_folder(os.path.join(root, f"step_{step}"))
            truncate_chunk(os.path.join(root, "step_20"))
            r = self.check_policy_skips(root, "step_10", "step_20",
                                        "[retention]\nkeep_last = 1\n[strip]\nolder_than_newest = 0\n")
            self.assertIn("step_10", r)
            ledger = json.load(open(os.path.join(root, ".ckptool", "state.json")))
            self.assertIn("strip", ledger["checkpoints"]["step_10"]["steps"])
            self.assertNotIn("strip", ledger["checkpoints"]["step_20"]["steps"])
            self.assertTrue(ledger["checkpoints"]["step_20"]["checked"]["damage"])


if __name__ == "__main__":
    unittest.main()
