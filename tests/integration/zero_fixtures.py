"""DeepSpeed ZeRO stage 1/2/3 checkpoint folders, written with real torch.save the way
DeepSpeedEngine.save_checkpoint writes them, and the reference consolidation of
deepspeed/utils/zero_to_fp32.py re-implemented from its source (groundwork for issue 14).

Source read: deepspeedai/DeepSpeed at commit DEEPSPEED_COMMIT (version.txt DEEPSPEED_VERSION):
deepspeed/utils/zero_to_fp32.py, deepspeed/runtime/engine.py, deepspeed/runtime/zero/stage_1_and_2.py,
deepspeed/runtime/zero/stage3.py, deepspeed/runtime/zero/partition_parameters.py,
deepspeed/runtime/bf16_optimizer.py, deepspeed/runtime/fp16/loss_scaler.py,
deepspeed/utils/tensor_fragment.py, deepspeed/utils/mixed_precision_linkage.py,
deepspeed/checkpoint/constants.py, deepspeed/checkpoint/ds_to_universal.py,
deepspeed/checkpoint/utils.py (clone_tensors_for_torch_save), deepspeed/ops/adam/fused_adam.py.
No DeepSpeed code is copied here; the classes that get pickled come from the test doubles in
py311_stacks/deepspeed (module paths, names and attributes only).

Entry points
  make_zero_checkpoint(root, stage, world_size, ...) -> ZeroFixture
  reference_consolidate(root, tag=None, exclude_frozen_parameters=False) -> OrderedDict
  make_bf16_optimizer_checkpoint / make_tensor_parallel_checkpoint / make_moe_checkpoint /
  make_universal_checkpoint / make_autoep_zero3_checkpoint -> RefusedFixture (the folder plus
  the exception type and exact message zero_to_fp32 raises on it)
  natural_keys, bitwise_equal, assert_state_dicts_bitwise_equal, run_real_zero_to_fp32

Run this file directly for a self-test: `python3 zero_fixtures.py`.
"""
import collections
import contextlib
import dataclasses
import enum
import glob
import json
import math
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
STACKS = os.path.join(HERE, "py311_stacks")
if STACKS not in sys.path:
    sys.path.insert(0, STACKS)
sys.dont_write_bytecode = True  # keep py311_stacks/ free of __pycache__ folders

from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler  # noqa: E402 (py311_stacks)
from deepspeed.runtime.zero.config import ZeroStageEnum  # noqa: E402
from deepspeed.utils.tensor_fragment import fragment_address  # noqa: E402

DEEPSPEED_REPO = "deepspeedai/DeepSpeed"
DEEPSPEED_COMMIT = "edaa7221267243c7be7fb49c5d5f5c4fb97b4641"
DEEPSPEED_VERSION = "0.19.6"

# deepspeed/checkpoint/constants.py
OPTIMIZER_STATE_DICT = "optimizer_state_dict"
FP32_FLAT_GROUPS = "fp32_flat_groups"
BASE_OPTIMIZER_STATE = "base_optimizer_state"
BASE_OPTIMIZER_STATE_STEP = "base_optimizer_state_step"
SINGLE_PARTITION_OF_FP32_GROUPS = "single_partition_of_fp32_groups"
PARAM_ALIGNMENT_PADDINGS = "param_alignment_paddings"  # DeepSpeed >= 0.19.7
PARAM_GROUPS = "param_groups"
GROUP_PADDINGS = "group_paddings"
PARTITION_COUNT = "partition_count"
ZERO_STAGE = "zero_stage"
CLIP_GRAD = "clip_grad"
LOSS_SCALER = "loss_scaler"
PARAM = "param"
PARAM_SHAPES = "param_shapes"
BUFFER_NAMES = "buffer_names"
FROZEN_PARAM_SHAPES = "frozen_param_shapes"
FROZEN_PARAM_FRAGMENTS = "frozen_param_fragments"
DS_VERSION = "ds_version"
PARAM_SLICE_MAPPINGS = "param_slice_mappings"
CAT_DIM = "cat_dim"
UNIVERSAL_CHECKPOINT_INFO = "universal_checkpoint_info"
UNIVERSAL_CHECKPOINT_VERSION_KEY = "universal_checkpoint_version"
UNIVERSAL_CHECKPOINT_VERSION_VALUE = 0.4
CHECKPOINT_PARALLEL_DIMS = "checkpoint_parallel_dimensions"
CHECKPOINT_PP_DEGREE = "pp_degree"
CHECKPOINT_TP_DEGREE = "tp_degree"
AUTOEP_LAYERS_KEY = "ds_autoep_layers"
AUTOEP_LAYERS_KEY_LEGACY = "autoep_layers"
AUTOEP_ZERO3_EXPERT_STATE_FORMAT_KEY = "checkpoint_format"
AUTOEP_ZERO3_PARTITIONED_EXPERT_STATE_FORMAT = "zero3_partitioned"
AUTOEP_ZERO3_EXPERT_STATE_FORMAT_VERSION_KEY = "checkpoint_format_version"
AUTOEP_ZERO3_EXPERT_STATE_FORMAT_VERSION = 1
EXPERT_PARAMETER_PATTERNS = "expert_parameter_patterns"

# engine.py::_common_checkpoint_state, in its order (client_state keys follow)
MODEL_STATE_KEYS = (
    "module", BUFFER_NAMES, "optimizer", PARAM_SHAPES, FROZEN_PARAM_SHAPES, "shared_params",
    FROZEN_PARAM_FRAGMENTS, "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
    "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size",
    CHECKPOINT_PARALLEL_DIMS, "ds_config", DS_VERSION)
# engine.py::_save_zero_checkpoint
OPTIM_FILE_KEYS = (OPTIMIZER_STATE_DICT, "ds_config", DS_VERSION)
# stage_1_and_2.py::DeepSpeedZeroOptimizer.state_dict (elastic_checkpoint False, the default)
ZERO12_OPTIM_KEYS = (LOSS_SCALER, "dynamic_loss_scale", "overflow", CLIP_GRAD, BASE_OPTIMIZER_STATE,
                     SINGLE_PARTITION_OF_FP32_GROUPS, ZERO_STAGE, GROUP_PADDINGS, PARTITION_COUNT, DS_VERSION,
                     PARAM_SLICE_MAPPINGS)
# stage3.py::DeepSpeedZeroOptimizer_Stage3._rigid_state_dict
ZERO3_OPTIM_KEYS = (ZERO_STAGE, LOSS_SCALER, "dynamic_loss_scale", "overflow", PARTITION_COUNT,
                    OPTIMIZER_STATE_DICT, FP32_FLAT_GROUPS)
# bf16_optimizer.py::BF16_Optimizer.state_dict (no zero_stage)
BF16_OPTIMIZER_KEYS = (CLIP_GRAD, BASE_OPTIMIZER_STATE, SINGLE_PARTITION_OF_FP32_GROUPS, GROUP_PADDINGS,
                       PARTITION_COUNT, DS_VERSION, PARAM_SLICE_MAPPINGS)

GPUS_PER_NODE = 8  # rank r's GPU tensors are saved with location "cuda:{r % 8}" (local rank)
ADAM_DEFAULTS = (("lr", 3e-4), ("bias_correction", True), ("betas", (0.9, 0.999)), ("eps", 1e-8),
                 ("weight_decay", 0.0))  # deepspeed.ops.adam.FusedAdam defaults, lr from ds_config
WEIGHT_DECAYS = (0.01, 0.0, 0.0)  # decay / no-decay / extra group, as Hugging Face Trainer builds them


# ---------------------------------------------------------------------------------------------
# Small utilities


def natural_keys(text):
    """zero_to_fp32.natural_keys: digit runs compare as numbers (rank 10 after rank 9)."""
    return [int(c) if c.isdigit() else c for c in re.split(r"(\d+)", text)]


def _numel(shape):
    return shape.numel() if callable(getattr(shape, "numel", None)) else math.prod(shape)


def bitwise_equal(a, b):
    """Same dtype, shape and bytes (NaN-safe, tells -0.0 from 0.0)."""
    if not (torch.is_tensor(a) and torch.is_tensor(b)):
        return False
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    a = a.detach().contiguous().reshape(-1)
    b = b.detach().contiguous().reshape(-1)
    if a.dtype.is_floating_point:
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.view(width), b.view(width)
    return torch.equal(a, b)


