"""The package's jobs are real functions of this process: what a job says comes back to the
caller (its Result, warnings, exceptions) and never through the process's stdout or stderr, so
another thread's prints all arrive; jobs in two threads run at once, each with its own progress
callback and report; Ctrl-C stops a job within a fraction of a second, removes what it had
started to write and raises KeyboardInterrupt, the input untouched.

Each case runs in a child Python (the package the build made, CKPT_PYTHON_PACKAGE) whose own
stdout and stderr are what is checked. Checkpoints are written by the real torch 2.13."""
import json
import os
import subprocess
import sys
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from stacklib import PACKAGE, TempDirTest  # noqa: E402

sys.path.insert(0, PACKAGE)

import torch  # noqa: E402


def child(script, *args, timeout=300):
    """Runs `script` in a fresh Python with the package on its path; returns (stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=PACKAGE, PYTHONWARNINGS="default")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise AssertionError(f"child failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout, p.stderr


def save_random(path, numel, seed=0):
    g = torch.Generator().manual_seed(seed)
    torch.save({"w": torch.randn(numel, generator=g), "step": 7}, path)


class JobsTest(TempDirTest):
    def test_another_threads_prints_all_arrive(self):
        src = os.path.join(self.tmp, "a.pt")
        save_random(src, 1 << 20)
        out, err = child("""
            import os, sys, threading, time
            import ckptool
            src, tmp = sys.argv[1], sys.argv[2]
            printed = threading.Event()
            def printer():
                for i in range(50):
                    print(f"line {i}", flush=True)
                    print(f"err {i}", file=sys.stderr, flush=True)
                    time.sleep(0.002)
                printed.set()
            t = threading.Thread(target=printer)
            t.start()
            runs = 0
            while not printed.is_set() or runs == 0:
                r = ckptool.convert(src, output=os.path.join(tmp, f"b{runs}.pt"), dtype="bf16")
                assert r.ok and r.report["files"][0]["converted_tensors"] == 1, r.report
                runs += 1
            t.join()
            print(f"runs {runs}")
        """, src, self.tmp)
        lines = out.splitlines()
        self.assertEqual([ln for ln in lines if ln.startswith("line ")],
                         [f"line {i}" for i in range(50)])
        self.assertEqual([ln for ln in err.splitlines() if ln.startswith("err ")],
                         [f"err {i}" for i in range(50)])
        # The jobs' own words went into their Results, none to the process's streams.
        self.assertEqual(len(lines), 51, out)
        self.assertTrue(lines[-1].startswith("runs "), out)
        self.assertNotIn("ckptool", out + err)

    def test_two_jobs_in_two_threads_run_at_once(self):
        for name, seed in (("a.pt", 1), ("b.pt", 2)):
            save_random(os.path.join(self.tmp, name), 1 << 20, seed)
        out, _ = child("""
            import json, os, sys, threading, time
            import ckptool
            tmp = sys.argv[1]
            calls = {"a": [], "b": []}
            results = {}
            def job(name):
                def progress(label, files, done, total):
                    calls[name].append((time.monotonic(), done, total))
                results[name] = ckptool.compress(
                    os.path.join(tmp, name + ".pt"), output=os.path.join(tmp, name + ".ckz"),
                    level="max", threads=1, progress=progress).report
            threads = [threading.Thread(target=job, args=(n,)) for n in ("a", "b")]
            for t in threads: t.start()
            for t in threads: t.join()
            print(json.dumps({"calls": calls, "results": results}))
        """, self.tmp)
        got = json.loads(out)
        calls, results = got["calls"], got["results"]
        for name in ("a", "b"):
            size = os.path.getsize(os.path.join(self.tmp, name + ".pt"))
            self.assertEqual(results[name]["files"][0]["input"],
                             os.path.join(self.tmp, name + ".pt"))
            # Each job's callback saw its own job only.
            self.assertTrue(calls[name], name)
            self.assertTrue(all(total == size for _, _, total in calls[name]), calls[name])
        # Side by side: each job reported progress while the other was still running (one at a
        # time, every call of one would come before every call of the other).
        a = [t for t, _, _ in calls["a"]]
        b = [t for t, _, _ in calls["b"]]
        self.assertLess(min(a), max(b))
        self.assertLess(min(b), max(a))
        for name in ("a", "b"):
            back = os.path.join(self.tmp, name + ".back.pt")
            subprocess.run([os.environ["CKPTOOL"], "decompress", os.path.join(self.tmp, name + ".ckz"),
                            "-o", back], check=True, capture_output=True)
            with open(back, "rb") as f1, open(os.path.join(self.tmp, name + ".pt"), "rb") as f2:
                self.assertEqual(f1.read(), f2.read())

    def test_ctrl_c_stops_the_job_and_leaves_nothing(self):
        src = os.path.join(self.tmp, "a.pt")
        save_random(src, 8 << 20)  # 32 MiB: compress --level max -j 1 takes seconds
        before = os.stat(src)
        out, _ = child("""
            import json, os, signal, sys, threading, time
            import ckptool
            src, tmp = sys.argv[1], sys.argv[2]
            raised = {}
            def fire():
                raised["at"] = time.monotonic()
                signal.raise_signal(signal.SIGINT)
            threading.Timer(0.5, fire).start()
            start = time.monotonic()
            try:
                ckptool.compress(src, output=os.path.join(tmp, "out", "a.ckz"), level="max",
                                 threads=1)
                print(json.dumps({"finished_in": time.monotonic() - start}))
            except KeyboardInterrupt:
                print(json.dumps({"stopped_after": time.monotonic() - raised["at"],
                                  "left": sorted(os.listdir(tmp))}))
        """, src, self.tmp)
        got = json.loads(out)
        self.assertIn("stopped_after", got, "the job ran to its end instead")
        # "Within a fraction of a second" (measured 0.17 s): 2 s leaves room for a loaded machine
        # and still fails a job that runs on to its end (seconds more).
        self.assertLess(got["stopped_after"], 2.0)
        self.assertEqual(got["left"], ["a.pt"])  # no archive, no temp file, no folder made
        after = os.stat(src)
        self.assertEqual((before.st_size, before.st_mtime_ns), (after.st_size, after.st_mtime_ns))

    def test_job_messages_are_warnings_and_exceptions_not_output(self):
        src = os.path.join(self.tmp, "a.pt")
        torch.save({"model": {"w": torch.ones(3)}, "step": 7}, src)
        out, err = child("""
            import os, sys, warnings
            import ckptool
            src, tmp = sys.argv[1], sys.argv[2]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                r = ckptool.export(src, output=os.path.join(tmp, "m.safetensors"),
                                   strip_prefix=["nothing."])
            assert r.ok, r.report
            assert caught and all(issubclass(w.category, ckptool.CheckpointWarning)
                                  for w in caught), caught
            assert any("nothing." in str(w.message) for w in caught), [str(w.message)
                                                                      for w in caught]
            try:
                ckptool.convert(os.path.join(tmp, "missing.pt"), output=os.path.join(tmp, "c.pt"),
                                dtype="bf16")
                raise SystemExit("no error")
            except ckptool.JobFailed as e:
                assert "missing.pt" in str(e), str(e)
            try:
                ckptool.compress(src, stdout=True)
                raise SystemExit("no error")
            except ckptool.UsageError as e:
                assert "output" in str(e), str(e)
            print("ok")
        """, src, self.tmp)
        self.assertEqual(out, "ok\n")
        self.assertEqual(err, "")


if __name__ == "__main__":
    unittest.main()
