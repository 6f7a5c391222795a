"""ckptool.open: one checkpoint of any container, read tensor by tensor, like safetensors'
safe_open. Tensors stored whole and in order in a file are mapped, not copied (copy-on-write:
writing to one never changes the file); the others (ZeRO partitions, DCP chunks, archives,
strided views) are gathered into new memory. No pickle is ever run."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from . import _core, _jobs
from ._errors import CheckpointError

_NUMPY = {
    "float64": "float64", "float32": "float32", "float16": "float16",
    "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8",
    "uint64": "uint64", "uint32": "uint32", "uint16": "uint16", "uint8": "uint8",
    "bool": "bool", "complex64": "complex64", "complex128": "complex128",
}


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - the suite always has torch
        raise ImportError("get_tensor and load need torch; get_numpy does not") from e
    return torch


def torch_dtype(name: str):
    torch = _torch()
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"torch {torch.__version__} has no dtype {name}")
    return dtype


class FileMaps:
    """Whole files mapped copy-on-write as torch storages, one per file, shared by the
    tensors cut from them."""

    def __init__(self):
        self._maps: Dict[str, Any] = {}

    def slice(self, path: str, offset: int, nbytes: int):
        torch = _torch()
        whole = self._maps.get(path)
        if whole is None:
            whole = torch.UntypedStorage.from_file(path, False, os.path.getsize(path))
            self._maps[path] = whole
        return whole[offset:offset + nbytes]


class Checkpoint:
    """An open checkpoint (see ckptool.open). Use as a context manager or call close()."""

    def __init__(self, path: "str | os.PathLike[str]", *, tag: Optional[str] = None,
                 threads: int = 0):
        self.path = os.fspath(path)
        try:
            self._c = _core.Checkpoint.open(self.path, threads, tag or "")
        except _core.CoreError as e:
            raise CheckpointError(str(e), self.path) from None
        self._maps = FileMaps()

    # -- what it is ---------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """'torch-zip', 'torch-legacy', 'safetensors', 'model-folder', 'dcp' or 'zero'."""
        return self._c.kind

    @property
    def archived(self) -> bool:
        """True when read from a .ckz archive."""
        return self._c.archived

    @property
    def warnings(self) -> List[str]:
        """What the reader noticed: unsafe pickle globals (never run), unreadable tensors."""
        return list(self._c.warnings)

    def keys(self) -> List[str]:
        """Every tensor name, in the source's order; a tensor under several names (tied
        weights) is listed under each."""
        return self._c.names()

    def __contains__(self, name: str) -> bool:
        return name in self._c

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._c.names())

    def metadata(self) -> Dict[str, str]:
        """safetensors' __metadata__ (merged over a model folder's shards); {} otherwise."""
        return dict(self._c.metadata())

    def info(self, name: str) -> Dict[str, Any]:
        """dtype (torch's name), shape, numel, nbytes of a tensor, and where it is."""
        return self._c.info(name)

    # -- reading ------------------------------------------------------------------------
    def get_tensor(self, name: str):
        """The tensor as a torch.Tensor on the CPU (KeyError when absent)."""
        torch = _torch()
        info = self._c.info(name)
        dtype = torch_dtype(info["dtype"])
        shape = tuple(info["shape"])
        if info["nbytes"] == 0:
            return torch.empty(shape, dtype=dtype)
        if info["file"] is not None:
            storage = self._maps.slice(info["file"], info["offset"], info["nbytes"])
            return torch.empty(0, dtype=dtype).set_(storage, 0, shape, _contiguous(shape))
        out = torch.empty(shape, dtype=dtype)
        self._read_into(name, out.reshape(-1).view(torch.uint8).numpy())
        return out

    def get_numpy(self, name: str):
        """The tensor as a numpy array, without torch (bfloat16 and float8 have no numpy
        dtype: use get_tensor)."""
        import numpy as np
        info = self._c.info(name)
        kind = _NUMPY.get(info["dtype"])
        if kind is None:
            raise TypeError(f"{name}: numpy has no {info['dtype']} dtype; get_tensor reads it")
        shape = tuple(info["shape"])
        if info["file"] is not None and info["nbytes"]:
            return np.memmap(info["file"], dtype=kind, mode="c", offset=info["offset"],
                             shape=shape)
        out = np.empty(shape, dtype=kind)
        if info["nbytes"]:
            self._read_into(name, out.reshape(-1).view(np.uint8))
        return out

    def _read_into(self, name: str, buffer) -> None:
        try:
            self._c.read_into(name, buffer)
        except _core.CoreError as e:
            raise CheckpointError(str(e), self.path) from None

    # -- reports ------------------------------------------------------------------------
    def describe(self) -> Dict[str, Any]:
        """ckptool inspect's report of this checkpoint, as a dict."""
        return _jobs.inspect(self.path).report

    def verify(self) -> "_jobs.Result":
        """ckptool verify of this checkpoint: result.ok, and the report."""
        return _jobs.verify(self.path)

    def close(self) -> None:
        """Releases the files (tensors already returned stay valid)."""
        self._c = None

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ckptool.Checkpoint {self.kind} {self.path!r}>"


def _contiguous(shape):
    stride, out = 1, []
    for d in reversed(shape):
        out.append(stride)
        stride *= max(d, 1)
    return tuple(reversed(out))


def open(path: "str | os.PathLike[str]", *, tag: Optional[str] = None,  # noqa: A001
         threads: int = 0) -> Checkpoint:
    """Opens a checkpoint of any container ckptool reads: a torch file (zip or legacy), a
    safetensors file, a model folder (Hugging Face, sharded or not), a
    torch.distributed.checkpoint folder, a DeepSpeed ZeRO folder (consolidated fp32, as
    zero_to_fp32 makes it; `tag` picks a tag folder), or a .ckz archive of any of them.
    Raises ckptool.CheckpointError naming the path and the reason."""
    return Checkpoint(path, tag=tag, threads=threads)
