"""Checkpoints as Python >= 3.11 and real training stacks write them, for
test_python311_pickles.py and test_legacy_protocols.py.

Since Python 3.11 `Enum.__reduce_ex__` returns `(getattr, (EnumClass, 'NAME'))`, so every enum
member in a checkpoint is a call of `builtins.getattr`. The classes come from test doubles in
py311_stacks/ (the module paths, class names, member names and instance attributes of DeepSpeed
and transformers classes; see its README), which this module puts first on sys.path; child
processes get it through child_env()."""
import collections
import enum
import json
import os
import pickletools
import struct
import subprocess
import sys
import zipfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
STACKS = os.path.join(HERE, "py311_stacks")
if STACKS not in sys.path:
    sys.path.insert(0, STACKS)
sys.dont_write_bytecode = True  # keep py311_stacks/ free of __pycache__ folders

from ckpt_enums import (Access, Color, Kind, Mode, Perm, PlainState,  # noqa: E402,F401 (py311_stacks)
                        RunConfig)


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = STACKS + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


# ---------------------------------------------------------------------------------------------
# Pickle opcodes, for splicing values into real torch.save output


def X(text):
    """BINUNICODE"""
    b = text.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def G(module, name):
    """GLOBAL"""
    return f"c{module}\n{name}\n".encode()


GETATTR = G("__builtin__", "getattr")  # how protocol 2 spells builtins.getattr


def get(index):
    """BINGET / LONG_BINGET"""
    return b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)


def put(index):
    """LONG_BINPUT"""
    return b"r" + struct.pack("<I", index)


def memo_index_of_global(pkl, module, name):
    """The memo slot torch.save's pickler gave GLOBAL 'module name' (the BINPUT right after it)."""
    ops = list(pickletools.genops(pkl))
    for i, (op, arg, _) in enumerate(ops):
        if op.name == "GLOBAL" and arg == f"{module} {name}":
            nxt, idx, _ = ops[i + 1]
            assert nxt.name in ("BINPUT", "LONG_BINPUT"), nxt.name
            return idx
    raise AssertionError(f"no GLOBAL {module} {name}")


def zip_records(path):
    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


def data_pkl(path):
    name, pkl = zip_records(path)[0]
    assert name.endswith("/data.pkl"), name
    return pkl


def rewrite_pickle(src, dst, transform):
    """Copies torch zip `src` to `dst` with data.pkl replaced by transform(data.pkl)."""
    records = zip_records(src)
    name, pkl = records[0]
    assert name.endswith("/data.pkl")
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for n, data in [(name, transform(pkl))] + records[1:]:
            z.writestr(n, data)


def add_top_level_value(src, dst, key, value):
    """torch.save output `src` (a dict) with one more entry key -> the object that the
    opcodes `value` build, written to `dst`."""
    def transform(pkl):
        assert pkl.startswith(b"\x80\x02") and pkl.endswith(b"u."), pkl[-8:]
        return pkl[:-2] + X(key) + value + b"u."
    rewrite_pickle(src, dst, transform)


def opcodes(pkl):
    """[(opcode name, argument)] of a pickle, for asserting what Python wrote."""
    return [(op.name, arg) for op, arg, _ in pickletools.genops(pkl)]


# ---------------------------------------------------------------------------------------------
# Comparing what torch.load returns


