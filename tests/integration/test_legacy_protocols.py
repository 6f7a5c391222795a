"""Legacy (non-zip) checkpoints written with every pickle protocol torch.save accepts:
`torch.save(obj, f, _use_new_zipfile_serialization=False, pickle_protocol=N)` for N in 1..5.

N goes to all four pickles of the legacy stream (magic number, protocol version, sys_info,
the object; FORMATS.md section 3), so the magic number is a text LONG for N=1, LONG1 after
PROTO 2/3, and sits in a FRAME after PROTO 4/5; the object pickle uses protocol 4's
STACK_GLOBAL/MEMOIZE/SHORT_BINUNICODE for N >= 4 and copyreg._reconstructor for plain objects
at N=1. Every command reads them all; rewrites come out in the zip format and load equal to
the original, enum members included (`getattr` reads, as Python >= 3.11 writes them). The
object holds a dataclass and a plain object of the test's own module, rebuilt without a call
(their __setstate__ would run), and members of its own Enums (read by getattr, which runs the
class's code): findings unless the module is trusted, so the commands are given --trust
ckpt_enums."""
import os
import shutil

import torch

from ckpt_testlib import CkptTestCase, assert_torch_layout, inspect, read_bytes, read_safetensors, run
from py311_fixtures import (Color, Mode, Perm, PlainState, RunConfig, assert_member, assert_same,
                            enum_members, enum_read_names)

PROTOCOLS = (1, 2, 3, 4, 5)
TRUST = ("--trust", "ckpt_enums")
MAGIC_LONG1 = b"\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")


