"""`ckptool apply` with a ckptool.toml on folders of real torch checkpoints in the layouts of
HF Trainer, Lightning, DeepSpeed ZeRO and Megatron torch_dist (DCP): the steps do what their
commands do, retention equals prune's plan, a second run does nothing (ledger and mtimes), an
incomplete checkpoint is never touched, and a run killed at any point (every ledger write and
moments spread over a run) resumes to the same bytes as an uninterrupted run."""
import json
import os
import signal
import subprocess
import time

import torch

import policy_fixtures as pf
from ckpt_testlib import CKPTOOL, CkptTestCase, read_safetensors, run

HF_POLICY = """
[retention]
keep_last = 2
keep = ["checkpoint-100"]
[shrink]
[convert]
dtype = "bf16"
keep = ["*norm*"]
[export]
[verify]
[strip]
older_than_newest = 1
delete_files = true
"""


def apply(root, *args, expect=0, env=None):
    """Runs `ckptool apply ROOT --json --settle 0 ...`; returns (events, summary)."""
    settle = [] if "--settle" in args else ["--settle", "0"]
    cmd = [CKPTOOL, "apply", root, "--json", "--yes", *settle, "-j", "2", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if expect is not None and p.returncode != expect:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}, expected {expect}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    events = [e for e in lines if e.get("event") != "summary"]
    summary = [e for e in lines if e.get("event") == "summary"]
    return events, (summary[0] if summary else None)


SETTLE = ("--settle", "30")


def steps_of(events, kind="step"):
    return sorted((e["checkpoint"], e["step"]) for e in events if e["event"] == kind)


