"""Fault injection over checkpoints the real libraries wrote: a Hugging Face Trainer checkpoint,
a Lightning checkpoint, DeepSpeed ZeRO stages 1-3 (two ranks), torch.distributed.checkpoint from
four ranks, and a plain torch.save. Each fault is made on a fresh copy: one bit flipped in tensor
data, a 4 KiB page of tensor data zeroed, the biggest file cut at a random byte, cut within its
first bytes (a crash right after the first write), emptied (created, never written), a
structural file deleted (a rank file, a chunk file, a model file, DeepSpeed's `latest`).

With a manifest (written on the intact copy) verify finds every fault, and `verify --structure`
(no data byte read) every cut, emptied or deleted file. Without one it finds what
docs/manifest.md's table says: every cut or emptied file and every deleted rank or chunk file; a
flipped bit or zeroed page only where the format has a checksum (torch zip records), not in
safetensors or DCP chunk data. Intact copies raise no alarm either way. The fixtures are the
ones the other real-stack tests train (stacklib.fixture caches them)."""
import os
import random
import shutil
import sys
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import real_dcp_save  # noqa: E402
import real_ds_train  # noqa: E402
import real_hf_train  # noqa: E402,F401 (sets HF_HUB_OFFLINE before transformers is imported)
import torch  # noqa: E402

from real_common import fixture_script  # noqa: E402
from stacklib import TempDirTest, fixture, run  # noqa: E402

# The same scripts and arguments as test_hf_trainer, test_lightning, test_deepspeed_real and
# test_dcp_real: the fixture cache serves them all.
HF = fixture_script("real_hf_train.py")
LIGHTNING = fixture_script("real_lit_train.py")


CHECKPOINT_FILES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".distcp")


def largest_file(root):
    """The biggest checkpoint file (DeepSpeed's folder also holds its zero_to_fp32.py)."""
    if os.path.isfile(root):
        return root
    files = [os.path.join(d, n) for d, _, ns in os.walk(root) for n in ns
             if n.endswith(CHECKPOINT_FILES)]
    return max(files, key=os.path.getsize)


