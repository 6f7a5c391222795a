"""Folders of real torch checkpoints as trainers write them, for `ckptool apply` and `watch`:
HF Trainer (checkpoint-N/ with trainer_state.json written last), PyTorch Lightning
(epoch=E-step=N.ckpt files, last.ckpt), DeepSpeed ZeRO (global_stepN/ + latest, via
zero_fixtures) and Megatron-Core torch_dist (iter_N/ DCP folders +
latest_checkpointed_iteration.txt, via dcp_fixtures); and helpers to compare whole trees."""
import json
import os
import shutil
import time

import torch

import dcp_fixtures
import zero_fixtures


def _model(step):
    """A small model whose weights are views into one flat buffer (as DeepSpeed/Megatron leave
    them): torch.save writes the whole buffer, so shrink has something to drop."""
    g = torch.Generator().manual_seed(step)
    flat = torch.randn(8192, generator=g)
    return {
        "layer.0.weight": flat[0:1024].view(32, 32),
        "layer.0.bias": flat[1024:1056],
        "layer.1.weight": flat[2048:3072].view(32, 32),
        "norm.weight": torch.ones(32),
    }


def _optimizer(step):
    g = torch.Generator().manual_seed(step + 1)
    return {"state": {i: {"step": torch.tensor(float(step)), "exp_avg": torch.randn(32, 32, generator=g),
                          "exp_avg_sq": torch.randn(32, 32, generator=g)} for i in range(2)},
            "param_groups": [{"lr": 1e-3, "params": [0, 1]}]}


def write_slowly(path, data, pieces=1, pause=0.0):
    """Writes `data` in `pieces` parts with a pause after each (a file growing on disk)."""
    with open(path, "wb") as f:
        step = max(1, len(data) // pieces)
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
            f.flush()
            if pause:
                time.sleep(pause)


def _torch_bytes(obj):
    import io
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def hf_checkpoint(root, step, best=None, pieces=1, pause=0.0, marker=True):
    """checkpoint-<step>/ as transformers' Trainer._save_checkpoint writes it: the model, the
    optimizer and scheduler, RNG state, and trainer_state.json last."""
    d = os.path.join(root, f"checkpoint-{step}")
    os.makedirs(d, exist_ok=True)
    write_slowly(os.path.join(d, "pytorch_model.bin"), _torch_bytes(_model(step)), pieces, pause)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "tiny", "hidden_size": 32}, f)
    write_slowly(os.path.join(d, "optimizer.pt"), _torch_bytes(_optimizer(step)), pieces, pause)
    torch.save({"last_epoch": step, "_step_count": step + 1}, os.path.join(d, "scheduler.pt"))
    torch.save({"python": [1, 2, 3], "cpu": torch.get_rng_state()}, os.path.join(d, "rng_state.pth"))
    if marker:
        hf_marker(root, step, best)
    return d


def hf_marker(root, step, best=None):
    state = {"global_step": step, "best_model_checkpoint": f"out/checkpoint-{best}" if best else None,
             "log_history": [{"loss": 1.0 / (step + 1), "step": step}]}
    with open(os.path.join(root, f"checkpoint-{step}", "trainer_state.json"), "w") as f:
        json.dump(state, f)


def lightning_checkpoint(root, epoch, step, pieces=1, pause=0.0):
    """epoch=E-step=N.ckpt as Lightning's ModelCheckpoint saves it (one torch file)."""
    obj = {"epoch": epoch, "global_step": step, "pytorch-lightning_version": "2.1.0",
           "state_dict": _model(step), "optimizer_states": [_optimizer(step)],
           "lr_schedulers": [{"last_epoch": step}], "callbacks": {}, "loops": {},
           "hyper_parameters": {"lr": 1e-3}}
    path = os.path.join(root, f"epoch={epoch}-step={step}.ckpt")
    write_slowly(path, _torch_bytes(obj), pieces, pause)
    return path


def deepspeed_checkpoint(root, step, stage=2, world_size=2, latest=True):
    """global_step<step>/ as DeepSpeedEngine.save_checkpoint writes it; `latest` is written
    after the rank files (zero_fixtures writes it; latest=False takes it back)."""
    old = None
    latest_path = os.path.join(root, "latest")
    if not latest and os.path.exists(latest_path):
        with open(latest_path) as f:
            old = f.read()
    zero_fixtures.make_zero_checkpoint(root, stage, world_size, tag=f"global_step{step}", seed=step,
                                       device="cpu", global_steps=step)
    if not latest:
        if old is None:
            os.remove(latest_path)
        else:
            with open(latest_path, "w") as f:
                f.write(old)


def megatron_checkpoint(root, iteration, tracker=True):
    """iter_<N>/ in Megatron-Core's torch_dist format (a DCP folder with common.pt and
    metadata.json), then latest_checkpointed_iteration.txt."""
    dcp_fixtures.make_megatron_checkpoint(os.path.join(root, f"iter_{iteration:07d}"), seed=iteration % 97)
    if tracker:
        with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(iteration))


IGNORED = {os.path.join(".ckptool", "state.json"), os.path.join(".ckptool", "lock")}


def tree(root, ignored=IGNORED):
    """relative path -> bytes (files), 'link:<target>' (symlinks) or 'dir' (folders)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if rel in ignored:
                continue
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
            elif os.path.isdir(p):
                out[rel] = "dir"
            else:
                with open(p, "rb") as f:
                    out[rel] = f.read()
    return out


def stamps(root):
    """relative path -> (size, mtime_ns, inode) of every file, the ledger included (not the
    lock file, which holds the pid of the run that has it)."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if os.path.relpath(p, root) == os.path.join(".ckptool", "lock"):
                continue
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def ledger(root):
    with open(os.path.join(root, ".ckptool", "state.json")) as f:
        return json.load(f)


def ledger_steps(root):
    """checkpoint -> sorted step names done (what a ledger says, without times)."""
    return {name: sorted(c["steps"]) for name, c in ledger(root)["checkpoints"].items()}


def copy_tree(src, dst):
    shutil.copytree(src, dst, symlinks=True)
