"""ckptool compress / decompress against real torch.save files: byte-identical restores of every
kind of checkpoint and of whole folders (paths, modes, mtimes, symlinks), smaller than plain
zstd -19 on realistic weights, the zstd/xz command-line conventions, and damaged archives
refused with one clear error and never a wrong restored file."""
import hashlib
import json
import os
import random
import signal
import stat
import struct
import subprocess
import time
import unittest

import torch
import zstandard

from ckpt_testlib import CKPTOOL, CkptTestCase, read_bytes, run

SANITIZED = os.environ.get("CKPT_SANITIZED", "0") in ("1", "ON", "TRUE", "true")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def weights(n, seed=0):
    """Realistic weights: torch.randn * 0.02 has the exponent statistics of trained layers."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * 0.02


def state_dict(elements, dtype, layers=8, seed=0):
    per = elements // layers
    sd = {}
    for i in range(layers):
        sd[f"model.layers.{i}.weight"] = weights(per, seed + i).view(-1, 256).to(dtype)
        sd[f"model.layers.{i}.bias"] = weights(256, seed + 100 + i).to(dtype)
    return sd


def write_safetensors(path, tensors):
    header, blobs, pos = {}, [], 0
    codes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.bfloat16 \
            else t.contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def zstd_size(path, level):
    return len(zstandard.ZstdCompressor(level=level).compress(read_bytes(path)))


def tree(root):
    """Every entry below root: relative path -> (kind, mode, mtime_ns, content or target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p), st.st_mtime_ns)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), st.st_mtime_ns)
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_mtime_ns, sha256(p))
    st = os.stat(root)
    out["."] = ("dir", stat.S_IMODE(st.st_mode), st.st_mtime_ns)
    return out