def enum_members(obj, path="", out=None, seen=None):
    """path -> enum member for every member reachable through dicts, lists, tuples and object
    attributes (paths as in ckpt_testlib.walk_tensors)."""
    if out is None:
        out, seen = {}, set()
    join = lambda part: f"{path}.{part}" if path else str(part)
    if isinstance(obj, enum.Enum):
        out[path] = obj
        return out
    if isinstance(obj, (torch.Tensor, np.ndarray, type)) or id(obj) in seen:
        return out
    seen.add(id(obj))
    if isinstance(obj, dict):
        for k, v in obj.items():
            enum_members(v, join(k), out, seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            enum_members(v, join(i), out, seen)
    elif hasattr(obj, "__dict__") and not callable(obj):
        for k, v in vars(obj).items():
            enum_members(v, join(k), out, seen)
    seen.discard(id(obj))
    return out


def is_singleton(member):
    """Whether looking the member up again returns the same object. True for every member and
    cached Flag combination; False for an IntFlag value with bits no member has (Python
    builds a new pseudo-member each time, so even torch.load of the original differs)."""
    return type(member)(member._value_) is member


def assert_member(test, want, got, path):
    if is_singleton(want):
        test.assertIs(got, want, path)
    else:
        test.assertIs(type(got), type(want), path)
        test.assertEqual(got._value_, want._value_, path)


def assert_same(test, a, b, path="<root>", tensor_check=None):
    """a == b structurally; tensors bitwise (or through tensor_check(path, a, b)); enum members
    must be the very same objects (`is`), as unpickling a member returns the singleton."""
    if isinstance(a, enum.Enum):
        assert_member(test, a, b, path)
        return
    test.assertIs(type(b), type(a), path)
    if isinstance(a, torch.Tensor):
        if tensor_check:
            tensor_check(path, a, b)
            return
        test.assertEqual((a.dtype, a.shape, a.stride(), a.requires_grad),
                         (b.dtype, b.shape, b.stride(), b.requires_grad), path)
        test.assertTrue(torch.equal(a, b) or (a.numel() == 0), path)
    elif isinstance(a, dict):
        test.assertEqual(list(a.keys()), list(b.keys()), path)
        for k in a:
            assert_same(test, a[k], b[k], f"{path}.{k}", tensor_check)
    elif isinstance(a, (list, tuple)):
        test.assertEqual(len(a), len(b), path)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(test, x, y, f"{path}.{i}", tensor_check)
    elif isinstance(a, np.ndarray):
        test.assertTrue(np.array_equal(a, b), path)
    elif hasattr(a, "__dict__") and not isinstance(a, type) and not callable(a):
        assert_same(test, vars(a), vars(b), path, tensor_check)
    else:
        test.assertEqual(a, b, path)


# ---------------------------------------------------------------------------------------------
# Generic checkpoints holding every kind of enum


def trained(seed=0, hidden=32):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.LayerNorm(hidden),
                                torch.nn.Linear(hidden, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, hidden)).sum().backward()
    opt.step()
    return model, opt


def every_enum_kind():
    """Enum members at the top level, in nested dicts, in a dataclass (NEWOBJ + BUILD), in a
    plain object's state and in optimizer state; the combined Flag values Python 3.11 writes as
    `_operator.or_(getattr(Perm, 'W'), getattr(Perm, 'R'))`, and Perm(0) as `Perm(0)`. A view
    into a bigger storage gives shrink work; the optimizer entry gives strip work."""
    model, opt = trained(0)
    sd = opt.state_dict()
    sd["state"][0]["phase"] = Mode.TRAIN
    sd["param_groups"][0]["precision"] = Color.BLUE
    flat = torch.randn(4096)
    return {
        "model": model.state_dict(),
        "view": flat[100:612],
        "color": Color.RED,
        "mode": Mode.EVAL,
        "kind": Kind.CONV,
        "perm": Perm.X,
        "perm_rw": Perm.R | Perm.W,
        "perm_rwx": Perm.R | Perm.W | Perm.X,
        "perm_none": Perm(0),
        "nested": {"a": {"b": [Color.GREEN, Kind.LINEAR, (Mode.TRAIN, Color.RED)]}},
        "config": RunConfig(),
        "state": PlainState(mode=Mode.EVAL, history=[Color.RED, Color.BLUE], step=7),
        "optimizer": sd,
    }


def enum_read_names(obj):
    """The ' (getattr)' rows inspect should show for obj: one per member name read. A Flag
    value that is not a single member pickles as `_operator.or_` over its single-bit members
    (3.11 Flag.__reduce_ex__), and Flag(0) as a call of the class: no read at all."""
    names = set()
    for member in enum_members(obj).values():
        cls = type(member)
        qual = f"{cls.__module__}.{cls.__qualname__}"
        if isinstance(member, enum.Flag):
            for bit in cls:  # canonical single-bit members
                if bit._value_ & member._value_ == bit._value_:
                    names.add(f"{qual}.{bit._name_} (getattr)")
        else:
            names.add(f"{qual}.{member._name_} (getattr)")
    return names