def assert_state_dicts_bitwise_equal(got, want, context=""):
    """Same keys in the same order, every tensor bitwise_equal; aliases must be the same object
    in `got` where they are in `want`."""
    if list(got.keys()) != list(want.keys()):
        raise AssertionError(f"{context}: keys differ\n got  {list(got.keys())}\n want {list(want.keys())}")
    first_of = {}
    for name in want:
        if not bitwise_equal(got[name], want[name]):
            g, w = got[name], want[name]
            raise AssertionError(f"{context}: {name} differs: got {g.dtype} {tuple(g.shape)} "
                                 f"want {w.dtype} {tuple(w.shape)}")
        owner = first_of.setdefault(id(want[name]), name)
        if owner != name and got[name] is not got[owner]:
            raise AssertionError(f"{context}: {name} should be the same tensor as {owner}")


def _storage_cdata(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()._cdata
    return t.storage()._storage._cdata


class _Py310EnumPickler(pickle.Pickler):
    """Pickles enum members the way Python <= 3.10 did: EnumClass(value)."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return type(obj), (obj._value_,)
        return NotImplemented


_PY310_PICKLE = types.SimpleNamespace(Pickler=_Py310EnumPickler, __name__="pickle")


@contextlib.contextmanager
def _storage_locations(locations):
    """While saving, storages whose _cdata is in `locations` get that location tag (e.g.
    "cuda:3") instead of "cpu": the bytes torch.save writes for tensors living on a GPU."""
    registry = torch.serialization._package_registry

    def tagger(storage):
        return locations.get(getattr(storage, "_cdata", None))

    def deserializer(obj, location):
        return None

    entry = (1, tagger, deserializer)
    registry.append(entry)
    registry.sort(key=lambda e: e[0])
    try:
        yield
    finally:
        registry.remove(entry)


@dataclasses.dataclass
class _File:
    obj: object
    gpu: list  # (tensor, rank) pairs: tensors DeepSpeed has on that rank's GPU when it saves


def _save_file(path, f, python311_enum, device):
    locations = {}
    if device == "cuda":
        for t, rank in f.gpu:
            locations[_storage_cdata(t)] = f"cuda:{rank % GPUS_PER_NODE}"
    kwargs = {} if python311_enum else {"pickle_module": _PY310_PICKLE}
    with _storage_locations(locations):
        torch.save(f.obj, path, **kwargs)


def _module_metadata(names):
    """nn.Module.state_dict() keeps `_metadata` (module prefix -> {'version': 1}, pre-order),
    which pickles as the OrderedDict's state."""
    meta = collections.OrderedDict()
    meta[""] = {"version": 1}
    for name in names:
        parts = name.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            meta.setdefault(".".join(parts[:i]), {"version": 1})
    return meta


def _state_dict(items, names):
    sd = collections.OrderedDict(items)
    sd._metadata = _module_metadata(names)
    return sd


def clone_tensors_for_torch_save(item):
    """deepspeed/checkpoint/utils.py::clone_tensors_for_torch_save (device cpu), as the MoE save
    path applies it: tensors cloned one by one (no storage sharing left), lists, tuples and dicts
    rebuilt -- so a torch.Size (a tuple) becomes a plain tuple and `_metadata` is dropped."""
    if torch.is_tensor(item):
        return item.detach().clone()
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v) for v in item]
    if isinstance(item, tuple):
        return tuple([clone_tensors_for_torch_save(v) for v in item])
    if isinstance(item, dict):
        return type(item)({k: clone_tensors_for_torch_save(v) for k, v in item.items()})
    return item


# ---------------------------------------------------------------------------------------------
# The model


@dataclasses.dataclass
class Entry:
    kind: str  # "param" (trainable), "frozen", "buffer", "alias"
    name: str
    shape: tuple = ()
    group: int = 0  # optimizer param group of a trainable param
    dtype: torch.dtype = torch.float32  # of a buffer
    owner: str = ""  # of an alias


def default_layout(zero_d_param=True, with_frozen=True, with_buffer=True, with_tied=True):
    """A small transformer in nn.Module.state_dict() order. Groups: 0 = weights with decay
    (544 elements), 1 = biases/norms/0-d scale (65 or 64), 2 = one element (so that with 11 ranks
    ten of them hold only padding)."""
    e = []
    e.append(Entry("param", "embed.weight", (12, 8), 0))
    if with_buffer:
        e.append(Entry("buffer", "embed.position_ids", (16,), dtype=torch.int64))
    if with_frozen:
        e.append(Entry("frozen", "pos_embed.weight", (5, 7)))
    e.append(Entry("param", "layers.0.norm.weight", (8,), 1))
    e.append(Entry("param", "layers.0.attn.qkv.weight", (24, 8), 0))
    e.append(Entry("param", "layers.0.attn.qkv.bias", (24,), 1))
    if zero_d_param:
        e.append(Entry("param", "layers.0.attn.scale", (), 1))
    if with_buffer:
        e.append(Entry("buffer", "layers.0.attn.rotary.inv_freq", (4,), dtype=torch.float32))
    e.append(Entry("param", "layers.0.mlp.fc1.weight", (16, 8), 0))
    e.append(Entry("param", "layers.0.mlp.fc1.bias", (16,), 1))
    e.append(Entry("param", "layers.0.mlp.fc2.weight", (8, 16), 0))
    e.append(Entry("param", "layers.0.mlp.fc2.bias", (8,), 1))
    e.append(Entry("param", "final_norm.weight", (8,), 1))
    e.append(Entry("param", "head.logit_scale", (1,), 2))
    if with_tied:
        e.append(Entry("alias", "lm_head.weight", owner="embed.weight"))
    return e


def layout_from_groups(groups, with_frozen=True, with_buffer=True, with_tied=True):
    """`groups`: list of lists of (name, shape). Module order: the groups' params in order, then
    the frozen param, the buffers, and an alias of the first param."""
    e = []
    for g, params in enumerate(groups):
        for name, shape in params:
            e.append(Entry("param", name, tuple(shape), g))
    if with_frozen:
        e.append(Entry("frozen", "frozen.weight", (5, 7)))
    if with_buffer:
        e.append(Entry("buffer", "buffers.position_ids", (16,), dtype=torch.int64))
        e.append(Entry("buffer", "buffers.inv_freq", (4,), dtype=torch.float32))
    if with_tied:
        e.append(Entry("alias", "tied.weight", owner=groups[0][0][0]))
    return e


def _make_values(layout, seed):
    """The full fp32 model: params and frozen params fp32 (not 16-bit representable), buffers as
    the model registers them; an alias is the owner's tensor object."""
    g = torch.Generator().manual_seed(seed)
    values = collections.OrderedDict()
    for e in layout:
        if e.kind in ("param", "frozen"):
            values[e.name] = torch.randn(e.shape, generator=g) * 0.5 + 0.01
        elif e.kind == "buffer":
            if e.dtype.is_floating_point:
                n = _numel(e.shape)
                values[e.name] = (1.0 / (10000 ** (torch.arange(0, 2 * n, 2, dtype=torch.float32) / (2 * n)))
                                  ).reshape(e.shape).to(e.dtype)
            else:
                values[e.name] = torch.arange(_numel(e.shape), dtype=e.dtype).reshape(e.shape)
        else:
            values[e.name] = values[e.owner]
    return values


def _groups_of(layout):
    n = 1 + max([e.group for e in layout if e.kind == "param"], default=-1)
    return [[e.name for e in layout if e.kind == "param" and e.group == g] for g in range(n)]


# ---------------------------------------------------------------------------------------------
# What the engine saves besides the partitions


def _ds_config(stage, world_size, dtype, sub_group_size=None, bf16_optimizer=False, offload=False):
    cfg = {
        "train_batch_size": 4 * world_size,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
                                                     "warmup_num_steps": 10}},
    }
    if dtype == torch.bfloat16:
        cfg["bf16"] = {"enabled": True}
    elif dtype == torch.float16:
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                       "hysteresis": 2, "min_loss_scale": 1}
    zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 500000000,
            "allgather_bucket_size": 500000000}
    if stage == 3:
        zero["stage3_sub_group_size"] = int(sub_group_size or 1e9)
        zero["stage3_param_persistence_threshold"] = 0
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    cfg["zero_optimization"] = zero
    if bf16_optimizer:
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg


