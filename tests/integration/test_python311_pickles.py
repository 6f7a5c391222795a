"""Issue 12: checkpoints written under Python >= 3.11 carry enum members as
`getattr(EnumClass, 'NAME')` calls (GLOBAL __builtin__ getattr, the class, the name, TUPLE2,
REDUCE; later members reuse the memoised getattr with BINGET). Such a call is an attribute
read: inspect names it `pkg.mod.Class.NAME (getattr)`. On an allowlisted Enum (DeepSpeed's,
transformers') it passes as it is; the lookup on any other class runs that class's code (a
module's __getattr__, a descriptor), so a project's own Enums (the test doubles' ckpt_enums,
lit_project) are read once their module is trusted: then verify passes with a note that
torch.load(weights_only=True) refuses the file, and every rewriting command keeps the members
(torch.load returns the very same objects). Any other use of getattr is still
flagged and refused, as the payloads at the end show (each checked to be live under torch.load
where it does something observable).

Every file is written by real torch.save; the classes come from py311_stacks/ (test doubles
with the module paths, class names and member names of DeepSpeed and transformers)."""
import enum
import json
import os
import re
import shutil

import torch

from ckpt_testlib import CkptTestCase, inspect, read_bytes, read_safetensors, run
from py311_fixtures import (GETATTR, G, X, Access, Color, Kind, Mode, Perm, PlainState, RunConfig,
                            add_top_level_value, assert_member, assert_same, data_pkl, deepspeed_zero2,
                            enum_members, enum_read_names, every_enum_kind, get, hf_checkpoint,
                            lightning_checkpoint, memo_index_of_global, opcodes, put, run_python)

WEIGHTS_ONLY_NOTE = "not on torch's weights_only allowlist"
# Perm(0) pickles as a call of the test's own Flag class with a value: a call of a class on no
# allowlist, which the user accepts by trusting the module.
TRUST = ("--trust", "ckpt_enums", "--trust", "lit_project")


