"""ckptool on DeepSpeed ZeRO checkpoints written by the real DeepSpeed 0.19 (torch 2.13, CPU).

real_ds_train.py trains a tiny model (tied embedding/head, a frozen Linear, LayerNorm, fp32 and
int64 buffers) with deepspeed.initialize on 2 ranks (torch.multiprocessing, gloo, DeepSpeed's
CPU accelerator, torch AdamW + WarmupLR) for 3 steps, engine.save_checkpoint, and 3 more steps;
ZeRO stages 1, 2 and 3, fp32 and bf16, and stage 2 bf16 with
zero_optimization.parameter_alignment. Each is made once (stacklib.fixture).

References are DeepSpeed's own: deepspeed.utils.zero_to_fp32's
get_fp32_state_dict_from_zero_checkpoint and convert_zero_checkpoint_to_state_dict, and
engine.load_checkpoint in fresh DeepSpeed runs. Resume test: the 3 losses after a
load_checkpoint of the original folder are bit-identical to the 3 the saving run went on to
make; so must they be after a load of ckptool's shrunk copy. Module-only loads
(load_module_only=True, no optimizer or scheduler state) of strip's outputs must equal one of the
original. All fresh runs go through one 2-process run (real_ds_train.py resume) that loads
every variant of every configuration in turn, each with a new engine.
"""
import contextlib
import io
import json
import math
import os
import shutil
import tempfile
import unittest

import torch

import real_ds_train
from stacklib import TempDirTest, assert_same_tensors, fixture, python, run, run_json

CONFIGS = {
    "s1_fp32": (1, "fp32", 0),
    "s2_fp32": (2, "fp32", 0),
    "s3_fp32": (3, "fp32", 0),
    "s1_bf16": (1, "bf16", 0),
    "s2_bf16": (2, "bf16", 0),
    "s3_bf16": (3, "bf16", 0),
    "s2_bf16_align": (2, "bf16", 1),
}
STEPS = real_ds_train.STEPS
TAG = f"global_step{STEPS}"
TRAINABLE = ["emb.weight", "l1.weight", "l1.bias", "norm.weight", "norm.bias", "l2.weight",
             "l2.bias", "head.weight"]
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
               torch.int64: "int64"}

_ROOT = None
_TRAINED = {}
_REF = {}
_RESUME = None
_RESUME_ERROR = None


def setUpModule():
    global _ROOT
    _ROOT = tempfile.mkdtemp(prefix="ckpt-real-ds-")


def tearDownModule():
    if _ROOT:
        shutil.rmtree(_ROOT, ignore_errors=True)