def _loss_scaler(dtype, global_steps):
    """fp16/loss_scaler.py::CreateLossScaler: dynamic for fp16, LossScaler(1.0) otherwise."""
    if dtype == torch.float16:
        s = DynamicLossScaler(init_scale=2 ** 16, scale_window=1000, min_scale=1, delayed_shift=2,
                              consecutive_hysteresis=False, raise_error_at_min_scale=True, dtype=torch.float16)
        s.cur_scale = 2.0 ** 15
        s.cur_iter = global_steps
        s.last_overflow_iter = 1
        s.cur_hysteresis = 1
        return s
    return LossScaler(scale=1.0)


def _param_group(g, params):
    """A FusedAdam param group as torch's Optimizer.state_dict packs it ('params' last)."""
    d = {"weight_decay": WEIGHT_DECAYS[g] if g < len(WEIGHT_DECAYS) else 0.0}
    for k, v in ADAM_DEFAULTS:
        d.setdefault(k, v)
    d["step"] = 0  # FusedAdam sets group['step'] = 0 once; the count lives in state['step']
    d["params"] = params
    return d


def _adam_state(numel, real, step, gen):
    """FusedAdam state of one flat fp32 tensor; zeros where the flat tensor is padding."""
    exp_avg = torch.zeros(numel)
    exp_avg_sq = torch.zeros(numel)
    for lo, hi in real:
        exp_avg[lo:hi] = torch.randn(hi - lo, generator=gen) * 1e-3
        exp_avg_sq[lo:hi] = torch.rand(hi - lo, generator=gen) * 1e-6
    return {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


def _common_state(module, buffer_names, param_shapes, frozen_param_shapes, shared_params,
                  frozen_param_fragments, *, world_size, mp_world_size, tp_degree, global_steps, skipped_steps,
                  ds_config, optimizer=None):
    """engine.py::_common_checkpoint_state."""
    return dict(
        module=module,
        buffer_names=buffer_names,
        optimizer=optimizer,
        param_shapes=param_shapes,
        frozen_param_shapes=frozen_param_shapes,
        shared_params=shared_params,
        frozen_param_fragments=frozen_param_fragments,
        lr_scheduler={"last_batch_iteration": global_steps - 1},  # WarmupLR.state_dict()
        data_sampler=None,
        random_ltd=None,
        sparse_tensor_module_names=set(),
        skipped_steps=skipped_steps,
        global_steps=global_steps,
        global_samples=global_steps * ds_config["train_batch_size"],
        dp_world_size=world_size,
        mp_world_size=mp_world_size,
        **{CHECKPOINT_PARALLEL_DIMS: {CHECKPOINT_PP_DEGREE: 1, CHECKPOINT_TP_DEGREE: tp_degree}},
        ds_config=ds_config,
        ds_version=DEEPSPEED_VERSION,
    )


def _bit16_prefix(dtype):
    """engine.py::_get_zero_ckpt_prefix: 'bf16_' when bf16 is enabled."""
    return "bf16_" if dtype == torch.bfloat16 else ""


def optim_file_name(rank, mp_rank=0, dtype=torch.bfloat16):
    return f"{_bit16_prefix(dtype)}zero_pp_rank_{rank}_mp_rank_{mp_rank:02d}_optim_states.pt"


def model_file_name(stage, rank=0, mp_rank=0):
    """engine.py::_get_ckpt_name."""
    if stage == 3:
        return f"zero_pp_rank_{rank}_mp_rank_{mp_rank:02d}_model_states.pt"
    return f"mp_rank_{mp_rank:02d}_model_states.pt"


# ---------------------------------------------------------------------------------------------
# Partitioning


def _zero12_split(flat32, world_size, fill):
    """stage_1_and_2.py: the group's flat buffer is padded with zeros (align_dense_tensors) to a
    multiple of nccl_start_alignment_factor (2) * world size, so every rank's partition has the
    same size ps = padded / world_size; rank r owns [r*ps, (r+1)*ps). Returns the padded flat
    buffer, ps, and per rank the padding its partition holds (the `groups_padding` rule)."""
    n = flat32.numel()
    alignment = 2 * world_size
    padded = int(math.ceil(n / alignment)) * alignment
    buf = torch.full((padded,), fill, dtype=torch.float32)
    buf[:n] = flat32
    ps = padded // world_size
    paddings = []
    for r in range(world_size):
        left = r * ps
        if n <= left:
            paddings.append(ps)
        elif n < left + ps:
            paddings.append(left + ps - n)
        else:
            paddings.append(0)
    return buf, ps, paddings


def _slice_mappings(names, shapes, left, ps):
    """mixed_precision_linkage._init_lp_to_hp_mapping + tensor_fragment.get_hp_fragment_mapping:
    name -> fragment_address(numel, start within this rank's partition) for the params that
    overlap [left, left + ps)."""
    mapping = collections.OrderedDict()
    cur = 0
    for name, shape in zip(names, shapes):
        n = _numel(shape)
        if cur < left + ps and cur + n > left:
            lo, hi = max(cur, left), min(cur + n, left + ps)
            mapping[name] = fragment_address(start=lo - left, numel=hi - lo)
        cur += n
    return mapping


def zero3_partition_numel(numel, world_size):
    """partition_parameters.py: each param is padded to a multiple of the world size;
    every rank holds ps = ceil(numel / world_size) elements of it."""
    return int(math.ceil(numel / world_size))


def _zero3_sub_groups(names, numels, world_size, sub_group_size):
    """stage3.py::_create_fp16_sub_groups, by partition numel."""
    part = [zero3_partition_numel(n, world_size) for n in numels]
    if sub_group_size is None or sub_group_size >= sum(part):
        return [list(names)]
    out, cur, size = [], [], 0
    for i, name in enumerate(names):
        cur.append(name)
        size += part[i]
        if size >= sub_group_size or i == len(names) - 1:
            out.append(cur)
            cur, size = [], 0
    return out


# ---------------------------------------------------------------------------------------------
# The fixture


@dataclasses.dataclass
class ZeroFixture:
    root: str
    tag: str
    folder: str
    stage: int
    world_size: int
    dtype: torch.dtype
    files: dict  # basename -> the object torch.save wrote
    model_files: list  # basenames, digit-aware order
    optim_files: list
    model: collections.OrderedDict  # the full model in module order: fp32 params, buffers, aliases
    expected: collections.OrderedDict  # what zero_to_fp32 returns for this folder
    param_groups: list  # trainable names per param_shapes entry (stage 3: per sub-group)
    frozen: list
    buffers: list
    aliases: dict  # alias -> owner


def make_zero_checkpoint(root, stage, world_size, tag="global_step14", dtype=torch.bfloat16, groups=None,
                         with_frozen=True, with_buffer=True, with_tied=True, zero_d_param=True,
                         views_with_padding=True, python311_enum=True, seed=0, sub_group_size=None,
                         device="cuda", offload=False, cast_buffers=False, padding_fill=None,
                         global_steps=14, recovery_script=True):
    """Writes <root>/latest and <root>/<tag>/ as DeepSpeedEngine.save_checkpoint does for ZeRO
    `stage` (1, 2, 3) on `world_size` data-parallel ranks, tensor/pipeline parallel 1.

    dtype: the 16-bit (or fp32) training dtype; bf16 names optimizer files bf16_zero_pp_rank_*.
    groups: list of lists of (name, shape), the optimizer's param groups (default: default_layout()).
    views_with_padding: stages 1/2 save `single_partition_of_fp32_groups[i]` as DeepSpeed does,
      a view `partition[:lean_length]` whose storage still holds the rank's padding; False saves
      a clone without it. (Stage 1/2 module params are always views into the group's flat 16-bit
      buffer; stage 3 fp32 groups are views into one buffer only for fp32 training.)
    python311_enum: zero_stage pickled as Python >= 3.11 does (getattr(ZeroStageEnum, 'gradients'));
      False: as <= 3.10 did (ZeroStageEnum(2)).
    sub_group_size: stage 3 stage3_sub_group_size (None = DeepSpeed's 1e9: one sub-group per group).
    device: "cuda" writes GPU-resident tensors with location cuda:<local rank> as on a GPU node
      (torch.load then needs map_location='cpu', as zero_to_fp32 passes); "cpu" writes all "cpu".
    offload: ZeRO-Offload of the optimizer (fp32 partitions and Adam state on the CPU).
    cast_buffers: float buffers saved in the 16-bit dtype (DeepSpeed before buffers were kept fp32).
    padding_fill: value of padding elements; None = DeepSpeed's: zeros for stages 1/2
      (align_dense_tensors), uninitialized memory for stage 3 (here NaN).
    """
    if stage not in (1, 2, 3):
        raise ValueError(f"stage {stage}")
    layout = (default_layout(zero_d_param, with_frozen, with_buffer, with_tied) if groups is None
              else layout_from_groups(groups, with_frozen, with_buffer, with_tied))
    built = _build(layout, stage, world_size, dtype=dtype, seed=seed, views_with_padding=views_with_padding,
                   sub_group_size=sub_group_size, offload=offload, cast_buffers=cast_buffers,
                   padding_fill=padding_fill, global_steps=global_steps, device=device)
    return _write(root, tag, built, stage, world_size, dtype, python311_enum, device, recovery_script)


@dataclasses.dataclass
class _Built:
    files: dict  # basename -> _File
    model: collections.OrderedDict
    expected: collections.OrderedDict
    param_groups: list
    frozen: list
    buffers: list
    aliases: dict


def _build(layout, stage, world_size, *, dtype, seed, views_with_padding=True, sub_group_size=None,
           offload=False, cast_buffers=False, padding_fill=None, global_steps=14, mp_rank=0, mp_world_size=1,
           bf16_optimizer=False, device="cuda"):
    model = _make_values(layout, seed)
    entries = {e.name: e for e in layout}
    module_names = [e.name for e in layout]
    groups = _groups_of(layout)
    frozen = [e.name for e in layout if e.kind == "frozen"]
    buffers = [e.name for e in layout if e.kind == "buffer"]
    aliases = collections.OrderedDict((e.name, e.owner) for e in layout if e.kind == "alias")
    ds_config = _ds_config(stage, world_size, dtype, sub_group_size, bf16_optimizer, offload)
    skipped_steps = 2 if dtype == torch.float16 else 0
    step = global_steps - skipped_steps
    gen = torch.Generator().manual_seed(seed + 1000)
    ws = world_size

    def buffer_value(name):
        v = model[name]
        if cast_buffers and v.dtype.is_floating_point:
            v = v.to(dtype)
        return v.clone()

    files = collections.OrderedDict()
    tp = mp_world_size
    common = dict(world_size=ws, mp_world_size=mp_world_size, tp_degree=tp, global_steps=global_steps,
                  skipped_steps=skipped_steps, ds_config=ds_config)

    if stage in (1, 2):
        fill = 0.0 if padding_fill is None else padding_fill
        # --- model states: module params are views into each group's flat 16-bit buffer
        module_tensor = {}
        gpu0 = []
        flat_fp32 = []
        for g, names in enumerate(groups):
            flat32 = torch.cat([model[n].reshape(-1) for n in names]) if names else torch.zeros(0)
            buf32, ps, paddings = _zero12_split(flat32, ws, fill)
            flat_fp32.append((flat32, buf32, ps, paddings))
            flat16 = torch.zeros(buf32.numel(), dtype=dtype)  # align_dense_tensors pads with zeros
            flat16[:flat32.numel()] = flat32.to(dtype)
            gpu0.append((flat16, 0))
            off = 0
            for n in names:
                k = model[n].numel()
                module_tensor[n] = flat16.narrow(0, off, k).view(entries[n].shape)
                off += k
        for n in frozen:
            module_tensor[n] = model[n].to(dtype)
            gpu0.append((module_tensor[n], 0))
        for n in buffers:
            module_tensor[n] = buffer_value(n)
            gpu0.append((module_tensor[n], 0))
        module = _state_dict(((n, module_tensor[entries[n].owner if n in aliases else n].detach())
                              for n in module_names), module_names)
        param_shapes = [collections.OrderedDict((n, torch.Size(entries[n].shape)) for n in names)
                        for names in groups]
        if stage == 2:  # save_frozen_param = zero_optimization_partition_gradients()
            frozen_param_shapes = collections.OrderedDict((n, torch.Size(entries[n].shape)) for n in frozen)
            # param.detach().cpu(): a CPU copy on a GPU node, the param itself on a CPU one
            frozen_param_fragments = collections.OrderedDict(
                (n, module_tensor[n].detach() if device == "cpu" else module_tensor[n].detach().clone())
                for n in frozen)
        else:
            frozen_param_shapes = None
            frozen_param_fragments = None
        shared_params = dict(aliases)  # _get_shared_params on rank 0: {alias: owner}
        state = _common_state(module, list(buffers), param_shapes, frozen_param_shapes, shared_params,
                              frozen_param_fragments, **common)
        files[model_file_name(stage, 0, mp_rank)] = _File(state, gpu0)

        # --- optimizer states, one file per data-parallel rank
        for r in range(ws):
            gpu = []
            singles, group_paddings, mappings, adam_state, adam_groups = [], [], [], {}, []
            for g, names in enumerate(groups):
                flat32, buf32, ps, paddings = flat_fp32[g]
                part = buf32[r * ps:(r + 1) * ps].clone()  # weights_partition ... .clone()
                lean_len = ps - paddings[r]
                if bf16_optimizer:
                    # BF16_Optimizer keeps the whole partition and reports all the padding on the
                    # last rank only
                    saved = part
                    group_paddings.append(buf32.numel() - flat32.numel() if r == ws - 1 else 0)
                else:
                    saved = part[:lean_len] if views_with_padding else part[:lean_len].clone()
                    group_paddings.append(paddings[r])
                singles.append(saved)
                if not offload:
                    gpu.append((saved, r))
                adam_state[g] = _adam_state(ps, [(0, lean_len)] if lean_len > 0 else [], step, gen)
                if not offload:
                    gpu.extend((adam_state[g][k], r) for k in ("exp_avg", "exp_avg_sq"))
                adam_groups.append(_param_group(g, [g]))
                mappings.append(_slice_mappings(names, [entries[n].shape for n in names], r * ps, ps))
            base = {"state": adam_state, "param_groups": adam_groups}
            if bf16_optimizer:
                osd = {CLIP_GRAD: 1.0, BASE_OPTIMIZER_STATE: base, SINGLE_PARTITION_OF_FP32_GROUPS: singles,
                       GROUP_PADDINGS: group_paddings, PARTITION_COUNT: [ws] * len(groups),
                       DS_VERSION: DEEPSPEED_VERSION, PARAM_SLICE_MAPPINGS: mappings}
            else:
                osd = {
                    LOSS_SCALER: _loss_scaler(dtype, global_steps),
                    "dynamic_loss_scale": dtype == torch.float16,
                    "overflow": False,
                    CLIP_GRAD: 1.0,
                    BASE_OPTIMIZER_STATE: base,
                    SINGLE_PARTITION_OF_FP32_GROUPS: singles,
                    ZERO_STAGE: ZeroStageEnum.gradients if stage == 2 else ZeroStageEnum.optimizer_states,
                    GROUP_PADDINGS: group_paddings,
                    PARTITION_COUNT: [ws] * len(groups),
                    DS_VERSION: DEEPSPEED_VERSION,
                    PARAM_SLICE_MAPPINGS: mappings,
                }
            files[optim_file_name(r, mp_rank, dtype)] = _File(
                {OPTIMIZER_STATE_DICT: osd, "ds_config": ds_config, DS_VERSION: DEEPSPEED_VERSION}, gpu)
        shape_groups = groups
    else:
        fill = float("nan") if padding_fill is None else padding_fill
        sub_groups = []
        sub_group_of_group = []
        for g, names in enumerate(groups):
            subs = _zero3_sub_groups(names, [model[n].numel() for n in names], ws, sub_group_size) if names else []
            sub_group_of_group.append(list(range(len(sub_groups), len(sub_groups) + len(subs))))
            sub_groups.extend(subs)

        def pieces(name, to_dtype):
            """Rank r's ds_tensor of a param: [r*ps, (r+1)*ps) of it padded to ps*ws."""
            flat = model[name].reshape(-1)
            ps = zero3_partition_numel(flat.numel(), ws)
            full = torch.full((ps * ws,), fill, dtype=to_dtype)
            full[:flat.numel()] = flat.to(to_dtype)
            return [full[r * ps:(r + 1) * ps].clone() for r in range(ws)]

        fp32_pieces = {n: pieces(n, torch.float32) for names in sub_groups for n in names}
        frozen16 = {n: pieces(n, dtype) for n in frozen}
        param_shapes = [collections.OrderedDict((n, torch.Size(entries[n].shape)) for n in names)
                        for names in sub_groups]
        frozen_param_shapes = collections.OrderedDict((n, torch.Size(entries[n].shape)) for n in frozen)
        for r in range(ws):
            # --- model states of rank r: params are empty placeholders (free_param)
            gpu = []
            placeholders = {}
            for e in layout:
                if e.kind in ("param", "frozen"):
                    placeholders[e.name] = torch.empty(0, dtype=dtype)
                    gpu.append((placeholders[e.name], r))
                elif e.kind == "buffer":
                    placeholders[e.name] = buffer_value(e.name)
                    gpu.append((placeholders[e.name], r))
            module = _state_dict(((n, placeholders[entries[n].owner if n in aliases else n].detach())
                                  for n in module_names), module_names)
            frozen_param_fragments = collections.OrderedDict((n, frozen16[n][r]) for n in frozen)  # .cpu()
            shared_params = dict(aliases) if r == 0 else {}  # computed on global rank 0 only
            state = _common_state(module, list(buffers), param_shapes, frozen_param_shapes, shared_params,
                                  frozen_param_fragments, **common)
            files[model_file_name(3, r, mp_rank)] = _File(state, gpu)

            # --- optimizer states of rank r
            flats = [torch.cat([fp32_pieces[n][r] for n in names]) for names in sub_groups]
            if dtype == torch.float32 and views_with_padding and flats:
                # no mixed precision: the fp32 groups are the flat "fp16" partitions themselves,
                # views into one defragmented buffer (lp_param_buffer)
                one = torch.cat(flats)
                views, off = [], 0
                for f in flats:
                    views.append(one.narrow(0, off, f.numel()))
                    off += f.numel()
                flats = views
            gpu = [] if offload else [(f, r) for f in flats]
            adam_state = {}
            for i, names in enumerate(sub_groups):
                real, off = [], 0
                for n in names:
                    ps = zero3_partition_numel(model[n].numel(), ws)
                    real_here = max(0, min(ps, model[n].numel() - r * ps))
                    if real_here:
                        real.append((off, off + real_here))
                    off += ps
                adam_state[i] = _adam_state(flats[i].numel(), real, step, gen)
                if not offload:
                    gpu.extend((adam_state[i][k], r) for k in ("exp_avg", "exp_avg_sq"))
            inner = {"state": adam_state,
                     "param_groups": [_param_group(g, subs) for g, subs in enumerate(sub_group_of_group)]}
            osd = {
                ZERO_STAGE: ZeroStageEnum.weights,
                LOSS_SCALER: _loss_scaler(dtype, global_steps),
                "dynamic_loss_scale": dtype == torch.float16,
                "overflow": False,
                PARTITION_COUNT: ws,
                OPTIMIZER_STATE_DICT: inner,
                FP32_FLAT_GROUPS: flats,
            }
            files[optim_file_name(r, mp_rank, dtype)] = _File(
                {OPTIMIZER_STATE_DICT: osd, "ds_config": ds_config, DS_VERSION: DEEPSPEED_VERSION}, gpu)
        shape_groups = sub_groups

    # --- what zero_to_fp32 returns: buffers (floating ones float32, as DeepSpeed >= 0.19.7
    # does; the real library's output is compared in tests/real), frozen (16-bit, stages 2/3),
    # trainable (fp32), aliases (the owner's tensor)
    expected = collections.OrderedDict()
    for n in buffers:
        v = buffer_value(n)
        expected[n] = v.float() if v.is_floating_point() else v
    if stage >= 2:
        for n in frozen:
            expected[n] = model[n].to(dtype)
    for names in shape_groups:
        for n in names:
            expected[n] = model[n].clone()
    for alias, owner in aliases.items():
        if owner in expected:
            expected[alias] = expected[owner]
    return _Built(files, model, expected, [list(x) for x in shape_groups], frozen, buffers, dict(aliases))


def _write(root, tag, built, stage, world_size, dtype, python311_enum, device, recovery_script=True,
           latest=True):
    folder = os.path.join(root, tag)
    os.makedirs(folder, exist_ok=True)
    for name, f in built.files.items():
        _save_file(os.path.join(folder, name), f, python311_enum, device)
    if latest:
        with open(os.path.join(root, "latest"), "w") as fd:
            fd.write(tag)  # no newline (engine.py::save_checkpoint)
    if recovery_script:
        with open(os.path.join(root, "zero_to_fp32.py"), "w") as fd:
            fd.write("# DeepSpeed copies its recovery script here (engine.py::_copy_recovery_script)\n")
    names = sorted(built.files, key=natural_keys)
    return ZeroFixture(root=root, tag=tag, folder=folder, stage=stage, world_size=world_size, dtype=dtype,
                       files={n: built.files[n].obj for n in names},
                       model_files=[n for n in names if n.endswith("_model_states.pt")],
                       optim_files=[n for n in names if n.endswith("_optim_states.pt")],
                       model=built.model, expected=built.expected, param_groups=built.param_groups,
                       frozen=built.frozen, buffers=built.buffers, aliases=built.aliases)


# ---------------------------------------------------------------------------------------------
# Reference consolidation: zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint, from its source


def _load(path):
    kwargs = {"map_location": torch.device("cpu"), "weights_only": False}
    return torch.load(path, **kwargs)


def _checkpoint_files(checkpoint_dir, glob_pattern, sort_key):
    files = sorted(glob.glob(os.path.join(checkpoint_dir, glob_pattern)), key=sort_key)
    if len(files) == 0:
        raise FileNotFoundError(f"can't find {glob_pattern} files in directory '{checkpoint_dir}'")
    return files


def _raise_if_autoep_zero3(state_dict):
    layers = state_dict.get(AUTOEP_LAYERS_KEY)
    if layers is None:
        layers = state_dict.get(AUTOEP_LAYERS_KEY_LEGACY)
    if isinstance(layers, list) and any(
            isinstance(x, dict) and x.get(AUTOEP_ZERO3_EXPERT_STATE_FORMAT_KEY) ==
            AUTOEP_ZERO3_PARTITIONED_EXPERT_STATE_FORMAT for x in layers):
        raise NotImplementedError(AUTOEP_MESSAGE)


AUTOEP_MESSAGE = ("zero_to_fp32 does not support AutoEP ZeRO-3 partition-native checkpoints. "
                  "AutoEP expert parameters are partitioned over expert replica groups, so "
                  "global data-parallel consolidation would produce incomplete expert tensors. "
                  "Use ds_to_universal.py for expert-aware conversion.")


def _parse_model_states(files):
    states = []
    for file in files:
        sd = _load(file)
        _raise_if_autoep_zero3(sd)
        if BUFFER_NAMES not in sd:
            raise ValueError(f"{file} is not a model state checkpoint")
        buffer_names = sd[BUFFER_NAMES]
        buffers = {k: v.float() if v.is_floating_point() else v
                   for k, v in sd["module"].items() if k in buffer_names}
        param_shapes = sd[PARAM_SHAPES]
        param_names = []
        for s in param_shapes:  # TypeError when param_shapes is None (no ZeRO optimizer)
            param_names.extend(s.keys())
        frozen_param_shapes = sd.get(FROZEN_PARAM_SHAPES, None)
        shared_params = [[k, v] for k, v in sd["shared_params"].items()]
        states.append(types.SimpleNamespace(buffers=buffers, param_shapes=param_shapes, shared_params=shared_params,
                                            ds_version=sd.get(DS_VERSION, None),
                                            frozen_param_shapes=frozen_param_shapes,
                                            frozen_param_fragments=sd.get(FROZEN_PARAM_FRAGMENTS, None)))
    return states


def _parse_optim_states(files, ds_checkpoint_dir):
    total_files = len(files)
    state_dicts = []
    for f in files:
        sd = _load(f)
        sd[OPTIMIZER_STATE_DICT].pop(OPTIMIZER_STATE_DICT, None)  # the Adam state is not needed
        state_dicts.append(sd)
    if ZERO_STAGE not in state_dicts[0][OPTIMIZER_STATE_DICT]:
        raise ValueError(f"{files[0]} is not a zero checkpoint")
    zero_stage = state_dicts[0][OPTIMIZER_STATE_DICT][ZERO_STAGE]
    world_size = state_dicts[0][OPTIMIZER_STATE_DICT][PARTITION_COUNT]
    if type(world_size) is list:  # stage 1/2: per group; MoE groups may differ, take the max
        world_size = max(world_size)
    if world_size != total_files:
        raise ValueError(
            f"Expected {world_size} of '*_optim_states.pt' under '{ds_checkpoint_dir}' but found {total_files} files. "
            "Possibly due to an overwrite of an old checkpoint, or a checkpoint didn't get saved by one or more processes.")
    if zero_stage <= 2:
        key = SINGLE_PARTITION_OF_FP32_GROUPS
    elif zero_stage == 3:
        key = FP32_FLAT_GROUPS
    else:
        raise ValueError(f"unknown zero stage {zero_stage}")
    return zero_stage, world_size, [sd[OPTIMIZER_STATE_DICT][key] for sd in state_dicts]


def _zero2_merge_trainable(state_dict, world_size, fp32_flat_groups, zero_model_states):
    param_shapes = zero_model_states[0].param_shapes
    merged = [torch.cat([sd[i] for sd in fp32_flat_groups], 0) for i in range(len(fp32_flat_groups[0]))]
    for shapes, full in zip(param_shapes, merged):
        offset = 0
        avail_numel = full.numel()
        for name, shape in shapes.items():
            n = _numel(shape)
            state_dict[name] = full.narrow(0, offset, n).view(shape)
            offset += n
        align_to = 2 * world_size

        def zero2_align(x):
            return align_to * math.ceil(x / align_to)

        offset = zero2_align(offset)
        avail_numel = zero2_align(avail_numel)
        if offset != avail_numel:
            raise ValueError(f"consumed {offset} numels out of {avail_numel} - something is wrong")


def zero3_partitioned_param_info(unpartitioned_numel, world_size):
    """zero_to_fp32.zero3_partitioned_param_info (kept apart from the writer's
    zero3_partition_numel so that each checks the other)."""
    remainder = unpartitioned_numel % world_size
    padding_numel = (world_size - remainder) if remainder else 0
    partitioned_numel = math.ceil(unpartitioned_numel / world_size)
    return partitioned_numel, padding_numel


def _zero3_gather(flat_groups, flat_groups_offset, offset, partitioned_numel, shape):
    """zero_to_fp32.GatheredTensor.contiguous."""
    end_idx = offset + partitioned_numel
    chunks = []
    for rank_groups in flat_groups:
        start_group_id = end_group_id = None
        for group_id in range(len(flat_groups_offset)):
            if flat_groups_offset[group_id] <= offset < flat_groups_offset[group_id + 1]:
                start_group_id = group_id
            if flat_groups_offset[group_id] < end_idx <= flat_groups_offset[group_id + 1]:
                end_group_id = group_id
                break
        for group_id in range(start_group_id, end_group_id + 1):
            flat = rank_groups[group_id]
            lo = offset - flat_groups_offset[group_id]
            hi = min(end_idx, flat_groups_offset[group_id + 1]) - flat_groups_offset[group_id]
            chunks.append(flat[lo:hi])
    return torch.cat(chunks, dim=0)[:shape.numel()].view(shape).contiguous()


def _zero3_merge_trainable(state_dict, world_size, fp32_flat_groups, zero_model_states):
    param_shapes = {k: v for d in zero_model_states[0].param_shapes for k, v in d.items()}
    avail_numel = sum(f.numel() for f in fp32_flat_groups[0]) * world_size
    flat_groups_offset = [0]
    for f in fp32_flat_groups[0]:
        flat_groups_offset.append(flat_groups_offset[-1] + f.numel())
    offset = 0
    for name, shape in param_shapes.items():
        partitioned_numel, _ = zero3_partitioned_param_info(shape.numel(), world_size)
        state_dict[name] = _zero3_gather(fp32_flat_groups, flat_groups_offset, offset, partitioned_numel, shape)
        offset += partitioned_numel
    offset *= world_size
    if offset != avail_numel:
        raise ValueError(f"consumed {offset} numels out of {avail_numel} - something is wrong")


def reference_consolidate(root, tag=None, exclude_frozen_parameters=False, sort_key=natural_keys):
    """zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(root, tag) re-implemented: every rank
    file loaded with torch.load(map_location='cpu'), merged as the script merges, returned in the
    script's order (buffers, frozen, trainable, aliases), raising its exceptions with its messages.
    `sort_key` exists to show what a digit-unaware sort (sort_key=None) does."""
    if tag is None:
        latest_path = os.path.join(root, "latest")
        if os.path.isfile(latest_path):
            with open(latest_path, "r") as fd:
                tag = fd.read().strip()
        else:
            raise ValueError(f"Unable to find 'latest' file at {latest_path}")
    ds_checkpoint_dir = os.path.join(root, tag)
    if not os.path.isdir(ds_checkpoint_dir):
        raise FileNotFoundError(f"Directory '{ds_checkpoint_dir}' doesn't exist")

    zero_model_states = _parse_model_states(_checkpoint_files(ds_checkpoint_dir, "*_model_states.pt", sort_key))
    zero_stage, world_size, fp32_flat_groups = _parse_optim_states(
        _checkpoint_files(ds_checkpoint_dir, "*_optim_states.pt", sort_key), ds_checkpoint_dir)

    state_dict = collections.OrderedDict()
    state_dict.update(zero_model_states[0].buffers)
    first = zero_model_states[0]
    has_frozen = first.frozen_param_shapes is not None and len(first.frozen_param_shapes) > 0
    if zero_stage <= 2:
        if not exclude_frozen_parameters and has_frozen:
            for name, shape in first.frozen_param_shapes.items():
                state_dict[name] = first.frozen_param_fragments[name]
        _zero2_merge_trainable(state_dict, world_size, fp32_flat_groups, zero_model_states)
    else:
        if not exclude_frozen_parameters and has_frozen:
            for name, shape in first.frozen_param_shapes.items():
                frags = tuple(ms.frozen_param_fragments[name] for ms in zero_model_states)
                state_dict[name] = torch.cat(frags, 0).narrow(0, 0, shape.numel()).view(shape)
        _zero3_merge_trainable(state_dict, world_size, fp32_flat_groups, zero_model_states)
    for alias, owner in first.shared_params:
        if owner in state_dict:
            state_dict[alias] = state_dict[owner]

    # to_torch_tensor: materialize, keeping aliases one tensor
    out = collections.OrderedDict()
    converted = {}
    for name, tensor in state_dict.items():
        if id(tensor) in converted:
            out[name] = out[converted[id(tensor)]]
        else:
            converted[id(tensor)] = name
            out[name] = tensor.contiguous()
    return out


# ---------------------------------------------------------------------------------------------
# Checkpoints zero_to_fp32 refuses


@dataclasses.dataclass
class RefusedFixture:
    root: str
    tag: str  # the tag to consolidate (for universal: the universal folder's name)
    folder: str
    files: list  # basenames in the folder, digit-aware order
    error_type: type  # what zero_to_fp32 raises
    error_message: str
    reason: str


def _refused(root, tag, error_type, error_message, reason):
    folder = os.path.join(root, tag)
    return RefusedFixture(root=root, tag=tag, folder=folder, files=sorted(os.listdir(folder), key=natural_keys),
                          error_type=error_type, error_message=error_message, reason=reason)


def make_bf16_optimizer_checkpoint(root, world_size, tag="global_step14", seed=0, python311_enum=True,
                                   device="cuda"):
    """ZeRO stage 1 + bf16 + data_types.grad_accum_dtype fp32 (engine.py::_do_optimizer_sanity_check
    returns BFLOAT16): the engine wraps the optimizer in BF16_Optimizer, not the ZeRO optimizer.
    Model states are those of stage 1 (param_shapes from bf16_groups); the optimizer files
    bf16_zero_pp_rank_*_optim_states.pt hold BF16_Optimizer.state_dict(): no zero_stage, no loss
    scaler, the fp32 partitions with their padding. zero_to_fp32: '<first optim file> is not a
    zero checkpoint'."""
    built = _build(default_layout(), 1, world_size, dtype=torch.bfloat16, seed=seed, bf16_optimizer=True)
    fx = _write(root, tag, built, 1, world_size, torch.bfloat16, python311_enum, device)
    first = os.path.join(root, tag, fx.optim_files[0])
    return _refused(root, tag, ValueError, f"{first} is not a zero checkpoint", "BF16_Optimizer (no zero_stage)")


def _tp_layout(tp_size):
    """Each tensor-parallel rank's shard: dim 0 split where it divides, else replicated."""
    out = []
    for e in default_layout():
        if e.kind in ("param", "frozen") and e.shape and e.shape[0] % tp_size == 0:
            e = dataclasses.replace(e, shape=(e.shape[0] // tp_size,) + tuple(e.shape[1:]))
        out.append(e)
    return out


def make_tensor_parallel_checkpoint(root, stage, world_size, tp_size=2, tag="global_step14", seed=0,
                                    dtype=torch.bfloat16, python311_enum=True, device="cuda"):
    """Tensor parallel `tp_size` > 1: every file exists once per mp rank (mp_rank_01_...).
    zero_to_fp32 globs *_optim_states.pt across all mp ranks, finds world_size * tp_size files for
    a partition_count of world_size and stops: 'Expected N of '*_optim_states.pt' ...'."""
    layout = _tp_layout(tp_size)
    for t in range(tp_size):
        built = _build(layout, stage, world_size, dtype=dtype, seed=seed + 17 * t, mp_rank=t, mp_world_size=tp_size)
        _write(root, tag, built, stage, world_size, dtype, python311_enum, device)
    folder = os.path.join(root, tag)
    msg = (f"Expected {world_size} of '*_optim_states.pt' under '{folder}' but found {world_size * tp_size} files. "
           "Possibly due to an overwrite of an old checkpoint, or a checkpoint didn't get saved by one or more processes.")
    return _refused(root, tag, ValueError, msg, f"tensor parallel {tp_size}")


def make_moe_checkpoint(root, stage, world_size, tag="global_step14", seed=0, dtype=torch.bfloat16,
                        python311_enum=True, device="cuda"):
    """A ZeRO-1/2 model with one native DeepSpeed MoE layer, ep_size = world_size (one expert per
    rank, expert data parallel 1), saved by engine.py::_save_moe_checkpoint:
    - layer_0_expert_{E}_mp_rank_00_model_states.pt: {expert key with the global id: 16-bit clone};
    - mp_rank_00_model_states.pt: the non-expert state dict plus num_experts and ds_autoep_layers
      (None), passed through clone_tensors_for_torch_save (every tensor a separate CPU clone,
      torch.Size shapes turned into tuples, module `_metadata` dropped);
    - the ZeRO optimizer files with an extra param group {'moe': True, 'name': 'ep_size_N'} of the
      rank's own experts, partition_count [N, ..., 1].
    zero_to_fp32 reads layer_0_expert_0_... first (it sorts before mp_/zero_) and stops:
    '<that file> is not a model state checkpoint'."""
    if stage not in (1, 2):
        raise ValueError("make_moe_checkpoint lays out ZeRO stage 1/2 MoE checkpoints")
    ws = world_size
    layout = default_layout()
    gate = "layers.0.moe.deepspeed_moe.gate.wg.weight"
    layout.insert(-1, Entry("param", gate, (ws, 8), 1))
    built = _build(layout, stage, ws, dtype=dtype, seed=seed)
    main = built.files[model_file_name(stage)]
    state = main.obj
    local = "layers.0.moe.deepspeed_moe.experts.deepspeed_experts.{}.weight"
    shape = (4, 8)
    moe_group = len(built.param_groups)
    experts = {}
    for r in range(ws):
        g = torch.Generator().manual_seed(seed + 5000 + r)
        experts[r] = torch.randn(shape, generator=g)  # fp32 master of global expert r (on rank r)
    # param_shapes of rank 0 (the file's writer): its own local expert, by local name
    state[PARAM_SHAPES].append(collections.OrderedDict([(local.format(0), torch.Size(shape))]))
    state["num_experts"] = [ws]
    state[AUTOEP_LAYERS_KEY] = None
    main.obj = clone_tensors_for_torch_save(state)
    main.gpu = []
    for r in range(ws):
        f = built.files[optim_file_name(r, 0, dtype)]
        osd = f.obj[OPTIMIZER_STATE_DICT]
        flat = experts[r].reshape(-1)
        buf, ps, paddings = _zero12_split(flat, 1, 0.0)  # expert data parallel world 1
        part = buf.clone()
        osd[SINGLE_PARTITION_OF_FP32_GROUPS].append(part[:ps - paddings[0]])
        osd[GROUP_PADDINGS].append(paddings[0])
        osd[PARTITION_COUNT].append(1)
        osd[PARAM_SLICE_MAPPINGS].append(_slice_mappings([local.format(0)], [shape], 0, ps))
        base = osd[BASE_OPTIMIZER_STATE]
        base["state"][moe_group] = _adam_state(ps, [(0, flat.numel())], 14, torch.Generator().manual_seed(r))
        group = _param_group(moe_group, [moe_group])
        group = {"moe": True, "name": f"ep_size_{ws}", **group}
        base["param_groups"].append(group)
    for r in range(ws):
        key = local.format(r)
        built.files[f"layer_0_expert_{r}_mp_rank_00_model_states.pt"] = _File({key: experts[r].to(dtype)}, [])
    _write(root, tag, built, stage, ws, dtype, python311_enum, device)
    first = os.path.join(root, tag, "layer_0_expert_0_mp_rank_00_model_states.pt")
    return _refused(root, tag, ValueError, f"{first} is not a model state checkpoint", "MoE expert files")


def make_universal_checkpoint(root, stage, world_size, tag="global_step14", seed=0, dtype=torch.bfloat16,
                              python311_enum=True, device="cuda", keep_source=True):
    """The output of deepspeed/checkpoint/ds_to_universal.py --input_folder <root>/<tag>
    --output_folder <root>/<tag>_universal: zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt (stages 1/2:
    {'cat_dim': 0, 'param': full tensor} and step.pt; stage 3: the bare flat tensor, no step),
    zero/optimizer_state.pt, the model-states files copied, and <root>/latest_universal (text =
    the folder name). It has no *_optim_states.pt, so zero_to_fp32 on tag <tag>_universal raises
    "can't find *_optim_states.pt files in directory '<root>/<tag>_universal'".
    keep_source=False removes the source checkpoint and `latest` (then the script, given no tag,
    raises "Unable to find 'latest' file at <root>/latest")."""
    fx = make_zero_checkpoint(root, stage, world_size, tag=tag, dtype=dtype, seed=seed,
                              python311_enum=python311_enum, device=device)
    utag = f"{tag}_universal"
    out = os.path.join(root, utag)
    zero = os.path.join(out, "zero")
    os.makedirs(zero, exist_ok=True)
    opt0 = fx.files[fx.optim_files[0]][OPTIMIZER_STATE_DICT]
    trainable = [n for names in fx.param_groups for n in names]
    for n in trainable:
        d = os.path.join(zero, n)
        os.makedirs(d, exist_ok=True)
        full = fx.model[n]
        states = {"fp32": full.clone()}
        # the merged Adam states, gathered from every rank the way the fixture spread them
        for key in ("exp_avg", "exp_avg_sq"):
            states[key] = _gather_adam(fx, n, key)
        for key, t in states.items():
            obj = {CAT_DIM: 0, PARAM: t} if stage <= 2 else t.reshape(-1)
            torch.save(obj, os.path.join(d, f"{key}.pt"))
        if stage <= 2:
            torch.save(14, os.path.join(d, "step.pt"))
    if stage <= 2:
        sharded = (BASE_OPTIMIZER_STATE, PARAM_SLICE_MAPPINGS, SINGLE_PARTITION_OF_FP32_GROUPS)
        osd = {k: v for k, v in opt0.items() if k not in sharded}
        osd[PARAM_GROUPS] = opt0[BASE_OPTIMIZER_STATE][PARAM_GROUPS]
    else:
        osd = dict(opt0)
        osd[PARAM_GROUPS] = opt0[OPTIMIZER_STATE_DICT][PARAM_GROUPS]
    torch.save(osd, os.path.join(zero, "optimizer_state.pt"))
    for name in fx.model_files:
        shutil.copy2(os.path.join(fx.folder, name), out)
    with open(os.path.join(root, "latest_universal"), "w") as fd:
        fd.write(utag)
    if not keep_source:
        shutil.rmtree(fx.folder)
        os.remove(os.path.join(root, "latest"))
    return _refused(root, utag, FileNotFoundError,
                    f"can't find *_optim_states.pt files in directory '{out}'", "universal checkpoint")


def _gather_adam(fx, name, key):
    """The full-length Adam state of one param, from the rank files' partitions (the same walk as
    the fp32 merge)."""
    ws = fx.world_size
    if fx.stage <= 2:
        for g, names in enumerate(fx.param_groups):
            if name in names:
                parts = []
                for f in fx.optim_files:
                    osd = fx.files[f][OPTIMIZER_STATE_DICT]
                    lean = osd[SINGLE_PARTITION_OF_FP32_GROUPS][g].numel()
                    parts.append(osd[BASE_OPTIMIZER_STATE]["state"][g][key][:lean])
                full = torch.cat(parts)
                off = 0
                for n in names:
                    k = fx.model[n].numel()
                    if n == name:
                        return full[off:off + k].reshape(fx.model[n].shape).clone()
                    off += k
    else:
        for i, names in enumerate(fx.param_groups):
            off = 0  # within sub-group i's flat tensor
            for n in names:
                k = fx.model[n].numel()
                ps = zero3_partition_numel(k, ws)
                if n == name:
                    parts = [fx.files[f][OPTIMIZER_STATE_DICT][OPTIMIZER_STATE_DICT]["state"][i][key][off:off + ps]
                             for f in fx.optim_files]
                    return torch.cat(parts)[:k].reshape(fx.model[n].shape).clone()
                off += ps
    raise KeyError(name)


def make_autoep_zero3_checkpoint(root, world_size, tag="global_step14", seed=0, dtype=torch.bfloat16,
                                 python311_enum=True, device="cuda"):
    """A ZeRO-3 checkpoint whose model-states files carry the AutoEP layer metadata
    (ds_autoep_layers entries with checkpoint_format 'zero3_partitioned', plus
    universal_checkpoint_info), as _save_moe_checkpoint writes for AutoEP + ZeRO-3. Simplified: the
    fused expert weights (layers.0.moe.experts.w1/w2/w3) are partitioned over the whole data
    parallel group like any param, and the files are not passed through clone_tensors_for_torch_save.
    zero_to_fp32 refuses on the first model file with NotImplementedError."""
    layout = default_layout()
    for w in ("w1", "w2", "w3"):
        layout.insert(-1, Entry("param", f"layers.0.moe.experts.{w}", (world_size, 4, 8), 0))
    built = _build(layout, 3, world_size, dtype=dtype, seed=seed)
    info = {
        "moe_layer_id": 0, "module_path": "layers.0.moe", "num_experts": world_size, "num_local_experts": 1,
        "ep_size": world_size, "expert_key_prefix": "layers.0.moe.experts",
        AUTOEP_ZERO3_EXPERT_STATE_FORMAT_KEY: AUTOEP_ZERO3_PARTITIONED_EXPERT_STATE_FORMAT,
        AUTOEP_ZERO3_EXPERT_STATE_FORMAT_VERSION_KEY: AUTOEP_ZERO3_EXPERT_STATE_FORMAT_VERSION,
        "ep_group_name": f"ep_size_{world_size}", "ep_rank": 0, "expert_data_parallel_rank": 0,
        "expert_data_parallel_world_size": 1, "global_expert_start": 0, "global_expert_end": 1,
    }
    for r in range(world_size):
        f = built.files[model_file_name(3, r)]
        layer = dict(info, ep_rank=r, global_expert_start=r, global_expert_end=r + 1)
        f.obj["num_experts"] = [world_size]
        f.obj[AUTOEP_LAYERS_KEY] = [layer]
        f.obj[UNIVERSAL_CHECKPOINT_INFO] = {
            UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE,
            EXPERT_PARAMETER_PATTERNS: [r".*\.experts\.w[123]$"],
            AUTOEP_LAYERS_KEY: [layer],
        }
    _write(root, tag, built, 3, world_size, dtype, python311_enum, device)
    return _refused(root, tag, NotImplementedError, AUTOEP_MESSAGE, "AutoEP ZeRO-3 partition-native")


# ---------------------------------------------------------------------------------------------
# The real script, where a developer has it (e.g. from a fetched DeepSpeed checkout)

_REAL_RUNNER = r"""
import importlib.util, json, logging, os, sys, types, traceback
import torch
script, root, tag, out = sys.argv[1:5]
import deepspeed.utils as du
du.logger = logging.getLogger("deepspeed")
constants = types.ModuleType("deepspeed.checkpoint.constants")
constants.__dict__.update(json.loads(os.environ["ZERO_FIXTURES_CONSTANTS"]))
pkg = types.ModuleType("deepspeed.checkpoint"); pkg.__path__ = []; pkg.constants = constants
sys.modules["deepspeed.checkpoint"] = pkg; sys.modules["deepspeed.checkpoint.constants"] = constants
try:
    import tqdm  # noqa
except ImportError:
    t = types.ModuleType("tqdm"); t.tqdm = lambda it=None, *a, **k: it; sys.modules["tqdm"] = t
import inspect
_load = torch.load
_has_mmap = "mmap" in inspect.signature(_load).parameters
def load(*a, **k):  # torch < 2.1 has no mmap
    if not _has_mmap:
        k.pop("mmap", None)
    return _load(*a, **k)
torch.load = load
spec = importlib.util.spec_from_file_location("zero_to_fp32", script)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
try:
    sd = mod.get_fp32_state_dict_from_zero_checkpoint(root, tag=None if tag == "-" else tag)
    torch.save({"ok": True, "names": list(sd.keys()), "sd": sd}, out)
except Exception as e:
    torch.save({"ok": False, "type": type(e).__name__, "message": str(e)}, out)
"""


def run_real_zero_to_fp32(script, root, tag=None, timeout=300):
    """Runs DeepSpeed's own deepspeed/utils/zero_to_fp32.py (path `script`) on the folder in a
    child process, with the stand-in deepspeed package plus shims for what the script imports
    (deepspeed.utils.logger, deepspeed.checkpoint.constants, tqdm if absent, torch.load's mmap on
    torch < 2.1). Returns ("ok", OrderedDict) or ("error", type name, message)."""
    consts = {k: v for k, v in globals().items() if k.isupper() and isinstance(v, (str, int, float))}
    env = dict(os.environ)
    env["PYTHONPATH"] = STACKS + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["ZERO_FIXTURES_CONSTANTS"] = json.dumps(consts)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.pt")
        runner = os.path.join(tmp, "runner.py")
        with open(runner, "w") as f:
            f.write(_REAL_RUNNER)
        p = subprocess.run([sys.executable, runner, script, root, tag or "-", out], env=env, capture_output=True,
                           text=True, timeout=timeout)
        if p.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"zero_to_fp32 runner failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        res = torch.load(out, weights_only=False)
    if res["ok"]:
        return "ok", collections.OrderedDict((n, res["sd"][n]) for n in res["names"])
    return "error", res["type"], res["message"]


# ---------------------------------------------------------------------------------------------
# Self-test


def _self_test():
    real = os.environ.get("DEEPSPEED_ZERO_TO_FP32")
    with tempfile.TemporaryDirectory() as tmp:
        for stage in (1, 2, 3):
            for ws in (1, 2, 3, 5, 11):
                root = os.path.join(tmp, f"s{stage}w{ws}")
                fx = make_zero_checkpoint(root, stage, ws)
                got = reference_consolidate(root)
                assert_state_dicts_bitwise_equal(got, fx.expected, f"stage {stage} ws {ws}")
                for n in fx.param_groups[0]:
                    assert bitwise_equal(got[n], fx.model[n])
                if real:
                    res = run_real_zero_to_fp32(real, root)
                    assert res[0] == "ok", res
                    assert_state_dicts_bitwise_equal(res[1], fx.expected, f"real stage {stage} ws {ws}")
                print(f"stage {stage} world {ws}: {len(got)} tensors, {len(fx.files)} files ok")
        for name, make in (("bf16", lambda r: make_bf16_optimizer_checkpoint(r, 3)),
                           ("tp", lambda r: make_tensor_parallel_checkpoint(r, 2, 3)),
                           ("moe", lambda r: make_moe_checkpoint(r, 2, 3)),
                           ("universal", lambda r: make_universal_checkpoint(r, 2, 3)),
                           ("autoep", lambda r: make_autoep_zero3_checkpoint(r, 3))):
            rf = make(os.path.join(tmp, name))
            try:
                reference_consolidate(rf.root, rf.tag)
            except Exception as e:  # noqa: BLE001
                assert type(e) is rf.error_type and str(e) == rf.error_message, (name, e)
            else:
                raise AssertionError(f"{name}: no error")
            if real:
                res = run_real_zero_to_fp32(real, rf.root, rf.tag)
                assert res == ("error", rf.error_type.__name__, rf.error_message), (name, res)
            print(f"refused {name}: {rf.error_type.__name__}: {rf.error_message}")


if __name__ == "__main__":
    _self_test()
