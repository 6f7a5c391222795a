"""Crash safety of in-place rewrites: SIGKILL at random moments, Ctrl-C and SIGTERM."""
import os
import random
import signal
import subprocess
import time

import torch

from ckpt_testlib import CKPTOOL, CkptTestCase, assert_same_object, inspect, read_bytes, run


def big_bloated(path, seed=0):
    torch.manual_seed(seed)
    flat = torch.empty(24 * 1024 * 1024).uniform_()  # 96 MiB storage, half of it used
    part = 12 * 1024 * 1024 // 8
    torch.save({"module": {f"w{i}": flat[i * part:(i + 1) * part] for i in range(8)}, "step": 1}, path)


class CrashSafetyTest(CkptTestCase):
    def setUp(self):
        super().setUp()
        self.ckpt = self.path("model.pt")
        big_bloated(self.ckpt)
        self.original = read_bytes(self.ckpt)
        self.expected = torch.load(self.ckpt)

    def assert_original_or_replaced(self):
        data = read_bytes(self.ckpt)
        if data == self.original:
            return "original"
        assert_same_object(self, self.expected, torch.load(self.ckpt))
        self.assertEqual(inspect(self.ckpt)["wasted_bytes"], 0)
        return "replaced"

    def restore(self):
        if read_bytes(self.ckpt) != self.original:
            with open(self.ckpt, "wb") as f:
                f.write(self.original)

    def test_sigkill_at_random_moments(self):
        # How long a whole run takes here, so the kills spread over all of it (parsing,
        # writing, fsync, verification, rename) and a little after.
        start = time.monotonic()
        run("shrink", self.ckpt)
        duration = time.monotonic() - start
        rng = random.Random(1)
        outcomes = []
        for attempt in range(20):
            self.restore()
            p = subprocess.Popen([CKPTOOL, "shrink", self.ckpt], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.0, duration * 1.1))
            p.send_signal(signal.SIGKILL)
            p.wait()
            outcomes.append(self.assert_original_or_replaced())
            # A killed run may leave its hidden temp file; it is never taken for a checkpoint.
            r = run("inspect", "--json", self.tmp)
            self.assertIn('"path"', r.stdout)
            self.assertNotIn(".ckptool-tmp-", r.stdout)
        # The next run on that file removes temp files left by dead runs.
        run("shrink", self.ckpt)
        self.assertEqual(sorted(os.listdir(self.tmp)), ["model.pt"])
        print(f"\nwhole run {duration:.3f} s; SIGKILL outcomes: {outcomes}")
        self.assertIn("original", outcomes)  # the kills did land mid-run

    def test_sigint_and_sigterm_remove_the_temp_file(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            with open(self.ckpt, "wb") as f:
                f.write(self.original)
            p = subprocess.Popen([CKPTOOL, "shrink", self.ckpt], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            time.sleep(0.05)
            p.send_signal(sig)
            rc = p.wait()
            self.assertIn(rc, (0, -sig))  # finished first, or died of the signal
            self.assert_original_or_replaced()
            self.assertEqual(sorted(os.listdir(self.tmp)), ["model.pt"])

    def test_interrupted_or_failed_convert_leaves_no_empty_folder(self):
        """convert --output-dir NEW/SUB makes the folders it needs; a run that ends with
        nothing written in them (interrupted, or refused) removes them again."""
        interrupted = 0
        for n, (sig, delay) in enumerate([(signal.SIGINT, 0.01), (signal.SIGTERM, 0.01),
                                          (signal.SIGINT, 0.003), (signal.SIGTERM, 0.003)]):
            top = self.path(f"converted_{n}")
            out = os.path.join(top, "sub")
            p = subprocess.Popen([CKPTOOL, "convert", "--dtype", "bf16", "--output-dir", out,
                                  self.ckpt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            p.send_signal(sig)
            rc = p.wait()
            self.assertIn(rc, (0, -sig))
            if rc == 0:  # finished first: the output is there, whole
                self.assertEqual(os.listdir(out), ["model.pt"])
            else:
                interrupted += 1
                self.assertFalse(os.path.exists(top), os.listdir(self.tmp))
        self.assertGreater(interrupted, 0, "no signal landed mid-run")
        # Refused (a damaged input): no folder either.
        bad = self.path("bad.pt")
        with open(bad, "wb") as f:
            f.write(self.original[:len(self.original) // 2])
        out = os.path.join(self.path("refused"), "sub")
        r = subprocess.run([CKPTOOL, "convert", "--dtype", "bf16", "--output-dir", out, bad],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertFalse(os.path.exists(self.path("refused")))

    def test_input_truncated_while_being_read_is_a_clear_error(self):
        import shutil
        big = self.path("big.pt")
        torch.save({"w": torch.empty(64 * 1024 * 1024).uniform_()}, big)  # 256 MiB
        # How long a whole verify takes here, so the truncations spread over all of it:
        # before the file is opened, while it is read, and after.
        start = time.monotonic()
        run("verify", big)
        duration = time.monotonic() - start
        sigbus = ("ckptool: error: a file being read was truncated by another process (or a disk "
                  "is full); nothing was replaced\n")
        outcomes = []

        def attempt(delay):
            victim = self.path("victim.pt")
            shutil.copyfile(big, victim)
            p = subprocess.Popen([CKPTOOL, "verify", victim], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            time.sleep(delay)
            os.truncate(victim, 4096)
            out, err = p.communicate()
            what = f"exit code {p.returncode}\nstdout:\n{out}\nstderr:\n{err}"
            self.assertGreaterEqual(p.returncode, 0, f"killed by signal: {what}")
            if p.returncode == 0:
                # Finished before the truncation.
                self.assertTrue(
                    out.startswith(f"{victim}: OK (torch-zip, 3 records, 256.00 MiB CRC-checked)"),
                    what)
                outcome = "finished first"
            elif out == f"{victim}: the file was truncated while being read (by another process?)\n":
                # Truncated under a read of its records (they are read with pread): one error
                # naming the file, nothing declared OK.
                self.assertEqual(p.returncode, 1, what)
                self.assertIn("1 problem in 1 of 1 checkpoint", err, what)
                outcome = "truncated while read"
            elif err and set(err.splitlines(keepends=True)) == {sigbus}:
                # Truncated under the mapping: the SIGBUS handler says so, and nothing was
                # declared OK. (Each CRC thread that faults prints the line today, so it may
                # come more than once.)
                self.assertEqual(p.returncode, 1, what)
                self.assertNotIn("OK", out, what)
                outcome = "truncated while read"
            else:
                # Truncated before it was opened: what is left (4 KiB) is not a zip.
                self.assertEqual(p.returncode, 1, what)
                self.assertEqual(
                    out, f"{victim}: not a zip file: no end-of-central-directory record\n", what)
                self.assertIn("1 problem in 1 of 1 checkpoint", err, what)
                outcome = "truncated before read"
            outcomes.append(outcome)
            return outcome

        # Steps of 5%: under the sanitizers most of a run is start-up and the read itself is
        # a window of ~20% of it.
        before, after = 0.0, duration * 1.5
        for delay in [duration * i / 20 for i in range(20)] + [duration * 1.5]:
            outcome = attempt(delay)
            if outcome == "truncated before read":
                before = max(before, delay)
            elif outcome == "finished first":
                after = min(after, delay)
        # On a loaded machine one run can take far longer than the one timed: narrow in on the
        # read between the latest truncation that came first and the earliest that came late.
        for _ in range(16):
            if "truncated while read" in outcomes:
                break
            if after <= before:  # runs vary: a later truncation came first, an earlier late
                after = before + duration
            middle = (before + after) / 2
            outcome = attempt(middle)
            if outcome == "truncated before read":
                before = middle
            elif outcome == "finished first":
                after = middle
        print(f"\nverify takes {duration:.3f} s; truncation outcomes: {outcomes}")
        self.assertIn("truncated while read", outcomes,
                      "no truncation landed while the file was read")


if __name__ == "__main__":
    import unittest
    unittest.main()
