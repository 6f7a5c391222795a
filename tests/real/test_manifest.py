"""`ckptool manifest` over checkpoints the real libraries write (transformers, safetensors,
torch.save, torch.distributed.checkpoint): the file digests are the SHA-256 hashlib computes
(as OpenSSF model signing does); tensor digests agree across containers; with a manifest every
injected fault is found, including those no format checksum covers (a bit flipped in a
safetensors shard or a DCP chunk); rewrites in place keep the manifest true and refuse a file
that no longer matches it; `ckptool latest` passes over a checkpoint its manifest condemns."""
import hashlib
import json
import os
import random
import shutil
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from real_common import sha256  # noqa: E402
from stacklib import TempDirTest, run  # noqa: E402

import torch  # noqa: E402
import safetensors.torch  # noqa: E402


def hf_checkpoint(folder, seed=0):
    """A Hugging Face Trainer-style checkpoint folder: the model saved by transformers
    (safetensors), the optimizer and scheduler by torch.save, trainer_state.json."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64,
                                     n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(folder, safe_serialization=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 64, (2, 8)), labels=torch.randint(0, 64, (2, 8))).loss.backward()
    opt.step()
    torch.save(opt.state_dict(), os.path.join(folder, "optimizer.pt"))
    torch.save({"step": 1}, os.path.join(folder, "scheduler.pt"))
    with open(os.path.join(folder, "trainer_state.json"), "w") as f:
        json.dump({"global_step": seed + 1}, f)
    return folder


def manifest_of(path):
    name = os.path.join(path, "ckptool-manifest.json") if os.path.isdir(path) else \
        path + ".ckptool-manifest.json"
    with open(name) as f:
        return json.load(f)


def flip_bit(path, at, mask=1):
    """XORs the byte at `at` with `mask`: one changed byte the file's size does not show."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))


