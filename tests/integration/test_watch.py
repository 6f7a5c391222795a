"""`ckptool watch` beside a simulated trainer that writes checkpoints slowly (files growing
piece by piece, the framework's marker written last after a pause longer than the settle
time) and deletes an old checkpoint under it: nothing is processed before it is complete,
every complete checkpoint is processed once, retention ends equal to prune's plan, and SIGTERM
ends it with exit 0 and no step half done."""
import datetime
import json
import os
import shutil
import signal
import subprocess
import threading
import time

import policy_fixtures as pf
from ckpt_testlib import CKPTOOL, CkptTestCase, run

POLICY = """
[retention]
keep_last = 2
[shrink]
[verify]
[strip]
older_than_newest = 1
delete_files = true
"""


def parse_time(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


class Watch:
    """ckptool watch as a child process; its JSON lines collected by a thread."""

    def __init__(self, root, *args):
        self.p = subprocess.Popen([CKPTOOL, "watch", root, "--json", "--yes", "-j", "1", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            with self.lock:
                self.events.append(json.loads(line))

    def snapshot(self):
        with self.lock:
            return list(self.events)

    def wait_for(self, predicate, timeout=90):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate(self.snapshot()):
                return True
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        return False

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        err = self.p.stderr.read()
        rc = self.p.wait(timeout=60)
        self.reader.join(timeout=10)
        self.p.stdout.close()
        self.p.stderr.close()
        return rc, err


def steps_done(events):
    return [(e["checkpoint"], e["step"]) for e in events if e["event"] == "step"]


class WatchTest(CkptTestCase):
    def check_run(self, root, watch, marker_times, expected_names, want_steps, deleted_by_trainer=()):
        ok = watch.wait_for(lambda ev: sorted(set(steps_done(ev))) == sorted(want_steps))
        events = watch.snapshot()
        self.assertTrue(ok, f"not every checkpoint was processed: {steps_done(events)}\n"
                            f"{json.dumps(events, indent=1)}")
        time.sleep(0.5)  # nothing more should come
        rc, err = watch.stop()
        events = watch.snapshot()
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "")
        self.assertIn("stopping on SIGTERM", events[-1]["message"])
        # Nothing processed before it was complete (its marker written), no step failed, no
        # checkpoint seen changing after it was processed.
        for e in events:
            self.assertNotIn(e["event"], ("changed", "resume"), e)
            if e["event"] == "failed":
                # Only a step racing the trainer's own deletion of that very checkpoint.
                self.assertIn(e["checkpoint"], deleted_by_trainer, e)
                self.assertFalse(os.path.exists(os.path.join(root, e["checkpoint"])))
            if e["event"] == "step":
                self.assertGreaterEqual(parse_time(e["time"]), marker_times[e["checkpoint"]] - 0.002, e)
        # Each step once per checkpoint.
        done = steps_done(events)
        self.assertEqual(len(done), len(set(done)), done)
        self.assertEqual(sorted(done), sorted(want_steps))
        # Retention ends as prune would plan it: nothing left for prune to delete.
        names = sorted(n for n in os.listdir(root) if n.startswith(("checkpoint-", "global_step")))
        self.assertEqual(names, expected_names)
        doc = json.loads(run("prune", root, "--json", "--keep-last", "2").stdout)
        self.assertTrue(all(e["keep"] for e in doc["entries"]), doc)
        ledger = pf.ledger(root)
        self.assertFalse(any("running" in c for c in ledger["checkpoints"].values()))
        self.assertEqual(sorted(ledger["checkpoints"]), expected_names)
        return events

    def test_hf_trainer_writing_slowly(self):
        root = self.path("run")
        os.makedirs(root)
        with open(os.path.join(root, "ckptool.toml"), "w") as f:
            f.write(POLICY)
        watch = Watch(root, "--settle", "0.6", "--rescan", "30")
        marker_times = {}
        steps = (100, 200, 300, 400)
        for s in steps:
            # Files grow in 3 pieces; then a pause longer than the settle time; then the marker.
            pf.hf_checkpoint(root, s, pieces=3, pause=0.15, marker=False)
            time.sleep(0.9)
            marker_times[f"checkpoint-{s}"] = time.time()
            pf.hf_marker(root, s)
            if s == 300:
                # The trainer's own rotation deletes checkpoint-100 under the watcher (which
                # may be deleting it too).
                shutil.rmtree(os.path.join(root, "checkpoint-100"), ignore_errors=True)
            time.sleep(0.3)
        want = [(f"checkpoint-{s}", step) for s in steps for step in ("shrink", "verify")]
        want += [("checkpoint-300", "strip")]
        # checkpoint-100 and 200 may have been deleted before they aged into strip; if 200 was
        # still there when 300 completed it was stripped too.
        def settled(ev):
            d = steps_done(ev)
            base = all(w in d for w in want)
            return base and not os.path.exists(os.path.join(root, "checkpoint-200"))

        self.assertTrue(watch.wait_for(settled), json.dumps(watch.snapshot(), indent=1))
        done = steps_done(watch.snapshot())
        want = sorted(set(want) | {d for d in done if d[1] == "strip"})
        events = self.check_run(root, watch, marker_times, ["checkpoint-300", "checkpoint-400"], want,
                                deleted_by_trainer=("checkpoint-100",))
        # The newest keeps its optimizer state; the older kept one was stripped.
        self.assertTrue(os.path.exists(os.path.join(root, "checkpoint-400", "optimizer.pt")))
        self.assertFalse(os.path.exists(os.path.join(root, "checkpoint-300", "optimizer.pt")))
        waits = [e for e in events if e["event"] == "wait"]
        self.assertTrue(any("trainer_state.json is not written yet" in e["message"] for e in waits), waits)

    def test_deepspeed_latest_written_last_with_rescans_only(self):
        stage = self.path("stage")  # rank files made here, then copied in slowly
        root = self.path("run")
        os.makedirs(root)
        with open(os.path.join(root, "ckptool.toml"), "w") as f:
            f.write(POLICY)
        watch = Watch(root, "--settle", "0.5", "--rescan", "0.3", "--no-inotify")
        marker_times = {}
        for s in (10, 20, 30):
            pf.deepspeed_checkpoint(stage, s)
            src = os.path.join(stage, f"global_step{s}")
            dst = os.path.join(root, f"global_step{s}")
            os.makedirs(dst)
            for name in sorted(os.listdir(src)):
                with open(os.path.join(src, name), "rb") as f:
                    pf.write_slowly(os.path.join(dst, name), f.read(), pieces=2, pause=0.1)
            time.sleep(0.8)
            marker_times[f"global_step{s}"] = time.time()
            with open(os.path.join(root, "latest"), "w") as f:
                f.write(f"global_step{s}")
            time.sleep(0.2)
        want = [(f"global_step{s}", step) for s in (10, 20, 30) for step in ("shrink", "verify")]
        self.assertTrue(watch.wait_for(lambda ev: all(w in steps_done(ev) for w in want) and
                                       not os.path.exists(os.path.join(root, "global_step10"))),
                        json.dumps(watch.snapshot(), indent=1))
        done = steps_done(watch.snapshot())
        want = sorted(set(want) | {d for d in done if d[1] == "strip"})
        self.assertIn(("global_step20", "strip"), want)
        events = self.check_run(root, watch, marker_times, ["global_step20", "global_step30"], want)
        self.assertIn("inotify off", events[0]["message"])
