"""The Python package (import ckptool) against the real libraries: open() and load() give the
tensors torch.load, safetensors, transformers, torch.distributed.checkpoint and DeepSpeed give
for every container, archives included; load() of hostile pickles runs nothing (an audit hook
sees every import, exec and process start); the job functions return the CLI's reports.

The package under test is the one the build just made (CKPT_PYTHON_PACKAGE: BUILD/python)."""
import collections
import contextlib
import dataclasses
import enum
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from stacklib import PACKAGE  # noqa: E402

sys.path.insert(0, PACKAGE)

import torch  # noqa: E402

import ckptool  # noqa: E402
import real_ds_train  # noqa: E402
from real_common import assert_same_object, assert_same_sharing  # noqa: E402
from stacklib import TempDirTest, as_bytes, assert_same_tensors, fixture, run  # noqa: E402


def training_state():
    """A small training checkpoint as a user writes it: model (tied weights, a bf16 buffer,
    an int64 counter), AdamW after real steps (step 4097 as a float tensor), a view, and plain
    Python data."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    model[1].weight = model[0].weight  # tied
    model.register_buffer("count", torch.tensor([4097], dtype=torch.int64))
    model.register_buffer("scale16", torch.randn(5).to(torch.bfloat16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = model(torch.randint(0, 16, (4,))).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    for group in opt.state.values():
        group["step"] = torch.tensor(4097.0)
    sd = model.state_dict()
    return {"model": sd, "optimizer": opt.state_dict(), "epoch": 7,
            "view": sd["0.weight"][2:5], "names": ("a", "b"), "od": collections.OrderedDict(x=1),
            "tiny": torch.tensor([1e-40, -0.0, float("nan")])}


def flatten(obj, prefix="", out=None):
    out = {} if out is None else out
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    return out


class OpenAndLoad(TempDirTest):
    def check_file(self, path, ref, archive=True):
        """open() gives every tensor torch.load gives, by every name; load() the same object
        with the same sharing; and the same again from a .ckz archive of the file."""
        got = ckptool.load(path)
        assert_same_object(self, ref, got)
        assert_same_sharing(self, ref, got)
        tensors = flatten(ref)
        with ckptool.open(path) as ck:
            self.assertEqual(set(ck.keys()), set(tensors))
            for name, t in tensors.items():
                assert_same_tensors(self, {name: t.detach()}, {name: ck.get_tensor(name)})
                if t.dtype in (torch.float32, torch.int64):
                    self.assertEqual(ck.get_numpy(name).tobytes(), as_bytes(t).numpy().tobytes())
        if archive:
            run("compress", path)
            self.check_file(path + ".ckz", ref, archive=False)
            with ckptool.open(path + ".ckz") as ck:
                self.assertTrue(ck.archived)

    def test_torch_zip_and_legacy_files_of_torch_2_13(self):
        state = training_state()
        for name, zip_format in (("zip.pt", True), ("legacy.pt", False)):
            path = self.path(name)
            torch.save(state, path, _use_new_zipfile_serialization=zip_format)
            with self.subTest(name):
                ref = torch.load(path, weights_only=True)
                self.check_file(path, ref)
                self.assertEqual(ckptool.open(path).kind,
                                 "torch-zip" if zip_format else "torch-legacy")
                # mapped copy-on-write: writing to a loaded tensor never reaches the file
                before = open(path, "rb").read()
                got = ckptool.load(path)
                got["model"]["0.weight"].add_(1)
                self.assertEqual(open(path, "rb").read(), before)

    def test_torch_1_13_files(self):
        script = textwrap.dedent("""
            import sys, torch
            torch.manual_seed(1)
            m = torch.nn.Linear(6, 3)
            sd = {"model": m.state_dict(), "step": 10, "half": torch.randn(4).half()}
            torch.save(sd, sys.argv[1] + "/new.pt")
            torch.save(sd, sys.argv[1] + "/old.pt", _use_new_zipfile_serialization=False)
            """)
        subprocess.run(["/usr/bin/python3", "-c", script, self.tmp], check=True)
        for name in ("new.pt", "old.pt"):
            with self.subTest(name):
                path = self.path(name)
                self.check_file(path, torch.load(path, weights_only=True))

    def test_safetensors_file_and_metadata(self):
        from safetensors.torch import load_file, save_file
        path = self.path("m.safetensors")
        torch.manual_seed(2)
        save_file({"a": torch.randn(3, 4), "b": torch.arange(7), "c": torch.randn(2).bfloat16()},
                  path, metadata={"format": "pt", "who": "test"})
        ref = load_file(path)
        assert_same_tensors(self, ref, ckptool.load(path))
        with ckptool.open(path) as ck:
            self.assertEqual(ck.metadata(), {"format": "pt", "who": "test"})
            self.assertEqual(ck.kind, "safetensors")
        run("compress", path)
        assert_same_tensors(self, ref, ckptool.load(path + ".ckz"))
        with self.assertRaises(TypeError):
            ckptool.open(path).get_numpy("c")  # bfloat16: numpy has no such dtype

    def test_hugging_face_folders(self):
        """A sharded safetensors folder as transformers 5 writes it, and a pytorch_model.bin
        folder as earlier versions wrote it (transformers 5 always writes safetensors)."""
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(3)
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                           n_positions=32))
        ref = {k: v.detach().clone() for k, v in model.state_dict().items()}
        sharded = self.path("sharded")
        model.save_pretrained(sharded, max_shard_size="20KB")
        self.assertTrue(os.path.exists(os.path.join(sharded, "model.safetensors.index.json")))
        binary = self.path("bin")
        os.makedirs(binary)
        model.config.save_pretrained(binary)
        torch.save(model.state_dict(), os.path.join(binary, "pytorch_model.bin"))
        for out in (sharded, binary):
            with self.subTest(out):
                got = ckptool.load(out)
                # safetensors holds tied weights once (lm_head.weight is wte.weight)
                saved = {k: v for k, v in ref.items() if k in got}
                self.assertIn("transformer.wte.weight", got)
                assert_same_tensors(self, saved, got)
                reloaded = GPT2LMHeadModel.from_pretrained(out)
                for k, v in got.items():
                    self.assertTrue(torch.equal(reloaded.state_dict()[k], v), k)
                with ckptool.open(out) as ck:
                    self.assertEqual(ck.kind, "model-folder")
                run("compress", out)
                assert_same_tensors(self, saved, ckptool.load(out + ".ckz"))
        self.assertEqual(set(ckptool.load(binary)), set(ref))  # both tied names

    def test_dcp_folder_against_dcp_to_torch_save(self):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        state = training_state()
        folder = self.path("dcp")
        dcp.save({"model": state["model"], "extra": {"t": torch.arange(5)}}, checkpoint_id=folder)
        dcp_to_torch_save(folder, self.path("ref.pt"))
        ref = flatten(torch.load(self.path("ref.pt"), weights_only=False))
        got = ckptool.load(folder)
        assert_same_tensors(self, ref, got)
        with ckptool.open(folder) as ck:
            self.assertEqual(ck.kind, "dcp")
        run("compress", folder)
        assert_same_tensors(self, ref, ckptool.load(folder + ".ckz"))

    def test_zero_folder_against_deepspeed(self):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        for name, (stage, dtype) in {"s2_fp32": (2, "fp32"), "s3_bf16": (3, "bf16")}.items():
            with self.subTest(name):
                root = fixture(f"ds-{name}", real_ds_train.script(), "train", stage, dtype, 0,
                               into=self.path(name))
                folder = os.path.join(root, "ckpt")
                with contextlib.redirect_stdout(io.StringIO()):
                    ref = get_fp32_state_dict_from_zero_checkpoint(folder)
                got = ckptool.load(folder)
                assert_same_tensors(self, dict(ref), got)
                with ckptool.open(folder) as ck:
                    self.assertEqual(ck.kind, "zero")
                run("compress", folder)
                assert_same_tensors(self, dict(ref), ckptool.load(folder + ".ckz"))
                # ckptool.reshard: the universal checkpoint, each fp32.pt the consolidated weight
                r = ckptool.reshard(folder, to="universal", output=self.path(name, "ucp"))
                self.assertEqual(r.report["stage"], stage)
                with open(self.path(name, "latest_universal")) as f:
                    self.assertEqual(f.read(), "ucp")
                for pname in os.listdir(self.path(name, "ucp", "zero")):
                    if pname == "optimizer_state.pt":
                        continue
                    fp32 = torch.load(self.path(name, "ucp", "zero", pname, "fp32.pt"),
                                      weights_only=True)
                    fp32 = fp32["param"] if stage <= 2 else fp32.view(ref[pname].shape)
                    self.assertTrue(torch.equal(fp32, ref[pname].float()), pname)
                with self.assertRaises(TypeError):
                    ckptool.reshard(folder, to="universal", ouptut="x")
                # ckptool.reshard(to="zero"): rank files for 3 ranks, which consolidate to the
                # same weights
                r = ckptool.reshard(folder, to="zero", world_size=3, output=self.path(name, "w3"))
                self.assertEqual((r.report["world_size"], r.report["to_world_size"]), (2, 3))
                assert_same_tensors(self, dict(ref), ckptool.load(self.path(name, "w3")))

    def test_select_picks_a_key(self):
        path = self.path("s.pt")
        state = training_state()
        torch.save(state, path)
        assert_same_object(self, torch.load(path, weights_only=True)["model"],
                           ckptool.load(path, select="model"))
        with self.assertRaises(ckptool.CheckpointError):
            ckptool.load(path, select="nope")

    def test_bare_storages_and_parameters(self):
        import warnings
        path = self.path("storages.pt")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            typed = torch.arange(6, dtype=torch.float32).storage()
        p = torch.nn.Parameter(torch.ones(3))
        torch.save({"untyped": torch.arange(4, dtype=torch.int16).untyped_storage(),
                    "typed": typed, "param": p,
                    "frozen": torch.nn.Parameter(torch.zeros(2), requires_grad=False)}, path)
        ref = torch.load(path, weights_only=True)
        got = ckptool.load(path)
        self.assertIsInstance(got["untyped"], torch.UntypedStorage)
        self.assertEqual(bytes(got["untyped"]), bytes(ref["untyped"]))
        self.assertIsInstance(got["typed"], torch.TypedStorage)
        self.assertEqual(got["typed"].dtype, torch.float32)
        self.assertEqual(got["typed"].tolist(), ref["typed"].tolist())
        self.assertIsInstance(got["param"], torch.nn.Parameter)
        self.assertTrue(got["param"].requires_grad)
        self.assertFalse(got["frozen"].requires_grad)

    def test_errors_name_the_path_and_the_reason(self):
        bad = self.path("bad.pt")
        with open(bad, "wb") as f:
            f.write(b"PK\x03\x04 not really a zip")
        with self.assertRaises(ckptool.CheckpointError) as e:
            ckptool.open(bad)
        self.assertEqual(e.exception.path, bad)
        self.assertTrue(e.exception.reason)
        with self.assertRaises(ckptool.CheckpointError):
            ckptool.open(self.path("missing.pt"))
        with self.assertRaises(KeyError):
            torch.save({"a": torch.zeros(1)}, self.path("ok.pt"))
            ckptool.open(self.path("ok.pt")).get_tensor("b")


class RunMode(enum.Enum):
    """A user's own Enum (Python 3.11 pickles a member as getattr(RunMode, 'TRAIN'))."""
    TRAIN = 1
    EVAL = 2