def globals_section(text):
    """The rows of inspect's `GLOBALS (what unpickling imports)` section."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == "GLOBALS (what unpickling imports)")
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        rows.append(line.strip())
    return rows


def bf16_check(test, converts=lambda path: True):
    """Float32 tensors whose path `converts` selects (convert's default: the model's weights)
    are bf16; every other tensor is as it was."""
    def check(path, want, got):
        if want.dtype == torch.float32 and converts(path):
            test.assertEqual(got.dtype, torch.bfloat16, path)
            test.assertTrue(torch.equal(got, want.to(torch.bfloat16)), path)
        else:
            test.assertEqual(got.dtype, want.dtype, path)
            test.assertTrue(torch.equal(got, want), path)
        test.assertEqual(got.shape, want.shape, path)
    return check


class EnumCase(CkptTestCase):
    def assertAcceptedAttributeReads(self, p, obj, extra_refused=(), trust=TRUST):
        """inspect lists every member read as an off-allowlist `(getattr)` row and never the raw
        getattr; nothing is unsafe; verify passes with a weights_only note naming the classes."""
        report = json.loads(run("inspect", "--json", p, *trust).stdout)["files"][0]
        reads = enum_read_names(obj)
        self.assertTrue(reads)
        names = report["globals"]
        self.assertEqual(report["unsafe_globals"], [], names)
        self.assertEqual(report["unsafe_calls"], [])
        for read in reads:
            self.assertIn(read, names)
            self.assertIn(read, report["weights_only_refused_globals"])
        for name in names:
            self.assertNotIn("getattr", name.replace(" (getattr)", ""), "the raw getattr is still listed")
            self.assertFalse(name.startswith("__builtin__."), name)
        for name in extra_refused:
            self.assertIn(name, report["weights_only_refused_globals"])
        detail = {d["name"]: d for d in report["globals_detail"]}
        self.assertEqual(sorted(detail), sorted(names))
        for name, d in detail.items():
            self.assertEqual(d["getattr"], name.endswith(" (getattr)"), d)
            self.assertIn(d["class"], ("torch-allowed", "other"), d)
            self.assertEqual(d["class"] == "other", name in report["weights_only_refused_globals"], d)
            if d["getattr"]:
                self.assertEqual(d["raw"], name[:-len(" (getattr)")], d)
        rows = globals_section(run("inspect", p, *trust).stdout)
        for read in reads:
            row = next((r for r in rows if r.startswith(read)), None)
            self.assertIsNotNone(row, (read, rows))
            self.assertTrue(row.endswith(WEIGHTS_ONLY_NOTE), row)
        self.assertFalse([r for r in rows if "UNSAFE" in r
                          or r.split()[0] in ("builtins.getattr", "__builtin__.getattr")], rows)
        out = run("verify", p, *trust).stdout
        self.assertIn(": OK", out)
        self.assertNotIn("can run code", out)
        note = [l for l in out.splitlines() if l.startswith("  note: ") and "weights_only=True" in l]
        self.assertEqual(len(note), 1, out)
        for member in enum_members(obj).values():
            cls = type(member)
            self.assertIn(f"{cls.__module__}.{cls.__qualname__}", note[0])
        return report

    def assertLoadsIdentical(self, p, expected, tensor_check=None):
        got = torch.load(p)
        assert_same(self, expected, got, tensor_check=tensor_check)
        want = enum_members(expected)
        self.assertTrue(want)
        members = enum_members(got)
        self.assertEqual(sorted(members), sorted(want))
        for path, member in want.items():
            assert_member(self, member, members[path], path)
        return got


class PicklesAsPython311WritesThem(EnumCase):
    def test_opcodes_python311_writes(self):
        """What the fixtures rely on (CPython 3.11, torch.save protocol 2)."""
        p = self.path("every.pt")
        torch.save(every_enum_kind(), p)
        ops = opcodes(data_pkl(p))
        globals_ = [arg for op, arg in ops if op == "GLOBAL"]
        # getattr is imported once and memoised; every later member fetches it with BINGET.
        self.assertEqual(globals_.count("__builtin__ getattr"), 1)
        slot = memo_index_of_global(data_pkl(p), "__builtin__", "getattr")
        self.assertGreaterEqual(ops.count(("BINGET", slot)) + ops.count(("LONG_BINGET", slot)), 5)
        # A combined Flag is _operator.or_(rest, lowest bit), recursively; Flag(0) calls the class.
        self.assertIn("_operator or_", globals_)
        i = ops.index(("GLOBAL", "_operator or_"))
        self.assertEqual([a for o, a in ops[i:i + 40] if o == "BINUNICODE"][:2], ["R", "W"])  # R|W = or_(R, W)
        perm = memo_index_of_global(data_pkl(p), "ckpt_enums", "Perm")
        calls = [k for k, op in enumerate(ops) if op in (("GLOBAL", "ckpt_enums Perm"), ("BINGET", perm))
                 and [o for o in ops[k + 1:k + 4] if o[0] != "BINPUT"][:2] == [("BININT1", 0), ("TUPLE1", None)]]
        self.assertEqual(len(calls), 1, "Perm(0) pickles as Perm((0,))")
        # The dataclass: GLOBAL class, EMPTY_TUPLE, NEWOBJ ... BUILD with the field dict.
        k = ops.index(("GLOBAL", "ckpt_enums RunConfig"))
        self.assertEqual([o for o, _ in ops[k + 1:k + 5]][1:3], ["EMPTY_TUPLE", "NEWOBJ"])

    def test_inspect_and_verify_every_kind_and_place(self):
        obj = every_enum_kind()
        p = self.path("every.pt")
        torch.save(obj, p)
        report = self.assertAcceptedAttributeReads(
            p, obj, extra_refused=["_operator.or_", "ckpt_enums.Perm", "ckpt_enums.RunConfig", "ckpt_enums.PlainState"],
            trust=TRUST)
        self.assertReportMatchesTorch(report, torch.load(p))
        # Without the trust, the one call of a class (Perm(0)) is a finding, and so are the
        # dataclass and the plain object rebuilt from their state (their __setstate__ runs) and
        # every member read of the project's own Enums.
        untrusted = inspect(p)
        whats = [c["what"].split(" without")[0] for c in untrusted["unsafe_calls"]]
        self.assertEqual([w for w in whats if not w.startswith("reads ")],
                         ["calls ckpt_enums.Perm", "makes ckpt_enums.RunConfig", "makes ckpt_enums.PlainState"])
        reads = [w for w in whats if w.startswith("reads ")]
        self.assertTrue(reads)
        self.assertTrue(all(w.startswith("reads ckpt_enums.") and w.endswith(" (getattr)") for w in reads), reads)
        verdicts = {d["name"]: d["verdict"] for d in untrusted["globals_detail"]}
        self.assertEqual(verdicts["ckpt_enums.Perm"], "calls")
        self.assertEqual(verdicts["ckpt_enums.RunConfig"], "reconstructed")
        self.assertEqual(verdicts["_operator.or_"], "allowed")
        r = run("verify", p, expect=1)
        self.assertIn("calls ckpt_enums.Perm when loaded", r.stdout)
        self.assertIn("--trust ckpt_enums", r.stdout)

    def test_each_place_alone(self):
        """One file per kind and place, so a failure names the form that is not accepted."""
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        osd = opt.state_dict()
        osd["param_groups"][0]["schedule"] = Mode.TRAIN
        osd["state"][0]["precision"] = Color.GREEN
        places = {
            "IntEnum at top level": Color.RED,
            "str-mixin Enum at top level": Mode.EVAL,
            "plain Enum at top level": Kind.CONV,
            "Flag member": Perm.W,
            "combined Flag (_operator.or_)": Perm.R | Perm.X,
            "Flag(0) (class called)": Perm(0),
            "IntFlag with a bit no member has (or_(or_(WRITE, READ), 8))": Access(11),
            "nested dicts and lists": {"a": {"b": [Color.RED, {"c": (Mode.TRAIN, Kind.LINEAR)}]}},
            "same member twice (memoised object)": [Color.BLUE, Color.BLUE, Color.BLUE],
            "dataclass state (NEWOBJ + BUILD)": RunConfig(mode=Mode.EVAL, perm=Perm.R | Perm.W),
            "plain object state": PlainState(color=Color.GREEN, kinds=[Kind.CONV]),
            "optimizer state": osd,
        }
        for place, value in places.items():
            with self.subTest(place=place):
                obj = {"w": torch.arange(64.0)[8:40], "value": value}
                p = self.path("one.pt")
                torch.save(obj, p)
                trust = TRUST
                if enum_read_names(obj):
                    # A project's own Enum: read once its module is trusted.
                    self.assertIn("(getattr)", run("verify", p, expect=1).stdout)
                if place.startswith("Flag(0)"):
                    self.assertIn("calls ckpt_enums.Perm when loaded", run("verify", p, expect=1).stdout)
                    self.assertIn("--trust", run("shrink", p, expect=1).stderr)
                if place in ("dataclass state (NEWOBJ + BUILD)", "plain object state"):
                    # A class of the project's own rebuilt without a call: its __setstate__ runs.
                    self.assertIn("without calling it", run("verify", p, expect=1).stdout)
                    self.assertIn("--trust ckpt_enums", run("verify", p, expect=1).stdout)
                    run("shrink", p, expect=1)
                if enum_read_names(obj):
                    self.assertAcceptedAttributeReads(p, obj, trust=trust)
                else:
                    self.assertEqual(inspect(p)["unsafe_globals"], [])
                    self.assertIn("weights_only=True", run("verify", p, *trust).stdout)
                run("shrink", p, *trust)
                self.assertEqual(inspect(p)["wasted_bytes"], 0)
                self.assertLoadsIdentical(p, obj)

    def test_rewrites_write_members_back(self):
        obj = every_enum_kind()
        src = self.path("every.pt")
        torch.save(obj, src)
        refused_before = sorted(inspect(src)["weights_only_refused_globals"])

        p = self.path("shrunk.pt")
        shutil.copy(src, p)
        r = run("shrink", p, *TRUST)
        self.assertNotIn("--allow-unsafe-globals", r.stdout + r.stderr)
        after = inspect(p)
        self.assertEqual(after["wasted_bytes"], 0)
        self.assertLess(os.path.getsize(p), os.path.getsize(src))
        self.assertEqual(sorted(after["weights_only_refused_globals"]), refused_before)
        self.assertAcceptedAttributeReads(p, obj, trust=TRUST)
        self.assertLoadsIdentical(p, obj)

        p = self.path("stripped.pt")
        run("strip", src, "-o", p, *TRUST)
        expected = {k: v for k, v in obj.items() if k != "optimizer"}
        self.assertNotIn("optimizer", torch.load(p))
        self.assertLoadsIdentical(p, expected)
        self.assertAcceptedAttributeReads(p, expected, trust=TRUST)

        p = self.path("bf16.pt")
        run("convert", "--dtype", "bf16", "-o", p, src, *TRUST)
        self.assertLoadsIdentical(p, obj, tensor_check=bf16_check(self, lambda path: path.startswith("<root>.model.")))
        self.assertAcceptedAttributeReads(p, obj, trust=TRUST)

        source = read_bytes(src)
        out = self.path("model.safetensors")
        run("export", src, "--to", out)
        _, tensors = read_safetensors(self, out)
        self.assertEqual(sorted(tensors), sorted(obj["model"]))
        for name, t in obj["model"].items():
            self.assertEqual(tensors[name][1].tobytes(), t.numpy().tobytes(), name)
        self.assertEqual(read_bytes(src), source, "export and the -o rewrites leave the source alone")


class RealStacks(EnumCase):
    def test_deepspeed_zero2_folder(self):
        from deepspeed.runtime.zero.config import ZeroStageEnum

        save_dir = self.path("checkpoints")
        files = deepspeed_zero2(save_dir)
        folder = os.path.join(save_dir, "global_step14")
        optim = sorted(n for n in files if n.startswith("zero_pp_rank_"))
        self.assertEqual(optim, ["zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                 "zero_pp_rank_1_mp_rank_00_optim_states.pt"])
        model_file = os.path.join(folder, "mp_rank_00_model_states.pt")
        for name in optim:
            p = os.path.join(folder, name)
            self.assertIs(torch.load(p)["optimizer_state_dict"]["zero_stage"], ZeroStageEnum.gradients)
            report = self.assertAcceptedAttributeReads(p, files[name], extra_refused=[
                "deepspeed.runtime.zero.config.ZeroStageEnum",
                "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
                "deepspeed.utils.tensor_fragment.fragment_address"])
            self.assertIn("deepspeed.runtime.zero.config.ZeroStageEnum.gradients (getattr)", report["globals"])
            self.assertGreater(report["wasted_bytes"], 0)
        out = run("verify", save_dir).stdout
        self.assertEqual(out.count(": OK (torch-zip"), 3, out)
        # The folder as a whole: its ZeRO partitions add up to one model.
        self.assertIn("global_step14: OK (DeepSpeed ZeRO stage 2, 2 ranks", out)

        model_before = read_bytes(model_file)
        sizes = {n: os.path.getsize(os.path.join(folder, n)) for n in optim}
        r = run("shrink", "--checkpoint_dir", folder, "--patterns", "zero*pt")
        m = re.search(r"Done\. Before ([\d.]+) ?MiB, after ([\d.]+) ?MiB, saved ([\d.]+) ?MiB", r.stdout)
        self.assertIsNotNone(m, r.stdout)
        before, after, saved = map(float, m.groups())
        self.assertAlmostEqual(before, sum(sizes.values()) / 2 ** 20, delta=0.01)
        self.assertGreater(saved, 0.5)
        self.assertAlmostEqual(before - after, saved, delta=0.011)
        self.assertEqual(read_bytes(model_file), model_before, "--patterns 'zero*pt' left the model file alone")
        for name in optim:
            p = os.path.join(folder, name)
            self.assertLess(os.path.getsize(p), sizes[name], name)
            self.assertEqual(inspect(p)["wasted_bytes"], 0)
            got = self.assertLoadsIdentical(p, files[name])
            self.assertIs(got["optimizer_state_dict"]["zero_stage"], ZeroStageEnum.gradients)
        run("verify", folder)

        # strip, convert, export: no --allow-unsafe-globals needed.
        rank0 = os.path.join(folder, optim[0])
        p = self.path("rank0_stripped.pt")
        run("strip", "--drop", "optimizer_state_dict.base_optimizer_state", "-o", p, rank0)
        expected = dict(files[optim[0]])
        expected["optimizer_state_dict"] = {k: v for k, v in expected["optimizer_state_dict"].items()
                                            if k != "base_optimizer_state"}
        self.assertLoadsIdentical(p, expected)
        p = self.path("rank1_bf16.pt")
        run("convert", "--dtype", "bf16", "-o", p, os.path.join(folder, optim[1]))
        # an optimizer states file is training state: convert copies it as it is
        self.assertLoadsIdentical(p, files[optim[1]], tensor_check=bf16_check(self, lambda path: False))
        out = self.path("ds_model")
        run("export", model_file, "--to", out)
        _, tensors = read_safetensors(self, os.path.join(out, "model.safetensors"))
        module = files["mp_rank_00_model_states.pt"]["module"]
        self.assertEqual(sorted(tensors), sorted(module))
        for name, t in module.items():
            self.assertEqual(tensors[name][1].tobytes(), t.contiguous().numpy().tobytes(), name)
        run("inspect", save_dir)

    def test_hf_trainer_checkpoint(self):
        from transformers.trainer_utils import IntervalStrategy, SaveStrategy

        folder, files = hf_checkpoint(self.path("out"))
        args_file = os.path.join(folder, "training_args.bin")
        args = files["training_args.bin"]
        # Surprise: SaveStrategy.STEPS reuses the memoised name string of IntervalStrategy.STEPS
        # (enum member names are interned): getattr(SaveStrategy, BINGET n).
        ops = opcodes(data_pkl(args_file))
        i = ops.index(("GLOBAL", "transformers.trainer_utils SaveStrategy"))
        self.assertIn(ops[i + 2][0], ("BINGET", "LONG_BINGET"))
        report = self.assertAcceptedAttributeReads(args_file, args, extra_refused=[
            "transformers.training_args.TrainingArguments", "transformers.training_args.OptimizerNames",
            "transformers.trainer_utils.SchedulerType", "transformers.trainer_utils.IntervalStrategy",
            "transformers.trainer_utils.SaveStrategy", "transformers.trainer_utils.HubStrategy"])
        self.assertIn("transformers.trainer_utils.SaveStrategy.STEPS (getattr)", report["globals"])
        self.assertIn("transformers.training_args.OptimizerNames.ADAMW_TORCH_FUSED (getattr)", report["globals"])
        out = run("verify", folder).stdout
        self.assertEqual(out.count(": OK"), 5, out)
        self.assertNotIn("can run code", out)

        run("shrink", folder)
        run("strip", folder)
        run("convert", "--dtype", "bf16", folder)
        self.assertAcceptedAttributeReads(os.path.join(folder, "bf16", "training_args.bin"), args)
        for p in (args_file, os.path.join(folder, "bf16", "training_args.bin")):
            got = self.assertLoadsIdentical(p, args)
            self.assertIs(got.eval_strategy, IntervalStrategy.EPOCH)
            self.assertIs(got.save_strategy, SaveStrategy.STEPS)
            self.assertEqual(got.device, torch.device("cpu"))
        got = torch.load(os.path.join(folder, "bf16", "pytorch_model.bin"))
        assert_same(self, files["pytorch_model.bin"], got, tensor_check=bf16_check(self))
        out = self.path("export")
        run("export", os.path.join(folder, "pytorch_model.bin"), "--to", out)
        _, tensors = read_safetensors(self, os.path.join(out, "model.safetensors"))
        self.assertEqual(sorted(tensors), sorted(files["pytorch_model.bin"]))

    def test_lightning_checkpoint(self):
        obj = lightning_checkpoint()
        p = self.path("last.ckpt")
        torch.save(obj, p)
        self.assertAcceptedAttributeReads(p, obj, extra_refused=["lit_project.config.Activation",
                                                                 "pathlib.PosixPath"])
        q = self.path("stripped.ckpt")
        r = json.loads(run("strip", "--json", "-o", q, p, *TRUST).stdout)
        self.assertEqual(sorted(d["path"] for d in r["files"][0]["dropped"]), ["lr_schedulers", "optimizer_states"])
        expected = {k: v for k, v in obj.items() if k not in ("optimizer_states", "lr_schedulers")}
        got = self.assertLoadsIdentical(q, expected)
        self.assertEqual(got["hyper_parameters"]["data_dir"], obj["hyper_parameters"]["data_dir"])
        q = self.path("bf16.ckpt")
        run("convert", "--dtype", "bf16", "-o", q, p, *TRUST)
        self.assertLoadsIdentical(q, obj, tensor_check=bf16_check(self, lambda path: path.startswith("<root>.state_dict.")))
        run("shrink", p, *TRUST)
        self.assertLoadsIdentical(p, obj)
        out = self.path("export")
        run("export", p, "--to", out)
        _, tensors = read_safetensors(self, os.path.join(out, "model.safetensors"))
        self.assertEqual(sorted(tensors), sorted(obj["state_dict"]))


# ---------------------------------------------------------------------------------------------
# Hostile uses of getattr, spliced into a real torch.save file that already reads enum members
# (so the stream has a memoised getattr that payloads can BINGET).

MEMO = 100000  # far from the memo slots torch.save used


def hostile_base():
    torch.manual_seed(0)
    return {"w": torch.randn(4096)[:1024], "optimizer": {"exp_avg": torch.zeros(64)},
            "mode": Mode.TRAIN, "color": Color.RED}


def hostile_payloads(marker, ga_memo):
    """name -> (opcodes building the "payload" value, Python check that it is live or None).
    `ga_memo` is the memo slot of the file's own getattr (used by an enum member already)."""
    cmd = f"touch {marker}"
    memo_ga = get(ga_memo)
    read = lambda ga, target, attr: ga + target + X(attr) + b"\x86R"
    call1 = lambda arg: b"(" + X(arg) + b"tR"
    utils_os = read(GETATTR, G("torch", "_utils_internal"), "os")
    color = G("ckpt_enums", "Color")
    return {
        # Attribute reads that reach a denied module or function.
        "getattr(os.path, 'join')": (read(GETATTR, G("os", "path"), "join"), None),
        "getattr(torch.serialization, 'load')": (read(GETATTR, G("torch", "serialization"), "load"),
                                                 "import torch.serialization as s; ok = obj['payload'] is s.load"),
        # Dunder names.
        "__globals__ of a torch function": (
            read(GETATTR, G("torch._utils", "_rebuild_tensor_v2"), "__globals__"),
            "ok = isinstance(obj['payload'], dict) and 'torch' in obj['payload']"),
        "__class__ of an enum class": (read(GETATTR, color, "__class__"),
                                       "ok = obj['payload'] is type(ckpt_enums.Color)"),
        "object.__subclasses__ called": (read(GETATTR, G("__builtin__", "object"), "__subclasses__") + b")R",
                                         "ok = type in obj['payload']"),
        "posix.system.__call__ called": (read(GETATTR, G("posix", "system"), "__call__") + call1(cmd), "marker"),
        "dotted attribute name": (read(GETATTR, color, "RED.value"), None),
        # Not an attribute read of a constant name.
        "computed name (str REDUCE)": (GETATTR + color + G("__builtin__", "str") + b"(" + X("RED") + b"tR\x86R",
                                       "ok = obj['payload'] is ckpt_enums.Color.RED"),
        "three arguments (default)": (GETATTR + color + X("NOPE") + b"N\x87R", "ok = obj['payload'] is None"),
        "one argument": (GETATTR + color + b"\x85R", None),
        "getattr stored in a list": (b"(" + GETATTR + b"l", "ok = obj['payload'] == [getattr]"),
        "getattr as a dict value": (b"}" + X("f") + GETATTR + b"s", "ok = obj['payload']['f'] is getattr"),
        # What the read returns is used as more than a value.
        "member read then called": (read(GETATTR, color, "RED") + b")R", None),
        "member read, memoised, called later": (
            b"(" + read(GETATTR, color, "GREEN") + put(MEMO) + get(MEMO) + b")Rt", None),
        "member read used as NEWOBJ class": (read(GETATTR, color, "RED") + b")\x81", None),
        "BUILD on a member read": (read(GETATTR, color, "RED") + b"}" + X("injected") + X("yes") + b"sb",
                                   "ok = ckpt_enums.Color.RED.injected == 'yes'"),
        "SETITEM on Color._value2member_map_": (
            read(GETATTR, color, "_value2member_map_") + b"Kc" + X("pwned") + b"s",
            "ok = ckpt_enums.Color._value2member_map_.get(99) == 'pwned'"),
        "APPEND on Color._member_names_": (read(GETATTR, color, "_member_names_") + X("PWNED") + b"a",
                                           "ok = 'PWNED' in ckpt_enums.Color._member_names_"),
        # The file's own memoised getattr, already used for Mode.TRAIN and Color.RED, reused.
        "memoised getattr on a dunder": (read(memo_ga, G("posix", "system"), "__call__") + call1(cmd), "marker"),
        "memoised getattr on a denied target": (read(memo_ga, G("torch", "serialization"), "load"), None),
        # getattr(getattr(G, 'a'), 'b'): the outer target is not an imported global.
        "nested chain": (GETATTR + utils_os + X("system") + b"\x86R", "import os; ok = obj['payload'] is os.system"),
        "nested chain called": (GETATTR + utils_os + X("system") + b"\x86R" + call1(cmd), "marker"),
        "nested chain through the memo": (memo_ga + read(memo_ga, G("torch", "_utils_internal"), "os")
                                          + X("system") + b"\x86R" + call1(cmd), "marker"),
    }