class PolicyTestCase(CkptTestCase):
    def write_policy(self, root, text, name="ckptool.toml"):
        path = os.path.join(root, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def prune_plan(self, root, *args):
        """Names prune --dry-run keeps (its plan, computed before apply touches anything)."""
        doc = json.loads(run("prune", root, "--json", *args).stdout)
        return sorted(e["name"] for e in doc["entries"] if e["keep"])

    def entries(self, root, pattern):
        import re
        return sorted(n for n in os.listdir(root) if re.search(pattern, n))

    def assertSecondRunDoesNothing(self, root):
        before = pf.stamps(root)
        ledger_before = pf.ledger(root)
        events, summary = apply(root)
        self.assertEqual(summary["steps"], 0, events)
        self.assertEqual(summary["deleted"], 0, events)
        self.assertEqual([e for e in events if e["event"] not in ("wait",)], [], events)
        self.assertEqual(pf.stamps(root), before, "a second run changed files (or their times)")
        self.assertEqual(pf.ledger(root), ledger_before, "a second run rewrote the ledger")


class HfTrainerTest(PolicyTestCase):
    def build(self, root, steps=(100, 200, 300, 400, 500), best=200):
        os.makedirs(root, exist_ok=True)
        for s in steps:
            pf.hf_checkpoint(root, s, best=best)
        self.write_policy(root, HF_POLICY)

    def test_apply_twice(self):
        root = self.path("run")
        self.build(root)
        sizes = {s: os.path.getsize(os.path.join(root, f"checkpoint-{s}", "pytorch_model.bin"))
                 for s in (100, 200, 300, 400, 500)}
        originals = {s: torch.load(os.path.join(root, f"checkpoint-{s}", "pytorch_model.bin"))
                     for s in (200, 400, 500)}
        expected = self.prune_plan(root, "--keep-last", "2", "--keep", "checkpoint-100")
        self.assertEqual(expected, ["checkpoint-100", "checkpoint-200", "checkpoint-400",
                                    "checkpoint-500"])  # 200 is best_model_checkpoint
        events, summary = apply(root)
        self.assertEqual(summary["failed"], 0, events)
        # Retention is prune's plan.
        self.assertEqual(self.entries(root, r"^checkpoint-"), expected)
        self.assertEqual(steps_of(events, "delete"), [("checkpoint-300", "retention")])
        # Every kept checkpoint: shrink, convert, export, verify; all but the newest: strip.
        want = {n: ["convert", "export", "shrink", "verify"] for n in expected}
        for n in expected[:-1]:
            want[n] = sorted(want[n] + ["strip"])
        self.assertEqual(pf.ledger_steps(root), want)
        self.assertEqual(sorted(steps_of(events)), sorted((n, s) for n, ss in want.items() for s in ss))
        for s, obj in originals.items():
            d = os.path.join(root, f"checkpoint-{s}")
            model = os.path.join(d, "pytorch_model.bin")
            self.assertLess(os.path.getsize(model), sizes[s], "shrink dropped the unused buffer")
            back = torch.load(model)
            for k in obj:
                self.assertTrue(torch.equal(back[k], obj[k]), k)
            # The bf16 copy beside it: float32 -> bf16 except *norm*; no training-only files.
            half = torch.load(os.path.join(d, "bf16", "pytorch_model.bin"))
            self.assertEqual(half["layer.0.weight"].dtype, torch.bfloat16)
            self.assertEqual(half["norm.weight"].dtype, torch.float32)
            self.assertEqual(sorted(os.listdir(os.path.join(d, "bf16"))),
                             ["config.json", "pytorch_model.bin", "trainer_state.json"])
            _, tensors = read_safetensors(self, os.path.join(d, "export", "model.safetensors"))
            self.assertEqual(sorted(tensors), sorted(obj))
            # strip older_than_newest = 1, delete_files: the optimizer files are gone from all
            # but the newest.
            self.assertEqual(os.path.exists(os.path.join(d, "optimizer.pt")), s == 500)
            self.assertEqual(os.path.exists(os.path.join(d, "rng_state.pth")), s == 500)
        self.assertSecondRunDoesNothing(root)

        # Training goes on: checkpoint-600 lands. Retention now deletes 400 (prune's plan);
        # 500 ages and is stripped; nothing else runs again.
        pf.hf_checkpoint(root, 600, best=200)
        expected = self.prune_plan(root, "--keep-last", "2", "--keep", "checkpoint-100")
        events, summary = apply(root)
        self.assertEqual(self.entries(root, r"^checkpoint-"), expected)
        self.assertEqual(steps_of(events, "delete"), [("checkpoint-400", "retention")])
        self.assertEqual(steps_of(events), [("checkpoint-500", "strip"), ("checkpoint-600", "convert"),
                                            ("checkpoint-600", "export"), ("checkpoint-600", "shrink"),
                                            ("checkpoint-600", "verify")])
        self.assertFalse(os.path.exists(os.path.join(root, "checkpoint-500", "optimizer.pt")))
        removed = [r["name"] for r in pf.ledger(root)["removed"]]
        self.assertEqual(removed, ["checkpoint-300", "checkpoint-400"])
        self.assertSecondRunDoesNothing(root)

    def test_incomplete_checkpoint_is_never_touched(self):
        root = self.path("run")
        self.build(root, steps=(100, 200))
        pf.hf_checkpoint(root, 300, marker=False)  # trainer_state.json not written yet
        before = pf.tree(os.path.join(root, "checkpoint-300"))
        events, summary = apply(root)
        self.assertEqual(summary["waiting"], 1)
        waits = [e for e in events if e["event"] == "wait"]
        self.assertEqual([(e["checkpoint"], e["message"]) for e in waits],
                         [("checkpoint-300", "looks incomplete (trainer_state.json is not written yet): left alone")])
        self.assertEqual(pf.tree(os.path.join(root, "checkpoint-300")), before)
        self.assertNotIn("checkpoint-300", pf.ledger(root)["checkpoints"])
        # Not counted as the newest: 200 is the newest complete one and is not stripped.
        self.assertTrue(os.path.exists(os.path.join(root, "checkpoint-200", "optimizer.pt")))
        self.assertFalse(os.path.exists(os.path.join(root, "checkpoint-100", "optimizer.pt")))
        # The settle time: a checkpoint changed a moment ago waits.
        pf.hf_marker(root, 300)
        events, summary = apply(root, "--settle", "3600")
        self.assertEqual(summary["steps"], 0, events)
        self.assertIn("settling", [e for e in events if e["checkpoint"] == "checkpoint-300"][0]["message"])
        # Complete now: processed, and 200 ages.
        events, summary = apply(root)
        self.assertIn(("checkpoint-300", "shrink"), steps_of(events))
        self.assertIn(("checkpoint-200", "strip"), steps_of(events))

    def test_changed_checkpoint_is_processed_again(self):
        root = self.path("run")
        self.build(root, steps=(100, 200))
        apply(root)
        # The trainer saves checkpoint-200 again (a resumed run): every step runs again on it.
        import shutil
        shutil.rmtree(os.path.join(root, "checkpoint-200"))
        pf.hf_checkpoint(root, 200, best=200)
        events, _ = apply(root)
        self.assertIn("changed since it was processed", [e for e in events if e["event"] == "changed"][0]["message"])
        self.assertEqual([s for c, s in steps_of(events)], ["convert", "export", "shrink", "verify"])
        self.assertSecondRunDoesNothing(root)

    def test_dry_run_changes_nothing(self):
        root = self.path("run")
        self.build(root)
        before = pf.tree(root)
        events, summary = apply(root, "--dry-run")
        self.assertEqual(pf.tree(root), before)
        self.assertFalse(os.path.exists(os.path.join(root, ".ckptool")))
        self.assertTrue(summary["dry_run"])
        self.assertGreater(summary["bytes_freed"], 0)
        self.assertEqual(steps_of(events, "delete"), [("checkpoint-300", "retention")])
        shrink = [e for e in events if e["step"] == "shrink"]
        self.assertEqual(len(shrink), 4)
        self.assertTrue(all(e["after"] < e["before"] for e in shrink), shrink)
        # The text form says what it would do and how many bytes.
        p = run("apply", root, "--dry-run", "--settle", "0")
        self.assertIn("checkpoint-300: retention: would delete", p.stdout)
        self.assertIn("Dry run:", p.stdout)
        self.assertIn("would free", p.stdout)

    def test_convert_in_place(self):
        root = self.path("run")
        self.build(root, steps=(100, 200))
        self.write_policy(root, "[convert]\ndtype = \"bf16\"\noutput = \"in_place\"\nkeep = [\"norm*\"]\n")
        opt = pf.tree(os.path.join(root, "checkpoint-200"))["optimizer.pt"]
        events, summary = apply(root)
        self.assertEqual(summary["failed"], 0, events)
        for s in (100, 200):
            d = os.path.join(root, f"checkpoint-{s}")
            model = torch.load(os.path.join(d, "pytorch_model.bin"))
            self.assertEqual(model["layer.0.weight"].dtype, torch.bfloat16)
            self.assertEqual(model["norm.weight"].dtype, torch.float32)
            self.assertFalse(os.path.exists(os.path.join(d, "bf16")))
        # Training-only files are left as they are (training_files = false).
        self.assertEqual(pf.tree(os.path.join(root, "checkpoint-200"))["optimizer.pt"], opt)
        self.assertSecondRunDoesNothing(root)

    def test_failed_step_is_reported_and_not_retried(self):
        root = self.path("run")
        self.build(root, steps=(100,))
        self.write_policy(root, "[export]\nselect = \"nothing.here\"\n")
        events, summary = apply(root, expect=1)
        failed = [e for e in events if e["event"] == "failed"]
        self.assertEqual(len(failed), 1, events)
        self.assertIn("--select nothing.here: no tensors under that path", failed[0]["message"])
        self.assertEqual(pf.ledger(root)["checkpoints"]["checkpoint-100"]["failed"]["step"], "export")
        events, summary = apply(root, expect=1)
        self.assertEqual(summary["steps"], 0)
        self.assertIn("not retried", [e for e in events if e["event"] == "failed"][0]["message"])
        apply(root, "--retry-failed", expect=1)
        self.assertEqual(summary["failed"], 1)
        # A policy that works: the step runs (its options changed).
        self.write_policy(root, "[export]\n")
        events, summary = apply(root)
        self.assertEqual(steps_of(events), [("checkpoint-100", "export")])

    def test_verify_step_is_the_verify_command(self):
        """[verify] runs what `ckptool verify CHECKPOINT` runs, a checkpoint's manifest too; a
        file changed since (trainer_state.json, no tensor file) is then damage, named in the
        event, and no step runs on it."""
        root = self.path("run")
        self.build(root, steps=(100,))
        ckpt = os.path.join(root, "checkpoint-100")
        run("manifest", ckpt)
        self.write_policy(root, "[verify]\n")
        events, _ = apply(root)
        done = [e for e in events if e["event"] == "step" and e["step"] == "verify"]
        self.assertEqual(len(done), 1, events)
        self.assertIn("matching its manifest", done[0]["message"], events)
        with open(os.path.join(ckpt, "trainer_state.json"), "a") as f:
            f.write(" ")
        self.assertEqual(run("verify", ckpt, expect=1).returncode, 1)
        self.write_policy(root, "[verify]\n# changed: runs again\n")
        events, _ = apply(root, expect=1)
        damaged = [e for e in events if e["event"] == "damaged"]
        self.assertEqual(len(damaged), 1, events)
        self.assertIn("trainer_state.json", damaged[0]["message"])
        self.assertEqual(steps_of(events), [])

class StepsAreTheJobsTest(PolicyTestCase):
    """The policy's steps run the commands' own jobs: the same files, the same outputs."""

    def test_a_safetensors_model_is_not_exported_again(self):
        root = self.path("run")
        d = os.path.join(root, "checkpoint-100")
        os.makedirs(d)
        source = self.path("model.pt")
        torch.save(pf._model(100), source)
        run("export", source, "--to", os.path.join(d, "model.safetensors"))
        torch.save(pf._optimizer(100), os.path.join(d, "optimizer.pt"))
        pf.hf_marker(root, 100)
        self.write_policy(root, "[export]\n[shrink]\n")
        before = pf.tree(d)
        events, summary = apply(root)
        self.assertEqual(summary["failed"], 0, events)
        said = {e["step"]: e["message"] for e in events if e["event"] == "step"}
        self.assertIn("already safetensors", said["export"], events)
        self.assertFalse(os.path.exists(os.path.join(d, "export")))
        # shrink takes torch files only: optimizer.pt holds no view to cut, the safetensors file
        # is none of shrink's.
        self.assertIn("1 file, nothing to drop", said["shrink"], events)
        self.assertEqual(pf.tree(d), before)

    def test_convert_step_writes_what_the_command_writes(self):
        root = self.path("run")
        os.makedirs(root)
        pf.hf_checkpoint(root, 100)
        self.write_policy(root, '[convert]\ndtype = "bf16"\n')
        cmd = self.path("by_command")
        run("convert", os.path.join(root, "checkpoint-100"), "--dtype", "bf16",
            "--output-dir", cmd)
        events, summary = apply(root)
        self.assertEqual(summary["failed"], 0, events)
        by_policy = os.path.join(root, "checkpoint-100", "bf16")
        # The command copies training-only files as they are; the policy leaves them out.
        training = {"optimizer.pt", "scheduler.pt", "rng_state.pth"}
        self.assertEqual(sorted(os.listdir(by_policy)),
                         sorted(set(os.listdir(cmd)) - training))
        for name in os.listdir(by_policy):
            with open(os.path.join(by_policy, name), "rb") as a, \
                    open(os.path.join(cmd, name), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)


class KillTestBase:
    """A run killed with SIGKILL anywhere, then run again, leaves the same bytes as a run never
    killed: at every ledger write (step boundaries: after a step's work, before the ledger
    knows) and at moments spread over a run (inside ops: temp files, half a folder)."""
    moments = (0.1, 0.3, 0.5, 0.7, 0.9)

    def build(self, root):
        raise NotImplementedError

    def setUp(self):
        super().setUp()
        self.base = self.path("base")
        os.makedirs(self.base)
        self.build(self.base)
        # Written an hour ago, and every run with the default settle time (30 s): a resumed
        # run must not wait for what the killed run itself changed a moment ago.
        old = time.time() - 3600
        for dirpath, dirnames, filenames in os.walk(self.base, topdown=False):
            for name in filenames + dirnames:
                os.utime(os.path.join(dirpath, name), (old, old))
        self.reference = self.path("reference")
        pf.copy_tree(self.base, self.reference)
        t = time.monotonic()
        apply(self.reference, *SETTLE)
        self.duration = time.monotonic() - t
        self.expected = self.tree(self.reference)
        self.expected_steps = pf.ledger_steps(self.reference)

    def tree(self, root):
        return pf.tree(root)

    def assertSameEnd(self, root, what):
        apply(root, *SETTLE)  # resume
        got = self.tree(root)
        self.assertEqual(sorted(got), sorted(self.expected), what)
        for rel in got:
            self.assertEqual(got[rel], self.expected[rel], f"{what}: {rel} differs")
        self.assertEqual(pf.ledger_steps(root), self.expected_steps, what)
        self.assertFalse(any("running" in c for c in pf.ledger(root)["checkpoints"].values()))

    def test_killed_at_every_ledger_write(self):
        k = 0
        while True:
            k += 1
            self.assertLess(k, 200)
            root = self.path(f"kill{k}")
            pf.copy_tree(self.base, root)
            env = dict(os.environ, CKPTOOL_TEST_KILL_AT_SAVE=str(k))
            p = subprocess.run([CKPTOOL, "apply", root, "--yes", *SETTLE, "-j", "2"], env=env,
                               capture_output=True, text=True, timeout=300)
            self.assertIn(p.returncode, (0, -signal.SIGKILL), p.stderr)
            self.assertSameEnd(root, f"killed before ledger write {k}")
            if p.returncode == 0:  # k is past the last write: every boundary was tried
                break
        self.assertGreater(k, 6, "the run has a ledger write before and after every step")

    def test_killed_at_moments_spread_over_a_run(self):
        for i, fraction in enumerate(self.moments):
            root = self.path(f"timed{i}")
            pf.copy_tree(self.base, root)
            p = subprocess.Popen([CKPTOOL, "apply", root, "--yes", *SETTLE, "-j", "2"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(self.duration * fraction)
            p.send_signal(signal.SIGKILL)
            p.wait()
            self.assertSameEnd(root, f"killed at {fraction:.0%} of a run")

    def test_sigterm_finishes_the_step_and_resumes(self):
        root = self.path("term")
        pf.copy_tree(self.base, root)
        p = subprocess.Popen([CKPTOOL, "apply", root, "--yes", *SETTLE, "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # SIGTERM once the pass is under way (its first action reported): a signal that came
        # before the handlers are installed (a slow start under the sanitizers) would test
        # nothing but the default action.
        first = p.stdout.readline()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        out = first + out
        self.assertIn(p.returncode, (0, 130), err)
        if p.returncode == 130:
            self.assertTrue(json.loads(out.splitlines()[-1])["stopped"])
            led = pf.ledger(root)
            self.assertFalse(any("running" in c for c in led["checkpoints"].values()),
                             "a step was left half done")
        self.assertSameEnd(root, "stopped by SIGTERM")


class HfKillTest(KillTestBase, PolicyTestCase):
    def build(self, root):
        for s in (100, 200, 300):
            pf.hf_checkpoint(root, s, best=100)
        self.write_policy(root, HF_POLICY.replace('keep = ["checkpoint-100"]\n', "")
                          .replace("keep_last = 2", "keep_last = 1"))


class MegatronKillTest(KillTestBase, PolicyTestCase):
    """torch_dist folders: strip builds a new folder beside the old one and swaps them."""
    moments = (0.2, 0.5, 0.8)

    def build(self, root):
        for it in (100, 200, 300):
            pf.megatron_checkpoint(root, it)
        self.write_policy(root, "[retention]\nkeep_last = 2\n[export]\n[verify]\n[strip]\n"
                                "older_than_newest = 0\n")


def unpacked_tree(test, root):
    """pf.tree, with every .ckz archive replaced by what `ckptool decompress` restores from it
    (archives hold mtimes, which differ between runs; their contents must not)."""
    out = {}
    for rel, data in pf.tree(root).items():
        if not rel.endswith(".ckz"):
            out[rel] = data
            continue
        dest = test.path(f"unpacked-{len(os.listdir(test.tmp))}")
        run("decompress", os.path.join(root, rel), "-o", dest)
        out[rel] = "archive"
        for inner, d in pf.tree(dest).items():
            out[f"{rel}!{inner}"] = d
        if os.path.isfile(dest):
            with open(dest, "rb") as f:
                out[f"{rel}!"] = f.read()
    return out


HF_COMPRESS_POLICY = """
[retention]
keep_last = 3
[verify]
[strip]
older_than_newest = 1
delete_files = true
[compress]
older_than_newest = 2
"""


class CompressStepTest(PolicyTestCase):
    """[compress]: checkpoints older than the newest N become NAME.ckz; retention counts and
    deletes the archives as the checkpoints they are, and prune plans the same."""

    def test_hf_checkpoints_become_archives_and_age_out(self):
        root = self.path("run")
        reference = self.path("reference")
        for r in (root, reference):
            for s in (100, 200, 300, 400):
                pf.hf_checkpoint(r, s, best=400)
        self.write_policy(root, HF_COMPRESS_POLICY)
        self.write_policy(reference, HF_COMPRESS_POLICY.split("[compress]")[0])
        apply(reference)
        events, summary = apply(root)
        self.assertEqual(summary["failed"], 0, events)
        # keep_last 3 keeps 200-400; strip ages 200 and 300; compress ages 200 only.
        self.assertEqual(self.entries(root, r"^checkpoint-"),
                         ["checkpoint-200.ckz", "checkpoint-300", "checkpoint-400"])
        step = [e for e in events if e["event"] == "step" and e["step"] == "compress"]
        self.assertEqual(len(step), 1, events)
        self.assertEqual(step[0]["checkpoint"], "checkpoint-200")
        self.assertEqual(step[0]["became"], "checkpoint-200.ckz")
        archive = os.path.join(root, "checkpoint-200.ckz")
        self.assertEqual(step[0]["after"], os.path.getsize(archive))
        self.assertLess(step[0]["after"], step[0]["before"])
        # The archive restores the stripped folder exactly (what the same policy without
        # [compress] leaves).
        dest = self.path("restored")
        run("decompress", archive, "-o", dest)
        want = pf.tree(os.path.join(reference, "checkpoint-200"))
        self.assertEqual(pf.tree(dest), want)
        self.assertNotIn("optimizer.pt", want)
        # The ledger record moved with it, steps and all.
        led = pf.ledger(root)
        self.assertNotIn("checkpoint-200", led["checkpoints"])
        self.assertEqual(sorted(led["checkpoints"]["checkpoint-200.ckz"]["steps"]),
                         ["compress", "strip", "verify"])
        self.assertEqual(list(led["checkpoints"]["checkpoint-200.ckz"]["files"]),
                         ["checkpoint-200.ckz"])
        self.assertSecondRunDoesNothing(root)

        # prune sees the archive as checkpoint 200.
        doc = json.loads(run("prune", root, "--keep-last", "3", "--json").stdout)
        self.assertEqual([(e["name"], e["step"], e["archive"], e["keep"]) for e in doc["entries"]],
                         [("checkpoint-200.ckz", 200, True, True),
                          ("checkpoint-300", 300, False, True),
                          ("checkpoint-400", 400, False, True)])

        # Training goes on: 500 lands. Retention deletes the archive (the oldest of four);
        # 300 ages into compress; 400 into strip.
        pf.hf_checkpoint(root, 500, best=500)
        expected = self.prune_plan(root, "--keep-last", "3")
        self.assertEqual(expected, ["checkpoint-300", "checkpoint-400", "checkpoint-500"])
        events, summary = apply(root)
        self.assertEqual(summary["failed"], 0, events)
        self.assertEqual(steps_of(events, "delete"), [("checkpoint-200.ckz", "retention")])
        self.assertEqual(steps_of(events), [("checkpoint-300", "compress"),
                                            ("checkpoint-400", "strip"),
                                            ("checkpoint-500", "verify")])
        self.assertEqual(self.entries(root, r"^checkpoint-"),
                         ["checkpoint-300.ckz", "checkpoint-400", "checkpoint-500"])
        self.assertEqual([r["name"] for r in pf.ledger(root)["removed"]],
                         ["checkpoint-100", "checkpoint-200.ckz"])
        self.assertSecondRunDoesNothing(root)

    def test_keep_original_writes_the_archive_beside_and_retention_deletes_both(self):
        root = self.path("run")
        for s in (100, 200, 300):
            pf.hf_checkpoint(root, s, best=300)
        self.write_policy(root, "[retention]\nkeep_last = 2\n[compress]\nolder_than_newest = 1\n"
                                "keep_original = true\n")
        before = pf.tree(os.path.join(root, "checkpoint-200"))
        events, summary = apply(root)
        self.assertEqual(summary["failed"], 0, events)
        self.assertEqual(self.entries(root, r"^checkpoint-"),
                         ["checkpoint-200", "checkpoint-200.ckz", "checkpoint-300"])
        self.assertEqual(pf.tree(os.path.join(root, "checkpoint-200")), before)
        dest = self.path("restored")
        run("decompress", os.path.join(root, "checkpoint-200.ckz"), "-o", dest)
        self.assertEqual(pf.tree(dest), before)
        # One checkpoint under two names: prune counts it once and would delete both.
        doc = json.loads(run("prune", root, "--keep-last", "1", "--json").stdout)
        self.assertEqual([(e["name"], e["also"], e["keep"]) for e in doc["entries"]],
                         [("checkpoint-200", ["checkpoint-200.ckz"], False),
                          ("checkpoint-300", [], True)])
        self.assertSecondRunDoesNothing(root)
        pf.hf_checkpoint(root, 400, best=400)
        events, summary = apply(root)
        self.assertEqual(steps_of(events, "delete"), [("checkpoint-200", "retention")])
        self.assertEqual(steps_of(events), [("checkpoint-300", "compress")])
        self.assertEqual(self.entries(root, r"^checkpoint-"),
                         ["checkpoint-300", "checkpoint-300.ckz", "checkpoint-400"])

    def test_a_lightning_file_becomes_an_archive(self):
        root = self.path("run")
        os.makedirs(root)
        for e, s in ((0, 100), (1, 200)):
            pf.lightning_checkpoint(root, e, s)
        self.write_policy(root, "[compress]\nolder_than_newest = 1\nlevel = \"max\"\n")
        original = pf.tree(root)["epoch=0-step=100.ckpt"]
        events, summary = apply(root)
        self.assertEqual(summary["failed"], 0, events)
        self.assertEqual(self.entries(root, r"^epoch"), ["epoch=0-step=100.ckpt.ckz",
                                                       "epoch=1-step=200.ckpt"])
        out = subprocess.run([CKPTOOL, "decompress", os.path.join(root, "epoch=0-step=100.ckpt.ckz"),
                              "-c"], capture_output=True, check=True).stdout
        self.assertEqual(out, original)
        self.assertSecondRunDoesNothing(root)


class CompressKillTest(KillTestBase, PolicyTestCase):
    """Killed anywhere in a pass that compresses: the checkpoint is always there under one of
    its names, and the resumed run ends as an uninterrupted one (archives compared by what
    they restore)."""
    moments = (0.3, 0.6, 0.9)

    def build(self, root):
        for s in (100, 200, 300, 400):
            pf.hf_checkpoint(root, s, best=400)
        self.write_policy(root, HF_COMPRESS_POLICY)

    def tree(self, root):
        return unpacked_tree(self, root)


class LightningTest(PolicyTestCase):
    def test_lightning_files_and_last_symlink(self):
        root = self.path("ckpts")
        os.makedirs(root)
        for epoch, step in enumerate((900, 1000, 1100, 1200)):
            pf.lightning_checkpoint(root, epoch, step)
        os.symlink("epoch=0-step=900.ckpt", os.path.join(root, "last.ckpt"))
        self.write_policy(root, """
[retention]
keep_last = 2
[shrink]
[convert]
dtype = "fp16"
[export]
dtype = "bf16"
[strip]
older_than_newest = 1
[verify]
""")
        expected = self.prune_plan(root, "--keep-last", "2")
        self.assertEqual(expected, ["epoch=0-step=900.ckpt", "epoch=2-step=1100.ckpt",
                                    "epoch=3-step=1200.ckpt"])
        events, summary = apply(root)
        self.assertEqual(summary["failed"], 0, events)
        self.assertEqual(self.entries(root, r"step="), expected + [])
        # The fp16 copies live in ROOT/fp16 and went with their checkpoint.
        self.assertEqual(sorted(os.listdir(os.path.join(root, "fp16"))), expected)
        for name in expected:
            obj = torch.load(os.path.join(root, name))
            self.assertEqual("optimizer_states" in obj, name.startswith("epoch=3"), name)
            half = torch.load(os.path.join(root, "fp16", name))
            self.assertEqual(half["state_dict"]["layer.0.weight"].dtype, torch.float16)
            # export picks the state_dict; its default place for a file is export/<stem>/.
            _, tensors = read_safetensors(self, os.path.join(root, "export", name[:-5], "model.safetensors"))
            self.assertEqual(sorted(tensors), sorted(obj["state_dict"]))
            self.assertEqual(tensors["layer.0.weight"][0], "BF16")
        self.assertEqual(os.readlink(os.path.join(root, "last.ckpt")), "epoch=0-step=900.ckpt")
        self.assertSecondRunDoesNothing(root)
        # The next epoch: 1100 goes, with its fp16 copy.
        pf.lightning_checkpoint(root, 4, 1300)
        events, _ = apply(root)
        self.assertEqual(steps_of(events, "delete"), [("epoch=2-step=1100.ckpt", "retention")])
        delete = [e for e in events if e["event"] == "delete"][0]
        self.assertEqual(delete["outputs"], ["fp16/epoch=2-step=1100.ckpt", "export/epoch=2-step=1100"])
        self.assertEqual(sorted(os.listdir(os.path.join(root, "fp16"))),
                         ["epoch=0-step=900.ckpt", "epoch=3-step=1200.ckpt", "epoch=4-step=1300.ckpt"])
        self.assertEqual(sorted(os.listdir(os.path.join(root, "export"))),
                         ["epoch=0-step=900", "epoch=3-step=1200", "epoch=4-step=1300"])
        self.assertSecondRunDoesNothing(root)

    def test_a_file_open_for_writing_is_not_complete(self):
        root = self.path("ckpts")
        os.makedirs(root)
        pf.lightning_checkpoint(root, 0, 100)
        self.write_policy(root, "[shrink]\n")
        with open(os.path.join(root, "epoch=0-step=100.ckpt"), "ab"):
            events, summary = apply(root)
            self.assertEqual(summary["steps"], 0)
            self.assertRegex([e for e in events if e["event"] == "wait"][0]["message"],
                             r"epoch=0-step=100.ckpt is open for writing by pid \d+")
        events, summary = apply(root)
        self.assertEqual(summary["steps"], 1)


class DeepSpeedTest(PolicyTestCase):
    def test_zero_folders_and_latest(self):
        root = self.path("ds")
        os.makedirs(root)
        for step in (10, 20, 30):
            pf.deepspeed_checkpoint(root, step)
        pf.deepspeed_checkpoint(root, 40, latest=False)  # rank files there, latest not yet
        self.write_policy(root, """
[retention]
keep_last = 1
keep_every = 20
[shrink]
[export]
dtype = "bf16"
[verify]
[strip]
older_than_newest = 1
delete_files = true
""")
        events, summary = apply(root)
        self.assertEqual(summary["failed"], 0, events)
        self.assertEqual(summary["waiting"], 1)
        wait = [e for e in events if e["event"] == "wait"][0]
        self.assertEqual(wait["checkpoint"], "global_step40")
        self.assertIn("DeepSpeed's 'latest' names 'global_step30'", wait["message"])
        # keep_last 1 + multiples of 20 + what latest names; 40 is not complete: not counted.
        self.assertEqual(self.entries(root, r"^global_step"), ["global_step20", "global_step30", "global_step40"])
        self.assertEqual(pf.ledger_steps(root), {"global_step20": ["export", "shrink", "strip", "verify"],
                                                 "global_step30": ["export", "shrink", "verify"]})
        # The consolidated model, exported before strip deleted the optimizer files.
        _, tensors = read_safetensors(self, os.path.join(root, "global_step20", "export", "model.safetensors"))
        # every floating tensor bf16; integer buffers keep their type, as zero_to_fp32 keeps them
        self.assertEqual({k: dt for k, (dt, _) in tensors.items() if dt != "BF16"}, {"embed.position_ids": "I64"})
        self.assertEqual([f for f in os.listdir(os.path.join(root, "global_step20")) if "optim" in f], [])
        self.assertTrue([f for f in os.listdir(os.path.join(root, "global_step30")) if "optim" in f])
        self.assertSecondRunDoesNothing(root)
        # DeepSpeed writes latest: 40 completes; 30 ages (strip) and is deleted by retention? No:
        # 30 is not a multiple of 20 and no longer newest: retention deletes it.
        with open(os.path.join(root, "latest"), "w") as f:
            f.write("global_step40")
        expected = self.prune_plan(root, "--keep-last", "1", "--keep-every", "20")
        events, _ = apply(root)
        self.assertEqual(self.entries(root, r"^global_step"), expected)
        self.assertEqual(expected, ["global_step20", "global_step40"])
        self.assertSecondRunDoesNothing(root)


class MegatronDcpTest(PolicyTestCase):
    def test_torch_dist_folders_and_tracker(self):
        root = self.path("megatron")
        os.makedirs(root)
        for it in (100, 200):
            pf.megatron_checkpoint(root, it)
        pf.megatron_checkpoint(root, 300, tracker=False)  # written; the tracker still says 200
        os.makedirs(os.path.join(root, "iter_0000400"))
        pf.dcp_fixtures.make_megatron_checkpoint(os.path.join(root, "iter_0000400"), seed=4)
        os.remove(os.path.join(root, "iter_0000400", ".metadata"))  # coordinator not done yet
        self.write_policy(root, """
[retention]
keep_last = 1
[export]
[verify]
[strip]
older_than_newest = 0
""")
        events, summary = apply(root)
        self.assertEqual(summary["failed"], 0, events)
        waits = {e["checkpoint"]: e["message"] for e in events if e["event"] == "wait"}
        self.assertIn("latest_checkpointed_iteration.txt says '200', not 300 or later", waits["iter_0000300"])
        self.assertIn("latest_checkpointed_iteration.txt says '200', not 400 or later", waits["iter_0000400"])
        self.assertEqual(self.entries(root, r"^iter_"), ["iter_0000200", "iter_0000300", "iter_0000400"])
        self.assertEqual(pf.ledger_steps(root), {"iter_0000200": ["export", "strip", "verify"]})
        _, tensors = read_safetensors(self, os.path.join(root, "iter_0000200", "export", "model.safetensors"))
        self.assertIn("embedding.word_embeddings.weight", tensors)
        self.assertFalse([t for t in tensors if "optimizer" in t])
        # strip (older_than_newest = 0) took the optimizer state out of the DCP folder itself.
        doc = json.loads(run("inspect", "--json", os.path.join(root, "iter_0000200")).stdout)
        self.assertNotIn("optimizer.state", json.dumps(doc))
        self.assertSecondRunDoesNothing(root)
        # The tracker moves on to 400 (Megatron wrote iter_0000300 completely, so 300 is
        # complete); iter_0000400 still lacks its .metadata: left alone, not counted.
        with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write("400")
        events, summary = apply(root)
        waits = {e["checkpoint"]: e["message"] for e in events if e["event"] == "wait"}
        self.assertIn("iter_0000400: .distcp files without .metadata (not written yet)", waits["iter_0000400"])
        self.assertEqual(self.entries(root, r"^iter_"), ["iter_0000300", "iter_0000400"])
        self.assertEqual(pf.ledger_steps(root), {"iter_0000300": ["export", "strip", "verify"]})
        self.assertSecondRunDoesNothing(root)


class PolicyFileTest(PolicyTestCase):
    def test_check_validates_and_touches_nothing(self):
        root = self.path("run")
        pf.hf_checkpoint(root, 100)
        self.write_policy(root, HF_POLICY)
        before = pf.tree(root)
        p = run("apply", "--check", root)
        self.assertIn("valid policy", p.stdout)
        self.assertIn("strip:", p.stdout)
        doc = json.loads(run("apply", "--check", "--json", root).stdout)
        self.assertEqual([s["step"] for s in doc["steps"]], ["shrink", "convert", "export", "verify", "strip"])
        self.assertEqual(pf.tree(root), before)
        self.assertFalse(os.path.exists(os.path.join(root, ".ckptool")))

    def test_errors_name_file_line_and_key(self):
        root = self.path("run")
        os.makedirs(root)
        bad = self.write_policy(root, "[retention]\nkeep_last = 0\n[shrink]\npattern = [\"*.pt\"]\n", "bad.toml")
        p = run("apply", "--check", "--policy", bad, root, expect=1)
        self.assertEqual(p.stderr.splitlines(), [
            f"ckptool: error: {bad}:2:13: retention.keep_last: must be an integer >= 1 (got 0)",
            f"ckptool: error: {bad}:4:1: shrink.pattern: unknown key (did you mean 'patterns'? "
            "known: patterns, materialize, allow_unsafe_globals)"])
        # apply refuses it the same way, before touching anything.
        p = run("apply", "--policy", bad, root, expect=1)
        self.assertIn("retention.keep_last", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(root, ".ckptool")))
        p = run("apply", root, expect=1)
        self.assertIn("no policy: put a ckptool.toml there or give --policy FILE", p.stderr)

    def test_compress_step_is_validated(self):
        root = self.path("run")
        pf.hf_checkpoint(root, 100)
        self.write_policy(root, "[compress]\nolder_than_newest = 2\nlevel = \"max\"\n"
                                "keep_original = true\n")
        doc = json.loads(run("apply", "--check", root, "--json").stdout)
        self.assertEqual(doc["steps"], [{"step": "compress", "options": {
            "level": "max", "keep_original": True, "older_than_newest": 2}}])
        self.assertFalse(os.path.exists(os.path.join(root, ".ckptool")))
        self.write_policy(root, "[compress]\nlevel = \"fastest\"\nkeep_original = 1\n")
        p = run("apply", "--check", root, expect=1)
        self.assertIn(':2:9: compress.level: must be one of "fast", "max" (got "fastest")', p.stderr)
        self.assertIn(":3:17: compress.keep_original: must be true or false", p.stderr)

    def test_one_run_at_a_time(self):
        root = self.path("run")
        pf.hf_checkpoint(root, 100)
        self.write_policy(root, "[verify]\n")
        import fcntl
        os.makedirs(os.path.join(root, ".ckptool"))
        with open(os.path.join(root, ".ckptool", "lock"), "w") as lock:
            lock.write("pid 4242\n")
            lock.flush()
            fcntl.flock(lock, fcntl.LOCK_EX)
            p = run("apply", root, "--settle", "0", expect=1)
            self.assertIn("another ckptool apply or watch (pid 4242) is working on this folder", p.stderr)


class DeletionNeedsConsentTest(PolicyTestCase):
    """Retention deletes only with --yes, or `delete = true` in [retention]; otherwise apply
    keeps the checkpoints and says what it would delete (as prune does without --yes)."""

    def test_no_deletion_without_yes(self):
        root = self.path("hf")
        os.makedirs(root)
        for s in (100, 200, 300):
            pf.hf_checkpoint(root, s)
        self.write_policy(root, "[retention]\nkeep_last = 1\n")
        p = run("apply", root, "--settle", "0")
        self.assertEqual(sorted(os.listdir(root)),
                         [".ckptool", "checkpoint-100", "checkpoint-200", "checkpoint-300", "ckptool.toml"])
        self.assertIn("2 checkpoints retention would delete, kept: deleting needs --yes", p.stdout)
        events, _ = apply(root)  # --yes
        self.assertEqual(sorted(e["checkpoint"] for e in events if e["event"] == "delete"),
                         ["checkpoint-100", "checkpoint-200"])
        self.assertNotIn("checkpoint-200", os.listdir(root))

    def test_the_policy_can_say_so(self):
        root = self.path("hf")
        os.makedirs(root)
        for s in (100, 200):
            pf.hf_checkpoint(root, s)
        self.write_policy(root, "[retention]\nkeep_last = 1\ndelete = true\n")
        run("apply", root, "--settle", "0")
        self.assertNotIn("checkpoint-100", os.listdir(root))
