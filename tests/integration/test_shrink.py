"""`ckptool shrink` on real torch checkpoints, checked with real torch.load."""
import json
import os
import re
import resource
import shutil
import signal
import stat
import zipfile

import torch

from ckpt_testlib import (CkptTestCase, assert_same_aliasing, assert_same_object,
                          assert_torch_layout, inspect, read_bytes, run)
from shrink_fixtures import clean, deepspeed_like


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def listing(folder):
    return sorted(os.listdir(folder))


class ShrinkTest(CkptTestCase):
    def shrink_and_compare(self, name, obj, **save_kwargs):
        p = self.path(name)
        torch.save(obj, p, **save_kwargs)
        before = inspect(p)
        original = torch.load(p)
        run("shrink", p)
        after = inspect(p)
        shrunk = torch.load(p)
        assert_same_object(self, original, shrunk)
        assert_same_aliasing(self, original, shrunk)
        assert_torch_layout(self, p)
        run("verify", p)
        self.assertEqual(after["format"], "torch-zip")
        self.assertEqual(after["wasted_bytes"], 0)
        self.assertEqual(after["storage_bytes"], before["used_bytes"])
        self.assertLessEqual(after["metadata_bytes"], before["metadata_bytes"] * 1.5 + 4096)
        self.assertLess(after["file_bytes"], before["file_bytes"])
        return before, after

    def test_deepspeed_like_zip(self):
        before, after = self.shrink_and_compare("mp_rank_00_model_states.pt", deepspeed_like())
        self.assertGreater(before["wasted_bytes"], before["used_bytes"] // 2)

    def test_protocol_4_and_legacy_inputs(self):
        self.shrink_and_compare("p4.pt", deepspeed_like(seed=2), pickle_protocol=4)
        self.shrink_and_compare("legacy.pt", deepspeed_like(seed=3), _use_new_zipfile_serialization=False)

    def test_weights_only_still_loads(self):
        obj = deepspeed_like(seed=4, with_python_objects=False)
        p = self.path("wo.pt")
        torch.save(obj, p)
        torch.load(p, weights_only=True)  # the input loads with weights_only...
        run("shrink", p)
        shrunk = torch.load(p, weights_only=True)  # ...so the output must too
        assert_same_object(self, obj, shrunk)
        self.assertIsInstance(shrunk["module"]["param"], torch.nn.Parameter)

    def test_tied_weights_stay_one_tensor(self):
        p = self.path("tied.pt")
        torch.save(deepspeed_like(seed=5), p)
        run("shrink", p)
        m = torch.load(p)["module"]
        self.assertIs(m["head.w"], m["layers.0.w"])
        self.assertEqual(m["layers.0.w_t"].storage().data_ptr(), m["layers.0.w"].storage().data_ptr())
        m["overlap.a"][60] = 123.0  # overlap.b[10] is the same element
        self.assertEqual(m["overlap.b"][10].item(), 123.0)

    def test_nothing_to_drop_leaves_file_untouched(self):
        p = self.path("clean.pt")
        torch.save(clean(), p)
        with open(p, "rb") as f:
            data = f.read()
        mtime = os.stat(p).st_mtime_ns
        out = run("shrink", "-d", p).stdout
        self.assertIn("saved 0 B", out)
        with open(p, "rb") as f:
            self.assertEqual(f.read(), data)
        self.assertEqual(os.stat(p).st_mtime_ns, mtime)

    def test_output_is_deterministic_and_dry_run_exact(self):
        p = self.path("ds.pt")
        torch.save(deepspeed_like(seed=6), p)
        with open(p, "rb") as f:
            original = f.read()
        dry = json.loads(run("shrink", "--dry-run", "--json", p).stdout)
        with open(p, "rb") as f:
            self.assertEqual(f.read(), original, "--dry-run must not write")
        self.assertEqual(listing(self.tmp), ["ds.pt"])
        run("shrink", "--output-dir", self.path("a"), p)
        run("shrink", "--output-dir", self.path("b"), p)
        with open(p, "rb") as f:
            self.assertEqual(f.read(), original, "--output-dir must leave the original alone")
        with open(self.path("a/ds.pt"), "rb") as f:
            a = f.read()
        with open(self.path("b/ds.pt"), "rb") as f:
            b = f.read()
        self.assertEqual(a, b)
        self.assertEqual(dry["files"][0]["after"], len(a))
        self.assertEqual(dry["after"], len(a))
        run("shrink", p)  # in place gives the same bytes
        with open(p, "rb") as f:
            self.assertEqual(f.read(), a)

    def test_checkpoint_dir_with_patterns_like_the_reference(self):
        d = self.path("global_step10")
        os.makedirs(d)
        torch.save(deepspeed_like(seed=7), os.path.join(d, "layer_01-model_00-model_states.pt"))
        torch.save(deepspeed_like(seed=8), os.path.join(d, "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
        torch.save(deepspeed_like(seed=9), os.path.join(d, "other.pt"))
        with open(os.path.join(d, "latest"), "w") as f:
            f.write("global_step10")
        sizes = {n: os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)}
        out = run("shrink", "--checkpoint_dir", self.tmp, "--patterns", "layer*pt", "zero*pt", "-d").stdout
        lines = out.strip().splitlines()
        self.assertEqual(len(lines), 3, out)
        for line in lines[:2]:
            self.assertRegex(line, r": before \d+\.\d\dMiB, after \d+\.\d\dMiB, saved \d+\.\d\dMiB$")
        self.assertRegex(lines[-1], r"^Done\. Before \d+\.\d\dMiB, after \d+\.\d\dMiB, saved \d+\.\d\dMiB$")
        self.assertEqual(os.path.getsize(os.path.join(d, "other.pt")), sizes["other.pt"])
        self.assertLess(os.path.getsize(os.path.join(d, "layer_01-model_00-model_states.pt")),
                        sizes["layer_01-model_00-model_states.pt"])
        before, after = map(float, re.findall(r"Before ([\d.]+)MiB, after ([\d.]+)MiB", lines[-1])[0])
        self.assertGreater(before, after)

    def test_in_place_keeps_mode_and_leaves_no_temp_files(self):
        p = self.path("m.pt")
        torch.save(deepspeed_like(seed=10), p)
        os.chmod(p, 0o640)
        run("shrink", p)
        self.assertEqual(stat.S_IMODE(os.stat(p).st_mode), 0o640)
        self.assertEqual(listing(self.tmp), ["m.pt"])

    def test_full_disk_leaves_the_original_intact(self):
        p = self.path("big.pt")
        torch.save(deepspeed_like(seed=11, hidden=128), p)
        with open(p, "rb") as f:
            original = f.read()
        limit = len(original) // 4

        def small_fs():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        import subprocess
        from ckpt_testlib import CKPTOOL
        r = subprocess.run([CKPTOOL, "shrink", p], capture_output=True, text=True, preexec_fn=small_fs)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("ckptool: error: ", r.stderr)
        with open(p, "rb") as f:
            self.assertEqual(f.read(), original)
        self.assertEqual(listing(self.tmp), ["big.pt"])

    def test_unwritable_output_location_fails_cleanly(self):
        p = self.path("m.pt")
        torch.save(deepspeed_like(seed=12), p)
        blocker = self.path("blocker")
        with open(blocker, "w") as f:
            f.write("a file, not a folder")
        r = run("shrink", "--output-dir", os.path.join(blocker, "out"), p, expect=None)
        self.assertNotEqual(r.returncode, 0)
        self.assertTrue(os.path.exists(p))
        torch.load(p)

    def test_hostile_file_is_not_laundered(self):
        marker = self.path("pwned")
        p = self.path("evil.pt")
        obj = deepspeed_like(seed=13)
        obj["payload"] = Evil(marker)
        torch.save(obj, p)
        with open(p, "rb") as f:
            original = f.read()
        r = run("shrink", p, expect=1)
        self.assertIn("posix.system", r.stderr)
        self.assertIn("--allow-unsafe-globals", r.stderr)
        with open(p, "rb") as f:
            self.assertEqual(f.read(), original)
        run("shrink", "--allow-unsafe-globals", p)
        self.assertIn("posix.system", inspect(p)["unsafe_globals"])  # still flagged after
        self.assertFalse(os.path.exists(marker))

    def test_json_report(self):
        p = self.path("j.pt")
        torch.save(deepspeed_like(seed=14), p)
        doc = json.loads(run("shrink", "--json", p).stdout)
        f = doc["files"][0]
        self.assertEqual(f["after"], os.path.getsize(p))
        self.assertEqual(f["saved"], f["before"] - f["after"])
        self.assertTrue(f["rewritten"])
        self.assertEqual(doc["saved"], f["saved"])

    def test_materialize_lays_out_lone_strided_views(self):
        from ckpt_testlib import tensor_bytes, walk_tensors
        p = self.path("m.pt")
        torch.save(deepspeed_like(seed=16), p)
        original = torch.load(p)
        size_plain = inspect(p)["used_bytes"]
        run("shrink", "--materialize", p)
        shrunk = torch.load(p)
        a, b = walk_tensors(original), walk_tensors(shrunk)
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertEqual(tensor_bytes(a[name]), tensor_bytes(b[name]), name)
            self.assertEqual(a[name].shape, b[name].shape, name)
        self.assertFalse(a["module.strided"].is_contiguous())
        self.assertTrue(b["module.strided"].is_contiguous())
        # A view that aliases another keeps its layout: it is not a lone view.
        self.assertEqual(b["module.layers.0.w_t"].stride(), a["module.layers.0.w_t"].stride())
        self.assertEqual(b["module.layers.0.w_t"].storage().data_ptr(),
                         b["module.layers.0.w"].storage().data_ptr())
        self.assertLess(inspect(p)["storage_bytes"], size_plain)
        run("verify", p)

    def test_small_gaps_stay_in_one_storage(self):
        # Views of 32 floats with 32 unused floats between them: cutting every gap would cost
        # more zip records and pickle than the gaps hold (the file once grew 11% this way).
        flat = torch.randn(2000 * 64)
        sd = {f"layer.{i}.weight": flat[i * 64:i * 64 + 32] for i in range(2000)}
        p = self.path("gaps.pt")
        torch.save(sd, p)
        before = os.path.getsize(p)
        run("shrink", p)
        self.assertLessEqual(os.path.getsize(p), before)
        self.assertEqual(len(inspect(p)["storages"]), 1)
        assert_same_object(self, sd, torch.load(p))
        assert_same_aliasing(self, sd, torch.load(p))

    def rezip_deflated(self, src, dst):
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                zout.writestr(info.filename, zin.read(info.filename))

    def test_never_bigger_than_the_input(self):
        # A deflated file (torch.load reads them) whose storage is mostly zeros: cutting the
        # unused half still writes the used half uncompressed, which is bigger than all of it
        # deflated. The file is left as it is, and the report says why.
        buf = torch.zeros(1 << 18)
        sd = {"w": buf[: 1 << 17]}
        plain = self.path("plain.pt")
        torch.save(sd, plain)
        p = self.path("deflated.pt")
        self.rezip_deflated(plain, p)
        data = read_bytes(p)
        out = run("shrink", "-d", p).stdout
        self.assertIn("left as it is", out)
        self.assertIn("saved 0 B", out)
        self.assertEqual(read_bytes(p), data)
        # To another folder: the output is the input, copied unchanged.
        os.mkdir(self.path("out"))
        run("shrink", "--output-dir", self.path("out"), p)
        self.assertEqual(read_bytes(os.path.join(self.path("out"), "deflated.pt")), data)
        # strip likewise: dropping the (deflated, zero) optimizer state and storing the rest
        # uncompressed would grow the file.
        full = self.path("full.pt")
        torch.save({"model": {"w": torch.zeros(1 << 17)}, "optimizer": {"m": torch.zeros(16)}}, full)
        q = self.path("full_deflated.pt")
        self.rezip_deflated(full, q)
        data = read_bytes(q)
        out = run("strip", q).stdout
        self.assertIn("left as it is", out)
        self.assertEqual(read_bytes(q), data)
        self.assertTrue(torch.equal(torch.load(q)["model"]["w"], torch.zeros(1 << 17)))

    def test_damaged_file_is_refused(self):
        p = self.path("cut.pt")
        torch.save(deepspeed_like(seed=15), p)
        with open(p, "rb") as f:
            data = f.read()
        with open(p, "wb") as f:
            f.write(data[: len(data) - 100])
        r = run("shrink", p, expect=1)
        self.assertIn(p, r.stderr)
        with open(p, "rb") as f:
            self.assertEqual(len(f.read()), len(data) - 100)


if __name__ == "__main__":
    import unittest
    unittest.main()
