"""Hostile pickles inside real torch checkpoints: ckptool never runs them, always flags them
(inspect and verify), and never rewrites them (shrink, strip, convert) unless told to with
--allow-unsafe-globals, after which they are still flagged. Each payload is checked to be
real: the same file, given to torch.load, does run it."""
import io
import os
import struct
import subprocess
import time
import zipfile

import torch

from ckpt_testlib import CKPTOOL, CkptTestCase, inspect, read_bytes, run


def X(text):
    """BINUNICODE"""
    b = text.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def U(text):
    """SHORT_BINUNICODE (a protocol 4 opcode; unpicklers accept it whatever PROTO says)"""
    b = text.encode()
    return b"\x8c" + bytes([len(b)]) + b


def payloads(marker):
    """name -> (pickle protocol, opcodes that build one value and run code when unpickled)."""
    cmd = f"touch {marker}"
    code = f"import os; os.system('touch {marker}')"
    inner = b"\x80\x02cposix\nsystem\n(" + X(cmd) + b"tR."  # a pickle inside the pickle
    memo = struct.pack("<I", 100000)  # far from the memo slots torch.save used
    return {
        "GLOBAL posix.system": (2, b"cposix\nsystem\n(" + X(cmd) + b"tR"),
        "STACK_GLOBAL os.system": (2, U("os") + U("system") + b"\x93(" + X(cmd) + b"tR"),
        "__builtin__.exec": (2, b"c__builtin__\nexec\n(" + X(code) + b"tR"),
        "builtins.eval": (2, b"cbuiltins\neval\n(" + X(f"__import__('os').system('{cmd}')") + b"tR"),
        "subprocess.check_call": (2, b"csubprocess\ncheck_call\n((" + X("touch") + X(str(marker)) + b"ltR"),
        "importlib + getattr": (2, b"cbuiltins\ngetattr\n(cimportlib\nimport_module\n(" + X("os") + b"tR"
                                + X("system") + b"tR(" + X(cmd) + b"tR"),
        # exec is never imported by name: it is fetched from builtins' namespace.
        "operator.getitem chain": (2, b"c_operator\ngetitem\n(cbuiltins\n__dict__\n" + X("exec") + b"tR("
                                   + X(code) + b"tR"),
        # Protocol 4 walks dotted names attribute by attribute: torch -> serialization -> os -> system.
        "dotted attribute path": (4, U("torch") + U("serialization.os.system") + b"\x93(" + X(cmd) + b"tR"),
        # The memo slot first holds a harmless module name, then "posix": scanners that
        # remember the first value see builtins.system.
        "memo slot reused": (2, U("builtins") + b"r" + memo + b"0" + U("posix") + b"r" + memo + b"0"
                             + b"j" + memo + U("system") + b"\x93(" + X(cmd) + b"tR"),
        # BUILD turns a harmless partial(print) into partial(os.system, cmd), then calls it.
        "BUILD into functools.partial": (2, b"cfunctools\npartial\n(cbuiltins\nprint\ntR(cposix\nsystem\n("
                                         + X(cmd) + b"t}Ntb)R"),
        "cPickle.loads nested pickle": (2, b"ccPickle\nloads\n(c_codecs\nencode\n(" + X(inner.decode("latin1"))
                                        + X("latin1") + b"tRtR"),
    }


def training_checkpoint():
    """Something every rewriting command has work on: a view into a bigger storage (shrink),
    optimizer state (strip), float32 weights (convert)."""
    torch.manual_seed(0)
    flat = torch.randn(4096)
    return {"w": flat[:1024], "optimizer": {"exp_avg": torch.zeros(64)}}


