#!/usr/bin/python3
"""Seeds for fuzz_ucp: universal checkpoints, each packed as one input: [u8 stage] then records
[u8 role: 0 model states, 1 a parameter's fp32.pt (param_shapes order)][u32 LE length][file].
    fuzz/make_ucp_seeds.py fuzz/corpus/ucp build/ckptool [UCP_FOLDER...]
makes universal checkpoints of small ZeRO checkpoints (tests/integration/zero_fixtures.py) with
`ckptool reshard --to universal`, and packs the universal checkpoint folders given too (such as
those of the real DeepSpeed runs of tests/real/test_reshard_real.py).
"""
import os
import re
import struct
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import zero_fixtures as zf  # noqa: E402


def digit_aware(name):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def pack(ucp):
    models = sorted((n for n in os.listdir(ucp) if n.endswith("_model_states.pt")), key=digit_aware)
    osd = torch.load(os.path.join(ucp, "zero", "optimizer_state.pt"), weights_only=False)
    stage = int(osd.get("zero_stage", 3 if models[0].startswith("zero_pp_rank_") else 1))
    blob = bytes([stage])
    for n in models:
        with open(os.path.join(ucp, n), "rb") as f:
            data = f.read()
        blob += struct.pack("<BI", 0, len(data)) + data
    shapes = torch.load(os.path.join(ucp, models[0]), weights_only=False)["param_shapes"]
    for group in shapes:
        for name in group:
            with open(os.path.join(ucp, "zero", name, "fp32.pt"), "rb") as f:
                data = f.read()
            blob += struct.pack("<BI", 1, len(data)) + data
    return blob


out, ckptool = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
small = [[("w", (3, 5)), ("b", (5,)), ("s", ())], [("x", (7,))]]
for stage, ws in ((1, 1), (2, 2), (3, 1), (3, 3)):
    with tempfile.TemporaryDirectory() as tmp:
        zf.make_zero_checkpoint(tmp, stage, ws, groups=small, device="cpu")
        subprocess.run([ckptool, "reshard", tmp, "--to", "universal", "-o",
                        os.path.join(tmp, "ucp"), "-q"], check=True)
        with open(os.path.join(out, f"seed-stage{stage}-ranks{ws}"), "wb") as f:
            f.write(pack(os.path.join(tmp, "ucp")))
for i, ucp in enumerate(sys.argv[3:]):
    with open(os.path.join(out, f"seed-given-{i}"), "wb") as f:
        f.write(pack(ucp))
