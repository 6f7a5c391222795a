"""`ckptool verify` catches what torch.load does not, and hostile files are described,
flagged and never executed."""
import os
import struct
import zipfile

import torch

from ckpt_testlib import CkptTestCase, inspect, run


class Evil:
    """Unpickling this runs a shell command: the classic malicious checkpoint."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class EvalEvil:
    def __reduce__(self):
        return (eval, ("__import__('os').system('true')",))


class VerifyTest(CkptTestCase):
    def save_model(self, name="model.pt", **kwargs):
        p = self.path(name)
        torch.manual_seed(0)
        torch.save({"w": torch.randn(64, 64), "b": torch.randn(64)}, p, **kwargs)
        return p

    def test_clean_files_pass(self):
        for name, kwargs in [("zip.pt", {}), ("legacy.pt", {"_use_new_zipfile_serialization": False})]:
            p = self.save_model(name, **kwargs)
            out = run("verify", p).stdout
            self.assertIn("OK", out)

    def test_flipped_data_byte_is_caught_although_torch_loads_it(self):
        p = self.save_model()
        with zipfile.ZipFile(p) as z:
            info = z.getinfo("model/data/0")
        with open(p, "r+b") as f:
            f.seek(info.header_offset + 26)
            name_len, extra_len = struct.unpack("<HH", f.read(4))
            data = info.header_offset + 30 + name_len + extra_len
            f.seek(data + 100)
            byte = f.read(1)
            f.seek(data + 100)
            f.write(bytes([byte[0] ^ 0x01]))
        torch.load(p)  # torch 1.13 does not notice: this is why verify exists
        r = run("verify", p, expect=1)
        self.assertIn("model/data/0: CRC32 mismatch", r.stdout)
        self.assertTrue(r.stdout.startswith(p + ": "), r.stdout)

    def test_truncated_file_is_a_clear_error(self):
        p = self.save_model()
        size = os.path.getsize(p)
        for cut in (10, size // 2, size - 30):
            with open(p, "rb") as f:
                data = f.read()
            q = self.path(f"cut{cut}.pt")
            with open(q, "wb") as f:
                f.write(data[:cut])
            r = run("verify", q, expect=1)
            self.assertIn(q, r.stdout)
            self.assertNotIn("internal error", r.stdout + r.stderr)
            r = run("inspect", q, expect=1)
            self.assertIn("ckptool: error: " + q, r.stderr)

    def test_missing_file_and_non_checkpoint(self):
        r = run("inspect", self.path("nope.pt"), expect=1)
        self.assertIn("cannot open", r.stderr)
        p = self.path("notes.txt")
        with open(p, "w") as f:
            f.write("hello")
        r = run("verify", p, expect=1)
        self.assertIn("not a checkpoint", r.stdout)

    def test_hostile_pickle_is_flagged_and_never_run(self):
        marker = self.path("pwned")
        p = self.path("evil.pt")
        torch.save({"w": torch.ones(3), "payload": Evil(f"touch {marker}"), "e": EvalEvil()}, p)
        report = inspect(p)
        self.assertIn("posix.system", report["unsafe_globals"])
        # Protocol 2 spells builtins the Python 2 way; reports use the Python 3 name, as
        # torch's own weights_only errors do, and JSON keeps the spelling of the file.
        self.assertIn("builtins.eval", report["unsafe_globals"])
        detail = {g["name"]: g for g in report["globals_detail"]}
        self.assertEqual(detail["builtins.eval"]["raw"], "__builtin__.eval")
        self.assertEqual(detail["builtins.eval"]["class"], "unsafe")
        self.assertEqual([t["name"] for t in report["tensors"]], ["w"])
        r = run("verify", p, expect=1)
        self.assertIn("posix.system", r.stdout)
        self.assertIn("can run code", r.stdout)
        human = run("inspect", p).stdout
        self.assertIn("UNSAFE", human)
        self.assertFalse(os.path.exists(marker), "ckptool must never execute pickle code")
        # Sanity: the file really is malicious for an unsafe loader.
        torch.load(p)
        self.assertTrue(os.path.exists(marker))

    def test_bad_safetensors_offsets(self):
        header = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' \
                 b'"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}'
        p = self.path("hole.safetensors")
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + bytes(16))
        r = run("verify", p, expect=1)
        self.assertIn("tensor 'b' starts at 12 but the previous tensor ends at 8 (hole)", r.stdout)


if __name__ == "__main__":
    import unittest
    unittest.main()
