#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/semantic_oracle.py into fuzz/corpus/semantic/ (run with
.venv/bin/python: torch 2.13 and numpy):

  real_*     data.pkl of files the real torch.save writes: state dicts, Parameters, numbers,
             strings, numpy arrays and random states, Enum members, standard-library values.
             Loading them must never be an oracle failure (the proxies are transparent).
  hostile_*  hand-made pickles built from the attack techniques the oracle knows: methods
             planted through BUILD (__setstate__, extend, append, add, keys), callables
             laundered through max([...]) or getattr and handed to allowlisted functions that
             call them, module paths, class switches, patched classes and registries.
             Whether each is SAFE is the verdict's business; the oracle checks the SAFE ones.

Files the fuzzer finds (regress_*) are kept beside them and left alone here. The outputs are
committed; rerun this when the techniques change.
"""
import argparse as _argparse
import collections
import datetime
import decimal
import fractions
import inspect
import io
import os
import pathlib
import sys
import uuid
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from semantic_oracle import (getattr_read, launder_max, op_call, op_dict, op_global,  # noqa: E402
                             op_int, op_list, op_newobj, op_none, op_stack_global, op_storage,
                             op_str, op_tensor, op_tuple, pickle_of, plant)

OUT = os.path.join(HERE, "corpus", "semantic")


def data_pkl(obj):
    """The data.pkl record of torch.save(obj)."""
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return z.read(name)


def real_seeds():
    import numpy as np
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    yield "real_state_dict", model.state_dict()
    yield "real_parameters", {"w": torch.nn.Parameter(torch.randn(2, 2)),
                              "frozen": torch.nn.Parameter(torch.ones(3), requires_grad=False)}
    yield "real_optimizer", {"model": model.state_dict(), "optimizer": opt.state_dict(),
                             "epoch": 7, "best": 0.25}
    yield "real_scalars", {"epoch": 3, "lr": 1e-3, "name": "run-1", "flags": [True, False, None],
                           "big": 2 ** 70, "neg": -5, "complex": 1 + 2j, "bytes": b"\x00\xff",
                           "bytearray": bytearray(b"ab"), "tuple": (1, 2.5, "x"),
                           "set": {1, 2}, "frozenset": frozenset({"a"}), "nested": {"a": {"b": [1]}},
                           "unicode": "h\u00e9llo \u2603"}
    yield "real_torch_values", {"size": torch.Size([2, 3]), "dtype": torch.float16,
                                "bf16": torch.zeros(2, dtype=torch.bfloat16),
                                "int8": torch.arange(4, dtype=torch.int8),
                                "bool": torch.tensor([True, False]),
                                "cplx": torch.zeros(2, dtype=torch.complex64),
                                "view": torch.arange(6.0)[2:], "device": torch.device("cpu"),
                                "layout": torch.strided,
                                "scalar": torch.tensor(3.5)}
    yield "real_sparse", {"sparse": torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,))}
    yield "real_quantized", {"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)}
    yield "real_numpy", {"arr": np.arange(6, dtype=np.int32).reshape(2, 3),
                         "f32": np.float32(1.5), "i64": np.int64(-3), "dtype": np.dtype("int16"),
                         "rec": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
                         "str": np.array(["ab", "c"])}
    yield "real_numpy_random", {"rs": np.random.RandomState(0), "gen": np.random.default_rng(1)}
    yield "real_enum", {"safe": uuid.SafeUUID.safe, "unknown": uuid.SafeUUID.unknown,
                        "kind": inspect.Parameter.KEYWORD_ONLY}
    yield "real_stdlib", {"path": pathlib.PurePosixPath("/a/b"), "posix": pathlib.PosixPath("c"),
                          "when": datetime.datetime(2024, 1, 2, 3, 4, 5),
                          "date": datetime.date(2020, 2, 29), "delta": datetime.timedelta(3, 4),
                          "dec": decimal.Decimal("1.50"), "frac": fractions.Fraction(1, 3),
                          "uuid": uuid.UUID(int=5), "ns": _argparse.Namespace(lr=0.1, opt="sgd"),
                          "od": collections.OrderedDict(a=1),
                          "dd": collections.defaultdict(list, {"a": [1]}),
                          "counter": collections.Counter("aab"),
                          "deque": collections.deque([1, 2], maxlen=5),
                          "slice": slice(1, 5, 2), "range": range(3), "ellipsis": ...}
    yield "real_shared", (lambda t: {"a": t, "b": t[1:], "c": [t, t]})(torch.arange(4.0))


NS = op_call(op_global("argparse", "Namespace"))
OD = op_call(op_global("collections", "OrderedDict"))
PRINT = op_global("builtins", "print")
LAUNDERED = launder_max(PRINT)


def hostile_seeds():
    """(name, pickle bytes). Each effect is evaluated and dropped; the root is {}."""
    s = {}
    # Methods planted in an instance __dict__ by BUILD, then called by the unpickler itself.
    s["plant_setstate"] = [plant(NS, "__setstate__", PRINT) + op_dict() + b"b"]
    s["plant_setstate_laundered"] = [plant(NS, "__setstate__", LAUNDERED) + op_dict() + b"b"]
    s["plant_extend"] = [plant(NS, "extend", PRINT) + b"(" + op_str("a") + b"e"]
    s["plant_append"] = [plant(NS, "append", PRINT) + op_str("a") + b"a"]
    s["plant_add"] = [plant(NS, "add", PRINT) + b"(" + op_str("a") + b"\x90"]
    s["plant_extend_ordereddict"] = [plant(OD, "extend", PRINT) + b"(" + op_str("a") + b"e"]
    # ... or by an allowlisted function: dict(x) and OrderedDict(x) call x.keys().
    s["plant_keys_ordereddict"] = [op_call(op_global("collections", "OrderedDict"),
                                           plant(NS, "keys", PRINT))]
    s["plant_keys_dict"] = [op_call(op_global("builtins", "dict"), plant(OD, "keys", LAUNDERED))]
    s["plant_keys_accepted"] = [op_call(op_global("collections", "OrderedDict"),
                                        plant(NS, "keys", op_global("builtins", "list")))]
    # Callables laundered through max([...]) and handed to allowlisted functions that call them.
    s["launder_max_called"] = [op_call(LAUNDERED, op_str("a"))]
    s["launder_map_sorted"] = [op_call(op_global("builtins", "sorted"),
                                       op_call(op_global("builtins", "map"), LAUNDERED,
                                               op_list(op_str("a"))))]
    s["launder_filter_list"] = [op_call(op_global("builtins", "list"),
                                        op_call(op_global("builtins", "filter"), LAUNDERED,
                                                op_list(op_str("a"))))]
    s["launder_rebuild_from_type"] = [op_call(op_global("torch._tensor", "_rebuild_from_type_v2"),
                                              LAUNDERED, op_global("torch", "Tensor"),
                                              op_tuple(op_str("a")), op_dict())]
    s["launder_randomstate_ctor"] = [op_call(op_global("numpy.random._pickle",
                                                       "__randomstate_ctor"),
                                             op_str("MT19937"), LAUNDERED)]
    s["launder_defaultdict_factory"] = [op_call(op_global("collections", "defaultdict"), LAUNDERED)]
    s["direct_map_print"] = [op_call(op_global("builtins", "sorted"),
                                     op_call(op_global("builtins", "map"), PRINT,
                                             op_list(op_str("a"))))]
    # getattr: an Enum member read is fine; a read that is then called is not.
    s["getattr_enum_read"] = [getattr_read(op_global("uuid", "SafeUUID"), "safe")]
    s["getattr_read_mapped"] = [op_call(op_global("builtins", "sorted"),
                                        op_call(op_global("builtins", "map"),
                                                getattr_read(op_global("collections",
                                                                       "OrderedDict"), "fromkeys"),
                                                op_list(op_list(op_str("a")))))]
    s["getattr_read_write_text"] = [op_call(op_global("builtins", "list"),
                                            op_call(op_global("builtins", "map"),
                                                    getattr_read(op_global("pathlib", "Path"),
                                                                 "write_text"),
                                                    op_list(op_call(op_global("pathlib", "Path"),
                                                                    op_str("/nonexistent/x"))),
                                                    op_list(op_str("data"))))]
    s["getattr_read_module"] = [getattr_read(op_global("pathlib", "os"), "system")]
    # Modules and paths through them.
    s["module_global"] = [op_global("pathlib", "os")]
    s["module_global_torch"] = [op_global("torch", "serialization")]
    s["module_dotted_stack_global"] = [op_stack_global("pathlib", "os.system")]
    s["module_dotted_class"] = [op_stack_global("collections", "abc.Mapping")]
    # Classes the pickle chooses: their code runs when the unpickler uses them.
    s["reconstruct_userdict_setitem"] = [op_newobj(op_global("collections", "UserDict"))
                                         + op_dict() + b"b" + op_str("k") + op_int(1) + b"s"]
    s["reconstruct_plain"] = [op_newobj(op_global("argparse", "Action"))
                              + op_dict((op_str("a"), op_int(1))) + b"b"]
    s["reconstruct_inst_noargs"] = [b"(icollections\nUserDict\n" + op_dict() + b"b"]
    s["class_switch_slotstate"] = [NS + op_tuple(op_none(), op_dict(
        (op_str("__class__"), op_global("argparse", "ArgumentParser")))) + b"b"]
    s["class_switch_parameter_state"] = [op_call(
        op_global("torch._utils", "_rebuild_parameter_with_state"), op_tensor(), b"\x89", OD,
        op_tuple(op_dict((op_str("__class__"), op_global("torch.nn.parameter",
                                                         "UninitializedBuffer"))), op_none()))]
    s["parameter_state_planted_keys"] = [op_call(
        op_global("collections", "OrderedDict"),
        op_call(op_global("torch._utils", "_rebuild_parameter_with_state"), op_tensor(), b"\x89",
                OD, op_tuple(op_dict((op_str("keys"), PRINT)), op_none())))]
    s["rebuild_from_type_subclass"] = [op_call(
        op_global("torch._tensor", "_rebuild_from_type_v2"),
        op_global("torch._utils", "_rebuild_tensor_v2"),
        op_global("torch.nn.parameter", "UninitializedBuffer"),
        op_tuple(op_storage(), op_int(0), op_tuple(op_int(1)), op_tuple(op_int(1)), b"\x89", OD),
        op_dict())]
    # Patching what is imported: a class (through max([...])), copyreg's extension registry.
    s["patch_class_slotstate"] = [launder_max(op_global("argparse", "Namespace"))
                                  + op_tuple(op_none(), op_dict((op_str("__eq__"), PRINT))) + b"b"]
    s["patch_registry"] = [op_global("copyreg", "_inverted_registry") + op_int(7)
                           + op_tuple(op_str("posix"), op_str("system")) + b"s",
                           b"\x82\x07"]
    s["patch_registry_max"] = [launder_max(op_global("copyreg", "_extension_registry"))
                               + op_tuple(op_str("posix"), op_str("system")) + op_int(9) + b"s"]
    # Where ckptool's parser stops and says torch.load would fail, but torch.load goes on:
    # what comes after runs unjudged. torch's find_class makes any name with "Storage" in
    # it a StorageType without importing its module, BUILD on that object or on a tuple
    # (with no state) and SETITEM on a storage work.
    after = op_call(PRINT, op_str("after"))
    s["stop_storage_nul_module"] = [op_global("x\x00y", "FloatStorage"), after]
    s["stop_build_on_storagetype"] = [plant(op_global("torch", "FloatStorage"), "__setstate__",
                                            PRINT) + op_str("a") + b"b"]
    s["stop_setitem_persistent_id"] = [op_storage() + op_int(0) + op_int(1) + b"s", after]
    s["stop_build_noop_on_tuple"] = [op_tuple(op_int(1)) + op_tuple(op_none(), op_dict()) + b"b",
                                     after]
    s["stop_build_on_function"] = [op_global("torch._utils", "_rebuild_tensor_v2")
                                   + op_dict((op_str("x"), op_int(1))) + b"b", after]
    # Calls the verdict must flag whatever the rest does.
    s["direct_print"] = [op_call(PRINT, op_str("a"))]
    s["direct_getattr_call"] = [op_call(getattr_read(op_global("pathlib", "Path"), "home"))]
    s["newobj_starmap"] = [op_newobj(op_global("itertools", "starmap"), PRINT,
                                     op_list(op_tuple(op_str("a"))))]
    out = {}
    for name, effects in s.items():
        out["hostile_" + name] = pickle_of(effects)
    # Protocol 4 for the dotted names (they resolve attribute paths only from protocol 4).
    for name in ("hostile_module_dotted_stack_global", "hostile_module_dotted_class"):
        out[name] = b"\x80\x04" + out[name][2:]
    return out


def main():
    import warnings
    warnings.simplefilter("ignore")
    os.makedirs(OUT, exist_ok=True)
    written = 0
    for name, obj in real_seeds():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data_pkl(obj))
        written += 1
    for name, data in hostile_seeds().items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        written += 1
    print(f"{written} seeds in {OUT}")


if __name__ == "__main__":
    main()