@dataclasses.dataclass
class RunConfig:
    """A user's own class, as training scripts save them in checkpoints."""
    lr: float
    name: str


class PythonStackObjects(TempDirTest):
    """Objects of the Python 3.11 stack: classes on the reviewed allowlist (argparse.Namespace)
    are rebuilt; others come back as inert records unless their module is trusted."""

    def test_allowlisted_untrusted_and_trusted_classes(self):
        import argparse
        path = self.path("args.pt")
        ns = argparse.Namespace(lr=0.1, name="run")
        torch.save({"args": ns, "config": RunConfig(0.5, "x"), "w": torch.ones(2)}, path)
        got = ckptool.load(path)
        self.assertEqual(got["args"], ns)  # on the allowlist verify uses
        self.assertIsInstance(got["config"], ckptool.Pickled)
        self.assertEqual((got["config"].module, got["config"].name),
                         (__name__, "RunConfig"))
        self.assertEqual(got["config"].state, {"lr": 0.5, "name": "x"})
        trusted = ckptool.load(path, trust=[__name__])
        self.assertEqual(trusted["config"], RunConfig(0.5, "x"))
        self.assertTrue(torch.equal(trusted["w"], torch.ones(2)))


    def test_real_training_args_with_python_3_11_enum_members(self):
        """transformers' TrainingArguments as the Trainer saves it (training_args.bin), which
        torch.load(weights_only=True) refuses: its classes and Enum members (pickled the Python
        3.11 way, getattr(Class, 'NAME')) are on the reviewed allowlist and come back real;
        accelerate's PartialState inside it (rebuilt from its state, on no allowlist) comes
        back as an inert record."""
        import dataclasses as dc

        from transformers import TrainingArguments
        path = self.path("training_args.bin")
        args = TrainingArguments(output_dir="out", eval_strategy="steps", report_to=[])
        torch.save(args, path)
        with self.assertRaises(Exception):
            torch.load(path, weights_only=True)
        ref = torch.load(path, weights_only=False)
        got = ckptool.load(path)
        self.assertIsInstance(got, TrainingArguments)
        self.assertIs(got.eval_strategy, type(args.eval_strategy).STEPS)
        for f in dc.fields(TrainingArguments):
            self.assertEqual(getattr(got, f.name), getattr(ref, f.name), f.name)
        inert = [v for v in vars(got).values() if isinstance(v, ckptool.Pickled)]
        self.assertTrue(all(p.module.startswith("accelerate") for p in inert), inert)

    def test_enum_members_of_untrusted_classes_stay_names(self):
        """Python 3.11 pickles a member as a call RunMode(1); 3.12 and later as
        getattr(RunMode, 'TRAIN'). Untrusted, either stays an inert record naming it (getattr
        is never called); trusted, it is the member."""
        class Read:  # what Python >= 3.12's Enum.__reduce_ex__ returns
            def __reduce__(self):
                return (getattr, (RunMode, "TRAIN"))

        path = self.path("mode.pt")
        torch.save({"call": RunMode.TRAIN, "read": Read(), "w": torch.ones(1)}, path)
        got = ckptool.load(path)
        call, read = got["call"], got["read"]
        self.assertEqual((call.module, call.name, call.called, call.args),
                         (__name__, "RunMode", True, (1,)))
        self.assertEqual((read.module, read.name, read.called), (__name__, "RunMode.TRAIN", False))
        trusted = ckptool.load(path, trust=[__name__])
        self.assertIs(trusted["call"], RunMode.TRAIN)
        self.assertIs(trusted["read"], RunMode.TRAIN)


