"""DeepSpeed ZeRO runs for the universal checkpoint tests (test_reshard_real.py): the model,
data and optimizer of real_ds_train.py, with what resuming on another world size needs.

  * the world size is an argument (1, 2, 3 ... CPU ranks over gloo);
  * every rank sees the SAME batch at a given step (batch(step) ignores the rank), so the
    training trajectory does not depend on the world size and a resume on 1 or 3 ranks can
    be compared with the uninterrupted 2-rank run;
  * OPT selects the client optimizer: adamw (default, as in the fixture) or sgd (momentum 0.9);
  * DTYPE may also be bf16acc32 (bf16 + data_types.grad_accum_dtype=fp32), which with ZeRO
    stage 1 makes DeepSpeed use BF16_Optimizer instead of the stage-1/2 ZeRO optimizer;
  * right after save_checkpoint (train) and right after load_checkpoint (resume) every rank
    gathers the full fp32 master weights and optimizer states through DeepSpeed's
    safe_get_full_fp32_param / safe_get_full_optimizer_state, rank 0 writes them to
    OUT/state_<name>.pt, and the optimizer 'step' and module buffers are recorded too.

    python -c script() OUT train STAGE DTYPE ALIGN WORLD [OPT]
        trains STEPS steps, engine.save_checkpoint(OUT/ckpt) (tag global_step<STEPS>), trains
        MORE steps further; OUT/train.json holds every rank's losses (float.hex) and lrs.
    python -c script() OUT resume SPEC.json WORLD
        SPEC: [{"name", "dir", "stage", "dtype", "align", "opt", "universal": bool,
                 "tag": optional}, ...]. For each item: a fresh engine (config with
        "checkpoint": {"load_universal": true} when universal), engine.load_checkpoint(dir,
        tag), then MORE steps on the batches of steps STEPS..;
        OUT/resume_w<WORLD>.json: name -> per-rank {"losses", "lrs", "global_steps",
        "count", "step"} or {"error"}.
"""
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import real_ds_train  # noqa: E402
from real_ds_train import gather  # noqa: E402
from stacklib import module_script, spawn_ranks  # noqa: E402
STEPS = 3
MORE = 3


def script():
    """The `python -c` text for stacklib.fixture: this module and real_ds_train, which it uses."""
    return module_script(__file__, os.path.join(HERE, "real_ds_train.py"))


def config(stage, dtype, align, universal=False, opt="adamw"):
    cfg = real_ds_train.config(stage, "bf16" if dtype == "bf16acc32" else dtype, align)
    if dtype == "bf16acc32":
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    if opt != "adamw":
        cfg["zero_allow_untested_optimizer"] = True
    return cfg


def engine(stage, dtype, align, opt="adamw", universal=False):
    import deepspeed
    import torch
    torch.manual_seed(0)
    model = real_ds_train.build_model()
    params = [p for p in model.parameters() if p.requires_grad]
    if opt == "sgd":
        optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(params, lr=0.01)
    eng, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, model_parameters=params,
                                        config=config(stage, dtype, align, universal, opt))
    return eng


def train(eng, first, n):
    """real_ds_train's steps with rank 0's batches on every rank: the run does not depend on the
    world size."""
    return real_ds_train.train(eng, first, n, 0)


def opt_step_values(eng):
    """The base optimizer's 'step' entries (tensor or int), as text."""
    out = []
    base = eng.optimizer.optimizer if hasattr(eng.optimizer, "optimizer") else eng.optimizer
    for p, st in base.state.items():
        if "step" in st:
            v = st["step"]
            out.append(repr(v) if not hasattr(v, "dtype") else f"tensor({v.item()!r}, {v.dtype})")
    return sorted(set(out))


def full_state(eng, opt):
    """Collective: every rank must call. Full fp32 master params + optimizer states."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    keys = ["momentum_buffer"] if opt == "sgd" else ["exp_avg", "exp_avg_sq"]
    # Stages 1/2 link each parameter to its optimizer state at the first step (or a universal
    # load): after a native load, before any step, link them as that step would.
    link = getattr(eng.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:
        link()
    out = {}
    for name, p in eng.module.named_parameters():
        if not p.requires_grad:
            continue
        v = safe_get_full_fp32_param(p)
        out[f"{name}/fp32"] = None if v is None else v.detach().cpu().clone()
        for k in keys:
            try:
                s = safe_get_full_optimizer_state(p, k)
            except Exception as e:  # noqa: BLE001
                s = f"error: {type(e).__name__}: {e}"
            out[f"{name}/{k}"] = s.detach().cpu().clone() if hasattr(s, "detach") else s
    if eng.zero_optimization_stage() < 3:
        # the low-precision (module) parameters themselves, as the forward pass sees them
        for name, p in eng.module.named_parameters():
            out[f"{name}/module"] = p.detach().cpu().clone()
    for name, b in eng.module.named_buffers():
        out[f"buffer:{name}"] = b.detach().cpu().clone()
    return out


def worker(rank, world, port, out, mode, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    import datetime
    import deepspeed
    import torch
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=300))
    work(rank, world, out, mode, args)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def work(rank, world, out, mode, args):
    import torch
    if mode == "train":
        stage, dtype, align, opt = args
        eng = engine(stage, dtype, align, opt)
        first = train(eng, 0, STEPS)
        eng.save_checkpoint(os.path.join(out, "ckpt"))
        st = full_state(eng, opt)
        if rank == 0:
            torch.save(st, os.path.join(out, "state_train.pt"))
        more = train(eng, STEPS, MORE)
        result = {"losses": first[0] + more[0], "lrs": first[1] + more[1],
                  "global_steps": eng.global_steps, "count": int(eng.module.count),
                  "optimizer": type(eng.optimizer).__name__}
        everything = gather(result)
        if rank == 0:
            with open(os.path.join(out, "train.json"), "w") as f:
                json.dump(everything, f, indent=1)
        return
    results = {}
    for item in args:
        eng = engine(item["stage"], item["dtype"], item["align"], item.get("opt", "adamw"),
                     universal=item.get("universal", True))
        try:
            path, _ = eng.load_checkpoint(item["dir"], tag=item.get("tag"))
            if path is None:
                raise RuntimeError(f"load_checkpoint({item['dir']!r}) found nothing to load")
            state = {"global_steps": eng.global_steps, "count": int(eng.module.count),
                     "step": opt_step_values(eng), "optimizer": type(eng.optimizer).__name__}
            st = full_state(eng, item.get("opt", "adamw"))
            if rank == 0:
                torch.save(st, os.path.join(out, f"state_{item['name']}_w{world}.pt"))
            losses, lrs = train(eng, STEPS, MORE)
            state.update(losses=losses, lrs=lrs)
        except Exception:  # noqa: BLE001
            state = {"error": traceback.format_exc()[-4000:]}
        results[item["name"]] = gather(state)
        if hasattr(eng, "destroy"):
            eng.destroy()
        del eng
    if rank == 0:
        with open(os.path.join(out, f"resume_w{world}.json"), "w") as f:
            json.dump(results, f, indent=1)


def main(argv):
    out, mode = argv[0], argv[1]
    if mode == "train":
        stage, dtype, align, world = int(argv[2]), argv[3], int(argv[4]), int(argv[5])
        opt = argv[6] if len(argv) > 6 else "adamw"
        args = (stage, dtype, align, opt)
    elif mode == "resume":
        with open(argv[2]) as f:
            args = json.load(f)
        world = int(argv[3])
    else:
        raise SystemExit(f"unknown mode {mode}")
    os.makedirs(out, exist_ok=True)
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    spawn_ranks(worker, world, lambda port: (world, port, out, mode, args))
