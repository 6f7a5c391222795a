"""Nothing laundered: a torch zip whose tensor record fails its CRC32 (torch.load does not check
it: FORMATS.md section 1) is refused by every command that would write from its bytes (shrink
in place and to a new file, convert, strip, export), with a message naming the file and the
record; the input stays byte-identical and no output appears. Before, shrink rewrote it with
fresh checksums and the damage stopped showing."""
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

    def test_an_intact_file_is_rewritten(self):
        src = self.path("intact.pt")
        torch.save({"w": torch.arange(1000.0)[:10]}, src)
        run("shrink", src)
        self.assertTrue(torch.equal(torch.load(src)["w"], torch.arange(10.0)))
        run("verify", src)


if __name__ == "__main__":
    import unittest
    unittest.main()
