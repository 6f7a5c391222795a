#!/usr/bin/python3
"""Seeds for fuzz_zero: small DeepSpeed ZeRO checkpoints (tests/integration/zero_fixtures.py),
each packed as one input of records [u8 role: 0 model states, 1 optimizer][u32 LE length][file].
    fuzz/make_zero_seeds.py fuzz/corpus/zero
"""
import os
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import zero_fixtures as zf  # noqa: E402

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
small = [[("w", (3, 5)), ("b", (5,)), ("s", ())], [("x", (7,))]]
for stage, ws in ((1, 1), (2, 2), (3, 1), (3, 3)):
    with tempfile.TemporaryDirectory() as tmp:
        fx = zf.make_zero_checkpoint(tmp, stage, ws, groups=small, device="cpu")
        folder = os.path.join(tmp, "global_step14")
        blob = b""
        for role, names in ((0, fx.model_files), (1, fx.optim_files)):
            for n in names:
                data = open(os.path.join(folder, n), "rb").read()
                blob += struct.pack("<BI", role, len(data)) + data
        with open(os.path.join(out, f"seed-stage{stage}-ranks{ws}"), "wb") as f:
            f.write(blob)
