"""ckptool.load: the object torch.load would return, built from ckptool's parse of the pickle
without importing or calling anything it names. Dicts, lists, tuples, sets, strings, bytes,
numbers and OrderedDicts are made directly; tensors come from the file's storages (mapped
copy-on-write where stored whole, as torch.load(mmap=True) does) with their views shared as
torch.load shares them; globals on the reviewed allowlist that `verify` uses, or in modules
the caller trusts, are imported and called as pickle would; anything else comes back as an
inert ckptool.Pickled record."""
from __future__ import annotations

import importlib
import os
from typing import Any, Dict, Iterable, Optional

from . import _core
from ._errors import CheckpointError
from ._open import Checkpoint, FileMaps, _torch, torch_dtype
from ._pickled import Pickled

_REDUCE, _NEWOBJ, _NEWOBJ_EX, _INST = 0, 1, 2, 3
_PLAIN = {"tensor", "parameter"}


class _Hooks:
    """What ckptool._core.load_graph asks the package for while it builds the objects."""

    def __init__(self, ckpt: Checkpoint, mmap: bool, device: Any = None,
                 weights_only: Optional[set] = None):
        self._c = ckpt._c
        self._path = ckpt.path
        self._maps: FileMaps = ckpt._maps
        self._mmap = mmap
        self._device = device  # None: the CPU; a torch.device; or map_location's callable
        self._weights_only = weights_only  # the globals torch's weights_only accepts, when asked
        self._storages: Dict[Any, Any] = {}
        self._torch = _torch()

    def place(self, t):
        """A tensor where map_location sends it."""
        if self._device is None:
            return t
        if callable(self._device):
            return t  # applied to its storage in _untyped
        return t.to(self._device)

    def _refuse_for_weights_only(self, name: str):
        if self._weights_only is not None and name not in self._weights_only:
            raise CheckpointError(
                f"{self._path}: weights_only=True: the pickle imports {name}, which torch's "
                f"weights_only unpickler refuses (weights_only=False, or trust=[...] with the "
                f"default weights_only=None, accepts it)", self._path)

    def _untyped(self, source: int, index: int):
        key = (source, index)
        s = self._storages.get(key)
        if s is not None:
            return s
        info = self._c.torch_storage(source, index)
        torch = self._torch
        if info["nbytes"] == 0:
            s = torch.UntypedStorage(0)
        elif self._mmap and info["file"] is not None:
            s = self._maps.slice(info["file"], info["offset"], info["nbytes"])
        else:
            buf = torch.empty(info["nbytes"], dtype=torch.uint8)
            try:
                self._c.read_storage_into(source, index, buf.numpy())
            except _core.CoreError as e:
                raise CheckpointError(str(e), self._path) from None
            s = buf.untyped_storage()
        if callable(self._device):
            s = self._device(s, info.get("location", "cpu"))
        self._storages[key] = s
        return s

    def tensor(self, source: int, index: int):
        torch = self._torch
        t = self._c.torch_tensor(source, index)
        if t["kind"] not in _PLAIN or t["storage"] < 0:
            raise CheckpointError(
                f"{self._path}: '{t['name']}' is a {t['kind']} tensor, which load() does not "
                f"rebuild (open() reads the plain tensors)", self._path)
        storage = self._untyped(source, t["storage"])
        out = torch.empty(0, dtype=torch_dtype(t["dtype"])).set_(
            storage, t["offset"], tuple(t["shape"]), tuple(t["stride"]))
        out = self.place(out)
        if t["kind"] == "parameter":
            return torch.nn.Parameter(out, requires_grad=t["requires_grad"])
        if t["requires_grad"]:
            out.requires_grad_(True)
        return out

    def storage(self, source: int, index: int):
        torch = self._torch
        info = self._c.torch_storage(source, index)
        untyped = self._untyped(source, index)
        if info["untyped"]:
            return untyped
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=torch_dtype(info["dtype"]),
                                          _internal=True)

    def persistent(self, pid):
        raise CheckpointError(f"{self._path}: a persistent id ckptool does not know: {pid!r}",
                              self._path)

    def resolve(self, module: str, name: str):
        import _compat_pickle
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        self._refuse_for_weights_only(f"{module}.{name}")
        try:
            obj = importlib.import_module(module)
        except ImportError as e:
            raise CheckpointError(
                f"{self._path}: the pickle needs {module}.{name}, and {module} cannot be imported "
                f"here ({e}); install it, or read the tensors with ckptool.open()", self._path) from None
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj

    @staticmethod
    def call(fn, args, kwargs, construct: int):
        if construct in (_NEWOBJ, _NEWOBJ_EX):
            return fn.__new__(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    @staticmethod
    def build(obj, state):
        setstate = getattr(obj, "__setstate__", None)
        if setstate is not None and not isinstance(obj, type):
            setstate(state)
            return None
        slots = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slots = state
        if state:
            obj.__dict__.update(state)
        if slots:
            for k, v in slots.items():
                setattr(obj, k, v)
        return None

    def pickled(self, module: str, name: str, called: bool):
        self._refuse_for_weights_only(f"{module}.{name}" if module else name)
        return Pickled(module, name, called)


def _select(obj: Any, select: Optional[str], path: str) -> Any:
    if not select:
        return obj
    if isinstance(obj, dict):
        if select in obj:
            return obj[select]
        below = {k[len(select) + 1:]: v for k, v in obj.items()
                 if isinstance(k, str) and k.startswith(select + ".")}
        if below:
            return below
        head, dot, rest = select.partition(".")
        if dot and head in obj:
            return _select(obj[head], rest, path)
    raise CheckpointError(f"{path}: select={select!r}: nothing under that key", path)


def _target_device(map_location: Any):
    """torch.load's map_location as ckptool applies it: None when tensors stay on the CPU
    (ckptool reads every storage to the CPU, as map_location="cpu" does), else the device to
    move them to, or a callable applied to each storage."""
    torch = _torch()
    if map_location is None:
        return None
    if callable(map_location):
        return map_location
    if isinstance(map_location, dict):
        targets = {torch.device(v).type for v in map_location.values()}
        if targets - {"cpu"}:
            raise CheckpointError(
                f"map_location={map_location!r}: ckptool.load maps every storage to the CPU; "
                f"pass one device (map_location='cuda:0') to move them all", "")
        return None
    device = torch.device(map_location)
    return None if device.type == "cpu" else device


def _weights_only_globals():
    """The globals torch.load(weights_only=True) accepts: its own list and the user's
    torch.serialization.add_safe_globals."""
    from torch import _weights_only_unpickler as wu
    import torch.serialization as ts
    allowed = set(wu._get_allowed_globals())
    for g in ts.get_safe_globals():
        obj = g[0] if isinstance(g, tuple) else g
        allowed.add(f"{obj.__module__}.{obj.__qualname__}")
    return allowed


def load(path: "str | os.PathLike[str]", map_location: Any = None, pickle_module: Any = None, *,
         weights_only: Optional[bool] = None, mmap: Optional[bool] = None,
         select: Optional[str] = None, trust: Iterable[str] = (), tag: Optional[str] = None,
         **pickle_load_args: Any) -> Any:
    """What torch.load(path, map_location, weights_only=..., mmap=...) returns, without running
    the pickle: torch.load's arguments with its meaning, plus `select`, `trust` and `tag`.

    A torch file gives its object; a safetensors file, a model folder, a
    torch.distributed.checkpoint folder or a DeepSpeed ZeRO folder (consolidated, as
    get_fp32_state_dict_from_zero_checkpoint makes it) gives a dict of name -> tensor; a .ckz
    archive gives what it holds. `select` picks a key ("state_dict", "model.encoder": a dict
    key, or a prefix of flat names). `trust` lists modules whose classes may be imported and
    called ("myproject", "myproject.*", "pkg.mod.Class"); the deny list always wins.

    map_location: None or a CPU device (tensors are read to the CPU), another device (they are
    moved there), or a callable (storage, location) -> storage as torch.load takes.
    weights_only: True refuses, as torch's weights_only unpickler does, any global outside
    its allowlist (and torch.serialization.add_safe_globals); False means you trust the file:
    every class and function it names that is not on the deny list is rebuilt (trust=['*']);
    None (the default) rebuilds what ckptool's allowlist and `trust` accept and returns the
    rest as inert ckptool.Pickled records. Nothing the verdict refuses is ever called.
    mmap: as torch.load, False (the default) copies every tensor into memory, so the file may
    be rewritten or removed while they live (load, edit, torch.save to the same path); True
    maps tensors stored whole copy-on-write from the file."""
    if pickle_module is not None:
        raise TypeError("ckptool.load never runs a pickle module: pickle_module must be None")
    unknown = set(pickle_load_args) - {"encoding"}
    if unknown:
        raise TypeError(f"ckptool.load() got unexpected keyword arguments: {sorted(unknown)}")
    trust = list(trust)
    if weights_only is False:
        trust.append("*")
    with Checkpoint(path, tag=tag) as c:
        hooks = _Hooks(c, bool(mmap), _target_device(map_location),
                       _weights_only_globals() if weights_only else None)
        core = c._c
        torch_sources = [s for s in range(core.sources()) if core.is_torch(s)]
        try:
            if c.kind in ("torch-zip", "torch-legacy"):
                obj = _core.load_graph(core, 0, hooks, trust)
            elif torch_sources and c.kind == "model-folder":
                obj = {}
                for s in torch_sources:  # shards of one state dict (pytorch_model-0000x.bin)
                    part = _core.load_graph(core, s, hooks, trust)
                    if not isinstance(part, dict):
                        raise CheckpointError(f"{c.path}: shard {s} is no state dict", c.path)
                    obj.update(part)
            else:
                obj = {name: hooks.place(_tensor(c, name, hooks)) for name in c.keys()}
        except _core.CoreError as e:
            raise CheckpointError(str(e), c.path) from None
        return _select(obj, select, c.path)


def _tensor(c: Checkpoint, name: str, hooks: _Hooks):
    if not hooks._mmap:
        t = c.get_tensor(name)
        return t.clone() if c.info(name)["file"] is not None else t
    return c.get_tensor(name)