class CompressRoundTrip(CkptTestCase):
    def roundtrip(self, path, *flags):
        """compress PATH, decompress to PATH.restored; asserts the same bytes; archive size."""
        run("compress", "-q", *flags, path)
        archive = path + ".ckz"
        self.assertTrue(os.path.exists(archive))
        self.assertTrue(os.path.exists(path), "the original is kept without --rm")
        restored = path + ".restored"
        run("decompress", "-q", "-f", archive, "-o", restored)
        self.assertEqual(sha256(restored), sha256(path))
        self.assertEqual(stat.S_IMODE(os.stat(restored).st_mode), stat.S_IMODE(os.stat(path).st_mode))
        self.assertEqual(os.stat(restored).st_mtime_ns, os.stat(path).st_mtime_ns)
        run("verify", archive)
        return os.path.getsize(archive)

    def test_fp32_bf16_fp16_restore_byte_identical_and_load(self):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            with self.subTest(dtype=dtype):
                p = self.path(f"model_{str(dtype)[6:]}.pt")
                sd = state_dict(1 << 20, dtype)
                torch.save(sd, p)
                self.roundtrip(p)
                back = torch.load(p + ".restored")
                for k, v in sd.items():
                    self.assertTrue(torch.equal(back[k], v), k)

    def test_smaller_than_zstd_19_on_realistic_fp32_and_bf16_weights(self):
        # Targets of the issue: >= 5% smaller than zstd -19 for fp32, >= 10% for bf16, and
        # never larger for any dtype (fp16 and an AdamW state included).
        n = (1 << 19) if SANITIZED else (1 << 21)
        for dtype, margin in ((torch.float32, 0.95), (torch.bfloat16, 0.90), (torch.float16, 1.0)):
            with self.subTest(dtype=dtype):
                p = self.path(f"w_{str(dtype)[6:]}.pt")
                torch.save(state_dict(n, dtype, seed=7), p)
                ours = self.roundtrip(p)
                z19 = zstd_size(p, 19)
                self.assertLess(ours, z19 * margin, f"ckz {ours} vs zstd -19 {z19}")

    def test_adamw_state_never_larger_than_zstd_19(self):
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(32, 256)).square().mean().backward()
            opt.step()
        p = self.path("optim.pt")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, p)
        for level in ("fast", "max"):
            with self.subTest(level=level):
                ours = self.roundtrip(p, "-f", "--level", level)
                self.assertLessEqual(ours, zstd_size(p, 19), level)

    def test_model_with_many_tensors(self):
        sd = {f"blocks.{i}.{k}": weights(64 + i % 50, i).to(torch.bfloat16 if i % 3 else torch.float32)
              for i in range(600) for k in ("w", "b")}
        sd["step"] = 1000
        sd["names"] = [f"layer{i}" for i in range(50)]
        p = self.path("many.pt")
        torch.save(sd, p)
        self.roundtrip(p)
        doc = json.loads(run("inspect", "--json", p + ".ckz").stdout)
        entry = doc["archives"][0]["entries"][0]
        self.assertEqual(entry["format"], "torch-zip")
        self.assertEqual(len(entry["tensors"]), 1200)

    def test_legacy_file(self):
        p = self.path("legacy.pt")
        torch.save(state_dict(1 << 18, torch.float32), p, _use_new_zipfile_serialization=False)
        self.roundtrip(p)
        doc = json.loads(run("inspect", "--json", p + ".ckz").stdout)
        self.assertEqual(doc["archives"][0]["entries"][0]["format"], "torch-legacy")
        planes = {x["name"]: x for x in doc["archives"][0]["planes"]}
        self.assertIn("f32 exponent", planes)

    def test_safetensors_file(self):
        p = self.path("model.safetensors")
        tensors = {"a": weights(300000).to(torch.bfloat16), "b": weights(70001, 1),
                   "c": weights(5, 2).to(torch.float16), "ids": torch.arange(1000)}
        write_safetensors(p, tensors)
        self.roundtrip(p)
        doc = json.loads(run("inspect", "--json", p + ".ckz").stdout)
        self.assertEqual(doc["archives"][0]["entries"][0]["format"], "safetensors")

    def test_dcp_folder_items_are_coded_by_dtype(self):
        """A torch.distributed.checkpoint folder's .distcp files are items at the offsets its
        metadata gives, each a torch.save archive: their tensors are found (and coded by dtype)
        without reading the items' pickles as one file; zstd-transformed items stay plain."""
        import dcp_fixtures as dcp
        cases = dcp.standard_cases()
        for name in ("fsdp_tp_bf16", "uneven_fp32", "per_rank_metadata", "megatron", "zstd"):
            with self.subTest(case=name):
                folder = self.path(name)
                cases[name](folder)
                run("compress", "-q", folder)
                restored = self.path(name + ".restored")
                run("decompress", "-q", folder + ".ckz", "-o", restored)
                distcp = 0
                for root, _, files in os.walk(folder):
                    for f in files:
                        rel = os.path.relpath(os.path.join(root, f), folder)
                        self.assertEqual(sha256(os.path.join(restored, rel)), sha256(os.path.join(root, f)), rel)
                        distcp += f.endswith(".distcp")
                self.assertGreater(distcp, 0)
                doc = json.loads(run("inspect", "--json", folder + ".ckz").stdout)
                entries = [e for e in doc["archives"][0]["entries"] if e["path"].endswith(".distcp")]
                self.assertEqual(len(entries), distcp)
                for e in entries:
                    if name == "zstd":
                        self.assertEqual((e["format"], e["tensors"]), ("other", []), e["path"])
                    else:
                        self.assertEqual(e["format"], "dcp-data", e["path"])
                        self.assertTrue(e["tensors"], e["path"])
                        for t in e["tensors"]:  # inside the file, named by fqn
                            self.assertLessEqual(t["end"], e["bytes"])
                            self.assertTrue(t["name"], e["path"])
                run("verify", folder + ".ckz", "--trust", "ckpt_enums")  # the fixtures' own dataclass

    def test_not_a_checkpoint_and_incompressible_bytes(self):
        p = self.path("random.bin")
        with open(p, "wb") as f:
            f.write(os.urandom(3 << 20) + b"\0" * 1000)
        size = self.roundtrip(p)
        self.assertLess(size, os.path.getsize(p) + 4096, "never much bigger than the input")
        e = self.path("empty")
        open(e, "wb").close()
        self.roundtrip(e)

    def test_repeated_rows_fall_back_to_plain_zstd(self):
        # Data with LZ structure the planes cannot see: each chunk falls back to plain zstd,
        # so the archive is no bigger than zstd -3 of each 1 MiB piece on its own (chunks are
        # independent: repeats further apart than a chunk are not found; whole-file zstd
        # does find them).
        row = weights(4096, 3)
        p = self.path("tiled.pt")
        torch.save({"w": row.repeat(256, 1)}, p)
        ours = self.roundtrip(p)
        data = read_bytes(p)
        z = zstandard.ZstdCompressor(level=3)
        pieces = sum(len(z.compress(data[i:i + (1 << 20)])) for i in range(0, len(data), 1 << 20))
        self.assertLessEqual(ours, pieces + 1024)
        doc = json.loads(run("inspect", "--json", p + ".ckz").stdout)
        self.assertGreater(doc["archives"][0]["plain_zstd_chunks"], 0)

    def test_folder_keeps_paths_modes_mtimes_and_symlinks(self):
        root = self.path("checkpoint-500")
        os.makedirs(os.path.join(root, "sub", "deeper"))
        os.makedirs(os.path.join(root, "empty_dir"))
        torch.save(state_dict(1 << 18, torch.bfloat16), os.path.join(root, "pytorch_model.bin"))
        write_safetensors(os.path.join(root, "model.safetensors"), {"w": weights(100000)})
        with open(os.path.join(root, "config.json"), "w") as f:
            json.dump({"hidden_size": 256, "layers": 8}, f)
        with open(os.path.join(root, "tokenizer.json"), "w") as f:
            json.dump({"vocab": {f"tok{i}": i for i in range(5000)}}, f)
        with open(os.path.join(root, "sub", "deeper", "notes.txt"), "w") as f:
            f.write("hello\n")
        open(os.path.join(root, "sub", "empty"), "w").close()
        run_sh = os.path.join(root, "run.sh")
        with open(run_sh, "w") as f:
            f.write("#!/bin/sh\necho hi\n")
        os.chmod(run_sh, 0o755)
        os.chmod(os.path.join(root, "config.json"), 0o600)
        os.symlink("pytorch_model.bin", os.path.join(root, "latest"))
        os.symlink("../outside", os.path.join(root, "sub", "dangling"))
        os.chmod(os.path.join(root, "sub"), 0o750)
        for i, (dirpath, dirnames, filenames) in enumerate(sorted(os.walk(root), reverse=True)):
            for name in filenames + dirnames:
                os.utime(os.path.join(dirpath, name), ns=(1, 1_600_000_000_123_456_789 + i), follow_symlinks=False)
        os.utime(root, ns=(1, 1_500_000_000_000_000_001))
        before = tree(root)

        run("compress", "-q", root + "/")
        archive = root + ".ckz"
        restored = self.path("restored")
        run("decompress", "-q", archive, "-o", restored)
        self.assertEqual(tree(restored), before)
        run("verify", archive)
        text = run("inspect", archive).stdout
        self.assertIn("pytorch_model.bin", text)
        self.assertIn("bf16 exponent", text)

        # Default name: DIR.ckz -> DIR, refused while DIR exists, replaced with -f.
        p = run("decompress", archive, expect=1)
        self.assertIn("exists; --force replaces it", p.stderr)
        with open(os.path.join(root, "config.json"), "w") as f:
            f.write("changed")
        run("decompress", "-q", "-f", archive)
        self.assertEqual(tree(root), before)
        self.assertEqual([n for n in os.listdir(self.tmp) if "ckptool-tmp" in n], [])

    def test_set_id_bits_are_not_restored(self):
        root = self.path("tools")
        os.makedirs(root)
        prog = os.path.join(root, "prog")
        with open(prog, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(prog, 0o6755)
        run("compress", "-q", root)
        doc = json.loads(run("inspect", "--json", root + ".ckz").stdout)
        self.assertEqual([e["mode"] for e in doc["archives"][0]["entries"] if e["path"] == "prog"], ["6755"])
        run("decompress", "-q", root + ".ckz", "-o", self.path("out"))
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(self.path("out"), "prog")).st_mode), 0o755)

    def test_rm_removes_the_original_only_after_success(self):
        p = self.path("model.pt")
        torch.save(state_dict(1 << 16, torch.float32), p)
        digest = sha256(p)
        out = run("compress", "--rm", p).stdout
        self.assertIn("original removed", out)
        self.assertFalse(os.path.exists(p))
        run("decompress", "--rm", "-q", p + ".ckz")
        self.assertEqual(sha256(p), digest)
        self.assertFalse(os.path.exists(p + ".ckz"))
        folder = self.path("run")
        os.makedirs(os.path.join(folder, "a"))
        torch.save({"w": weights(1000)}, os.path.join(folder, "a", "w.pt"))
        os.symlink("a/w.pt", os.path.join(folder, "link"))
        run("compress", "-q", "--rm", folder)
        self.assertFalse(os.path.exists(folder))
        run("decompress", "-q", folder + ".ckz")
        self.assertTrue(os.path.islink(os.path.join(folder, "link")))

    def test_refuses_to_overwrite_without_force(self):
        p = self.path("model.pt")
        torch.save(state_dict(1 << 16, torch.float32), p)
        run("compress", "-q", p)
        first = read_bytes(p + ".ckz")
        err = run("compress", p, expect=1).stderr
        self.assertIn("exists; --force replaces it", err)
        self.assertEqual(read_bytes(p + ".ckz"), first)
        run("compress", "-q", "-f", "--level", "max", p)
        self.assertNotEqual(read_bytes(p + ".ckz"), b"")
        err = run("decompress", p + ".ckz", expect=1).stderr
        self.assertIn("exists; --force replaces it", err)
        err = run("compress", p + ".ckz", expect=1).stderr
        self.assertIn("already a .ckz archive", err)

    def test_stdout_streams(self):
        p = self.path("model.pt")
        torch.save(state_dict(1 << 18, torch.bfloat16), p)
        with open(self.path("x.ckz"), "wb") as f:
            subprocess.run([CKPTOOL, "compress", "-q", "-c", p], stdout=f, check=True)
        out = subprocess.run([CKPTOOL, "decompress", "-c", self.path("x.ckz")], capture_output=True, check=True)
        self.assertEqual(out.stdout, read_bytes(p))
        os.makedirs(self.path("d"))
        run("compress", "-q", self.path("d"))
        err = run("decompress", "-c", self.path("d.ckz"), expect=1).stderr
        self.assertIn("-c streams a one-file archive", err)

    def test_command_line_errors(self):
        p = self.path("a.pt")
        torch.save({"w": weights(10)}, p)
        self.assertIn("one input", run("compress", "-o", self.path("x"), p, p, expect=2).stderr)
        self.assertIn("--rm", run("compress", "-c", "--rm", p, expect=2).stderr)
        err = run("compress", self.path("missing"), expect=1).stderr
        self.assertIn("missing", err)
        run("compress", "-q", p, "-o", self.path("renamed"))
        err = run("decompress", self.path("renamed"), expect=1).stderr
        self.assertIn("-o", err)


