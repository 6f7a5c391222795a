"""Plain torch 2.13 training, as a hand-written training script does it: a tiny language model
(tied embedding/output weights, LayerNorm, BatchNorm buffers with an int64 counter, Dropout, a
positional table registered as a slice of a larger table), AdamW with its `step` tensors, a
StepLR scheduler, and the RNG states of torch, numpy and Python in the checkpoint. Every random
draw of a step (data, dropout, a numpy and a Python draw mixed into the loss) comes from the
global generators, so a resume is bit-exact only if all three states come back exactly.

test_torch2.py imports this module to resume; its fixture script embeds this file's text
(real_common.read_source), so the cached fixture is remade whenever this code changes."""
import math
import random
import struct

import numpy as np
import torch

VOCAB, DIM, SEQ, TABLE, BATCH = 48, 32, 12, 2048, 8
LR = 3e-3


def determinism():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def sinusoid_table(rows, dim):
    pos = torch.arange(rows, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    t = torch.zeros(rows, dim)
    t[:, 0::2] = torch.sin(pos * freq)
    t[:, 1::2] = torch.cos(pos * freq)
    return t


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        # A slice of a 2048-row table, as many models register positional tables: torch.save
        # writes the whole table's storage (256 KiB) for the 12 rows used.
        self.register_buffer("pos", sinusoid_table(TABLE, DIM)[:SEQ])
        self.norm = torch.nn.LayerNorm(DIM)
        self.fc = torch.nn.Linear(DIM, DIM)
        self.bn = torch.nn.BatchNorm1d(DIM)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # tied
        # Reaches the loss scaled by 1e-6: its gradients, and so its AdamW exp_avg_sq (~1e-14),
        # are tiny (they flush to zero in float16, lose bits in bfloat16).
        self.tiny = torch.nn.Parameter(torch.full((DIM,), 0.5))

    def forward(self, ids):
        h = self.emb(ids) + self.pos[: ids.shape[1]] + self.tiny * 1e-6
        h = self.norm(h)
        h = torch.relu(self.fc(h))
        h = self.bn(h.transpose(1, 2)).transpose(1, 2)
        return self.head(self.drop(h))


def build(seed=0):
    torch.manual_seed(seed)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1000, gamma=0.5)
    return model, opt, sched


def train_step(model, opt, sched):
    """One step; returns the float32 loss as a Python float (exact)."""
    model.train()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    weight = 0.75 + 0.5 * float(np.random.rand())
    jitter = random.random()
    logits = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1)) * weight
    loss = loss + 1e-3 * jitter
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    return loss.detach().item()


def checkpoint(model, opt, sched, step):
    """The dict a hand-written training script saves."""
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "rng_state": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                      "python": random.getstate()},
        "step": step,
        "config": {"vocab": VOCAB, "dim": DIM, "seq": SEQ, "lr": LR},
    }


def resume(ckpt, steps):
    """Rebuilds model, optimizer and scheduler from a loaded checkpoint, restores the RNG states
    and trains `steps` more steps: (losses, model)."""
    model, opt, sched = build(seed=12345)  # different init: everything must come from ckpt
    model.load_state_dict(ckpt["model"], strict=True)
    opt.load_state_dict(ckpt["optimizer"])
    sched.load_state_dict(ckpt["scheduler"])
    torch.set_rng_state(ckpt["rng_state"]["torch"])
    np.random.set_state(ckpt["rng_state"]["numpy"])
    random.setstate(ckpt["rng_state"]["python"])
    return [train_step(model, opt, sched) for _ in range(steps)], model


def set_seeds(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def make_fixture(out, steps, more):
    """Trains `steps` steps and saves the checkpoint in every way torch.save can (zip, legacy,
    pickle protocols 4 and 5), then goes on for `more` steps uninterrupted and records those
    losses and the final weights."""
    import json
    import os
    determinism()
    model, opt, sched = build()
    set_seeds(1)
    for _ in range(steps):
        train_step(model, opt, sched)
    ck = checkpoint(model, opt, sched, steps)
    torch.save(ck, os.path.join(out, "train.pt"))
    torch.save(ck, os.path.join(out, "train_legacy.pt"), _use_new_zipfile_serialization=False)
    torch.save(ck, os.path.join(out, "train_p4.pt"), pickle_protocol=4)
    torch.save(ck, os.path.join(out, "train_p5_legacy.pt"), pickle_protocol=5,
               _use_new_zipfile_serialization=False)
    losses = [train_step(model, opt, sched) for _ in range(more)]
    torch.save(model.state_dict(), os.path.join(out, "final.pt"))
    with open(os.path.join(out, "uninterrupted.json"), "w") as f:
        json.dump({"steps": steps, "more": more,
                   "losses": [struct.pack("<d", v).hex() for v in losses]}, f)
