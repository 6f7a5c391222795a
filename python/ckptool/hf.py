"""Hugging Face integration: a TrainerCallback that runs the team's policy (ckptool.toml) on
the Trainer's output_dir after every save, after the Trainer's own rotation.

    from ckptool.hf import CkptoolCallback
    trainer = Trainer(..., callbacks=[CkptoolCallback()])   # output_dir/ckptool.toml

The Trainer's save_total_limit counts checkpoint folders only: a checkpoint the policy
compressed (checkpoint-500.ckz) is a file it neither counts nor deletes. Rotate with the
policy's [retention] instead (save_total_limit=None); the callback warns otherwise. Resume
from the newest checkpoint that is complete and intact:
trainer.train(resume_from_checkpoint=ckptool.latest(args.output_dir)).

What the Trainer still needs is left as it is until training ends: with
load_best_model_at_end, the checkpoint trainer_state.json names as best is held (kept, no
step runs on it: `ckptool apply --hold`), so the Trainer ends on the best weights; the policy
runs over it once training ends. A missing policy file is an error when training starts."""
from __future__ import annotations

import os
import warnings
from typing import Optional

from transformers import TrainerCallback

from . import _jobs


class CkptoolCallback(TrainerCallback):
    """on_save: `ckptool apply` on args.output_dir (or `root`) with `policy` (default:
    ROOT/ckptool.toml), no settle time (the checkpoint the Trainer just wrote is complete:
    trainer_state.json is its marker). Runs on the main process only. A failed step raises
    ckptool.JobFailed, stopping training, unless `raise_on_failure=False` (then it warns)."""

    def __init__(self, policy: Optional[str] = None, root: Optional[str] = None,
                 raise_on_failure: bool = True, threads: int = 0):
        self.policy = policy
        self.root = root
        self.raise_on_failure = raise_on_failure
        self.threads = threads
        self.results = []  # each save's apply report

    def _root(self, args) -> str:
        return self.root or args.output_dir

    def on_train_begin(self, args, state, control, **kwargs):
        policy = self.policy or os.path.join(self._root(args), "ckptool.toml")
        if not os.path.exists(policy):
            raise FileNotFoundError(
                f"ckptool: no policy file {policy}: CkptoolCallback runs it after every save; "
                f"write one there (docs/policy.md) or pass CkptoolCallback(policy=PATH)")
        if getattr(args, "save_total_limit", None):
            warnings.warn("ckptool: save_total_limit counts only checkpoint folders, not the "
                          "archives a policy makes; rotate with [retention] in ckptool.toml",
                          _jobs.CheckpointWarning, stacklevel=2)

    def on_save(self, args, state, control, **kwargs):
        self._apply(args, state, hold=self._held(args, state))

    def on_train_end(self, args, state, control, **kwargs):
        # The Trainer has loaded the best model (load_best_model_at_end) and is done: what
        # was held gets its steps now.
        self._apply(args, state, hold=[])

    def _held(self, args, state) -> list:
        """Entries of the root the Trainer still needs as they are."""
        best = getattr(state, "best_model_checkpoint", None)
        if not (getattr(args, "load_best_model_at_end", False) and best):
            return []
        rel = os.path.relpath(os.path.abspath(best), os.path.abspath(self._root(args)))
        return [rel.split(os.sep)[0]] if not rel.startswith("..") else []

    def _apply(self, args, state, hold: list):
        if not state.is_world_process_zero:
            return
        root = self._root(args)
        options: dict = {"settle": 0, "quiet": True}
        if hold:
            options["hold"] = hold
        if self.threads:
            options["threads"] = self.threads
        if self.policy:
            options["policy"] = os.fspath(self.policy)
        try:
            self.results.append(_jobs.apply(root, **options))
        except _jobs.JobFailed as e:
            if self.raise_on_failure:
                raise
            warnings.warn(str(e), _jobs.CheckpointWarning, stacklevel=2)
