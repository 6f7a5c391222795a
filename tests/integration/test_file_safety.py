"""Nothing is lost when the file system says no: read-only folders and files, missing
permissions, read-only and full file systems, inputs changed by another process while ckptool
works on them, and symlinked checkpoints. Each case checks the exact error, that the original
is byte-for-byte what it was (or what the other process made it), and that no temp file is
left behind."""
import json
import os
import shutil
import signal
import subprocess
import time

import torch

from ckpt_testlib import CKPTOOL, HERE, CkptTestCase, inspect, read_bytes, run
from shrink_fixtures import deepspeed_like

UNPRIVILEGED = os.path.join(HERE, "..", "unprivileged")
TEMP_MARK = ".ckptool-tmp-"


def bloated(path, mib=32, seed=0):
    """A DeepSpeed-like file of about 2*mib MiB, half of it bytes no tensor uses."""
    torch.manual_seed(seed)
    n = mib * 1024 * 1024 // 4
    flat = torch.empty(2 * n).uniform_()
    torch.save({"module": {"w": flat[:n // 2], "b": flat[n // 2:n]},
                "optimizer": {"exp_avg": torch.zeros(8)}, "step": 7}, path)


def dense_fp32(path, mib=32, seed=0):
    torch.manual_seed(seed)
    torch.save({"w": torch.empty(mib * 1024 * 1024 // 4).uniform_()}, path)


def temp_files(folder):
    return [n for n in os.listdir(folder) if TEMP_MARK in n]


def run_as_user(*args):
    """ckptool without the capabilities that let root ignore permission bits."""
    return subprocess.run([UNPRIVILEGED, CKPTOOL, *map(str, args)], capture_output=True, text=True,
                          timeout=300)


class FileSafetyCase(CkptTestCase):
    def setUp(self):
        super().setUp()
        self.mounts = []

    def tearDown(self):
        for folder in reversed(self.mounts):  # before the temp folder holding them goes
            subprocess.run(["umount", "-l", folder], capture_output=True)
        for folder, _, _ in os.walk(self.tmp):  # tests make folders read-only
            os.chmod(folder, 0o755)
        super().tearDown()

    def assert_clean_failure(self, r, message):
        """Exit code 1 and exactly one line on stderr: 'ckptool: error: ... <message>'."""
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("ckptool: error: "), r.stderr)
        self.assertIn(message, lines[0])

    def mount_tmpfs(self, name, size):
        """A small tmpfs of our own (needs root); the test is skipped where mounting is not
        allowed, since the RLIMIT_FSIZE test in test_shrink covers the same path."""
        folder = self.path(name)
        os.mkdir(folder)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        self.mounts.append(folder)
        return folder

    def run_and_change(self, args, temp_folder, change):
        """Runs ckptool, freezes it (SIGSTOP) as soon as its temp file appears, calls change()
        and lets it go on: the change lands mid-run whatever the machine's speed."""
        p = subprocess.Popen([CKPTOOL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while not temp_files(temp_folder):
                self.assertIsNone(p.poll(), "finished before its temp file was seen")
                self.assertLess(time.monotonic(), deadline)
            p.send_signal(signal.SIGSTOP)
            self.assertTrue(temp_files(temp_folder), "committed before it could be stopped")
            change()
        finally:
            p.send_signal(signal.SIGCONT)
        out, err = p.communicate(timeout=300)
        return subprocess.CompletedProcess(args, p.returncode, out, err)


class PermissionTest(FileSafetyCase):
    def setUp(self):
        super().setUp()
        # The checks below mean something only where permission bits bind the process.
        probe = self.path("probe")
        os.mkdir(probe, 0o555)
        r = subprocess.run([UNPRIVILEGED, "touch", os.path.join(probe, "x")], capture_output=True)
        shutil.rmtree(probe)
        if r.returncode == 0:
            if os.environ.get("CKPT_REQUIRE_PERMISSIONS"):
                self.fail("tests/unprivileged could not drop the capabilities that bypass permissions")
            self.skipTest("this environment bypasses permission bits")
        self.folder = self.path("ckpts")
        os.mkdir(self.folder)
        self.ckpt = os.path.join(self.folder, "model.pt")
        bloated(self.ckpt, mib=2)
        self.original = read_bytes(self.ckpt)

    def assert_untouched(self):
        self.assertEqual(read_bytes(self.ckpt), self.original)
        self.assertEqual(os.listdir(self.folder), ["model.pt"])

    def test_read_only_folder(self):
        os.chmod(self.folder, 0o555)
        for command in (["shrink"], ["strip"]):
            r = run_as_user(*command, self.ckpt)
            self.assert_clean_failure(r, f"{self.ckpt}: cannot create a file in {self.folder}: Permission denied")
            self.assert_untouched()
        # Reading still works: inspect and verify need no write access.
        self.assertEqual(run_as_user("verify", self.ckpt).returncode, 0)

    def test_read_only_file_is_not_replaced(self):
        os.chmod(self.ckpt, 0o444)
        for command in ("shrink", "strip"):
            r = run_as_user(command, self.ckpt)
            self.assert_clean_failure(
                r, f"{self.ckpt}: no permission to replace it (Permission denied); nothing was replaced")
            self.assert_untouched()
        # With the owner's write bit back, the same command works.
        os.chmod(self.ckpt, 0o644)
        self.assertEqual(run_as_user("shrink", self.ckpt).returncode, 0)
        self.assertEqual(inspect(self.ckpt)["wasted_bytes"], 0)

    def test_unreadable_input(self):
        os.chmod(self.ckpt, 0o000)
        for command in ("inspect", "verify", "shrink"):
            r = run_as_user(command, self.ckpt)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn(f"{self.ckpt}: cannot open: Permission denied", r.stdout + r.stderr)
        os.chmod(self.ckpt, 0o644)
        self.assert_untouched()

    def test_output_folder_not_writable(self):
        out = self.path("out")
        os.mkdir(out, 0o555)
        r = run_as_user("shrink", "--output-dir", out, self.ckpt)
        self.assert_clean_failure(r, f"cannot create a file in {out}: Permission denied")
        r = run_as_user("export", self.ckpt, "--to", os.path.join(out, "model.safetensors"))
        self.assert_clean_failure(r, f"cannot create a file in {out}: Permission denied")
        self.assertEqual(os.listdir(out), [])
        self.assert_untouched()

    def test_prune_in_a_read_only_folder_deletes_nothing(self):
        root = self.path("run")
        os.mkdir(root)
        for step in (100, 200, 300):
            os.mkdir(os.path.join(root, f"global_step{step}"))
            bloated(os.path.join(root, f"global_step{step}", "mp_rank_00_model_states.pt"), mib=1)
        os.chmod(root, 0o555)
        r = run_as_user("prune", root, "--keep-last", "1", "--yes")
        self.assert_clean_failure(
            r, f"{root}: cannot delete checkpoints in this folder (Permission denied); nothing was deleted")
        self.assertEqual(sorted(os.listdir(root)), ["global_step100", "global_step200", "global_step300"])

    def test_strip_reports_training_files_it_could_not_delete(self):
        # strip DIR --delete-files in a folder whose optimizer file cannot be removed: the
        # model file is still stripped, the failed delete is an error line and exit 1.
        sub = self.path("ckpt-100")
        os.mkdir(sub)
        optim = os.path.join(sub, "optimizer.pt")
        torch.save({"state": {0: {"exp_avg": torch.zeros(8)}}}, optim)
        model = os.path.join(sub, "pytorch_model.bin")
        torch.save({"w": torch.ones(4)}, model)
        os.chmod(sub, 0o555)
        r = run_as_user("strip", "--delete-files", sub)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(f"{optim}: could not delete this training-only file: Permission denied", r.stderr)
        self.assertIn("NOT deleted", r.stdout)
        self.assertNotIn("--delete-files removes it", r.stdout)
        self.assertTrue(os.path.exists(optim))
        r = run_as_user("strip", "--delete-files", "--json", sub)
        self.assertEqual(r.returncode, 1)
        row = json.loads(r.stdout)["training_only_files"][0]
        self.assertEqual((row["path"], row["deleted"], row["error"]), (optim, False, "Permission denied"))

    def test_read_only_file_system(self):
        mnt = self.mount_tmpfs("ro", "16m")
        shutil.copy(self.ckpt, mnt)
        subprocess.run(["mount", "-o", "remount,ro", mnt], check=True)
        target = os.path.join(mnt, "model.pt")
        r = run("shrink", target, expect=None)
        self.assert_clean_failure(r, f"{target}: no permission to replace it (Read-only file system)")
        self.assertEqual(read_bytes(target), self.original)


class ChangedWhileProcessingTest(FileSafetyCase):
    """Another process writes, touches or replaces the input while ckptool works on it;
    ckptool must refuse to commit what it made from the old bytes."""

    def test_shrink_and_strip_in_place(self):
        p = self.path("model.pt")
        for command, change in (("shrink", "append"), ("strip", "touch"), ("shrink", "replace")):
            with self.subTest(command=command, change=change):
                bloated(p, mib=48)
                before = read_bytes(p)

                def do_change():
                    if change == "append":
                        with open(p, "ab") as f:
                            f.write(b"another writer")
                    elif change == "touch":
                        os.utime(p, (1, 1))
                    else:
                        shutil.copy(p, p + ".new")
                        os.rename(p + ".new", p)

                r = self.run_and_change([command, p], self.tmp, do_change)
                self.assert_clean_failure(
                    r, f"{p}: the file changed while it was being processed; nothing was replaced")
                expected = before + b"another writer" if change == "append" else before
                self.assertEqual(read_bytes(p), expected)
                self.assertEqual(temp_files(self.tmp), [])

    def test_convert_and_export_to_new_files(self):
        src = self.path("dense.pt")
        dense_fp32(src, mib=96)
        st = self.path("dense.safetensors")
        run("export", src, "--to", st)
        out = self.path("out")
        os.mkdir(out)
        cases = [
            (["convert", "--dtype", "bf16", "--output-dir", out, src], src, os.path.join(out, "dense.pt")),
            (["convert", "--dtype", "fp16", "--output-dir", out, st], st, os.path.join(out, "dense.safetensors")),
            (["export", src, "--to", os.path.join(out, "m.safetensors")], src, os.path.join(out, "m.safetensors")),
        ]
        for args, source, output in cases:
            with self.subTest(command=args[0], source=source):
                stamp = time.time_ns() - 10 ** 9  # a modification time the file never had
                r = self.run_and_change(args, out, lambda: os.utime(source, ns=(stamp, stamp)))
                self.assert_clean_failure(
                    r, f"{source}: the file changed while it was being processed; {output} was not written")
                self.assertEqual(os.listdir(out), [])


class SymlinkTest(FileSafetyCase):
    def test_in_place_rewrite_follows_the_link(self):
        # Lightning keeps last.ckpt as a symlink to the newest epoch file.
        target = self.path("epoch=3-step=1200.ckpt")
        bloated(target, mib=1)
        expected = torch.load(target)
        link = self.path("last.ckpt")
        os.symlink(os.path.basename(target), link)
        for command in ("shrink", "strip"):
            run(command, link)
            self.assertTrue(os.path.islink(link))
            self.assertEqual(os.readlink(link), os.path.basename(target))
            self.assertEqual(sorted(os.listdir(self.tmp)), ["epoch=3-step=1200.ckpt", "last.ckpt"])
        report = inspect(target)
        self.assertEqual(report["wasted_bytes"], 0)
        self.assertNotIn("optimizer", [k["key"] for k in report["by_key"]])
        loaded = torch.load(link)
        self.assertTrue(torch.equal(loaded["module"]["w"], expected["module"]["w"]))


class FullFileSystemTest(FileSafetyCase):
    def test_output_that_cannot_fit_fails_before_writing(self):
        mnt = self.mount_tmpfs("small", "24m")
        p = os.path.join(mnt, "model.pt")
        bloated(p, mib=10)  # ~20 MiB file whose shrunk copy (~10 MiB) cannot fit beside it
        original = read_bytes(p)
        r = run("shrink", p, expect=None)
        self.assert_clean_failure(r, f"{p}: the output needs 10.00 MiB but only ")
        self.assertEqual(read_bytes(p), original)
        self.assertEqual(os.listdir(mnt), ["model.pt"])

    def test_disk_filled_by_another_process_mid_write(self):
        """The space check passes, then another process takes the rest of the disk before the
        data is written. strace holds ckptool for 2 s right after it created its temp file
        (the space-reserving call), which is when the disk gets filled."""
        mnt = self.mount_tmpfs("fills", "160m")
        p = os.path.join(mnt, "model.pt")
        bloated(p, mib=32)
        original = read_bytes(p)
        filler = os.path.join(mnt, "filler")
        hold = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=ftruncate,fallocate",
                "-e", "inject=ftruncate:delay_exit=2000000", "-e", "inject=fallocate:delay_exit=2000000"]
        if subprocess.run([*hold, "true"], capture_output=True).returncode != 0:
            self.skipTest("strace cannot trace processes here")
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")  # LeakSanitizer cannot run under ptrace
        proc = subprocess.Popen([*hold, CKPTOOL, "shrink", p], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 60
        while not temp_files(mnt):
            self.assertIsNone(proc.poll(), "finished before its temp file was seen")
            self.assertLess(time.monotonic(), deadline)
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, bytes(1 << 20)) > 0:
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        out, err = proc.communicate(timeout=300)
        r = subprocess.CompletedProcess([], proc.returncode, out, err)
        self.assert_clean_failure(r, f"{p}: writing the new file failed: no space left on device")
        self.assertEqual(read_bytes(p), original)
        self.assertEqual(sorted(os.listdir(mnt)), ["filler", "model.pt"])
        os.remove(filler)
        run("shrink", p)  # with the space back, the same command succeeds
        self.assertEqual(inspect(p)["wasted_bytes"], 0)


if __name__ == "__main__":
    import unittest
    unittest.main()
