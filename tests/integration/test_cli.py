"""One CLI: the conventions every command shares (docs/commands.md), each shown on real
torch.save files.

- help, version, did-you-mean for commands and flags; usage errors exit 2;
- the exit-code table: 0 success, 1 a problem found or a job failed, 2 usage error,
  130 (death by SIGINT) interrupted, with one line saying what happened;
- outputs: -o/--output for one, --output-dir for many, parent folders created, never over an
  existing output without -f/--force;
- --dry-run writes nothing, on every command that writes;
- a failed command prints no success line;
- read-only commands run inside a torchrun job (WORLD_SIZE set); writing ones say how to run
  them there.
"""
import json
import os
import signal
import subprocess
import time
import unittest

import torch

from ckpt_testlib import CKPTOOL, CkptTestCase, read_bytes, run


def training_checkpoint(path, seed=0):
    """A view into a bigger storage (shrink), optimizer state (strip), float32 weights."""
    torch.manual_seed(seed)
    flat = torch.randn(4096)
    torch.save({"model": {"w": flat[:1024], "b": torch.randn(8)},
                "optimizer": {"state": {0: {"step": torch.tensor(4097.0),
                                            "exp_avg": torch.randn(1024),
                                            "exp_avg_sq": torch.full((1024,), 1e-9)}},
                              "param_groups": [{"lr": 1e-3, "params": [0]}]}}, path)


def tree(folder):
    """Every file below `folder`, relative, with its bytes."""
    out = {}
    for d, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, folder)] = read_bytes(p)
    return out


class HelpAndUsageTest(CkptTestCase):
    def test_help_version_and_no_command(self):
        r = run("help")
        for command in ("inspect", "verify", "shrink", "convert", "export", "strip", "prune",
                        "compress", "apply"):
            self.assertIn(command, r.stdout)
        self.assertIn("Exit codes", r.stdout)
        self.assertIn("--dry-run", run("help", "shrink").stdout)
        self.assertIn("--include-optimizer", run("help", "convert").stdout)
        self.assertRegex(run("version").stdout, r"^ckptool \d+\.\d+\.\d+\n")
        self.assertEqual(run("--version").stdout, run("version").stdout)
        r = run(expect=2)
        self.assertIn("no command given", r.stderr)

    def test_a_mistyped_command_or_flag_gets_a_suggestion_and_exit_2(self):
        p = self.path("m.pt")
        training_checkpoint(p)
        r = run("shrnk", p, expect=2)
        self.assertIn("did you mean shrink?", r.stderr)
        self.assertEqual(r.stdout, "")
        r = run("help", "exprt", expect=2)
        self.assertIn("did you mean export?", r.stderr)
        r = run("shrink", "--dryrun", p, expect=2)
        self.assertIn("--dry-run", r.stderr)
        r = run("convert", "--dtype", "bf17", p, "-o", self.path("x.pt"), expect=2)
        self.assertIn("bf16", r.stderr)
        self.assertNotIn("did you mean", r.stderr)  # a bad value: its option is not misspelt
        self.assertFalse(os.path.exists(self.path("x.pt")))
        # A misspelt required option is named as such, not as the option missing.
        r = run("convert", "--dtpye", "bf16", p, "-o", self.path("x.pt"), expect=2)
        self.assertIn("unknown option --dtpye (did you mean --dtype?)", r.stderr)
        self.assertNotIn("required", r.stderr)
        r = run("export", p, "--to", self.path("e"), "--strip-prefx", "module.", expect=2)
        self.assertIn("unknown option --strip-prefx (did you mean --strip-prefix?)", r.stderr)
        # -o with two inputs is a usage error, as every other one.
        r = run("convert", "--dtype", "bf16", p, p, "-o", self.path("x.pt"), expect=2)
        self.assertIn("give exactly one input file", r.stderr)
        self.assertFalse(os.path.exists(self.path("x.pt")))
        self.assertFalse(os.path.exists(self.path("e")))
        # Options that do not fit together, found by a job rather than the parser: exit 2 too.
        for args, said in ((("shrink", p, p, "-o", self.path("x.pt")), "-o names one output"),
                           (("strip", p, p, "-o", self.path("x.pt")), "-o names one output"),
                           (("compress", p, p, "-o", self.path("x.ckz")), "-o names one output"),
                           (("decompress", p, "-c", "-o", self.path("x")), "cannot be used"),
                           (("reshard", p, "--to", "zero"), "needs --world-size"),
                           (("reshard", p, "--to", "universal", "--world-size", "2"),
                            "--world-size is for --to zero"),
                           (("convert", p, "--dtype", "bf16", "-o", self.path("x.safetensors")),
                            "convert keeps"),
                           (("export", p, "--to", self.path("x.pt"), "--max-shard-size", "1KiB"),
                            "applies to safetensors output"),
                           (("export", p, "--to", self.path("e"), "--tag", "t"),
                            "apply to DeepSpeed ZeRO"),
                           (("export", p, "--to", self.path("e"), "--strip-prefix", ""),
                            "give a prefix")):
            r = run(*args, expect=2)
            self.assertIn(said, r.stderr, args)
        for made in ("x.pt", "x.ckz", "x.safetensors", "e"):
            self.assertFalse(os.path.exists(self.path(made)), made)

    def test_sizes_need_a_unit(self):
        p = self.path("m.pt")
        training_checkpoint(p)
        r = run("export", p, "-o", self.path("out"), "--max-shard-size", "5", expect=2)
        self.assertIn("needs a unit", r.stderr)
        self.assertFalse(os.path.exists(self.path("out")))
        run("export", p, "-o", self.path("out"), "--max-shard-size", "3KiB")
        shards = [f for f in os.listdir(self.path("out")) if f.endswith(".safetensors")]
        self.assertGreater(len(shards), 1)