def legacy_object(seed=0):
    """A training checkpoint: weights (one a view into a bigger storage, one fp16), optimizer
    state with an enum in it, enum members at the top level, in a dataclass and in a plain
    object, and a combined Flag."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    osd = opt.state_dict()
    osd["param_groups"][0]["phase"] = Mode.TRAIN
    flat = torch.randn(2048)
    return {
        "model": model.state_dict(),
        "extra": {"window": flat[256:512], "half": torch.randn(64).half(), "steps": torch.arange(10)},
        "optimizer": osd,
        "color": Color.BLUE,
        "perm": Perm.R | Perm.W,
        "config": RunConfig(mode=Mode.EVAL),
        "state": PlainState(color=Color.RED, step=3),
        "epoch": 4,
    }


def save_legacy(path, obj, protocol):
    torch.save(obj, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)


class LegacyProtocolsTest(CkptTestCase):
    def test_magic_number_encodings(self):
        """What torch 1.13 writes, which every reader of the legacy format has to recognise."""
        for n in PROTOCOLS:
            with self.subTest(protocol=n):
                p = self.path(f"p{n}.pt")
                save_legacy(p, {"w": torch.ones(2)}, n)
                head = read_bytes(p)[:40]
                if n == 1:
                    self.assertTrue(head.startswith(b"L119547037146038801333356L\n."), head)
                elif n <= 3:
                    self.assertTrue(head.startswith(b"\x80" + bytes([n]) + MAGIC_LONG1 + b"."), head)
                else:
                    self.assertTrue(head.startswith(b"\x80" + bytes([n]) + b"\x95"), head)
                    self.assertEqual(head[11:23], MAGIC_LONG1)

    def test_every_command_reads_every_protocol(self):
        obj = legacy_object()
        reads = enum_read_names(obj)
        for n in PROTOCOLS:
            with self.subTest(protocol=n):
                src = self.path(f"legacy{n}.pt")
                save_legacy(src, obj, n)
                original = read_bytes(src)
                loaded = torch.load(src)

                untrusted = inspect(src)
                whats = [c["what"].split(" without")[0] for c in untrusted["unsafe_calls"]]
                self.assertEqual(sorted(w for w in whats if not w.startswith("reads ")),
                                 ["makes ckpt_enums.PlainState", "makes ckpt_enums.RunConfig"])
                self.assertTrue(all(w.startswith("reads ckpt_enums.") for w in whats
                                    if w.startswith("reads ")), whats)
                self.assertIn("--trust ckpt_enums", run("verify", src, expect=1).stdout)
                report = inspect(src, *TRUST)
                self.assertEqual(report["format"], "torch-legacy")
                if n >= 2:
                    self.assertEqual(report["pickle_protocol"], n)
                self.assertReportMatchesTorch(report, loaded)
                self.assertGreater(report["wasted_bytes"], 0)
                self.assertEqual(report["unsafe_globals"], [], report["globals"])
                self.assertEqual(report["unsafe_calls"], [])
                for read in reads:
                    self.assertIn(read, report["globals"])
                for name in report["globals"]:
                    self.assertFalse(name.startswith("__builtin__."), name)
                    self.assertNotEqual(name, "builtins.getattr")
                self.assertIn("ckpt_enums.Color.BLUE (getattr)", run("inspect", src, *TRUST).stdout)

                out = run("verify", src, *TRUST).stdout
                self.assertIn(": OK", out)
                note = [l for l in out.splitlines() if "weights_only=True" in l]
                self.assertEqual(len(note), 1, out)
                self.assertIn("ckpt_enums.Color", note[0])

                p = self.path(f"shrunk{n}.pt")
                shutil.copy(src, p)
                run("shrink", p, *TRUST)
                after = inspect(p, *TRUST)
                self.assertEqual(after["format"], "torch-zip")
                self.assertEqual(after["wasted_bytes"], 0)
                assert_torch_layout(self, p)
                self.check_loads(p, obj)

                p = self.path(f"stripped{n}.pt")
                run("strip", src, "-o", p, *TRUST)
                self.assertEqual(inspect(p)["format"], "torch-zip")
                self.check_loads(p, {k: v for k, v in obj.items() if k != "optimizer"})

                p = self.path(f"bf16_{n}.pt")
                run("convert", "--dtype", "bf16", "-o", p, src, *TRUST)
                self.assertEqual(inspect(p)["format"], "torch-zip")

                def as_bf16(path, want, got):
                    # convert's default: the model's weights; the rest stays as it is
                    model = path.startswith("<root>.model.")
                    dtype = torch.bfloat16 if want.dtype == torch.float32 and model else want.dtype
                    self.assertEqual(got.dtype, dtype, path)
                    self.assertTrue(torch.equal(got, want.to(dtype)), path)
                self.check_loads(p, obj, tensor_check=as_bf16)

                out = self.path(f"export{n}")
                run("export", src, "--to", out)
                _, tensors = read_safetensors(self, os.path.join(out, "model.safetensors"))
                self.assertEqual(sorted(tensors), sorted(obj["model"]))
                for name, t in obj["model"].items():
                    self.assertEqual(tensors[name][1].tobytes(), t.numpy().tobytes(), name)

                self.assertEqual(read_bytes(src), original, "rewrites with -o / --to leave the source alone")

    def test_unsafe_payloads_are_flagged_in_every_protocol(self):
        marker = self.path("pwned")

        class Evil:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        class ReadsADunder:
            def __reduce__(self):  # getattr(posix.system, '__call__'): an attribute read, of a dunder
                return (getattr, (os.system, "__call__"))

        for n in PROTOCOLS:
            for name, payload in (("os.system call", Evil()), ("getattr dunder", ReadsADunder())):
                with self.subTest(protocol=n, payload=name):
                    p = self.path("evil.pt")
                    obj = {"w": torch.randn(512)[:16], "color": Color.RED, "payload": payload}
                    save_legacy(p, obj, n)
                    original = read_bytes(p)
                    report = inspect(p)
                    self.assertIn("posix.system", report["unsafe_globals"])
                    self.assertIn("can run code", run("verify", p, expect=1).stdout)
                    for args in (["shrink", p], ["strip", p],
                                 ["convert", "--dtype", "bf16", "-o", self.path("c.pt"), p]):
                        r = run(*args, expect=1)
                        self.assertIn("--allow-unsafe-globals", r.stderr)
                        self.assertEqual(read_bytes(p), original, args)
                    self.assertFalse(os.path.exists(self.path("c.pt")))
                    self.assertFalse(os.path.exists(marker))

    def check_loads(self, path, expected, tensor_check=None):
        got = torch.load(path)
        assert_same(self, expected, got, tensor_check=tensor_check)
        want = enum_members(expected)
        got_members = enum_members(got)
        self.assertEqual(sorted(got_members), sorted(want))
        for k, member in want.items():
            assert_member(self, member, got_members[k], k)


if __name__ == "__main__":
    import unittest
    unittest.main()
