"""A real Lightning 2.6 Trainer.fit on CPU, for test_lightning.py: a tiny LightningModule with
hyper-parameters, a positional table registered as a slice of a larger one (so .ckpt files carry
storage bytes no tensor uses), tied weights, AdamW + StepLR, a DistributedSampler whose order
depends only on the epoch (Lightning calls set_epoch; it does not save RNG state), two
ModelCheckpoint callbacks: one keeping every epoch with save_last=True, one keeping the best two
by loss with save_last="link". The fixture script embeds this file's text (real_common.read_source)
so the cached fixture is remade whenever this code changes; the test imports it to resume."""
import logging
import math
import os
import struct
import warnings

import torch

warnings.filterwarnings("ignore")
logging.getLogger("lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

import lightning as L  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

D_IN, HIDDEN, TABLE, ROWS, N, BATCH, EPOCHS, RESUME_EPOCH = 8, 32, 1024, 4, 32, 8, 4, 1
STEPS_PER_EPOCH = N // BATCH


def table(rows, dim):
    pos = torch.arange(rows, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    t = torch.zeros(rows, dim)
    t[:, 0::2] = torch.sin(pos * freq)
    t[:, 1::2] = torch.cos(pos * freq)
    return t


class TinyLit(L.LightningModule):
    def __init__(self, lr=5e-3, hidden=HIDDEN, name="tiny", layers=(D_IN, HIDDEN, 1)):
        super().__init__()
        self.save_hyperparameters()
        self.inp = torch.nn.Linear(D_IN, hidden)
        self.mid = torch.nn.Linear(hidden, hidden)
        self.mid2 = torch.nn.Linear(hidden, hidden)
        self.mid2.weight = self.mid.weight  # tied
        self.norm = torch.nn.LayerNorm(hidden)
        self.out = torch.nn.Linear(hidden, 1)
        # 4 rows of a 1024-row table: torch.save writes all 32 KiB of it
        self.register_buffer("pe", table(TABLE, D_IN)[:ROWS])
        self.step_losses = []

    def forward(self, x):
        x = x + self.pe.sum(0) * 0.1
        h = torch.relu(self.inp(x))
        h = torch.relu(self.mid(h)) + self.mid2(h) * 0.5
        return self.out(self.norm(h))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.step_losses.append((self.global_step + 1, loss.detach().item()))
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)}


def loader():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, D_IN, generator=g)
    y = (x[:, :1] * 2 - x[:, 1:2]).tanh() + 0.1 * torch.randn(N, 1, generator=g)
    ds = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=7)
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=0)


def fit(root, ckpt_path=None, plugins=None):
    """Trains to EPOCHS (from ckpt_path when given); checkpoints go to root/ckpts (every epoch,
    last.ckpt a copy) and root/best (top 2 by loss, last.ckpt a symlink), through `plugins`
    (a CheckpointIO) when given. Returns the module."""
    torch.set_num_threads(1)
    L.seed_everything(0, workers=True, verbose=False)
    model = TinyLit()
    every = ModelCheckpoint(dirpath=os.path.join(root, "ckpts"), filename="{epoch}-{step}",
                            every_n_epochs=1, save_top_k=-1, save_last=True)
    best = ModelCheckpoint(dirpath=os.path.join(root, "best"), filename="best-{epoch}-{step}",
                           monitor="train_loss_epoch", mode="min", save_top_k=2, save_last="link")
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, deterministic=True,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[every, best], num_sanity_val_steps=0, plugins=plugins)
    trainer.fit(model, loader(), ckpt_path=ckpt_path)
    return model


def hexes(losses):
    return [[s, struct.pack("<d", v).hex()] for s, v in losses]


def make_fixture(out):
    import json
    model = fit(out)
    with open(os.path.join(out, "losses.json"), "w") as f:
        json.dump(hexes(model.step_losses), f)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, os.path.join(out, "final.pt"))
