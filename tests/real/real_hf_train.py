"""A real transformers 5 Trainer run on a tiny GPT-2 built from its config (no downloads: the
hub is offline and the dataset is made in memory), for test_hf_trainer.py. Its fixture script
embeds this file's text (real_common.read_source), so the cached fixture is remade whenever this
code changes; the test imports it to resume in-process with the same code."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_VERBOSITY"] = "error"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import struct  # noqa: E402

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

VOCAB, SEQ, MAX_STEPS, SAVE_STEPS, RESUME_AT = 96, 16, 9, 3, 6


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, made in memory from a fixed seed."""

    def __init__(self, n=64):
        g = torch.Generator().manual_seed(123)
        self.x = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


class LossTrainer(Trainer):
    """Records each step's loss exactly (the float32 value, not the rounded log)."""

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        r = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        loss = r[0] if return_outputs else r
        self.step_losses.append((self.state.global_step + 1, loss.detach().item()))
        return r


def config():
    return GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=32,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)


def trainer(out, seed=0):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config())  # dropout 0.1 everywhere: the RNG state matters
    args = TrainingArguments(
        output_dir=out, max_steps=MAX_STEPS, per_device_train_batch_size=4, save_steps=SAVE_STEPS,
        save_total_limit=2, logging_steps=1, report_to=[], seed=0, data_seed=0, use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, learning_rate=1e-3, warmup_steps=2,
        weight_decay=0.01, full_determinism=True, save_only_model=False)
    tr = LossTrainer(model=model, args=args, train_dataset=Tokens())
    tr.step_losses = []
    return tr


def train(out, resume=None):
    """Trains (or resumes from `resume`) to MAX_STEPS in `out`; returns [(step, loss)]."""
    tr = trainer(out)
    tr.train(resume_from_checkpoint=resume)
    return tr.step_losses, tr


def hexes(losses):
    return [[s, struct.pack("<d", v).hex()] for s, v in losses]


def make_fixture(out):
    """run/: the Trainer's output_dir (checkpoint-6/ and checkpoint-9/ left by save_total_limit=2)
    and the uninterrupted losses; sharded/: save_pretrained with max_shard_size; bin/: the
    pytorch_model.bin that save_pretrained(safe_serialization=False) wrote before transformers 5
    (which ignores that argument and always writes safetensors)."""
    import json
    losses, tr = train(os.path.join(out, "run"))
    with open(os.path.join(out, "losses.json"), "w") as f:
        json.dump(hexes(losses), f)
    model = tr.model
    model.save_pretrained(os.path.join(out, "sharded"), max_shard_size="100KB")
    os.makedirs(os.path.join(out, "bin"))
    model.save_pretrained(os.path.join(out, "bin", "ignored"), safe_serialization=False)
    with open(os.path.join(out, "bin_save_pretrained.json"), "w") as f:
        json.dump(sorted(os.listdir(os.path.join(out, "bin", "ignored"))), f)
    import shutil
    shutil.rmtree(os.path.join(out, "bin", "ignored"))
    model.config.save_pretrained(os.path.join(out, "bin"))
    torch.save(model.state_dict(), os.path.join(out, "bin", "pytorch_model.bin"))