class ExitCodeTest(CkptTestCase):
    def test_0_1_2(self):
        p = self.path("m.pt")
        training_checkpoint(p)
        run("verify", p)  # 0
        with open(self.path("broken.pt"), "wb") as f:
            f.write(read_bytes(p)[:-100])
        run("verify", self.path("broken.pt"), expect=1)  # a problem found
        run("shrink", self.path("nope.pt"), expect=1)  # a job failed
        run("inspect", "--no-such-flag", p, expect=2)  # usage

    def test_130_on_ctrl_c_with_one_line(self):
        # A command slow enough to be interrupted: compress --level max of 64 MiB of floats.
        big = self.path("big.pt")
        torch.manual_seed(0)
        torch.save({"w": torch.randn(16 * 1024 * 1024)}, big)
        before = read_bytes(big)
        for attempt in range(5):
            p = subprocess.Popen([CKPTOOL, "compress", "--level", "max", "-j", "1", big],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(0.3 + attempt * 0.2)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate()
            if p.returncode == 0:  # finished first: try again, interrupting sooner is not possible
                os.remove(big + ".ckz")
                continue
            # Death by SIGINT: a shell reports it as 130.
            self.assertEqual(p.returncode, -signal.SIGINT, err)
            self.assertEqual(err.splitlines()[-1],
                             "ckptool: interrupted: the outputs being written were removed; what "
                             "was replaced before stays replaced, nothing is half written")
            self.assertNotIn("Done", out)
            self.assertEqual(sorted(os.listdir(self.tmp)), ["big.pt"])  # no archive, no temp
            self.assertEqual(read_bytes(big), before)
            break
        else:
            self.fail("compress finished before every SIGINT")

    def test_130_from_a_read_only_command_says_nothing_changed(self):
        # verify of a FIFO nobody writes to waits in open() until interrupted.
        fifo = self.path("pipe.pt")
        os.mkfifo(fifo)
        p = subprocess.Popen([CKPTOOL, "verify", fifo], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, -signal.SIGINT, err)  # a shell shows 130
        self.assertEqual(err, "ckptool: interrupted: nothing was changed\n")
        self.assertEqual(out, "")
        # A signal ignored by whoever started it (nohup) stays ignored.
        p = subprocess.Popen([CKPTOOL, "verify", fifo], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
        time.sleep(0.5)
        p.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        self.assertIsNone(p.poll(), "SIGHUP was ignored by the caller, yet it ended ckptool")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, -signal.SIGTERM, err)
        self.assertEqual(err, "ckptool: interrupted: nothing was changed\n")


class OutputConventionsTest(CkptTestCase):
    def setUp(self):
        super().setUp()
        self.src = self.path("m.pt")
        training_checkpoint(self.src)
        self.original = read_bytes(self.src)

    # command line -> the output it writes, below a folder that does not exist yet
    def commands(self, out):
        return {
            "shrink": (["shrink", self.src, "-o", f"{out}/a/s.pt"], f"{out}/a/s.pt"),
            "convert": (["convert", "--dtype", "bf16", self.src, "-o", f"{out}/b/c.pt"],
                        f"{out}/b/c.pt"),
            "export": (["export", self.src, "-o", f"{out}/c/e"], f"{out}/c/e/model.safetensors"),
            "strip": (["strip", self.src, "-o", f"{out}/d/t.pt"], f"{out}/d/t.pt"),
            "compress": (["compress", self.src, "-o", f"{out}/e/m.pt.ckz"], f"{out}/e/m.pt.ckz"),
        }

    def test_parents_are_created_and_nothing_is_overwritten_without_force(self):
        out = self.path("new")
        for name, (args, result) in self.commands(out).items():
            with self.subTest(command=name):
                run(*args)
                self.assertTrue(os.path.isfile(result), result)
                first = read_bytes(result)
                r = run(*args, expect=1)
                self.assertIn("--force", r.stderr)
                self.assertNotIn("Done", r.stdout)
                self.assertEqual(read_bytes(result), first)
                run(*args, "--force")
                self.assertTrue(os.path.isfile(result))
                self.assertEqual(read_bytes(self.src), self.original)

    def test_decompress_of_a_folder_creates_parents_too(self):
        folder = self.path("run")
        os.makedirs(folder)
        training_checkpoint(os.path.join(folder, "a.pt"))
        run("compress", folder)
        dest = self.path("new/f/g/restored")
        run("decompress", folder + ".ckz", "-o", dest)
        self.assertEqual(tree(dest), tree(folder))
        r = run("decompress", folder + ".ckz", "-o", dest, expect=1)
        self.assertIn("--force", r.stderr)
        run("decompress", folder + ".ckz", "-o", dest, "--force")
        self.assertEqual(tree(dest), tree(folder))

    def test_dry_run_writes_nothing(self):
        out = self.path("dry")
        for name, (args, result) in self.commands(out).items():
            with self.subTest(command=name):
                r = run(*args, "--dry-run")
                self.assertTrue(r.stdout.strip(), "a dry run says what it would do")
                self.assertFalse(os.path.exists(out), name)
        before = tree(self.tmp)
        run("shrink", "--dry-run", self.src)
        run("strip", "--dry-run", self.src)
        run("convert", "--dtype", "bf16", "--dry-run", self.tmp)
        for step in (1, 2):
            training_checkpoint(os.path.join(self.tmp, f"step={step}.ckpt"), seed=step)
        before = tree(self.tmp)
        r = run("prune", self.tmp, "--keep-last", "1", "--dry-run")
        self.assertIn("Would free", r.stdout)
        run("compress", "--dry-run", self.src)
        self.assertEqual(tree(self.tmp), before)
        run("compress", self.src)
        os.remove(self.src)
        before = tree(self.tmp)
        r = run("decompress", "--dry-run", self.src + ".ckz")
        self.assertIn("every chunk checked", r.stdout)
        self.assertEqual(tree(self.tmp), before)

    def test_shrink_output_dir_keeps_runs_apart(self):
        for run_name in ("run1", "run2"):
            os.makedirs(self.path(run_name))
            training_checkpoint(os.path.join(self.path(run_name), "mp_rank_00_model_states.pt"))
        out = self.path("out")
        run("shrink", self.path("run1"), self.path("run2"), "--output-dir", out)
        self.assertEqual(sorted(tree(out)), ["run1/mp_rank_00_model_states.pt",
                                             "run2/mp_rank_00_model_states.pt"])
        # Bare folder names, relative to the working folder, keep their names too.
        run("shrink", "run1", "run2/", "--output-dir", "bare", cwd=self.tmp)
        self.assertEqual(sorted(tree(self.path("bare"))), sorted(tree(out)))
        # Two inputs of one name, given as files, would collide: refused before any work.
        r = run("shrink", os.path.join(self.path("run1"), "mp_rank_00_model_states.pt"),
                os.path.join(self.path("run2"), "mp_rank_00_model_states.pt"), "--output-dir",
                self.path("flat"), expect=2)
        self.assertIn("would both be written to", r.stderr)
        self.assertFalse(os.path.exists(self.path("flat")))

    def test_strip_writes_a_stripped_copy_of_a_folder(self):
        folder = self.path("checkpoint-100")
        os.makedirs(os.path.join(folder, "extra"))
        torch.save({"w": torch.randn(16)}, os.path.join(folder, "pytorch_model.bin"))
        training_checkpoint(os.path.join(folder, "extra", "trainer_like.pt"))
        torch.save({"state": {0: {"exp_avg": torch.zeros(16)}}, "param_groups": []},
                   os.path.join(folder, "optimizer.pt"))
        with open(os.path.join(folder, "config.json"), "w") as f:
            f.write('{"model_type": "gpt2"}')
        before = tree(folder)
        copy = self.path("for-serving")
        r = run("strip", folder, "-o", copy)
        self.assertIn("left out", r.stdout)
        self.assertEqual(tree(folder), before)  # the original is untouched
        got = tree(copy)
        self.assertEqual(sorted(got), ["config.json", "extra/trainer_like.pt", "pytorch_model.bin"])
        self.assertEqual(got["config.json"], before["config.json"])
        stripped = torch.load(os.path.join(copy, "extra", "trainer_like.pt"))
        self.assertEqual(sorted(stripped), ["model"])
        r = run("strip", folder, "-o", copy, expect=1)
        self.assertIn("--force", r.stderr)
        run("strip", folder, "-o", copy, "--force", "-q")
        self.assertEqual(sorted(tree(copy)), sorted(got))
        self.assertFalse([n for n in os.listdir(self.tmp) if "ckptool-tmp" in n])


class FailureAndClusterTest(CkptTestCase):
    def test_a_failed_command_prints_no_success_line(self):
        good = self.path("good.pt")
        training_checkpoint(good)
        for args in (["shrink", self.path("nope.pt")],
                     ["shrink", good, self.path("nope.pt")],
                     ["convert", "--dtype", "bf16", self.path("nope.pt"), "-o", self.path("x.pt")],
                     ["strip", self.path("nope.pt")]):
            with self.subTest(args=args):
                r = run(*args, expect=1)
                self.assertNotIn("Done", r.stdout)
                self.assertIn("nope.pt", r.stderr)

    def test_read_only_commands_run_inside_a_torchrun_job(self):
        p = self.path("m.pt")
        training_checkpoint(p)
        original = read_bytes(p)
        env = dict(os.environ, WORLD_SIZE="2", RANK="1", LOCAL_RANK="1")
        for args in (["inspect", p], ["verify", p], ["verify", "--json", p], ["help"],
                     ["version"]):
            with self.subTest(args=args):
                r = subprocess.run([CKPTOOL, *args], env=env, capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertTrue(r.stdout)
        # A writing command would race with its copies: refused, with how to run it instead.
        r = subprocess.run([CKPTOOL, "shrink", p], env=env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("mpirun", r.stderr)
        self.assertEqual(read_bytes(p), original)

    def test_verify_json(self):
        p = self.path("m.pt")
        training_checkpoint(p)
        with open(self.path("broken.pt"), "wb") as f:
            f.write(read_bytes(p)[:-100])
        r = run("verify", "--json", p, self.path("broken.pt"), expect=1)
        doc = json.loads(r.stdout)
        by_path = {c["path"]: c for c in doc["checkpoints"]}
        self.assertTrue(by_path[p]["ok"])
        self.assertFalse(by_path[self.path("broken.pt")]["ok"])
        self.assertTrue(by_path[self.path("broken.pt")]["problems"])
        self.assertEqual(doc["problems"], len(by_path[self.path("broken.pt")]["problems"]))


if __name__ == "__main__":
    unittest.main()