def with_payload(path, protocol, value):
    """torch.save of training_checkpoint() with one more top-level entry, "payload", whose
    pickle opcodes are `value`. The zip is rewritten with the new data.pkl."""
    buf = io.BytesIO()
    torch.save(training_checkpoint(), buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        records = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    pkl_name, pkl = records[0]
    assert pkl_name.endswith("/data.pkl") and pkl.startswith(b"\x80\x02") and pkl.endswith(b"u.")
    hostile = b"\x80" + bytes([protocol]) + pkl[2:-2] + X("payload") + value + b"u."
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in [(pkl_name, hostile)] + records[1:]:
            z.writestr(name, data)


class HostilePickleTest(CkptTestCase):
    def check_never_run_and_never_rewritten(self, p, marker):
        original = read_bytes(p)
        report = inspect(p)
        flagged = report["unsafe_globals"] + [c["what"] for c in report["unsafe_calls"]]
        self.assertTrue(flagged, report["globals"])
        self.assertIn("UNSAFE", run("inspect", p).stdout)
        r = run("verify", p, expect=1)
        self.assertIn("which can run code or reach the system when unpickled", r.stdout)
        out = self.path("converted.pt")
        for args in (["shrink", p], ["strip", p], ["convert", "--dtype", "bf16", "-o", out, p]):
            r = run(*args, expect=1)
            self.assertIn("which can run code when loaded; not rewriting it (--allow-unsafe-globals overrides)",
                          r.stderr, args)
            self.assertEqual(read_bytes(p), original, args)
            self.assertFalse(os.path.exists(out))
        r = run("export", p, "--to", self.path("m.safetensors"), "--force")
        self.assertIn("never run; left behind by export", r.stderr)
        self.assertFalse(os.path.exists(marker), "ckptool ran pickle code")
        # Told to rewrite it anyway, it does, and the result is flagged exactly as before.
        run("shrink", "--allow-unsafe-globals", p)
        after = inspect(p)
        self.assertEqual(after["wasted_bytes"], 0)
        self.assertEqual(after["unsafe_globals"], report["unsafe_globals"])
        self.assertEqual([c["what"] for c in after["unsafe_calls"]], [c["what"] for c in report["unsafe_calls"]])
        self.assertFalse(os.path.exists(marker), "ckptool ran pickle code")
        return report

    def test_every_payload(self):
        marker = self.path("pwned")
        for name, (protocol, value) in payloads(marker).items():
            with self.subTest(payload=name):
                p = self.path("evil.pt")
                with_payload(p, protocol, value)
                report = self.check_never_run_and_never_rewritten(p, marker)
                print(f"\n{name}: unsafe_globals={report['unsafe_globals']} "
                      f"unsafe_calls={[c['what'] for c in report['unsafe_calls']]}", end="")
                # The payload is real: torch.load (without weights_only) runs it.
                subprocess.run(["/usr/bin/python3", "-c", f"import torch; torch.load({p!r})"],
                               capture_output=True, timeout=120)
                self.assertTrue(os.path.exists(marker), f"{name}: the payload did not run under torch.load")
                os.remove(marker)

    def test_a_payload_in_a_later_zero_rank_file_is_flagged_by_export(self):
        # ZeRO-3 model states files after the first are read one at a time and their parsed
        # pickles dropped: what they hide is still found and named.
        import zero_fixtures as zf
        root = self.path("zero")
        zf.make_zero_checkpoint(root, 3, 3, device="cpu")
        victim = os.path.join(root, "global_step14", "zero_pp_rank_1_mp_rank_00_model_states.pt")
        marker = self.path("ran")
        with zipfile.ZipFile(victim) as z:
            records = [(i.filename, z.read(i.filename)) for i in z.infolist()]
        pkl_name, pkl = records[0]
        self.assertTrue(pkl_name.endswith("/data.pkl") and pkl.endswith(b"u."), pkl_name)
        protocol, value = payloads(marker)["GLOBAL posix.system"]
        with zipfile.ZipFile(victim, "w", zipfile.ZIP_STORED) as z:
            for name, data in [(pkl_name, pkl[:-2] + X("payload") + value + b"u.")] + records[1:]:
                z.writestr(name, data)
        r = run("export", root, "--to", self.path("hf") + "/")
        warned = [l for l in r.stderr.splitlines() if "never run; left behind by export" in l]
        self.assertTrue(any(os.path.basename(victim) in l and "posix.system" in l for l in warned),
                        r.stderr)
        self.assertFalse(os.path.exists(marker), "ckptool ran pickle code")

    def test_legacy_format_payload(self):
        marker = self.path("pwned")

        class Evil:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        p = self.path("legacy.pt")
        obj = training_checkpoint()
        obj["payload"] = Evil()
        torch.save(obj, p, _use_new_zipfile_serialization=False)
        report = self.check_never_run_and_never_rewritten(p, marker)
        self.assertIn("posix.system", report["unsafe_globals"])
        self.assertEqual(inspect(p)["format"], "torch-zip")  # rewritten as zip, still flagged

    def test_monkey_patching_an_imported_module_is_refused(self):
        # BUILD with slot state on the module torch._utils: setattr(torch._utils, name, value).
        p = self.path("patch.pt")
        with_payload(p, 2, b"ctorch\n_utils\n(N}" + X("_ckpt_test_patched") + b"cposix\nsystem\nstb")
        original = read_bytes(p)
        for command in ("inspect", "shrink", "strip"):
            r = run(command, p, expect=1)
            self.assertIn("BUILD on the imported object torch._utils: a regular unpickler would modify it in "
                          "place (monkey-patching); refused", r.stderr)
        r = run("verify", p, expect=1)
        self.assertIn("monkey-patching", r.stdout)
        self.assertEqual(read_bytes(p), original)
        probe = f"import torch; torch.load({p!r}); print(torch._utils._ckpt_test_patched.__name__)"
        r = subprocess.run(["/usr/bin/python3", "-c", probe], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.stdout.strip(), "system", "the patch is real: torch.load applies it")

    def test_names_cannot_break_lines_or_reach_the_terminal(self):
        p = self.path("names.pt")
        name = "evil\n\x1b[2J\x1b]0;title\x07\u009b"
        torch.save({name: torch.zeros(2), "ok": torch.ones(1)[0:1]}, p)
        human = run("inspect", p).stdout
        self.assertNotIn("\x1b", human)
        self.assertNotIn("\x07", human)
        self.assertNotIn("\u009b", human)
        self.assertIn("evil\\n\\x1b[2J\\x1b]0;title\\x07\\u009b", human)
        self.assertEqual(inspect(p)["tensors"][0]["name"], name)  # JSON keeps the real name
        # Messages too: verify's problem lines and strip's report stay one line per entry.
        r = run("strip", "--drop", "evil*", "--dry-run", p)
        self.assertEqual(len([l for l in r.stdout.splitlines() if "drop" in l]), 1, r.stdout)
        self.assertNotIn("\x1b", r.stdout + r.stderr)

    def test_billion_laughs_costs_milliseconds(self):
        # 60 levels of [previous, previous]: 2^60 paths in 1 KiB, next to a real tensor.
        laughs = b"]r" + struct.pack("<I", 100000) + b"0"
        for level in range(1, 60):
            prev, cur = struct.pack("<I", 99999 + level), struct.pack("<I", 100000 + level)
            laughs += b"(j" + prev + b"j" + prev + b"lr" + cur + b"0"
        laughs += b"j" + struct.pack("<I", 100059)
        p = self.path("laughs.pt")
        with_payload(p, 2, laughs)
        for args, code in ((["inspect"], 0), (["verify"], 0), (["shrink", "--dry-run"], 0),
                           (["strip", "--dry-run"], 0), (["export", "--to", self.path("l.safetensors")], 0),
                           (["strip", "--drop", "payload.*.x", "--dry-run"], 1)):
            start = time.monotonic()
            r = run(*args, p, expect=code)
            self.assertLess(time.monotonic() - start, 5, args)
            if code:
                self.assertIn(f"{p}: object graph has more than 250000 steps to walk again through shared "
                              "references; refusing", r.stderr)


if __name__ == "__main__":
    import unittest
    unittest.main()
