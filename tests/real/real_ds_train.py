"""DeepSpeed ZeRO checkpoints written by the real DeepSpeed 0.19 on CPU (for test_deepspeed_real.py).

Two ranks started with torch.multiprocessing (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT
set as the deepspeed launcher sets them; MASTER_PORT a free port), gloo through
deepspeed.init_distributed, DeepSpeed's CPU accelerator. The model is tiny and has what
zero_to_fp32 has to handle: an embedding tied to the output head, a frozen Linear, a LayerNorm,
an fp32 buffer and int64 buffers (one 0-d, counting forward calls). torch.optim.AdamW is the
client optimizer (DeepSpeedCPUAdam would need a JIT-built op), with DeepSpeed's WarmupLR
scheduler and gradient clipping from the config.

    python -c script() OUT train STAGE DTYPE ALIGN
        trains STEPS steps, engine.save_checkpoint(OUT/ckpt) (tag global_step<STEPS>), trains
        MORE steps further; OUT/train.json holds every rank's losses (float.hex) and lrs.
    python -c script() OUT resume SPEC.json
        SPEC: [{"name", "dir", "kind": "full" | "module", "stage", "dtype", "align", "tag"?}, ...].
        For each, in the same two processes: a fresh model and deepspeed.initialize,
        engine.load_checkpoint(dir, tag=tag) (no tag: the one `latest` names; full: everything;
        module: load_module_only=True, load_optimizer_states=False,
        load_lr_scheduler_states=False), then MORE steps on the data of steps STEPS..;
        OUT/resume.json: name -> {"losses", "lrs", "global_steps", "count"} or {"error"}.

DTYPE is fp32 or bf16; ALIGN 1 sets zero_optimization.parameter_alignment (DeepSpeed 0.19:
16-byte aligned parameters inside the flat groups, saved as param_alignment_paddings).
"""
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from stacklib import module_script, spawn_ranks  # noqa: E402
WORLD = 2
STEPS = 3
MORE = 3


def script():
    """The `python -c` text for stacklib.fixture (stacklib.module_script)."""
    return module_script(__file__)


def build_model():
    import torch
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 6)
            self.l1 = nn.Linear(6, 10)
            self.norm = nn.LayerNorm(10)
            self.frozen = nn.Linear(10, 10)
            self.l2 = nn.Linear(10, 7)
            self.head = nn.Linear(6, 11, bias=False)
            self.head.weight = self.emb.weight            # tied
            self.register_buffer("scale", torch.arange(10) / 8 + 0.5)   # exact in bf16
            self.register_buffer("ids", torch.arange(5))
            self.register_buffer("count", torch.zeros((), dtype=torch.int64))
            for p in self.frozen.parameters():
                p.requires_grad_(False)

        def forward(self, x):
            self.count += 1
            h = self.emb(x)
            h2 = self.norm(torch.relu(self.l1(h)))
            h2 = self.frozen(h2)
            h2 = self.l2(h2 * self.scale.to(h2.dtype))
            return self.head(h).float().pow(2).mean() + h2.float().pow(2).mean()

    return Net()


def config(stage, dtype, align):
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10 ** 9,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01,
                                 "warmup_num_steps": 4, "warmup_type": "linear"}},
    }
    if align:
        cfg["zero_optimization"]["parameter_alignment"] = True
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def engine(stage, dtype, align):
    import deepspeed
    import torch
    torch.manual_seed(0)
    model = build_model()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.01)
    eng, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, model_parameters=params,
                                        config=config(stage, dtype, align))
    return eng


def batch(step, rank):
    import torch
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, 11, (2, 3), generator=g)


def train(eng, first, n, rank):
    losses, lrs = [], []
    for step in range(first, first + n):
        loss = eng(batch(step, rank))
        eng.backward(loss)
        eng.step()
        losses.append(float(loss.item()).hex())
        lrs.append(float(eng.get_lr()[0]).hex())
    return losses, lrs


def gather(obj):
    import deepspeed.comm as dist
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def worker(rank, port, out, mode, stage, dtype, align, spec):  # noqa: PLR0913
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    import datetime
    import deepspeed
    import torch
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=180))
    work(rank, out, mode, stage, dtype, align, spec)
    # Every rank waits for the others, then tears gloo down while the interpreter is alive: a
    # process that exits with the group still up can abort in gloo's worker threads at
    # finalisation ("terminate called without an active exception", pytorch issue 190489).
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    # Then it leaves without the interpreter's finalisation, where threads DeepSpeed's CPU
    # communication op started can still abort the process the same way: the work is done and
    # written, and mp.spawn sees exit code 0.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def work(rank, out, mode, stage, dtype, align, spec):  # noqa: PLR0913
    if mode == "train":
        eng = engine(stage, dtype, align)
        first = train(eng, 0, STEPS, rank)
        eng.save_checkpoint(os.path.join(out, "ckpt"))
        more = train(eng, STEPS, MORE, rank)
        result = {"losses": first[0] + more[0], "lrs": first[1] + more[1],
                  "global_steps": eng.global_steps, "count": int(eng.module.count)}
        everything = gather(result)
        if rank == 0:
            with open(os.path.join(out, "train.json"), "w") as f:
                json.dump(everything, f, indent=1)
        return
    results = {}
    for item in spec:
        eng = engine(item["stage"], item["dtype"], item["align"])
        try:
            if item["kind"] == "full":
                path, _ = eng.load_checkpoint(item["dir"], tag=item.get("tag"))
            else:
                path, _ = eng.load_checkpoint(item["dir"], tag=item.get("tag"), load_module_only=True,
                                              load_optimizer_states=False,
                                              load_lr_scheduler_states=False)
            if path is None:
                raise RuntimeError(f"load_checkpoint({item['dir']!r}) found nothing to load")
            state = {"global_steps": eng.global_steps, "count": int(eng.module.count)}
            losses, lrs = train(eng, STEPS, MORE, rank)
            state.update(losses=losses, lrs=lrs)
        except Exception:  # noqa: BLE001 (reported to the test, which names it)
            state = {"error": traceback.format_exc()[-3000:]}
        results[item["name"]] = gather(state)
        if hasattr(eng, "destroy"):
            eng.destroy()
        del eng
    if rank == 0:
        with open(os.path.join(out, "resume.json"), "w") as f:
            json.dump(results, f, indent=1)


def main(argv):
    out, mode = argv[0], argv[1]
    stage = dtype = align = spec = None
    if mode == "train":
        stage, dtype, align = int(argv[2]), argv[3], int(argv[4])
    elif mode == "resume":
        with open(argv[2]) as f:
            spec = json.load(f)
    else:
        raise SystemExit(f"unknown mode {mode}")
    # the venv's own tools (ninja, which DeepSpeed's CPU op builder runs) come first
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    spawn_ranks(worker, WORLD, lambda port: (port, out, mode, stage, dtype, align, spec))


if __name__ == "__main__":
    main(sys.argv[1:])