# ---------------------------------------------------------------------------------------------
# DeepSpeed ZeRO-2 (fp16) folder, as DeepSpeedEngine.save_checkpoint lays it out with dp=2


def deepspeed_zero2(save_dir, tag="global_step14", dp=2, hidden=256, seed=0):
    """Writes <save_dir>/<tag>/mp_rank_00_model_states.pt, zero_pp_rank_{r}_mp_rank_00_optim_states.pt
    for r < dp, <save_dir>/latest and <save_dir>/zero_to_fp32.py, with the keys of
    engine.py::_common_checkpoint_state / _save_zero_checkpoint and stage_1_and_2.py::state_dict.
    Returns {file name: object saved}.

    The module's fp16 params are views into one flat fp16 buffer (`_update_model_bit16_weights`),
    saved uncloned. Real ZeRO-2 clones each rank's fp32 partition and pads it by a few
    elements at most; this double keeps the partitions as views into one flat fp32 buffer of
    every rank's partition plus padding (the layout of parallel_partitioned_bit16_groups),
    so `single_partition_of_fp32_groups` = `group[:lean_length]` views carry whole-buffer bloat
    that shrink can measure."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    torch.manual_seed(seed)
    model = torch.nn.Sequential(collections.OrderedDict([
        ("embed", torch.nn.Linear(hidden, hidden)), ("norm", torch.nn.LayerNorm(hidden)),
        ("head", torch.nn.Linear(hidden, hidden))]))
    model.register_buffer("position_ids", torch.arange(hidden))
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    numel = sum(p.numel() for p in params)
    alignment = 2 * dp  # nccl_start_alignment_factor * dp world size
    aligned = -(-numel // alignment) * alignment
    flat16 = torch.zeros(aligned, dtype=torch.float16)
    off = 0
    for p in params:  # _update_model_bit16_weights: p.data = view of the flat buffer
        n = p.numel()
        flat16[off:off + n].copy_(p.data.reshape(-1))
        p.data = flat16[off:off + n].view(p.shape)
        off += n
    part = aligned // dp
    module_sd = model.state_dict()  # _save_checkpoint passes module_state_dict() uncloned
    ds_config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
                 "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16},
                 "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True},
                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    version = "0.16.4"
    files = {}
    files["mp_rank_00_model_states.pt"] = dict(
        module=module_sd,
        buffer_names=["position_ids"],
        optimizer=None,
        param_shapes=[collections.OrderedDict((n, p.shape) for n, p in zip(names, params))],
        frozen_param_shapes=collections.OrderedDict(),
        shared_params={},
        frozen_param_fragments=collections.OrderedDict(),
        lr_scheduler={"last_batch_iteration": 13, "warmup_min_lr": [0.0], "warmup_max_lr": [1e-4],
                      "warmup_num_steps": [10]},
        data_sampler=None,
        random_ltd=None,
        sparse_tensor_module_names=set(),
        skipped_steps=1,
        global_steps=14,
        global_samples=112,
        dp_world_size=dp,
        mp_world_size=1,
        checkpoint_parallel_dimensions={"pp_degree": 1, "tp_degree": 1},
        ds_config=ds_config,
        ds_version=version,
    )
    # fp32 master weights: one flat buffer of all partitions plus padding (see docstring).
    fp32_flat = torch.cat([flat16.float(), torch.zeros(part)])  # the padding rides along
    starts = np.cumsum([0] + [p.numel() for p in params])
    for rank in range(dp):
        left = rank * part
        padding = max(0, left + part - numel) if numel > left else part
        partition = fp32_flat[left:left + part]
        lean = partition[:part - padding]  # _get_groups_without_padding
        torch.manual_seed(100 + rank)
        base = {"state": {0: {"step": torch.tensor(14.0), "exp_avg": torch.randn(part) * 1e-3,
                              "exp_avg_sq": torch.rand(part) * 1e-6}},
                "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
                                  "amsgrad": False, "foreach": None, "maximize": False, "capturable": False,
                                  "params": [0]}]}
        mapping = collections.OrderedDict()
        for name, begin, end in zip(names, starts[:-1], starts[1:]):
            lo, hi = max(begin, left), min(end, left + part)
            if lo < hi:
                mapping[name] = fragment_address(numel=int(hi - lo), start=int(lo - left))
        scaler = DynamicLossScaler(init_scale=2 ** 16, scale_window=1000, min_scale=1, delayed_shift=2,
                                   consecutive_hysteresis=False, raise_error_at_min_scale=True,
                                   dtype=torch.half)
        scaler.cur_iter = 14
        files[f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"] = dict(
            optimizer_state_dict={
                "loss_scaler": scaler,
                "dynamic_loss_scale": True,
                "overflow": False,
                "clip_grad": 1.0,
                "base_optimizer_state": base,
                "single_partition_of_fp32_groups": [lean],
                "zero_stage": ZeroStageEnum.gradients,
                "group_paddings": [padding],
                "partition_count": [dp],
                "ds_version": version,
                "param_slice_mappings": [mapping],
            },
            ds_config=ds_config,
            ds_version=version,
        )
    folder = os.path.join(save_dir, tag)
    os.makedirs(folder, exist_ok=True)
    for name, obj in files.items():
        torch.save(obj, os.path.join(folder, name))
    with open(os.path.join(save_dir, "latest"), "w") as f:
        f.write(tag)
    with open(os.path.join(save_dir, "zero_to_fp32.py"), "w") as f:
        f.write("# DeepSpeed copies its recovery script here (_copy_recovery_script)\n")
    return files


# ---------------------------------------------------------------------------------------------
# Hugging Face Trainer checkpoint-500/


def hf_training_args(output_dir):
    from transformers.training_args import TrainingArguments

    args = TrainingArguments(output_dir=output_dir, eval_strategy="epoch", save_strategy="steps",
                             save_steps=500, lr_scheduler_type="cosine", optim="adamw_torch_fused",
                             debug="underflow_overflow", learning_rate=2e-5, fp16=True,
                             report_to=["tensorboard"])
    assert args.device == torch.device("cpu")  # Trainer touches it: cached in __dict__
    return args


def hf_checkpoint(root, step=500):
    """<root>/checkpoint-<step>/ as Trainer._save_checkpoint writes it (pytorch_model.bin,
    optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json, training_args.bin).
    Returns (folder, {file name: object saved})."""
    import random

    folder = os.path.join(root, f"checkpoint-{step}")
    os.makedirs(folder, exist_ok=True)
    model, opt = trained(5, hidden=64)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    sched_sd = sched.state_dict()
    sched_sd["lr_lambdas"] = [None]
    files = {
        "pytorch_model.bin": model.state_dict(),
        "optimizer.pt": opt.state_dict(),
        "scheduler.pt": sched_sd,
        "rng_state.pth": {"python": random.getstate(), "numpy": np.random.get_state(),
                          "cpu": torch.get_rng_state()},
        "training_args.bin": hf_training_args(os.path.dirname(folder)),
    }
    for name, obj in files.items():
        torch.save(obj, os.path.join(folder, name))
    with open(os.path.join(folder, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step, "epoch": 1.0, "log_history": []}, f)
    return folder, files


# ---------------------------------------------------------------------------------------------
# Lightning


def lightning_checkpoint():
    import pathlib

    from lit_project.config import Activation, NormKind, Precision

    model, opt = trained(7)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    hparams = {"hidden": 32, "lr": 1e-3, "activation": Activation.GELU, "norm": NormKind.RMS,
               "precision": Precision.BF16, "acts_per_layer": [Activation.SILU, Activation.GELU],
               "data_dir": pathlib.PosixPath("/data/run1")}
    return {"epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.4.0",
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 4, "completed": 3}}}},
            "callbacks": {"ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0, "
                          "'every_n_epochs': 1, 'train_time_interval': None}": {
                              "monitor": "val_loss", "best_model_score": torch.tensor(0.25),
                              "best_model_path": "/ckpt/epoch=2.ckpt", "current_score": torch.tensor(0.25),
                              "dirpath": "/ckpt", "best_k_models": {"/ckpt/epoch=2.ckpt": torch.tensor(0.25)}}},
            "optimizer_states": [opt.state_dict()], "lr_schedulers": [sched.state_dict()],
            "hparams_name": "kwargs", "hyper_parameters": hparams}


def run_python(code, timeout=120):
    """Runs code under /usr/bin/python3 with py311_stacks importable; returns the CompletedProcess."""
    return subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=child_env())