class RewriteFromArchive(CkptTestCase):
    """`ckptool convert X.ckz` and `ckptool strip X.ckz` work on the checkpoint the archive
    holds (restored bit for bit into a temp folder beside the output, removed afterwards) and
    write what the same command writes from the original; they need an output, and name the
    archive (never the temp folder) in what they print."""

    def leftovers(self, folder):
        return [n for n in os.listdir(folder) if "ckptool-tmp" in n]

    def at(self, *parts):
        return os.path.join(self.tmp, *parts)

    def test_convert_and_strip_of_file_and_folder_archives(self):
        src = self.path("model.pt")
        torch.save({"model": state_dict(1 << 14, torch.float32), "optimizer": {"step": 4097}}, src)
        folder = self.path("checkpoint-500")
        os.makedirs(folder)
        torch.save({"w": weights(4096)}, os.path.join(folder, "pytorch_model.bin"))
        torch.save({"state": {0: {"exp_avg": weights(4096, 3)}}}, os.path.join(folder, "optimizer.pt"))
        run("compress", "-q", src)
        run("compress", "-q", folder)
        for cmd in (["convert", "--dtype", "bf16"], ["strip"]):
            for original in (src, folder):
                name = os.path.basename(original)
                with self.subTest(cmd=cmd[0], input=name):
                    ref, out = self.at(cmd[0], "ref", name), self.at(cmd[0], "out", name)
                    if cmd[0] == "convert" and original == folder:  # a folder: --output-dir
                        run(*cmd, original, "--output-dir", ref)
                        p = run(*cmd, original + ".ckz", "--output-dir", out)
                    else:
                        run(*cmd, original, "-o", ref)
                        p = run(*cmd, original + ".ckz", "-o", out)
                    self.assertIn(name + ".ckz: " + name, p.stdout)
                    self.assertNotIn("ckptool-tmp", p.stdout + p.stderr)
                    if os.path.isdir(ref):
                        self.assertEqual(sorted(os.listdir(out)), sorted(os.listdir(ref)))
                        for n in os.listdir(ref):
                            self.assertEqual(read_bytes(os.path.join(out, n)),
                                             read_bytes(os.path.join(ref, n)), n)
                    else:
                        self.assertEqual(read_bytes(out), read_bytes(ref))
                    self.assertEqual(self.leftovers(os.path.dirname(out)), [])
                    self.assertEqual(self.leftovers(self.path(cmd[0])), [])
        # --output-dir for convert; no output at all is refused, and the archive is untouched
        before = read_bytes(src + ".ckz")
        run("convert", "--dtype", "bf16", src + ".ckz", "--output-dir", self.path("dir"))
        self.assertEqual(read_bytes(self.at("dir", "model.pt")),
                         read_bytes(self.at("convert", "ref", "model.pt")))
        for cmd in (["convert", "--dtype", "bf16"], ["strip"]):
            err = run(*cmd, src + ".ckz", expect=1).stderr
            self.assertIn("an archive is rewritten into a new checkpoint: give -o", err)
        self.assertEqual(read_bytes(src + ".ckz"), before)
        # a damaged archive: one clear error, no output
        bad = bytearray(before)
        bad[len(bad) // 2] ^= 0xFF
        with open(self.path("bad.pt.ckz"), "wb") as f:
            f.write(bad)
        err = run("convert", "--dtype", "bf16", self.path("bad.pt.ckz"), "-o",
                  self.at("badout", "bad.pt"), expect=1).stderr
        self.assertIn("bad.pt.ckz", err)
        self.assertFalse(os.path.exists(self.at("badout", "bad.pt")))
        self.assertEqual(self.leftovers(self.path("badout")), [])


class ExportFromArchive(CkptTestCase):
    """`ckptool export X.ckz` reads the archive in place: the plain bytes of the file being read
    are decoded into memory, tensor bytes from the chunks as they are written; nothing is
    written but the output. The same bytes as an export of the original, for every kind of
    checkpoint export reads; nothing left behind; a damaged chunk anywhere is one clear error
    and no output."""

    def leftovers(self, folder):
        return [n for n in os.listdir(folder) if "ckptool-tmp" in n]

    def assert_same_export(self, original, archive, *args, out_name="out"):
        """Exports `original` and `archive` with the same arguments; the outputs are identical."""
        ref, out = self.path(out_name + "_ref"), self.path(out_name)
        run("export", original, "--to", ref, *args)
        p = run("export", archive, "--to", out, *args)
        names = sorted(os.listdir(ref))
        self.assertEqual(sorted(os.listdir(out)), names)
        self.assertTrue(any(n.endswith(".safetensors") for n in names))
        for n in names:
            self.assertEqual(read_bytes(os.path.join(out, n)), read_bytes(os.path.join(ref, n)), n)
        self.assertEqual(self.leftovers(self.tmp), [])
        return p

    def test_file_archive_exports_like_the_original(self):
        src = self.path("model.pt")
        sd = state_dict(1 << 16, torch.float32)
        torch.save({"model": sd, "optimizer": {"step": 3}}, src)
        run("compress", "-q", src)
        p = self.assert_same_export(src, src + ".ckz", "--dtype", "bf16")
        self.assertIn("from 'model'", p.stdout)
        self.assertIn("Read in place from the archive: 264.00 KiB of tensors decoded", p.stdout)
        self.assertEqual(sorted(os.listdir(self.path("out"))), ["model.safetensors"])
        for j in ("1", "2"):  # chunks split between windows and threads
            self.assert_same_export(src, src + ".ckz", "-j", j, "--max-shard-size", "40KiB",
                                    out_name="shards" + j)

    def test_views_strided_tied_and_small_tensors_export_like_the_original(self):
        src = self.path("views.pt")
        flat = weights(1 << 18, 5)
        sd = {f"experts.{i}": flat[i * 97:(i + 1) * 97] for i in range(2000)}  # small views, shared
        sd["transposed"] = weights(96 * 160, 6).view(96, 160).t()  # strided
        sd["every_other"] = weights(4096, 7).view(64, 64)[:, ::2]  # strided inside a row
        sd["sparse_reach"] = weights(17 << 20, 9)[::1001]  # reaches 68 MiB of its storage
        sd["tied"] = sd["experts.3"]
        sd["bf16"] = weights(3000, 8).to(torch.bfloat16)
        sd["ids"] = torch.arange(1000)
        torch.save(sd, src)
        run("compress", "-q", src)
        self.assert_same_export(src, src + ".ckz")
        self.assert_same_export(src, src + ".ckz", "--dtype", "fp16", "-j", "2", out_name="fp16")

    def test_legacy_file_archive_exports_like_the_original(self):
        src = self.path("legacy.pt")
        torch.save(state_dict(1 << 15, torch.float32), src, _use_new_zipfile_serialization=False)
        run("compress", "-q", src)
        self.assert_same_export(src, src + ".ckz")

    def test_folder_archive_of_shards_exports_like_the_folder(self):
        folder = self.path("checkpoint-500")
        os.makedirs(folder)
        sd = state_dict(1 << 15, torch.float32)
        names = sorted(sd)
        half = len(names) // 2
        torch.save({k: sd[k] for k in names[:half]}, os.path.join(folder, "pytorch_model-00001-of-00002.bin"))
        torch.save({k: sd[k] for k in names[half:]}, os.path.join(folder, "pytorch_model-00002-of-00002.bin"))
        with open(os.path.join(folder, "config.json"), "w") as f:
            f.write("{}")
        run("compress", "-q", folder)
        run("export", folder, "--to", self.path("ref.safetensors"))
        run("export", self.path("checkpoint-500.ckz"), "--to", self.path("out.safetensors"))
        self.assertEqual(read_bytes(self.path("out.safetensors")), read_bytes(self.path("ref.safetensors")))
        self.assertEqual(self.leftovers(self.tmp), [])
        # Into a folder: the config comes along from the archive as it does from the folder.
        self.assert_same_export(folder, self.path("checkpoint-500.ckz"), out_name="as_folder")
        self.assertIn("config.json", os.listdir(self.path("as_folder")))

    def test_zero_and_dcp_folder_archives_export_like_the_folders(self):
        import dcp_fixtures as dcp
        import zero_fixtures as zf
        for stage in (2, 3):
            root = self.path(f"zero{stage}")
            zf.make_zero_checkpoint(root, stage, 3)
            run("compress", "-q", root)
            p = self.assert_same_export(root, root + ".ckz", out_name=f"zero{stage}_out")
            self.assertNotIn("0B of tensors decoded", p.stdout)
        cases = dcp.standard_cases()
        for name in ("fsdp_tp_bf16", "uneven_fp32", "megatron", "zstd", "legacy_shard_113"):
            folder = self.path(name)
            cases[name](folder)
            run("compress", "-q", folder)
            self.assert_same_export(folder, folder + ".ckz", out_name=name + "_out")

    def test_two_archives_with_the_same_name_export_together(self):
        for d in ("a", "b"):
            os.makedirs(self.path(d))
        names = sorted(state_dict(1 << 14, torch.float32))
        sd = state_dict(1 << 14, torch.float32)
        torch.save({k: sd[k] for k in names[:4]}, self.path("a/model.pt"))
        torch.save({k: sd[k] for k in names[4:]}, self.path("b/model.pt"))
        run("compress", "-q", self.path("a/model.pt"), self.path("b/model.pt"))
        run("export", self.path("a/model.pt"), self.path("b/model.pt"), "--to", self.path("ref"))
        run("export", self.path("a/model.pt.ckz"), self.path("b/model.pt.ckz"), "--to", self.path("out"))
        self.assertEqual(read_bytes(self.path("out/model.safetensors")),
                         read_bytes(self.path("ref/model.safetensors")))

    def damaged_export(self, src, where):
        """Flips a byte of the archive at `where` (a fraction of the payload) and exports it."""
        data = bytearray(read_bytes(src + ".ckz"))
        data[16 + int((len(data) - 16) * where)] ^= 0x40
        bad = self.path("bad.pt.ckz")
        with open(bad, "wb") as f:
            f.write(bytes(data))
        p = run("export", bad, "--to", self.path("out"), expect=1)
        self.assertIn("bad.pt.ckz", p.stderr)
        self.assertIn("the archive is damaged", p.stderr)
        self.assertFalse(os.path.exists(self.path("out/model.safetensors")))
        self.assertEqual(self.leftovers(self.tmp), [])
        return p.stderr

    def test_a_damaged_archive_exports_nothing(self):
        src = self.path("model.pt")
        torch.save(state_dict(1 << 20, torch.float32), src)  # 4 MiB: chunks holding only tensors
        run("compress", "-q", src)
        # At the start: the chunk with the pickle and zip headers (read when the file is opened).
        self.assertIn("chunk 0 ", self.damaged_export(src, 0.001))
        # In the middle: a chunk of tensor bytes only, read while the output is written.
        err = self.damaged_export(src, 0.5)
        self.assertNotIn("chunk 0 ", err)
        self.assertIn("'model.layers.", err)


class InspectAndVerifyArchives(CkptTestCase):
    """inspect and verify of a .ckz archive also judge the checkpoints it holds, read in place,
    as they would the restored originals: an archive of a file whose pickle would run code is
    not OK, and the held reports equal the originals' (but for the path)."""

    class Evil:
        def __init__(self, marker):
            self.marker = marker

        def __reduce__(self):
            return (os.system, (f"touch {self.marker}",))

    def test_verify_of_an_archive_judges_the_pickles_inside(self):
        marker = self.path("pwned")
        evil = self.path("evil.pt")
        torch.save({"w": weights(64), "x": self.Evil(marker)}, evil)
        run("compress", "-q", evil)
        r = run("verify", evil + ".ckz", expect=1)
        self.assertIn("evil.pt.ckz: evil.pt: pickle offset", r.stderr + r.stdout)
        self.assertIn("posix.system", r.stderr + r.stdout)
        self.assertNotIn(": OK", r.stdout)
        self.assertFalse(os.path.exists(marker))
        # A good folder archive: the archive and each checkpoint inside.
        folder = self.path("run")
        os.makedirs(folder)
        for i in range(2):
            torch.save(state_dict(1 << 12, torch.float32, seed=i), os.path.join(folder, f"{i}.pt"))
        run("compress", "-q", folder)
        r = run("verify", folder + ".ckz")
        self.assertIn("2 checkpoints inside verified as restored", r.stdout)
        self.assertEqual([n for n in os.listdir(self.tmp) if "ckptool-tmp" in n], [])

    def test_reading_an_archive_in_place_writes_nothing_and_stays_inside_it(self):
        """verify and inspect of a folder archive write nothing at all (the plain bytes are
        decoded into memory), nor does export but its output; a link in the archive is followed
        only inside it."""
        folder = self.path("hf")
        os.makedirs(folder)
        torch.save(state_dict(1 << 12, torch.float32), os.path.join(folder, "pytorch_model.bin"))
        with open(os.path.join(folder, "config.json"), "w") as f:
            f.write('{"model_type": "x"}')
        os.chmod(os.path.join(folder, "config.json"), 0o640)
        secret = self.path("secret.json")
        with open(secret, "w") as f:
            f.write("not the archive's")
        os.symlink(secret, os.path.join(folder, "tokenizer.json"))  # absolute: leaves the archive
        os.symlink("config.json", os.path.join(folder, "generation_config.json"))  # inside
        run("compress", "-q", folder)
        # verify and inspect create no file or folder anywhere (traced: a temp folder made and
        # removed during the run would leave no other trace).
        trace = self.path("trace")
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")  # LeakSanitizer cannot run under ptrace
        for args in (["verify", folder + ".ckz"], ["inspect", folder + ".ckz"]):
            p = subprocess.run(["strace", "-f", "-qq", "-o", trace, "-e",
                                "trace=open,openat,creat,mkdir,mkdirat,symlink,symlinkat,rename,"
                                "renameat,renameat2", CKPTOOL, *args],
                               capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(trace) as f:
                calls = f.read().splitlines()
            self.assertTrue(any(self.tmp in c for c in calls), "strace saw no call")  # it traced
            writes = [c for c in calls if "O_CREAT" in c or "O_WRONLY" in c or "O_RDWR" in c or
                      "mkdir" in c or "symlink" in c or "rename" in c]
            self.assertEqual(writes, [], args)
        run("export", folder + ".ckz", "--to", self.path("out"))
        self.assertEqual(sorted(os.listdir(self.path("out"))),
                         ["config.json", "generation_config.json", "model.safetensors"])
        with open(self.path("out/generation_config.json")) as f:
            self.assertEqual(f.read(), '{"model_type": "x"}')
        self.assertEqual(stat.S_IMODE(os.stat(self.path("out/config.json")).st_mode), 0o640)
        self.assertEqual(sorted(n for n in os.listdir(self.tmp) if "ckptool-tmp" in n), [])

    def test_verify_of_a_zero_folder_archive_checks_the_partitions(self):
        import zero_fixtures as zf
        root = self.path("zero2")
        zf.make_zero_checkpoint(root, 2, 2)
        run("compress", "-q", root)
        r = run("verify", root + ".ckz")
        self.assertIn("the ZeRO partitions add up", r.stdout)
        # Without rank 1's optimizer file the partitions no longer add up: not OK.
        optim = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                 if f.endswith("optim_states.pt")]
        os.remove(sorted(optim)[-1])
        # Refused as it is (the archive would vouch for a broken checkpoint)...
        r = run("compress", "-q", "-f", root, expect=1)
        self.assertIn("partition_count says 2 ranks", r.stderr)
        self.assertIn("refusing a damaged input", r.stderr)
        # ...archived on request, the damage kept where verify sees it.
        run("compress", "-q", "-f", "--allow-damaged", root)
        r = run("verify", root + ".ckz", expect=1)
        self.assertIn("zero2.ckz: zero2", r.stdout + r.stderr)
        self.assertNotIn("ckptool-tmp", r.stdout + r.stderr)

    def test_inspect_of_an_archive_reports_what_it_holds(self):
        src = self.path("model.pt")
        torch.save({"model": state_dict(1 << 14, torch.float32), "step": 7}, src)
        ref = json.loads(run("inspect", "--json", src).stdout)["files"][0]
        run("compress", "-q", src)
        doc = json.loads(run("inspect", "--json", src + ".ckz").stdout)
        held = doc["archives"][0]["checkpoints"]
        self.assertEqual(len(held), 1)
        self.assertEqual(held[0]["path"], src + ".ckz: model.pt")
        self.assertEqual({k: v for k, v in held[0].items() if k != "path"},
                         {k: v for k, v in ref.items() if k != "path"})
        text = run("inspect", src + ".ckz").stdout
        self.assertIn("model.pt.ckz: model.pt", text)
        self.assertIn("BY TOP-LEVEL KEY", text)


class ChangedWhileCompressing(CkptTestCase):
    """Another process changes an input while compress reads it: no archive is written."""

    def run_and_change(self, args, folder, change):
        """Freezes ckptool (SIGSTOP) once its temp file appears, calls change(), lets it go on."""
        p = subprocess.Popen([CKPTOOL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while not [n for n in os.listdir(folder) if "ckptool-tmp" in n]:
                self.assertIsNone(p.poll(), "finished before its temp file was seen")
                self.assertLess(time.monotonic(), deadline)
            p.send_signal(signal.SIGSTOP)
            change()
        finally:
            p.send_signal(signal.SIGCONT)
        out, err = p.communicate(timeout=300)
        return subprocess.CompletedProcess(args, p.returncode, out, err)

    def test_file_and_folder_member_touched_mid_run(self):
        folder = self.path("ckpt")
        os.makedirs(folder)
        model = os.path.join(folder, "model.pt")
        torch.save(state_dict(16 << 20, torch.float32), model)
        for i, (target, archive) in enumerate(((model, model + ".ckz"), (folder, folder + ".ckz"))):
            with self.subTest(target=target):
                stamp = time.time_ns() - (i + 1) * 10 ** 9  # a modification time it never had
                r = self.run_and_change(["compress", "-j1", target], os.path.dirname(archive),
                                        lambda: os.utime(model, ns=(stamp, stamp)))
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                lines = r.stderr.splitlines()
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertIn(f"{model}: the file changed while it was being compressed", lines[0])
                self.assertFalse(os.path.exists(archive))
                self.assertEqual([n for n in os.listdir(os.path.dirname(archive)) if "ckptool-tmp" in n], [])


class DamagedArchives(CkptTestCase):
    def setUp(self):
        super().setUp()
        self.src = self.path("model.pt")
        torch.save(state_dict(1 << 19, torch.bfloat16), self.src)
        run("compress", "-q", self.src)
        self.archive = self.src + ".ckz"
        self.good = read_bytes(self.archive)
        self.original = read_bytes(self.src)

    def damaged(self, data):
        bad = self.path("bad.ckz")
        with open(bad, "wb") as f:
            f.write(data)
        return bad

    def assert_refused(self, bad, *expect_in_error):
        out = self.path("bad")
        p = run("decompress", bad, expect=1)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertTrue(lines[0].startswith("ckptool: error: "), lines[0])
        self.assertIn("bad.ckz", lines[0])
        for s in expect_in_error:
            self.assertIn(s, lines[0])
        self.assertFalse(os.path.exists(out), "no output after a failure")
        self.assertEqual([n for n in os.listdir(self.tmp) if "ckptool-tmp" in n], [])
        v = run("verify", bad, expect=1)
        self.assertIn("bad.ckz", v.stdout)
        return lines[0]

    def test_flipped_byte_in_tensor_data_names_the_file_and_tensor(self):
        data = bytearray(self.good)
        data[len(data) // 2] ^= 0x40
        err = self.assert_refused(self.damaged(bytes(data)), "model.pt: chunk", "tensor")
        self.assertIn("damaged", err)
        v = run("verify", self.path("bad.ckz"), expect=1).stdout
        self.assertIn("model.layers.", v)

    def test_truncations_and_flips_in_every_region_are_refused(self):
        n = len(self.good)
        rng = random.Random(5)
        cuts = sorted({0, 1, 8, 15, 16, 17, n // 3, n // 2, n - 41, n - 40, n - 39, n - 1} |
                      {rng.randrange(n) for _ in range(10)})
        for cut in cuts:
            with self.subTest(cut=cut):
                self.assert_refused(self.damaged(self.good[:cut]))
        # Header, first chunk header, payload, index, trailer.
        for pos in (0, 9, 20, 30, n // 4, n - 200, n - 45, n - 20, n - 3):
            with self.subTest(flip=pos):
                data = bytearray(self.good)
                data[pos] ^= 0x01
                bad = self.damaged(bytes(data))
                p = run("decompress", "-f", bad, "-o", self.path("out"), expect=None)
                if p.returncode == 0:
                    self.assertEqual(read_bytes(self.path("out")), self.original, f"flip at {pos}")
                else:
                    self.assertFalse(os.path.exists(self.path("out")) and
                                     read_bytes(self.path("out")) != self.original)

    def test_a_different_file_named_ckz(self):
        err = self.assert_refused(self.damaged(b"PK\x03\x04 not an archive at all" * 10))
        self.assertIn("not a ckptool archive", err)

    def test_stream_stops_at_the_first_bad_chunk(self):
        data = bytearray(self.good)
        data[len(data) - 3000] ^= 0x10
        bad = self.damaged(bytes(data))
        p = subprocess.run([CKPTOOL, "decompress", "-c", bad], capture_output=True)
        self.assertEqual(p.returncode, 1)
        self.assertTrue(self.original.startswith(p.stdout), "only checked bytes are written")
        self.assertLess(len(p.stdout), len(self.original))


if __name__ == "__main__":
    unittest.main()
