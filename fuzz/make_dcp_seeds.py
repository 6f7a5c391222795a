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


with tempfile.TemporaryDirectory() as tmp:
    for name, make in dcp.standard_cases().items():
        folder = os.path.join(tmp, name)
        make(folder)
        blob = pack(folder)
        if len(blob) > 400_000:
            continue
        with open(os.path.join(out, f"seed-{name}"), "wb") as f:
            f.write(blob)
