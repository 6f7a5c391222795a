"""torch.distributed.checkpoint folders written by the real torch 2.13 (for test_dcp_real.py).

Run as a fixture script (stacklib.fixture runs `python -c script() OUT MODE WORLD`): it starts
WORLD processes with torch.multiprocessing (gloo on CPU, MASTER_PORT a free port) and each
calls dcp.save into OUT/ckpt. Modes:

- fsdp2: a small model sharded with FSDP2 (`fully_shard` on a 1-D CPU mesh), some parameters
  in bfloat16 (their own FSDP group), an fp32 and an int64 buffer, a weight whose rows do not
  divide by WORLD (13 rows) and one with fewer rows than ranks at 4 processes (3 rows: one
  rank holds an empty shard); trained 2 steps with AdamW; saved with get_state_dict's model and
  optimizer state plus non-tensor entries and an uneven DTensor. At 2 processes the writer
  uses 2 threads (two .distcp files per rank).
- plain: a state dict of DTensors sharded unevenly (Shard(0) and Shard(1) on dims that do not
  divide by WORLD, an empty shard, a 2-D mesh at 4 processes), a Replicate DTensor, plain
  (replicated) tensors in fp32/bf16/fp16/int64, a 0-d tensor, special float values, ints,
  floats, strings and a nested dict; no "model" key.

Every rank also writes OUT/rank<r>.json with what it put into the state dict (names only), so
a failing save is visible. Nothing here is ckptool's: this is what torch writes.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from stacklib import module_script, spawn_ranks  # noqa: E402


def script():
    """The `python -c` text for stacklib.fixture (stacklib.module_script)."""
    return module_script(__file__)


def build_model():
    import torch
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(13, 6)        # 13 rows: uneven at 2 and 4 ranks
            self.l1 = nn.Linear(6, 10)
            self.l2 = nn.Linear(10, 3)            # 3 rows: an empty shard at 4 ranks
            self.lowp = nn.Linear(10, 5).to(torch.bfloat16)
            self.register_buffer("scale", torch.linspace(0.5, 1.5, 10))
            self.register_buffer("count", torch.zeros((), dtype=torch.int64))

        def forward(self, x):
            self.count += 1
            h = torch.relu(self.l1(self.emb(x))) * self.scale
            return self.l2(h).pow(2).mean() + self.lowp(h.to(torch.bfloat16)).float().pow(2).mean()

    return Net()


def fsdp2_state(rank, world):
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    model = build_model()
    for sub in (model.emb, model.l1, model.l2, model.lowp):
        fully_shard(sub, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(2):
        loss = model(torch.randint(0, 13, (4, 3), generator=gen))
        loss.backward()
        opt.step()
        opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    uneven = torch.arange(7 * 5, dtype=torch.float32).reshape(7, 5) / 7
    sd = {
        "model": msd,
        "optim": osd,
        "extra": {"uneven": distribute_tensor(uneven, mesh, [Shard(0)]),
                  "epoch": 0.5, "tag": "real-fsdp2", "hist": [1, 2, 3]},
        "step": 2,
    }
    return sd


def plain_state(rank, world):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(7)   # the same full tensors on every rank
    a = torch.randn(7, 5, generator=g)
    a[0, 0], a[0, 1], a[0, 2], a[0, 3] = -0.0, float("inf"), float("nan"), 1e-40
    sd = {
        "a": distribute_tensor(a, mesh, [Shard(0)]),                                   # 7 rows
        "b": distribute_tensor(torch.randn(6, 9, generator=g).to(torch.bfloat16), mesh,
                               [Shard(1)]),                                            # 9 columns
        "c": distribute_tensor(torch.randn(3, generator=g), mesh, [Shard(0)]),          # 3 < 4
        "h": distribute_tensor(torch.randn(5, 4, generator=g).to(torch.float16), mesh,
                               [Shard(0)]),
        "rep": distribute_tensor(torch.randn(4, generator=g), mesh, [Replicate()]),
        "plain": torch.arange(9, dtype=torch.int64).reshape(3, 3),
        "scalar": torch.tensor(3.25),
        "nested": {"w": distribute_tensor(torch.randn(10, 3, generator=g), mesh, [Shard(0)]),
                   "n": 5},
        "step": 11,
        "name": "plain",
        "lr": 0.5,
    }
    if world == 4:
        mesh2 = init_device_mesh("cpu", (2, 2))
        sd["grid"] = distribute_tensor(torch.randn(5, 7, generator=g), mesh2,
                                       [Shard(0), Shard(1)])
    return sd


def worker(rank, world, port, out, mode):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        sd = fsdp2_state(rank, world) if mode == "fsdp2" else plain_state(rank, world)
        threads = 2 if (mode == "fsdp2" and world == 2) else 1
        dcp.save(sd, storage_writer=FileSystemWriter(os.path.join(out, "ckpt"),
                                                     thread_count=threads))
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(sorted(sd), f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv):
    out, mode, world = argv[0], argv[1], int(argv[2])
    if mode not in ("fsdp2", "plain"):
        raise SystemExit(f"unknown mode {mode}")
    spawn_ranks(worker, world, lambda port: (world, port, out, mode))


if __name__ == "__main__":
    main(sys.argv[1:])
