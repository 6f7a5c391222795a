"""Nothing laundered: a torch zip whose tensor record fails its CRC32 (torch.load does not check
it: FORMATS.md section 1) is refused by every command that would write from its bytes
(shrink, convert, strip, export, compress), with a message naming the file and the record; the
input stays byte-identical and no output appears. A policy (apply) and prune report it, keep
it, do not count it among the newest kept, and run no step on it. Before, shrink rewrote it
with fresh checksums and the damage stopped showing. (A truncated safetensors shard and a short
DCP chunk, written by transformers and torch.distributed.checkpoint: tests/real/
test_damaged_checkpoints.py.)"""
import hashlib
import json
import os
import struct
import zipfile

import torch

from ckpt_testlib import CkptTestCase, read_bytes, run


def flip_in_record(path, record_suffix, at=100):
    """Flips one byte of the named record's data; returns the record's full name."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(record_suffix))
    data = bytearray(read_bytes(path))
    off = info.header_offset
    n, e = struct.unpack("<HH", data[off + 26:off + 30])
    data[off + 30 + n + e + at] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    return info.filename


def tree_digest(path):
    """sha256 over every file under path (or of the file), names included."""
    h = hashlib.sha256()
    if os.path.isfile(path):
        h.update(read_bytes(path))
        return h.hexdigest()
    for dirpath, dirnames, filenames in sorted(os.walk(path)):
        dirnames.sort()
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            h.update(os.path.relpath(p, path).encode() + b"\0" + read_bytes(p))
    return h.hexdigest()


def damaged_zip(path):
    torch.save({"w": torch.arange(1000.0)[:10], "b": torch.ones(4)}, path)
    return flip_in_record(path, "data/0")


class DamagedInputTest(CkptTestCase):
    def test_every_writer_refuses_a_crc_damaged_record(self):
        src = self.path("damaged.pt")
        # A view into a larger storage: shrink would copy a slice of the damaged record.
        torch.save({"w": torch.arange(1000.0)[:10], "b": torch.ones(4)}, src)
        record = flip_in_record(src, "data/0")
        original = read_bytes(src)
        self.assertIn("CRC32 mismatch", run("verify", src, expect=1).stdout)
        outputs = {
            "shrink in place": (["shrink", src], None),
            "shrink -o": (["shrink", src, "-o", self.path("s.pt")], self.path("s.pt")),
            "convert": (["convert", "--dtype", "bf16", "-o", self.path("c.pt"), src], self.path("c.pt")),
            "strip": (["strip", src, "-o", self.path("t.pt")], self.path("t.pt")),
            "export": (["export", src, "-o", self.path("e.safetensors")], self.path("e.safetensors")),
        }
        for what, (args, out) in outputs.items():
            with self.subTest(command=what):
                r = run(*args, expect=1)
                self.assertIn(f"record '{record}': CRC32 mismatch", r.stderr)
                self.assertIn("refusing a damaged input", r.stderr)
                self.assertNotIn("Done", r.stdout)
                self.assertEqual(read_bytes(src), original, "the input changed")
                if out:
                    self.assertFalse(os.path.exists(out), out)
        # The damage still shows.
        self.assertIn("CRC32 mismatch", run("verify", src, expect=1).stdout)

    def assertRefused(self, src, args, outputs, needle):
        before = tree_digest(src)
        r = run(*args, expect=1)
        self.assertIn(needle, r.stderr)
        self.assertNotIn("Done", r.stdout)
        self.assertNotIn("Wrote", r.stdout)
        self.assertEqual(tree_digest(src), before, "the input changed")
        for out in outputs:
            self.assertFalse(os.path.exists(out), out)

    def test_compress_refuses_a_crc_damaged_zip_unless_asked(self):
        src = self.path("damaged.pt")
        record = damaged_zip(src)
        self.assertRefused(src, ["compress", src, "--rm"], [src + ".ckz"],
                           f"{record}: CRC32 mismatch")
        self.assertTrue(os.path.exists(src))
        # Asked for, the damage goes into the archive as it is, and still shows there.
        original = read_bytes(src)
        run("compress", src, "--allow-damaged")
        out = run("verify", src + ".ckz", expect=1).stdout
        self.assertIn("CRC32 mismatch", out)
        restored = self.path("restored.pt")
        run("decompress", src + ".ckz", "-o", restored)
        self.assertEqual(read_bytes(restored), original)

    def check_policy_skips(self, root, good, bad, policy):
        """apply reports the damaged checkpoint, keeps it as it is, does not count it among the
        newest kept (the good one older than it stays), and runs no step on it."""
        with open(os.path.join(root, "ckptool.toml"), "w") as f:
            f.write(policy)
        before = tree_digest(os.path.join(root, bad))
        for attempt in range(2):  # the second pass reads the verdict from the ledger
            r = run("apply", root, "--yes", "--settle", "0", expect=1)
            self.assertIn(f"{bad}: damaged: fails verify", r.stdout)
            self.assertIn("1 damaged", r.stdout)
            self.assertEqual(tree_digest(os.path.join(root, bad)), before)
        names = os.listdir(root)
        self.assertIn(bad, names)
        self.assertFalse(any(n.startswith(bad) and n != bad for n in names), names)
        self.assertTrue(any(n.startswith(good) for n in names), names)
        return names

    def test_apply_skips_a_damaged_checkpoint(self):
        policy = "[retention]\nkeep_last = 1\n[compress]\nolder_than_newest = 0\n"
        root = self.path("zips")
        os.makedirs(root)
        torch.save({"w": torch.randn(100)}, os.path.join(root, "step_10.pt"))
        torch.save({"w": torch.randn(100)}, os.path.join(root, "step_5.pt"))
        damaged_zip(os.path.join(root, "step_20.pt"))
        names = self.check_policy_skips(root, "step_10.pt", "step_20.pt", policy)
        self.assertIn("step_10.pt.ckz", names)  # the newest good one was compressed
        self.assertNotIn("step_5.pt", names)     # and counted: the older one went

    def test_prune_does_not_count_a_damaged_checkpoint(self):
        root = self.path("run")
        os.makedirs(root)
        for step in (10, 20):
            torch.save({"w": torch.randn(10)}, os.path.join(root, f"step_{step}.pt"))
        damaged_zip(os.path.join(root, "step_30.pt"))
        # A flipped bit shows only to the CRC32s: --checksums reads them (the structure check,
        # the default, does not read every byte).
        dry = json.loads(run("prune", root, "--keep-last", "1", "--json").stdout)
        self.assertFalse(any(e["damaged"] for e in dry["entries"]))
        r = run("prune", root, "--keep-last", "1", "--yes", "--json", "--checksums")
        entries = {e["name"]: e for e in json.loads(r.stdout)["entries"]}
        self.assertTrue(entries["step_30.pt"]["damaged"])
        self.assertTrue(entries["step_30.pt"]["keep"])
        self.assertTrue(entries["step_20.pt"]["keep"])
        self.assertFalse(entries["step_10.pt"]["keep"])
        self.assertIn("step_30.pt: damaged", r.stderr)
        self.assertEqual(sorted(os.listdir(root)), ["step_20.pt", "step_30.pt"])

    def test_prune_checks_the_structure_by_default(self):
        """A ZeRO checkpoint missing a rank's optimizer file is damaged by its structure alone:
        prune keeps it, does not count it, and keeps the one before as the newest."""
        from zero_fixtures import make_zero_checkpoint
        root = self.path("ds")
        for step in (10, 20, 30):
            make_zero_checkpoint(root, 2, 2, tag=f"global_step{step}", seed=step)
        optim = sorted(f for f in os.listdir(os.path.join(root, "global_step30"))
                       if f.endswith("optim_states.pt"))
        os.remove(os.path.join(root, "global_step30", optim[-1]))
        r = run("prune", root, "--keep-last", "1", "--yes", "--json")
        entries = {e["name"]: e for e in json.loads(r.stdout)["entries"]}
        self.assertTrue(entries["global_step30"]["damaged"])
        self.assertIn("partition_count says 2 ranks", entries["global_step30"]["reason"])
        self.assertTrue(entries["global_step20"]["keep"])
        self.assertFalse(entries["global_step10"]["keep"])
        self.assertEqual(sorted(n for n in os.listdir(root) if n.startswith("global_step")),
                         ["global_step20", "global_step30"])

    def test_latest_names_the_newest_complete_and_intact_checkpoint(self):
        root = self.path("run")
        os.makedirs(root)
        for step in (5, 10):
            torch.save({"w": torch.randn(10), "step": step}, os.path.join(root, f"step_{step}.pt"))
        damaged_zip(os.path.join(root, f"step_{20}.pt"))
        # An HF Trainer checkpoint whose trainer_state.json is not written yet: incomplete.
        os.makedirs(os.path.join(root, "checkpoint-30"))
        torch.save({"w": torch.randn(10)}, os.path.join(root, "checkpoint-30", "pytorch_model.bin"))
        r = run("latest", root)
        self.assertEqual(r.stdout.strip(), os.path.join(root, "step_10.pt"))
        self.assertIn("skipped checkpoint-30: incomplete: trainer_state.json", r.stderr)
        self.assertIn("skipped step_20.pt: damaged: step_20/data/0: CRC32 mismatch", r.stderr)
        doc = json.loads(run("latest", root, "--json").stdout)
        self.assertEqual(doc["latest"], os.path.join(root, "step_10.pt"))
        self.assertEqual(doc["step"], 10)
        self.assertEqual(doc["checkpoints"], 4)
        self.assertEqual([s["name"] for s in doc["skipped"]], ["checkpoint-30", "step_20.pt"])
        # None left: exit 1, said; a folder without checkpoints likewise.
        for name in ("step_5.pt", "step_10.pt"):
            damaged_zip(os.path.join(root, name))
        r = run("latest", root, expect=1)
        self.assertEqual(r.stdout, "")
        self.assertIn("none of its 4 checkpoints is complete and intact", r.stderr)
        self.assertIsNone(json.loads(run("latest", root, "--json", expect=1).stdout)["latest"])
        empty = self.path("empty")
        os.makedirs(empty)
        self.assertIn("no checkpoints", run("latest", empty, expect=1).stderr)

    def test_an_intact_file_is_rewritten(self):
        src = self.path("intact.pt")
        torch.save({"w": torch.arange(1000.0)[:10]}, src)
        run("shrink", src)
        self.assertTrue(torch.equal(torch.load(src)["w"], torch.arange(10.0)))
        run("verify", src)


if __name__ == "__main__":
    import unittest
    unittest.main()