AUDIT = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    import ckptool, torch, numpy, collections
    events = []
    BAD = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "exec",
           "compile", "ctypes.dlopen", "os.fork"}
    before = set(sys.modules)
    def hook(event, args):
        if event in BAD or event == "import" and args[0] not in before:
            events.append([event, repr(args)[:200]])
    sys.addaudithook(hook)
    results = {}
    for path in sys.argv[2:]:
        try:
            obj = ckptool.load(path)
            results[path] = "loaded"
        except ckptool.Error as e:
            results[path] = "refused: " + str(e)[:200]
        try:
            with ckptool.open(path) as ck:
                for name in ck.keys():
                    ck.get_tensor(name)
        except ckptool.Error:
            pass
    print(json.dumps({"events": events, "results": results}))
    """)


class LoadAsTorchLoad(TempDirTest):
    """ckptool.load takes torch.load's arguments with their meaning (map_location, weights_only,
    mmap; pickle_module only as None), and its default copies as torch.load does, so a
    checkpoint can be loaded, edited and saved back to the same path."""

    def test_map_location_and_weights_only_as_torch_load(self):
        path = self.path("ck.pt")
        torch.save(training_state(), path)
        want = torch.load(path, map_location="cpu", weights_only=True)
        for kwargs in ({"map_location": "cpu", "weights_only": True},
                       {"map_location": torch.device("cpu")}, {"map_location": {"cpu": "cpu"}},
                       {"weights_only": False}, {}):
            with self.subTest(**{k: str(v) for k, v in kwargs.items()}):
                got = ckptool.load(path, **kwargs)
                assert_same_object(self, want, got)
        seen = []
        got = ckptool.load(path, lambda storage, location: seen.append(location) or storage)
        assert_same_object(self, want, got)
        self.assertTrue(seen and set(seen) == {"cpu"}, seen)
        with self.assertRaises(TypeError):
            ckptool.load(path, pickle_module=pickle)
        with self.assertRaises(TypeError):
            ckptool.load(path, dtpye="bf16")

    def test_weights_only_refuses_what_torch_refuses(self):
        path = self.path("cfg.pt")
        torch.save({"w": torch.ones(2), "cfg": RunConfig(lr=0.5, name="run")}, path)
        with self.assertRaises(Exception):  # torch's own refusal: the parity this mirrors
            torch.load(path, weights_only=True)
        with self.assertRaises(ckptool.CheckpointError) as e:
            ckptool.load(path, weights_only=True)
        self.assertIn("weights_only=True", str(e.exception))
        self.assertIn(f"{__name__}.", str(e.exception))
        # weights_only=False: the user trusts the file, as with torch.load: the dataclass itself.
        got = ckptool.load(path, weights_only=False)
        self.assertIsInstance(got["cfg"], RunConfig)
        self.assertEqual(got["cfg"], torch.load(path, weights_only=False)["cfg"])
        # The default: an inert record, nothing of the file's choosing called.
        self.assertIsInstance(ckptool.load(path)["cfg"], ckptool.Pickled)

    def test_load_edit_save_to_the_same_path(self):
        for name, make in (("ck.pt", lambda p: torch.save(training_state(), p)),
                           ("legacy.pt", lambda p: torch.save(training_state(), p,
                                                              _use_new_zipfile_serialization=False))):
            with self.subTest(file=name):
                path = self.path(name)
                make(path)
                sd = ckptool.load(path)
                sd["epoch"] = 8
                sd["model"]["0.weight"].add_(1.0)
                torch.save(sd, path)  # truncates the very file load read
                back = torch.load(path, weights_only=True)
                self.assertEqual(back["epoch"], 8)
                self.assertTrue(torch.equal(back["model"]["0.weight"], sd["model"]["0.weight"]))
        # safetensors: load, edit, save_file to the same path.
        from safetensors.torch import load_file, save_file
        path = self.path("model.safetensors")
        save_file({"w": torch.arange(8.0), "b": torch.ones(2)}, path)
        sd = ckptool.load(path)
        sd["w"].mul_(2)
        save_file(sd, path)
        self.assertTrue(torch.equal(load_file(path)["w"], torch.arange(8.0) * 2))
        # A .ckz archive: what it holds, edited, saved over the archive's name.
        path = self.path("ck2.pt")
        torch.save(training_state(), path)
        run("compress", "--rm", path)
        sd = ckptool.load(path + ".ckz")
        sd["epoch"] = 9
        torch.save(sd, path + ".ckz")
        self.assertEqual(torch.load(path + ".ckz", weights_only=True)["epoch"], 9)
        # mmap=True maps copy-on-write, as torch.load(mmap=True) does.
        path = self.path("mapped.pt")
        torch.save({"w": torch.arange(4096.0)}, path)
        mapped = ckptool.load(path, mmap=True)
        self.assertTrue(torch.equal(mapped["w"], torch.arange(4096.0)))


class HostilePickles(TempDirTest):
    """load() and open() of the scanners' malicious payloads and the FRAME cases: nothing is imported,
    executed or started (a Python audit hook watches), and the marker file never appears."""

    def test_nothing_runs(self):
        import test_scanner_suites as S
        wrap = S.Wrapper()
        marker = self.path("MARKER")
        paths = []

        class Touch:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        class Exec:
            def __reduce__(self):
                return (exec, (f"open({marker!r}, 'w').close()",))

        for i, payload in enumerate((Touch(), Exec())):
            for proto in (2, 4, 5):
                p = self.path(f"marker{i}_{proto}.pt")
                wrap.zip(p, pickle.dumps({"w": 1, "x": payload}, protocol=proto))
                paths.append(p)
        for f in sorted(os.listdir(os.path.join(HERE, "..", "hostile", "frame_cases"))):
            p = self.path(f + ".pt")
            with open(os.path.join(HERE, "..", "hostile", "frame_cases", f), "rb") as src:
                wrap.zip(p, src.read())
            paths.append(p)
        for entry in S.load_manifest():
            if entry["expect"] != "malicious":
                continue
            p = self.path(f"corpus{len(paths)}.pt")
            with open(os.path.join(HERE, "..", "hostile", entry["file"]), "rb") as src:
                wrap.zip(p, src.read())
            paths.append(p)
        out = subprocess.run([sys.executable, "-c", AUDIT, PACKAGE, *paths], capture_output=True,
                             text=True, timeout=600)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        report = json.loads(out.stdout.strip().splitlines()[-1])
        self.assertEqual(report["events"], [], "load() imported or ran something")
        self.assertFalse(os.path.exists(marker), "a payload ran")
        self.assertEqual(len(report["results"]), len(paths))
        # the marker payloads come back as inert records naming what they would have run
        got = ckptool.load(paths[0])
        self.assertIsInstance(got["x"], ckptool.Pickled)
        self.assertEqual(got["x"].name, "system")
        self.assertFalse(os.path.exists(marker))


class Jobs(TempDirTest):
    def test_jobs_return_the_cli_reports(self):
        path = self.path("t.pt")
        torch.save(training_state(), path)
        r = ckptool.verify(path)
        self.assertTrue(r.ok)
        self.assertIn("checkpoints", r.report)
        calls = []
        out = self.path("bf16")
        with self.assertWarns(ckptool.CheckpointWarning):
            c = ckptool.convert(path, dtype="bf16", output_dir=out,
                                progress=lambda *a: calls.append(a))
        self.assertTrue(c.ok)
        got = torch.load(os.path.join(out, "t.pt"), weights_only=True)
        self.assertEqual(got["model"]["1.bias"].dtype, torch.bfloat16)
        # the tied, viewed weight stays float32 so that it still aliases; the job says so
        self.assertEqual(got["model"]["0.weight"].dtype, torch.float32)
        self.assertTrue(any("share a storage" in w for w in c.warnings), c.warnings)
        # training state kept exactly: AdamW's step and moments
        ref = torch.load(path, weights_only=True)
        assert_same_object(self, ref["optimizer"], got["optimizer"])
        self.assertTrue(calls, "the progress callback was never called")
        with self.assertRaises(ckptool.UsageError):
            ckptool.convert(path, dtype="bf17", output_dir=out)
        # A misspelt keyword is a TypeError, as for any Python function; nothing ran.
        with self.assertRaises(TypeError) as e:
            ckptool.convert(path, dtpye="bf16", output_dir=self.path("never"))
        self.assertIn("unexpected keyword argument 'dtpye' (did you mean 'dtype'?)",
                      str(e.exception))
        self.assertFalse(os.path.exists(self.path("never")))
        with self.assertRaises(ckptool.JobFailed) as e:
            ckptool.convert(path, dtype="bf16", output_dir=out)  # exists: needs force
        self.assertIn("force", str(e.exception))
        bad = self.path("bad.pt")
        with open(bad, "wb") as f:
            f.write(b"\x80\x02garbage")
        v = ckptool.verify(bad)
        self.assertFalse(v.ok)
        self.assertIn("--output-dir", ckptool.shrink.__doc__)
        # One table of commands: the CLI's is the package's (every command a job, bar watch,
        # which runs until stopped), and the stubs declare each.
        from ckptool import _core, _jobs
        names = {n for n, _ in _core.commands()} - _jobs._NOT_JOBS
        self.assertEqual(names, {n for n in _jobs.__all__ if callable(getattr(_jobs, n))
                                 and getattr(_jobs, n).__name__ in names})
        for n in names:
            self.assertTrue(callable(getattr(ckptool, n)), n)
        with open(os.path.join(PACKAGE, "ckptool", "__init__.pyi")) as f:
            stubs = f.read()
        for n in names:
            self.assertIn(f"def {n}(", stubs)
        # The stubs are generated from the commands' options (scripts/gen-stubs), and say what
        # the functions take: keyword-only arguments, one per option.
        from ckptool import _stubs
        self.assertEqual(_stubs.replace_in(stubs), stubs, "run scripts/gen-stubs")
        import inspect as pyinspect
        sig = pyinspect.signature(ckptool.convert)
        self.assertEqual(sig.parameters["dtype"].kind, pyinspect.Parameter.KEYWORD_ONLY)
        self.assertIn("output_dir", sig.parameters)
        self.assertNotIn("json", sig.parameters)
        self.assertIn("dtype:", ckptool.convert.__doc__)
        with self.assertRaises(TypeError) as e:
            ckptool.export(path, to=self.path("never"), strip_prefx=["module."])
        self.assertIn("(did you mean 'strip_prefix'?)", str(e.exception))


if __name__ == "__main__":
    unittest.main()
