#!/usr/bin/env python3
"""Loading checkpoints from Python: ckptool.load against torch.load(mmap=True,
weights_only=True), safetensors.torch.load_file and DeepSpeed's
get_fp32_state_dict_from_zero_checkpoint, side by side in one run.

    .venv/bin/python bench/load.py [--gib 1] [--tensors 160000] [--zero-gib 1] [--repeat 3]

Cases (files in tmpfs, made first): a state dict of --gib GiB of fp32 (64 tensors) as a
torch.save file and as a safetensors file; --tensors small tensors (16 fp32 each) likewise; a
DeepSpeed ZeRO-3 folder of --zero-gib GiB of fp32 parameters over 4 ranks, laid out as
DeepSpeed writes it (tests/integration/zero_fixtures.py: real DeepSpeed cannot train a GiB
model on this CPU machine in reasonable time). Each load runs in a fresh interpreter after its
imports; reported: the load's time, the time to load and then read every byte of every tensor
(a mapped load reads them then), and the peak RSS the load added over the interpreter with its
imports (VmHWM - VmRSS before; mapped pages count once read). Best of --repeat; the loaders
must agree on the number of tensors and the sum of their values. Prints a Markdown table and writes
bench/load.json."""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TMPFS = "/dev/shm/ckptool-bench-load"

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
how, path = sys.argv[2], sys.argv[3]
def rss(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
if how.startswith("ckptool"):
    import ckptool
    fn = lambda: ckptool.load(path, mmap=True)
elif how == "torch.load(mmap)":
    fn = lambda: torch.load(path, mmap=True, weights_only=True, map_location="cpu")
elif how == "safetensors":
    from safetensors.torch import load_file
    fn = lambda: load_file(path)
elif how == "zero_to_fp32":
    import contextlib, io
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    def fn():
        with contextlib.redirect_stdout(io.StringIO()):
            return get_fp32_state_dict_from_zero_checkpoint(path)
base = rss("VmRSS:")
t0 = time.perf_counter()
sd = fn()
t1 = time.perf_counter()
total = 0.0
for t in sd.values():
    total += float(t.sum())  # reads every element (mapped pages fault in here)
t2 = time.perf_counter()
print(json.dumps({"load": t1 - t0, "read": t2 - t0, "rss": rss("VmHWM:") - base,
                  "tensors": len(sd), "sum": total}))
"""

MAKE = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
kind, out = sys.argv[2], sys.argv[3]
if kind == "big":
    n = int(sys.argv[4])
    per = n // 64 // 4
    g = torch.Generator().manual_seed(0)
    sd = {f"layers.{i}.weight": torch.randn(per, generator=g) for i in range(64)}
elif kind == "many":
    n = int(sys.argv[4])
    sd = {f"layers.{i}.weight": torch.full((16,), float(i)) for i in range(n)}
torch.save(sd, out + ".pt")
from safetensors.torch import save_file
save_file(sd, out + ".safetensors")
"""

MAKE_ZERO = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import zero_fixtures as zf
root, params, side = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
groups = [[(f"layers.{i}.weight", (side, side)) for i in range(params)]]
zf.make_zero_checkpoint(root, 3, 4, groups=groups, dtype=torch.bfloat16, with_frozen=False,
                        with_buffer=False, with_tied=False, zero_d_param=False, device="cpu")
"""


def child(how, path, package):
    p = subprocess.run([sys.executable, "-c", CHILD, package, how, path], capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else str(p.returncode)}
    return json.loads(p.stdout.strip().splitlines()[-1])


def best(how, path, package, repeat):
    runs = [child(how, path, package) for _ in range(repeat)]
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    return {"load": min(r["load"] for r in ok), "read": min(r["read"] for r in ok),
            "rss": min(r["rss"] for r in ok), "tensors": ok[0]["tensors"], "sum": ok[0]["sum"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--tensors", type=int, default=160000)
    ap.add_argument("--zero-gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--package", default=os.path.join(ROOT, "build", "python"),
                    help="folder holding the ckptool package to measure (default: build/python)")
    ap.add_argument("--out", default=os.path.join(HERE, "load.json"))
    a = ap.parse_args()
    shutil.rmtree(TMPFS, ignore_errors=True)
    os.makedirs(TMPFS)
    fixtures = os.path.join(ROOT, "tests", "integration")
    big, many, zero = (os.path.join(TMPFS, n) for n in ("big", "many", "zero"))
    subprocess.run([sys.executable, "-c", MAKE, fixtures, "big", big, str(int(a.gib * 2**30))],
                   check=True)
    subprocess.run([sys.executable, "-c", MAKE, fixtures, "many", many, str(a.tensors)],
                   check=True)
    side = 2048
    params = max(1, int(a.zero_gib * 2**30) // (side * side * 4))
    subprocess.run([sys.executable, "-c", MAKE_ZERO, fixtures, zero, str(params), str(side)],
                   check=True)
    cases = [
        (f"{a.gib:g} GiB state dict, 64 tensors", [
            ("torch.load(mmap=True, weights_only=True)", "torch.load(mmap)", big + ".pt"),
            ("ckptool.load (torch file)", "ckptool", big + ".pt"),
            ("safetensors.torch.load_file", "safetensors", big + ".safetensors"),
            ("ckptool.load (safetensors)", "ckptool-st", big + ".safetensors")]),
        (f"{a.tensors:,} tensors of 16 fp32", [
            ("torch.load(mmap=True, weights_only=True)", "torch.load(mmap)", many + ".pt"),
            ("ckptool.load (torch file)", "ckptool", many + ".pt"),
            ("safetensors.torch.load_file", "safetensors", many + ".safetensors"),
            ("ckptool.load (safetensors)", "ckptool-st", many + ".safetensors")]),
        (f"ZeRO-3 folder, {a.zero_gib:g} GiB fp32 over 4 ranks", [
            ("get_fp32_state_dict_from_zero_checkpoint", "zero_to_fp32", zero),
            ("ckptool.load", "ckptool", zero)]),
    ]
    results = []
    print("| case | loader | load | load + read every byte | peak RSS added |")
    print("|---|---|---|---|---|")
    for case, loaders in cases:
        sums = set()
        for label, how, path in loaders:
            r = best(how, path, a.package, a.repeat)
            results.append({"case": case, "loader": label, **r})
            if "error" in r:
                print(f"| {case} | {label} | failed: {r['error']} | | |")
                continue
            sums.add((r["tensors"], r["sum"]))
            print(f"| {case} | {label} | {r['load']:.3f} s | {r['read']:.3f} s | "
                  f"{r['rss'] / 2**20:.0f} MiB |")
        if len(sums) > 1:
            print(f"| {case} | **the loaders disagree on the tensors: {sorted(sums)}** | | | |")
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "results": results}, f, indent=1)
    shutil.rmtree(TMPFS, ignore_errors=True)


if __name__ == "__main__":
    main()