class HostileGetattr(CkptTestCase):
    def make(self, name, value):
        base = self.path("base.pt")
        if not os.path.exists(base):
            torch.save(hostile_base(), base)
        p = self.path(name)
        add_top_level_value(base, p, "payload", value)
        return p

    def ga_memo(self):
        base = self.path("base.pt")
        torch.save(hostile_base(), base)
        return memo_index_of_global(data_pkl(base), "__builtin__", "getattr")

    def test_the_splice_itself_is_accepted(self):
        """Control: the same splicing with legitimate reads (fresh and memoised getattr, a
        memoised name string) is not flagged, so the verdicts below come from the payloads."""
        ga = self.ga_memo()
        for name, value in {
            "fresh getattr": GETATTR + G("ckpt_enums", "Color") + X("GREEN") + b"\x86R",
            "memoised getattr": get(ga) + G("ckpt_enums", "Kind") + X("CONV") + b"\x86R",
            "tuple of reads": b"(" + get(ga) + G("ckpt_enums", "Mode") + X("EVAL") + b"\x86R" + get(ga)
                              + G("ckpt_enums", "Perm") + X("W") + b"\x86Rt",
            "combined Flag": G("_operator", "or_") + b"(" + get(ga) + G("ckpt_enums", "Perm") + X("R") + b"\x86R"
                             + get(ga) + G("ckpt_enums", "Perm") + X("X") + b"\x86RtR",
        }.items():
            with self.subTest(value=name):
                p = self.make("ok.pt", value)
                report = inspect(p, *TRUST)
                self.assertEqual(report["unsafe_globals"], [], report["globals"])
                self.assertEqual(report["unsafe_calls"], [])
                out = run("verify", p, *TRUST).stdout
                self.assertIn("weights_only=True", out)
                run("shrink", p, *TRUST)
                self.assertIsInstance(torch.load(p)["payload"], (enum.Enum, tuple))

    def test_hostile_forms_are_flagged_and_refused(self):
        marker = self.path("pwned")
        ga = self.ga_memo()
        for name, (value, _) in hostile_payloads(marker, ga).items():
            with self.subTest(payload=name):
                p = self.make("evil.pt", value)
                original = read_bytes(p)
                report = inspect(p)
                flagged = report["unsafe_globals"] + [c["what"] for c in report["unsafe_calls"]]
                self.assertTrue(flagged, report["globals"])
                for n in report["globals"]:
                    self.assertFalse(n.startswith("__builtin__."), f"Python 2 spelling in {n}")
                for d in report.get("globals_detail", []):
                    if d["class"] == "unsafe":
                        self.assertIn(d["name"], report["unsafe_globals"])
                text = run("inspect", p).stdout
                rows = globals_section(text)
                for u in report["unsafe_globals"]:
                    self.assertTrue([r for r in rows if r.startswith(u + " ") and "UNSAFE" in r], (u, rows))
                for c in report["unsafe_calls"]:
                    self.assertIn(c["what"], text)
                r = run("verify", p, expect=1)
                self.assertIn("can run code", r.stdout)
                out = self.path("converted.pt")
                for args in (["shrink", p], ["strip", p], ["convert", "--dtype", "bf16", "-o", out, p]):
                    r = run(*args, expect=None)
                    self.assertNotEqual(r.returncode, 0, (args, r.stdout, r.stderr))
                    self.assertIn("--allow-unsafe-globals", r.stderr, args)
                    self.assertEqual(read_bytes(p), original, args)
                    self.assertFalse(os.path.exists(out))
                self.assertFalse(os.path.exists(marker), "ckptool ran pickle code")

    def test_attribute_that_is_a_denied_module(self):
        """torch._utils_internal does `import os`, so getattr(torch._utils_internal, 'os') returns
        the os module: G.S reaches an unsafe module although neither G nor the name 'os' looks
        dangerous on its own."""
        ga = self.ga_memo()
        for name, ga_bytes in (("fresh getattr", GETATTR), ("memoised getattr", get(ga))):
            with self.subTest(getattr=name):
                p = self.make("os.pt", ga_bytes + G("torch", "_utils_internal") + X("os") + b"\x86R")
                original = read_bytes(p)
                report = inspect(p)
                self.assertTrue(report["unsafe_globals"] + report["unsafe_calls"], report["globals"])
                run("verify", p, expect=1)
                run("shrink", p, expect=1)
                self.assertEqual(read_bytes(p), original)
                r = run_python(f"import os, torch; print(torch.load({p!r})['payload'] is os)")
                self.assertEqual(r.stdout.strip(), "True", r.stderr)

    def test_payloads_are_live_under_torch_load(self):
        marker = self.path("pwned")
        ga = self.ga_memo()
        live = {}
        for i, (name, (value, check)) in enumerate(hostile_payloads(marker, ga).items()):
            if check:
                live[name] = (self.make(f"live{i}.pt", value), check)
        script = ["import json, os, torch, ckpt_enums", "results = {}"]
        for name, (p, check) in live.items():
            body = (f"os.path.exists({marker!r})" if check == "marker" else None)
            script += [
                "try:",
                f"    obj = torch.load({p!r})",
                f"    ok = {body}" if body else "    " + check.replace("; ", "\n    "),
                "except Exception as e:",
                "    ok = repr(e)",
                f"results[{name!r}] = ok",
                f"if os.path.exists({marker!r}): os.remove({marker!r})",
            ]
        script.append("print(json.dumps(results))")
        r = run_python("\n".join(script))
        self.assertEqual(r.returncode, 0, r.stderr)
        results = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual({k: v for k, v in results.items() if v is not True}, {},
                         "these payloads did not do what they claim under torch.load")
        self.assertEqual(sorted(results), sorted(live))