def data_range(path):
    """(begin, end) of a file's tensor bytes: a torch zip's biggest record, a safetensors data
    buffer, a DCP chunk file's bytes after its first 4 KiB."""
    with open(path, "rb") as f:
        head = f.read(8)
    if path.endswith(".distcp"):  # raw tensor bytes, and torch.save blobs of other items
        return min(4096, os.path.getsize(path) // 2), os.path.getsize(path), "raw"
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            info = max(z.infolist(), key=lambda i: i.compress_size)
        with open(path, "rb") as f:
            f.seek(info.header_offset + 26)
            n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        begin = info.header_offset + 30 + n + m
        return begin, begin + info.compress_size, "torch-zip"
    size = os.path.getsize(path)
    n = int.from_bytes(head, "little")
    if 0 < n < size:
        return 8 + n, size, "safetensors"
    return min(4096, size // 2), size, "raw"


class FaultMatrixTest(TempDirTest):
    def sources(self):
        cache = os.path.join(self.tmp, "fixtures")
        hf = fixture("hf-trainer", HF, into=os.path.join(cache, "hf"))
        lt = fixture("lightning", LIGHTNING, into=os.path.join(cache, "lt"))
        # name -> (checkpoint, the file "delete" removes, whether verify sees that without a
        # manifest: a ZeRO rank or a DCP chunk, yes; the one model file of an unsharded HF
        # checkpoint, no: nothing else names it).
        out = {
            "hf-trainer": (os.path.join(hf, "run", "checkpoint-9"), "model.safetensors", False),
            "lightning": (os.path.join(lt, "ckpts", "epoch=3-step=16.ckpt"), None, False),
        }
        for stage in (1, 2, 3):
            root = fixture(f"ds-s{stage}_fp32", real_ds_train.script(), "train", stage, "fp32", 0,
                           into=os.path.join(cache, f"z{stage}"))
            out[f"zero-{stage}"] = (os.path.join(root, "ckpt"), "rank1", True)
        dcp = fixture("dcp-plain_4", real_dcp_save.script(), "plain", 4,
                      into=os.path.join(cache, "dcp"))
        out["dcp-4-ranks"] = (os.path.join(dcp, "ckpt"), ".distcp", True)
        plain = os.path.join(cache, "plain.pt")
        torch.manual_seed(0)
        torch.save({"model": {"w": torch.randn(256, 256)}, "step": 10}, plain)
        out["torch"] = (plain, None, False)
        return out

    def copy(self, src, name):
        dst = os.path.join(self.tmp, "work", name)
        shutil.rmtree(os.path.dirname(dst), ignore_errors=True)
        os.makedirs(os.path.dirname(dst))
        if os.path.isdir(src):
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst)
        return dst

    def deletable(self, ck, hint):
        """A structural file of the checkpoint: a rank file, a chunk, the model file."""
        files = sorted(os.path.join(d, n) for d, _, ns in os.walk(ck) for n in ns)
        if hint == "rank1":
            return next(f for f in files if "rank_1" in os.path.basename(f) or "_1_mp_rank" in f)
        return next(f for f in files if f.endswith(hint))

    def test_every_fault_found_with_a_manifest_and_as_the_table_says_without(self):
        rng = random.Random(20261206)
        intact_checked = 0
        outcomes = []
        for name, (src, delete_hint, delete_seen) in self.sources().items():
            # Intact: no alarm, without and with a manifest.
            ck = self.copy(src, os.path.basename(src))
            run("verify", ck)
            run("manifest", ck)
            self.assertIn("matches", run("verify", ck).stdout)
            intact_checked += 2
            faults = ["flip", "zero", "truncate", "cut header", "empty"] + (["delete"] if delete_hint else [])
            if name.startswith("zero"):
                faults.append("delete latest")
            for fault in faults:
                with self.subTest(checkpoint=name, fault=fault):
                    ck = self.copy(src, os.path.basename(src))
                    run("manifest", ck)
                    manifest = (os.path.join(ck, "ckptool-manifest.json") if os.path.isdir(ck)
                                else ck + ".ckptool-manifest.json")
                    target = largest_file(ck)
                    begin, end, kind = data_range(target)
                    if fault == "flip":
                        at = rng.randrange(begin, end)
                        with open(target, "r+b") as f:
                            f.seek(at)
                            b = f.read(1)[0]
                            f.seek(at)
                            f.write(bytes([b ^ (1 << rng.randrange(8))]))
                    elif fault == "zero":
                        at = rng.randrange(begin, max(begin + 1, end - 4096))
                        with open(target, "r+b") as f:
                            f.seek(at)
                            page = f.read(4096)
                            if page == b"\0" * len(page):
                                self.fail(f"{target}: the page at {at} was zero already")
                            f.seek(at)
                            f.write(b"\0" * len(page))
                    elif fault == "truncate":
                        os.truncate(target, rng.randrange(1, os.path.getsize(target)))
                    elif fault == "cut header":  # a crash right after the first write
                        os.truncate(target, rng.randrange(1, min(begin, 48)))
                    elif fault == "empty":  # created, never written
                        os.truncate(target, 0)
                    elif fault == "delete":
                        target = self.deletable(ck, delete_hint)
                        kind = "structural" if delete_seen else "unnamed"
                        os.remove(target)
                    else:  # delete latest
                        target = os.path.join(ck, "latest")
                        kind = "marker"
                        os.remove(target)
                    with_manifest = run("verify", ck, expect=1)
                    self.assertIn(os.path.basename(manifest), with_manifest.stdout + with_manifest.stderr)
                    # --structure reads no data byte: with the manifest's sizes it sees every cut
                    # and deleted file; a flipped bit or zeroed page only where it lands in
                    # structure (a pickle, a zip header), which verify without a manifest sees too.
                    quick = run("verify", "--structure", ck, expect=None)
                    quick_found = quick.returncode != 0
                    if fault not in ("flip", "zero"):
                        self.assertTrue(quick_found, f"verify --structure after {fault}:\n{quick.stdout}")
                    os.remove(manifest)
                    without = run("verify", ck, expect=None)
                    found = without.returncode != 0
                    if quick_found and fault in ("flip", "zero"):
                        self.assertTrue(found, f"--structure found what verify did not: {quick.stdout}")
                    outcomes.append(f"{name:12} {fault:14} {os.path.basename(target):42} {kind:11} "
                                    f"manifest: found  without: {'found' if found else 'not found'}")
                    if fault in ("truncate", "cut header", "empty") or kind == "structural":
                        self.assertTrue(found, f"{fault} of {target} passed verify:\n{without.stdout}")
                    elif fault in ("flip", "zero") and kind != "raw":
                        # Only a format checksum sees these (docs/manifest.md): torch zip records
                        # have CRC32s, safetensors data has none. (A DCP chunk file holds raw
                        # tensor bytes and torch.save blobs with their own CRCs: it depends.)
                        self.assertEqual(found, kind == "torch-zip",
                                         f"{fault} in {target} ({kind}):\n{without.stdout}")
        print("\n" + "\n".join(outcomes))
        self.assertGreaterEqual(intact_checked, 14)
        self.assertEqual(len(outcomes), 43)


if __name__ == "__main__":
    unittest.main()