def quiet(fn, *args, **kwargs):
    """DeepSpeed's converters print their progress to stdout."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def zero_to_fp32(folder, **kwargs):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    return quiet(get_fp32_state_dict_from_zero_checkpoint, folder, **kwargs)


def trained(name):
    """(root with ckpt/ and train.json, the checkpoint folder, the saving run's record)."""
    if name not in _TRAINED:
        stage, dtype, align = CONFIGS[name]
        root = fixture(f"ds-{name}", real_ds_train.script(), "train", stage, dtype, align,
                       into=os.path.join(_ROOT, name))
        with open(os.path.join(root, "train.json")) as f:
            record = json.load(f)
        _TRAINED[name] = (root, os.path.join(root, "ckpt"), record)
    return _TRAINED[name]


def reference(name):
    if name not in _REF:
        _REF[name] = zero_to_fp32(trained(name)[1])
    return _REF[name]


def snapshot(folder):
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            out[os.path.relpath(p, folder) + "/"] = (os.lstat(p).st_mode, None)
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = (os.lstat(p).st_mode, fh.read())
    return out


def resumes():
    """Makes ckptool's variants of every configuration and loads each (and the original) in
    fresh DeepSpeed engines in one 2-process run. Returns (results, prep) where results maps
    "config/variant" to the per-rank records and prep maps it to ckptool's failure (if the
    command that makes the variant failed, the variant is not loaded)."""
    global _RESUME, _RESUME_ERROR
    if _RESUME is not None:
        return _RESUME
    if _RESUME_ERROR is not None:  # every test that needs the run reports its real cause
        raise AssertionError(f"the resume run failed earlier: {_RESUME_ERROR}")
    try:
        return _make_resumes()
    except BaseException as e:
        _RESUME_ERROR = f"{type(e).__name__}: {e}"
        raise


def _make_resumes():
    global _RESUME
    base = os.path.join(_ROOT, "resume")
    os.makedirs(base)
    spec, prep = [], {}
    # ZeRO-3 replaces torch.nn.functional.linear for the rest of the process ("This will
    # persist unless manually reset", deepspeed/runtime/zero/partition_parameters.py), which
    # changes the numerics of every later engine: the stage 3 configurations go last.
    for name, (stage, dtype, align) in sorted(CONFIGS.items(), key=lambda c: c[1][0] == 3):
        _, ckpt, _ = trained(name)
        where = os.path.join(base, name)

        def add(variant, folder, kind, tag=None):
            spec.append({"name": f"{name}/{variant}", "dir": folder, "kind": kind,
                         "stage": stage, "dtype": dtype, "align": align, "tag": tag})

        def variant(v, *args):
            folder = os.path.join(where, v)
            shutil.copytree(ckpt, folder)
            p = run(*[a.replace("{}", folder) for a in args], expect=None)
            if p.returncode != 0:
                prep[f"{name}/{v}"] = f"{' '.join(args)} -> {p.returncode}\n{p.stdout}{p.stderr}"
            return folder, p

        add("original-full", ckpt, "full")
        add("original-module", ckpt, "module")
        # A newer tag that `latest` names, its rank 1 optimizer file cut short (a crash while
        # saving): ckptool latest must name the tag before it, which resumes exactly.
        folder = os.path.join(where, "latest")
        shutil.copytree(ckpt, folder)
        newer = os.path.join(folder, "global_step6")
        shutil.copytree(os.path.join(folder, TAG), newer)
        cut = next(os.path.join(newer, n) for n in os.listdir(newer)
                   if "optim_states" in n and "rank_1" in n)
        os.truncate(cut, os.path.getsize(cut) // 2)
        with open(os.path.join(folder, "latest"), "w") as f:
            f.write("global_step6")
        p = run("latest", "--json", folder, expect=None)
        answer = json.loads(p.stdout)["latest"] if p.returncode == 0 else None
        if answer != os.path.join(folder, TAG):
            prep[f"{name}/latest-full"] = f"latest -> {p.returncode}\n{p.stdout}{p.stderr}"
        else:
            add("latest-full", folder, "full", tag=os.path.basename(answer))
        folder, p = variant("shrink", "shrink", "--checkpoint_dir", "{}")
        if p.returncode == 0:
            add("shrink-full", folder, "full")
        folder, p = variant("strip", "strip", "{}")
        if p.returncode == 0:
            add("strip-module", folder, "module")
        folder, p = variant("strip-delete", "strip", "{}", "--delete-files")
        if p.returncode == 0:
            add("strip-delete-module", folder, "module")
        conv = os.path.join(where, "convert")
        os.makedirs(conv)
        shutil.copy2(os.path.join(ckpt, "latest"), conv)
        p = run("convert", "--dtype", "bf16", os.path.join(ckpt, TAG),
                "--output-dir", os.path.join(conv, TAG), expect=None)
        if p.returncode != 0:
            prep[f"{name}/convert"] = f"convert -> {p.returncode}\n{p.stdout}{p.stderr}"
        else:
            add("convert-full", conv, "full")
    with open(os.path.join(base, "spec.json"), "w") as f:
        json.dump(spec, f, indent=1)
    python(real_ds_train.script(), base, "resume", os.path.join(base, "spec.json"), timeout=900)
    with open(os.path.join(base, "resume.json")) as f:
        _RESUME = (json.load(f), prep)
    return _RESUME


class _ZeroTests:
    NAME = None

    @classmethod
    def setUpClass(cls):
        cls.root, cls.ckpt, cls.record = trained(cls.NAME)
        cls.stage, cls.dtype, cls.align = CONFIGS[cls.NAME]

    def ref(self):
        return reference(self.NAME)

    def assert_same_state_dict(self, got, want, msg):
        """Same names in the same order, same dtypes, shapes and bytes, and tied names the same
        tensor exactly where they are in `want`."""
        self.assertEqual(list(got), list(want), f"{msg}: names or their order")
        assert_same_tensors(self, got, want, msg)
        names = list(want)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                tied = want[a].data_ptr() == want[b].data_ptr() and want[a].numel() > 0
                self.assertEqual(got[a].data_ptr() == got[b].data_ptr() and got[a].numel() > 0,
                                 tied, f"{msg}: {a} and {b} tied in one and not the other")

    def aliases(self):
        """alias -> kept name (the first in sort order), as export records tied names."""
        ref = self.ref()
        out = {}
        names = sorted(ref)
        for i, a in enumerate(names):
            for b in names[:i]:
                if ref[a].data_ptr() == ref[b].data_ptr() and b not in out:
                    out[a] = b
                    break
        return out

    def load_file(self, path):
        return torch.load(path, map_location="cpu", weights_only=False)

    def optim_files(self, folder):
        return sorted(f for f in os.listdir(os.path.join(folder, TAG))
                      if f.endswith("_optim_states.pt"))

    # --- the fixture: what DeepSpeed 0.19 wrote ---------------------------------------------

    def test_fixture_is_what_deepspeed_wrote(self):
        prefix = "bf16_" if self.dtype == "bf16" else ""
        want = [f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)]
        if self.stage == 3:
            want += [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(2)]
        else:
            want.append("mp_rank_00_model_states.pt")
        self.assertEqual(sorted(os.listdir(os.path.join(self.ckpt, TAG))), sorted(want))
        with open(os.path.join(self.ckpt, "latest")) as f:
            self.assertEqual(f.read().strip(), TAG)
        self.assertTrue(os.path.isfile(os.path.join(self.ckpt, "zero_to_fp32.py")))
        for rank in self.record:
            self.assertTrue(all(math.isfinite(float.fromhex(x)) for x in rank["losses"]))
        osd = self.load_file(os.path.join(self.ckpt, TAG, want[0]))["optimizer_state_dict"]
        self.assertEqual(int(osd["zero_stage"]), self.stage)
        if self.stage <= 2:
            pads = osd["param_alignment_paddings"]
            self.assertEqual(any(any(g) for g in pads), bool(self.align), pads)

    # --- export against zero_to_fp32 ---------------------------------------------------------

    def test_export_pt_matches_zero_to_fp32(self):
        out = self.path("model.pt")
        run("export", self.ckpt, "--to", out)
        self.assert_same_state_dict(torch.load(out, weights_only=True), self.ref(), "export .pt")
        run("verify", out)

    def test_export_keeps_integer_buffers(self):
        """DeepSpeed 0.19's zero_to_fp32 makes floating buffers float32 and leaves the others
        (int64 `ids`, the 0-d step counter `count`) as they are."""
        out = self.path("model.pt")
        run("export", self.ckpt, "--to", out)
        got = torch.load(out, weights_only=True)
        for k in ("ids", "count"):
            self.assertEqual(self.ref()[k].dtype, torch.int64)
            assert_same_tensors(self, {k: got[k]}, {k: self.ref()[k]}, "integer buffer")

    def test_export_tag_folder_and_tag_option(self):
        a, b = self.path("a.pt"), self.path("b.pt")
        run("export", os.path.join(self.ckpt, TAG), "--to", a)
        run("export", self.ckpt, "--tag", TAG, "--to", b)
        self.assert_same_state_dict(torch.load(a, weights_only=True), self.ref(), "tag folder")
        self.assert_same_state_dict(torch.load(b, weights_only=True), self.ref(), "--tag")

    def test_export_exclude_frozen(self):
        out = self.path("nofrozen.pt")
        run("export", self.ckpt, "--to", out, "--exclude-frozen")
        want = zero_to_fp32(self.ckpt, exclude_frozen_parameters=True)
        self.assert_same_state_dict(torch.load(out, weights_only=True), want, "--exclude-frozen")

    def test_export_safetensors_with_aliases(self):
        from safetensors import safe_open
        from safetensors.torch import load_file
        aliases = self.aliases()
        self.assertEqual(aliases, {"head.weight": "emb.weight"})
        want = {k: v for k, v in self.ref().items() if k not in aliases}
        out = self.path("model.safetensors")
        run("export", self.ckpt, "--to", out)
        assert_same_tensors(self, load_file(out), want, "export .safetensors")
        with safe_open(out, "pt") as f:
            self.assertEqual(f.metadata(), {"format": "pt", **aliases})
        folder = self.path("shards")
        run("export", self.ckpt, "--to", folder, "--max-shard-size", "300B")
        got = {}
        shards = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        self.assertGreater(len(shards), 1)
        for s in shards:
            got.update(load_file(os.path.join(folder, s)))
        assert_same_tensors(self, got, want, "shards")
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            self.assertEqual(sorted(json.load(f)["weight_map"]), sorted(want))

    def test_export_dtype_matches_deepspeed_convert(self):
        from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_state_dict
        for dtype, flag in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            ds_out = self.path(f"ds-{flag}")
            quiet(convert_zero_checkpoint_to_state_dict, self.ckpt, ds_out, dtype=dtype,
                  max_shard_size=None)
            want = torch.load(os.path.join(ds_out, "pytorch_model.bin"), weights_only=True)
            out = self.path(f"{flag}.pt")
            run("export", self.ckpt, "--to", out, "--dtype", flag)
            self.assert_same_state_dict(torch.load(out, weights_only=True), want,
                                        f"export --dtype {flag}")

    # --- inspect, verify, compress ------------------------------------------------------------

    def test_inspect_and_verify(self):
        doc = run_json("inspect", self.ckpt)
        self.assertEqual(len(doc["zero"]), 1)
        z = doc["zero"][0]
        self.assertEqual((z["stage"], z["world_size"], z["tag"]), (self.stage, 2, TAG))
        aliases = self.aliases()
        self.assertEqual(z["aliases"], aliases)
        want = {k: (DTYPE_NAMES[v.dtype], list(v.shape)) for k, v in self.ref().items()
                if k not in aliases}
        self.assertEqual({t["name"]: (t["dtype"], t["shape"]) for t in z["tensors"]}, want)
        optim_bytes = sum(os.path.getsize(os.path.join(self.ckpt, TAG, f))
                          for f in self.optim_files(self.ckpt))
        self.assertEqual(z["optimizer_bytes"], optim_bytes)
        p = run("verify", self.ckpt)
        self.assertIn(f"ZeRO stage {self.stage}, 2 ranks", p.stdout)
        broken = self.path("broken")
        shutil.copytree(self.ckpt, broken)
        os.remove(os.path.join(broken, TAG, self.optim_files(broken)[-1]))
        run("verify", broken, expect=1)
        run("export", broken, "--to", self.path("never.pt"), expect=1)
        self.assertFalse(os.path.exists(self.path("never.pt")))

    def test_compress_roundtrip_and_export_from_archive(self):
        archive = self.path("ckpt.ckz")
        run("compress", self.ckpt, "-o", archive)
        run("verify", archive)
        self.assertTrue(run_json("inspect", archive))
        restored = self.path("restored")
        run("decompress", archive, "-o", restored)
        self.assertEqual(snapshot(restored), snapshot(self.ckpt))
        out = self.path("from-archive.pt")
        run("export", archive, "--to", out)
        self.assert_same_state_dict(torch.load(out, weights_only=True), self.ref(), "from .ckz")

    # --- shrink / strip / convert, loaded back by DeepSpeed ------------------------------------

    def resumed(self, variant):
        results, prep = resumes()
        key = f"{self.NAME}/{variant}"
        self.assertNotIn(key, prep, f"ckptool failed making {key}: {prep.get(key)}")
        self.assertIn(key, results)
        for rank, r in enumerate(results[key]):
            self.assertNotIn("error", r, f"{key}: rank {rank}: load_checkpoint/training "
                                         f"failed:\n{r.get('error')}")
        return results[key]

    def test_resume_from_original_is_bit_exact(self):
        full = self.resumed("original-full")
        for rank, r in enumerate(full):
            self.assertEqual(r["losses"], self.record[rank]["losses"][STEPS:], f"rank {rank}")
            self.assertEqual(r["lrs"], self.record[rank]["lrs"][STEPS:], f"rank {rank}")
            self.assertEqual((r["global_steps"], r["count"]), (STEPS, STEPS))
        module = self.resumed("original-module")
        for rank, r in enumerate(module):   # same weights: the first loss; no optimizer state
            self.assertEqual(r["losses"][0], self.record[rank]["losses"][STEPS])
            self.assertNotEqual(r["losses"], self.record[rank]["losses"][STEPS:])

    def test_latest_skips_a_damaged_tag_and_resumes_exactly(self):
        """`latest` names global_step6 (a rank file cut short); ckptool latest names the tag
        before it, and load_checkpoint(dir, tag=...) from it gives the run's own losses."""
        self.assertEqual(self.resumed("latest-full"), self.resumed("original-full"))
        for rank, r in enumerate(self.resumed("latest-full")):
            self.assertEqual(r["losses"], self.record[rank]["losses"][STEPS:], f"rank {rank}")

    def test_resume_after_shrink(self):
        self.assertEqual(self.resumed("shrink-full"), self.resumed("original-full"))
        shrunk = os.path.join(_ROOT, "resume", self.NAME, "shrink")
        for rel, (_, data) in snapshot(shrunk).items():
            if data is not None:
                self.assertLessEqual(len(data), os.path.getsize(os.path.join(self.ckpt, rel)), rel)
        run("verify", shrunk)
        self.assert_same_state_dict(zero_to_fp32(shrunk), self.ref(), "zero_to_fp32 of shrunk")

    def test_resume_module_only_after_strip(self):
        self.assertEqual(self.resumed("strip-module"), self.resumed("original-module"))
        stripped = os.path.join(_ROOT, "resume", self.NAME, "strip")
        run("verify", stripped)
        out = self.path("stripped.pt")
        run("export", stripped, "--to", out)
        self.assert_same_state_dict(torch.load(out, weights_only=True), self.ref(), "stripped")

    def test_strip_delete_files_keeps_the_model(self):
        """The optimizer files go, but the model must still load: at ZeRO-3 the model states
        files hold 0-element placeholders and the fp32 partitions in *_optim_states.pt are the
        only copy of the trainable weights."""
        self.assertEqual(self.resumed("strip-delete-module"), self.resumed("original-module"))

    def test_convert_keeps_fp32_master_partitions(self):
        self.resumed("original-full")   # makes the variants
        conv = os.path.join(_ROOT, "resume", self.NAME, "convert")
        key = "fp32_flat_groups" if self.stage == 3 else "single_partition_of_fp32_groups"
        self.assertEqual(self.optim_files(conv), self.optim_files(self.ckpt))
        for f in self.optim_files(self.ckpt):
            before = self.load_file(os.path.join(self.ckpt, TAG, f))["optimizer_state_dict"]
            after = self.load_file(os.path.join(conv, TAG, f))["optimizer_state_dict"]
            for i, (a, b) in enumerate(zip(before[key], after[key])):
                self.assertEqual(b.dtype, torch.float32, f"{f}: {key}[{i}] is now {b.dtype}")
                assert_same_tensors(self, {f"{key}[{i}]": b}, {f"{key}[{i}]": a}, f)
        got = zero_to_fp32(conv)
        ref = self.ref()
        for k in TRAINABLE:
            assert_same_tensors(self, {k: got[k]}, {k: ref[k]}, "zero_to_fp32 after convert")

    def test_resume_after_convert(self):
        """A converted folder still resumes. In bf16 runs the module's weights are bf16 already
        and the buffers exact in bf16, so training goes on bit for bit as from the original;
        in fp32 runs the frozen weights are rounded to bf16 by the conversion, so only the
        load and the restored step are compared."""
        conv = self.resumed("convert-full")
        if self.dtype == "bf16":
            self.assertEqual(conv, self.resumed("original-full"))
        for r in conv:
            self.assertEqual((r["global_steps"], r["count"]), (STEPS, STEPS))


class Stage1Fp32(_ZeroTests, TempDirTest):
    NAME = "s1_fp32"


class Stage2Fp32(_ZeroTests, TempDirTest):
    NAME = "s2_fp32"


class Stage3Fp32(_ZeroTests, TempDirTest):
    NAME = "s3_fp32"


class Stage1Bf16(_ZeroTests, TempDirTest):
    NAME = "s1_bf16"


class Stage2Bf16(_ZeroTests, TempDirTest):
    NAME = "s2_bf16"


class Stage3Bf16(_ZeroTests, TempDirTest):
    NAME = "s3_bf16"


class Stage2Bf16ParameterAlignment(_ZeroTests, TempDirTest):
    NAME = "s2_bf16_align"


if __name__ == "__main__":
    unittest.main()
