#!/usr/bin/python3
"""Seeds for fuzz_dcp: small torch.distributed.checkpoint folders (tests/integration/
dcp_fixtures.py), each packed as one input of records [u8 name length][name][u32 LE length]
[bytes], the .metadata first.
    fuzz/make_dcp_seeds.py fuzz/corpus/dcp
"""
import os
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import dcp_fixtures as dcp  # noqa: E402

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def pack(folder):
    names = sorted(os.listdir(folder))
    meta = [n for n in names if n.endswith(".metadata")][:1]
    blob = b""
    for n in meta + [n for n in names if n.endswith(".distcp")]:
        data = open(os.path.join(folder, n), "rb").read()
        blob += struct.pack("<B", len(n)) + n.encode() + struct.pack("<I", len(data)) + data
    return blob


def tiny(folder, **kw):
    """Small enough to fuzz fast: a row-, a column- and a 2-D-sharded tensor, a replicated
    0-d one, an object."""
    import torch
    g = torch.Generator().manual_seed(7)
    state = {
        "model.w": dcp.Shard(torch.randn(5, 3, generator=g), 2, 0),
        "model.v": dcp.Shard(torch.randn(2, 5, generator=g).to(torch.bfloat16), 2, 1),
        "model.g": dcp.DT(torch.randn(4, 4, generator=g), (2, 2), [("S", 0), ("S", 1)]),
        "optim.state.model.w.step": torch.tensor(3.0),
        "optim.param_groups.0.lr": 0.1,
    }
    return dcp.make_dcp_checkpoint(folder, state, world_size=kw.pop("world_size", 4), **kw)


with tempfile.TemporaryDirectory() as tmp:
    cases = {"tiny": tiny, "tiny_zstd": lambda d: tiny(d, zstd=True),
             "tiny_legacy": lambda d: tiny(d, legacy_module_paths=True)}
    cases.update(dcp.standard_cases())
    for name, make in cases.items():
        folder = os.path.join(tmp, name)
        make(folder)
        blob = pack(folder)
        if len(blob) > 400_000:
            continue
        with open(os.path.join(out, f"seed-{name}"), "wb") as f:
            f.write(blob)