def data_offset(st_path):
    with open(st_path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    return 8 + n


class ManifestTest(TempDirTest):
    def test_file_digests_are_sha256_of_every_file(self):
        ck = hf_checkpoint(os.path.join(self.tmp, "checkpoint-1"))
        r = run("manifest", ck, "--json")
        doc = json.loads(r.stdout)["manifests"][0]
        m = manifest_of(ck)
        names = sorted(os.listdir(ck))
        names.remove("ckptool-manifest.json")
        self.assertEqual([x["name"] for x in m["resources"]], names)
        for x in m["resources"]:
            self.assertEqual(x["algorithm"], "sha256")
            self.assertEqual(x["digest"], sha256(os.path.join(ck, x["name"])), x["name"])
            self.assertEqual(x["size"], os.path.getsize(os.path.join(ck, x["name"])))
        self.assertEqual(doc["files"], len(names))
        self.assertGreater(doc["tensors"], 10)
        self.assertEqual(m["serialization"]["method"], "files")
        # Written once: again only with --force.
        self.assertIn("exists", run("manifest", ck, expect=1).stderr)
        run("manifest", ck, "--force")
        self.assertIn("matches", run("verify", ck).stdout)
        # Never fresh digests over bytes that changed since: --force refuses then.
        config = os.path.join(ck, "config.json")
        with open(config, "a") as f:
            f.write(" ")
        r = run("manifest", ck, "--force", expect=1)
        size = os.path.getsize(config)
        self.assertIn(f"config.json: {size} bytes where ckptool-manifest.json says {size - 1}", r.stderr)
        self.assertIn("no manifest written", r.stderr)

    def test_tensor_digests_agree_across_containers(self):
        torch.manual_seed(3)
        sd = {"a.weight": torch.randn(16, 8), "a.bias": torch.randn(16),
              "h": torch.randn(4, 4).to(torch.bfloat16), "count": torch.tensor([7])}
        pt = os.path.join(self.tmp, "model.pt")
        st = os.path.join(self.tmp, "model.safetensors")
        torch.save(sd, pt)
        safetensors.torch.save_file(sd, st)
        dcp_dir = os.path.join(self.tmp, "dcp")
        import torch.distributed.checkpoint as dcp
        dcp.save({k: v.clone() for k, v in sd.items()}, checkpoint_id=dcp_dir)
        archive = os.path.join(self.tmp, "model.pt.ckz")
        run("compress", pt)
        digests = {}
        for path in (pt, st, dcp_dir, archive):
            run("manifest", path)
            units = manifest_of(path)["tensors"]
            self.assertEqual(len(units), 1, units)
            digests[path] = units[0]["digests"]
        expected = digests[st]
        self.assertEqual(sorted(expected), sorted(sd))
        for path, d in digests.items():
            self.assertEqual(d, expected, path)
        # A bit flipped in a DCP chunk's tensor bytes: only the manifest sees it.
        chunk = max((os.path.join(dcp_dir, n) for n in os.listdir(dcp_dir) if n.endswith(".distcp")),
                    key=os.path.getsize)
        flip_bit(chunk, os.path.getsize(chunk) // 2, 4)
        self.assertIn(os.path.basename(chunk) + ": its SHA-256 differs",
                      run("verify", dcp_dir, expect=1).stdout)
        os.remove(os.path.join(dcp_dir, "ckptool-manifest.json"))
        run("verify", dcp_dir)  # DCP chunk data carries no checksum
        # The digest is SHA-256 of "<dtype>[<shape>]\n" and the little-endian elements.
        t = sd["a.weight"]
        want = hashlib.sha256(b"float32[16,8]\n" + t.numpy().tobytes()).hexdigest()
        self.assertEqual(expected["a.weight"], want)

    def test_every_fault_is_found_with_a_manifest(self):
        base = hf_checkpoint(os.path.join(self.tmp, "base"))
        run("manifest", base)
        st = os.path.join(base, "model.safetensors")
        size = os.path.getsize(st)
        rng = random.Random(7)

        def flip(path):
            at = rng.randrange(data_offset(path), os.path.getsize(path))
            flip_bit(path, at, 1 << rng.randrange(8))

        def zero_page(path):
            at = rng.randrange(data_offset(path), os.path.getsize(path) - 4096)
            with open(path, "r+b") as f:
                f.seek(at)
                f.write(b"\0" * 4096)

        def truncate(path):
            with open(path, "r+b") as f:
                f.truncate(rng.randrange(1, os.path.getsize(path)))

        faults = {
            "bit flipped in the safetensors shard": lambda ck: flip(os.path.join(ck, "model.safetensors")),
            "page zeroed in the safetensors shard": lambda ck: zero_page(os.path.join(ck, "model.safetensors")),
            "safetensors shard truncated": lambda ck: truncate(os.path.join(ck, "model.safetensors")),
            "optimizer.pt truncated": lambda ck: truncate(os.path.join(ck, "optimizer.pt")),
            "scheduler.pt deleted": lambda ck: os.remove(os.path.join(ck, "scheduler.pt")),
            "file added": lambda ck: open(os.path.join(ck, "extra.bin"), "wb").write(b"x"),
            "config.json edited": lambda ck: open(os.path.join(ck, "config.json"), "a").write(" "),
        }
        self.assertEqual(size, os.path.getsize(st))
        for what, fault in faults.items():
            ck = os.path.join(self.tmp, "ck")
            shutil.rmtree(ck, ignore_errors=True)
            shutil.copytree(base, ck)
            fault(ck)
            r = run("verify", ck, expect=1)
            self.assertIn("ckptool-manifest.json", r.stdout + r.stderr, what)
            # Without the manifest, a flipped bit or zeroed page in safetensors data is invisible:
            # the format has no checksum (docs/manifest.md's table).
            os.remove(os.path.join(ck, "ckptool-manifest.json"))
            silent = run("verify", ck, expect=None)
            if what.startswith(("bit flipped", "page zeroed", "file added", "config.json")):
                self.assertEqual(silent.returncode, 0, what)
        # Intact copies: no false alarm.
        for i in range(3):
            ck = os.path.join(self.tmp, f"intact{i}")
            shutil.copytree(base, ck)
            run("verify", ck)

    def test_rewrites_in_place_keep_the_manifest_true(self):
        pt = os.path.join(self.tmp, "train.pt")
        torch.manual_seed(0)
        big = torch.randn(64, 64)

        def save(path, scale=1.0):
            # A view of a bigger storage (shrink drops the rest) and optimizer state (strip).
            torch.save({"model": {"w": (big * scale)[:4]},
                        "optimizer": {"state": {0: {"exp_avg": torch.ones(4, 64)}}},
                        "step": 3}, path)

        save(pt)
        # big[:4] is saved with its whole storage: torch.save keeps views' storages whole.
        run("manifest", pt)
        first = manifest_of(pt)
        run("shrink", pt)
        shrunk = manifest_of(pt)
        self.assertEqual(shrunk["resources"][0]["digest"], sha256(pt))
        self.assertLess(shrunk["resources"][0]["size"], first["resources"][0]["size"])
        self.assertEqual(shrunk["tensors"], first["tensors"])  # the same tensors, fewer bytes
        run("strip", pt)
        stripped = manifest_of(pt)
        self.assertEqual(stripped["resources"][0]["digest"], sha256(pt))
        self.assertEqual(sorted(stripped["tensors"][0]["digests"]), ["model.w"])
        self.assertIn("matches", run("verify", pt).stdout)
        # Restoring a damaged file from its archive is no rewrite of the damaged bytes: it is
        # allowed, and the manifest matches again.
        run("compress", pt)
        with open(pt, "ab") as f:
            f.write(b"\0")
        run("decompress", pt + ".ckz", "-f")
        self.assertIn("matches", run("verify", pt).stdout)
        self.assertEqual(manifest_of(pt), stripped)
        # A file that no longer matches its manifest (a valid torch file, other values) is
        # refused, not rewritten, and the manifest stays as it was.
        other = os.path.join(self.tmp, "other.pt")
        save(other)
        run("manifest", other)
        kept = manifest_of(other)
        save(other, scale=2.0)
        r = run("shrink", other, expect=1)
        self.assertIn("manifest", r.stderr)
        self.assertEqual(manifest_of(other), kept)
        self.assertIn("SHA-256 differs", run("verify", other, expect=1).stdout)

    def test_files_written_into_or_deleted_from_a_checkpoint_folder_keep_it_true(self):
        """convert's default output (SRC/bf16/) lands inside the checkpoint folder and strip
        --delete-files deletes its training-only files: the folder's manifest records both, so
        verify and latest do not condemn a checkpoint for what ckptool itself did."""
        ck = hf_checkpoint(self.path("run", "checkpoint-1"))
        run("manifest", ck)
        run("convert", "--dtype", "bf16", ck)
        names = {r["name"]: r for r in manifest_of(ck)["resources"]}
        self.assertIn("bf16/model.safetensors", names)
        self.assertEqual(names["bf16/model.safetensors"]["digest"],
                         sha256(os.path.join(ck, "bf16", "model.safetensors")))
        self.assertEqual(list(names), sorted(names))
        self.assertIn("matches", run("verify", ck).stdout)
        run("strip", ck, "--delete-files")
        names = [r["name"] for r in manifest_of(ck)["resources"]]
        self.assertNotIn("optimizer.pt", names)
        self.assertNotIn("bf16/optimizer.pt", names)
        self.assertFalse(any(u["of"].endswith("optimizer.pt") for u in manifest_of(ck)["tensors"]))
        self.assertIn("matches", run("verify", ck).stdout)
        self.assertEqual(run("latest", self.path("run")).stdout.strip(), ck)
        # A file someone else adds is still reported.
        with open(os.path.join(ck, "notes.txt"), "w") as f:
            f.write("x")
        self.assertIn("notes.txt: not in", run("verify", ck, expect=1).stdout)

    def test_latest_passes_over_a_checkpoint_its_manifest_condemns(self):
        root = os.path.join(self.tmp, "run")
        for step in (1, 2):
            ck = hf_checkpoint(os.path.join(root, f"checkpoint-{step}"), seed=step - 1)
            run("manifest", ck)
        st = os.path.join(root, "checkpoint-2", "model.safetensors")
        flip_bit(st, data_offset(st) + 100, 1)
        r = run("latest", root)
        self.assertEqual(r.stdout.strip(), os.path.join(root, "checkpoint-1"))
        self.assertIn("skipped checkpoint-2: damaged", r.stderr)
        # verify of the run's folder checks each checkpoint's manifest below it.
        v = run("verify", root, expect=1).stdout
        self.assertIn(os.path.join(root, "checkpoint-2") + ": model.safetensors: its SHA-256 differs", v)
        self.assertIn(os.path.join(root, "checkpoint-1") + ": OK (matches", v)
        self.assertIn("model.safetensors", r.stderr)


    def test_indexes_and_links_are_checked_without_a_manifest(self):
        import transformers
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64,
                                         n_positions=32)
        ck = os.path.join(self.tmp, "sharded")
        transformers.GPT2LMHeadModel(config).save_pretrained(ck, max_shard_size="40KB")
        index = os.path.join(ck, "model.safetensors.index.json")
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        shards = sorted(set(weight_map.values()))
        self.assertGreater(len(shards), 2)
        run("verify", ck)  # intact: no false alarm
        # An index entry pointing at a shard that does not hold the tensor.
        edited = json.loads(open(index).read())
        name = next(n for n, s in weight_map.items() if s == shards[0])
        edited["weight_map"][name] = shards[1]
        shutil.copy(index, index + ".bak")
        with open(index, "w") as f:
            json.dump(edited, f)
        r = run("verify", ck, expect=1)
        self.assertIn(f"model.safetensors.index.json: maps {name} to {shards[1]}, which does not "
                      "hold it", r.stdout)
        shutil.move(index + ".bak", index)
        # A shard deleted: every other file verifies, the index says what is missing.
        os.remove(os.path.join(ck, shards[-1]))
        r = run("verify", ck, expect=1)
        self.assertIn(f"names the shard {shards[-1]}", r.stdout)
        self.assertIn("which is missing", r.stdout)
        # Lightning's last.ckpt as a link (save_last="link") to a checkpoint that is gone.
        lt = os.path.join(self.tmp, "lightning")
        os.makedirs(lt)
        torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 1}, os.path.join(lt, "epoch=1.ckpt"))
        os.symlink("epoch=1.ckpt", os.path.join(lt, "last.ckpt"))
        run("verify", lt)
        os.remove(os.path.join(lt, "epoch=1.ckpt"))
        torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 0}, os.path.join(lt, "epoch=0.ckpt"))
        r = run("verify", lt, expect=1)
        self.assertIn("last.ckpt: a link to epoch=1.ckpt, which does not exist", r.stdout)

    def test_the_policys_manifest_step(self):
        root = os.path.join(self.tmp, "run")
        for step in (1, 2):
            hf_checkpoint(os.path.join(root, f"checkpoint-{step}"), seed=step - 1)
        with open(os.path.join(root, "ckptool.toml"), "w") as f:
            f.write("[manifest]\n")
        r = run("apply", root, "--settle", "0")
        for step in (1, 2):
            ck = os.path.join(root, f"checkpoint-{step}")
            self.assertIn("matches", run("verify", ck).stdout, r.stdout)
        # A second run finds nothing to do (the manifest is no change of the checkpoint).
        again = run("apply", root, "--settle", "0", "--json")
        self.assertNotIn('"manifest"', again.stdout)
        st = os.path.join(root, "checkpoint-2", "model.safetensors")
        flip_bit(st, data_offset(st) + 64, 0x10)
        self.assertEqual(run("latest", root).stdout.strip(), os.path.join(root, "checkpoint-1"))


    def test_no_manifest_is_left_naming_bytes_that_are_gone(self):
        root = os.path.join(self.tmp, "run")
        os.makedirs(root)
        for step in (1, 2, 3):
            path = os.path.join(root, f"step_{step}.pt")
            torch.save({"w": torch.full((8,), float(step)), "step": step}, path)
            run("manifest", path)
        run("prune", root, "--keep-last", "1", "--yes")
        self.assertEqual(sorted(os.listdir(root)),
                         ["step_3.pt", "step_3.pt.ckptool-manifest.json"])
        last = os.path.join(root, "step_3.pt")
        r = run("compress", last, "--rm")
        self.assertIn("step_3.pt.ckptool-manifest.json: removed with", r.stderr)
        self.assertEqual(sorted(os.listdir(root)), ["step_3.pt.ckz"])
        run("decompress", last + ".ckz", "--rm")
        self.assertEqual(sorted(os.listdir(root)), ["step_3.pt"])


    def test_a_dcp_folder_stripped_in_place_gets_its_manifest_anew(self):
        import torch.distributed.checkpoint as dcp
        import warnings
        folder = os.path.join(self.tmp, "dcp")
        torch.manual_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"model": {"w": torch.randn(64, 64)},
                      "optimizer": {"state": {"0": {"exp_avg": torch.randn(64, 64)}}}},
                     checkpoint_id=folder)
        run("manifest", folder)
        before = manifest_of(folder)["tensors"][0]["digests"]
        run("strip", folder)
        self.assertIn("matches", run("verify", folder).stdout)
        after = manifest_of(folder)["tensors"][0]["digests"]
        self.assertEqual(after, {k: v for k, v in before.items() if k.startswith("model.")})
        # Bytes changed since the manifest: refused, the folder untouched.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"model": {"w": torch.randn(64, 64)},
                      "optimizer": {"state": {"0": {"exp_avg": torch.randn(64, 64)}}}},
                     checkpoint_id=os.path.join(self.tmp, "dcp2"))
        folder = os.path.join(self.tmp, "dcp2")
        run("manifest", folder)
        chunk = max((os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".distcp")),
                    key=os.path.getsize)
        flip_bit(chunk, os.path.getsize(chunk) - 10, 0x40)
        r = run("strip", folder, expect=1)
        self.assertIn("SHA-256 differs", r.stderr)
        self.assertIn("nothing stripped", r.stderr)


if __name__ == "__main__":
    unittest.main()
