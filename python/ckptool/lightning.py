"""Lightning integration: a CheckpointIO plugin that writes checkpoints atomically and
verified, runs the team's policy (ckptool.toml) on the folder after each save, and loads
through ckptool.load, which never runs the pickle.

    from ckptool.lightning import CkptoolCheckpointIO
    trainer = L.Trainer(plugins=[CkptoolCheckpointIO(policy="ckptool.toml")], ...)

With a [retention] table in the policy, give ModelCheckpoint save_top_k=-1 and let the policy
rotate; a checkpoint the policy compressed (NAME.ckpt.ckz) still loads by its name. Resume from
the newest checkpoint that is complete and intact: trainer.fit(model,
ckpt_path=ckptool.latest(dirpath))."""
from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, Iterable, Optional

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

from . import _jobs
from ._errors import JobFailed
from ._load import load


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CkptoolCheckpointIO(CheckpointIO):
    """Saves with torch.save to a temp file beside the target, fsyncs it, verifies it with
    ckptool (structure, CRCs, pickle safety) and renames it into place; then, if a policy is
    given (a ckptool.toml path; or True: the checkpoint folder's own ckptool.toml, where
    there is one), runs
    `ckptool apply` on the folder with no settle time (the file just written is complete).
    Loads with ckptool.load (objects of classes outside the allowlist come back as inert
    records unless their module is in `trust`)."""

    def __init__(self, policy: "str | os.PathLike | bool | None" = None, verify: bool = True,
                 trust: Iterable[str] = (), threads: int = 0):
        super().__init__()
        self.policy = policy
        self.verify = verify
        self.trust = list(trust)
        self.threads = threads

    def save_checkpoint(self, checkpoint: dict, path: Any,
                        storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError("CkptoolCheckpointIO.save_checkpoint takes no storage_options")
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        # a ckptool temp name: a run killed while writing leaves nothing ckptool keeps
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.ckptool-tmp-{os.getpid()}-",
                                   dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            if self.verify:
                # Damage only: what Lightning hands over is the user's to save, classes of
                # their own included (a load judges those, with weights_only and trust).
                result = _jobs.verify(tmp)
                damage = [f"{p['where']}: {p['what']}" if p["where"] else p["what"]
                          for c in result.report["checkpoints"] for p in c["problems"]
                          if not p["unsafe"]]
                if damage:
                    raise JobFailed(f"{path}: the checkpoint just written does not verify: "
                                    f"{damage[0]}", path, result)
            os.replace(tmp, path)
            tmp = None
            _fsync_folder(folder)
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
        if self.policy is True and not os.path.exists(os.path.join(folder, "ckptool.toml")):
            return  # a folder without a policy of its own (another ModelCheckpoint's)
        if self.policy:
            options: dict = {"settle": 0, "quiet": True}
            if self.threads:
                options["threads"] = self.threads
            if isinstance(self.policy, (str, os.PathLike)):
                options["policy"] = os.fspath(self.policy)
            _jobs.apply(folder, **options)

    def load_checkpoint(self, path: Any, map_location: Optional[Callable] = None,
                        weights_only: Optional[bool] = None) -> dict:
        path = os.fspath(path)
        if not os.path.exists(path) and os.path.exists(path + ".ckz"):
            path += ".ckz"  # the policy compressed it
        if not os.path.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        # What Lightning's TorchCheckpointIO does for a local file: torch.load with this
        # weights_only, whose default (None) is torch's, True. The plugin's trust=[...] accepts
        # your own classes as weights_only=False would, without trusting everything.
        if weights_only is None and not self.trust:
            weights_only = True
        return load(path, map_location=map_location, weights_only=weights_only,
                    trust=self.trust)

    def remove_checkpoint(self, path: Any) -> None:
        path = os.fspath(path)
        for p in (path, path + ".ckz"):
            if os.path.lexists(p):
                os.remove(p)

    def teardown(self) -> None:
        pass
