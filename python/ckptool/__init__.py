"""ckptool: inspect, verify, shrink, convert, export and load ML checkpoints without running
their pickles. The engine is the same C++ library as the `ckptool` command line.

    import ckptool
    with ckptool.open("checkpoint.pt") as ck:          # any container, lazily
        w = ck.get_tensor("model.encoder.weight")
    sd = ckptool.load("checkpoint.pt")                   # torch.load's object, safely
    ckptool.convert("run/", dtype="bf16", output_dir="run-bf16")   # any command

docs/python.md describes the whole API."""
from ._errors import CheckpointError, Error, JobFailed, UsageError  # noqa: I001 (first)
from . import _core
from ._jobs import (CheckpointWarning, Result, apply, compress, convert, decompress, export,
                    inspect, latest, manifest, prune, reshard, run, shrink, strip, verify)
from ._load import load
from ._open import Checkpoint, open  # noqa: A004
from ._pickled import Pickled

__version__ = "0.1.0"

__all__ = ["open", "load", "Checkpoint", "Pickled", "Result", "run", "inspect", "verify",
           "shrink", "convert", "strip", "export", "compress", "decompress", "prune", "apply",
           "manifest", "latest", "reshard", "Error", "UsageError", "CheckpointError", "JobFailed", "CheckpointWarning",
           "__version__"]
