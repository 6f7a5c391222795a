#!/usr/bin/python3
"""Makes examples/bloated.pt: a small DeepSpeed-style checkpoint with the usual bloat.

Like ZeRO stage 1/2 and pipeline engines, the per-layer weights are views into one flat
fp32 buffer that also holds other ranks' partitions and alignment padding, so torch.save
writes the whole buffer behind every view; the optimizer state holds Adam moments that are
slices of equally oversized buffers. About half of the file is dead bytes.
Run with Debian's interpreter (it has python3-torch):  /usr/bin/python3 make_example.py
"""
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    torch.manual_seed(42)
    hidden, layers = 64, 4
    shapes = []
    for i in range(layers):
        shapes += [(f"layers.{i}.attn.weight", (hidden, hidden)), (f"layers.{i}.attn.bias", (hidden,)),
                   (f"layers.{i}.mlp.weight", (hidden, hidden)), (f"layers.{i}.norm.weight", (hidden,))]
    numel = sum(torch.Size(s).numel() for _, s in shapes)
    padded = 2 * numel + 4096  # another rank's partition plus alignment padding
    flat = torch.randn(padded)
    module, offset = {}, 0
    for name, shape in shapes:
        n = torch.Size(shape).numel()
        module[name] = flat[offset:offset + n].view(shape)
        offset += n
    module["lm_head.weight"] = module["layers.0.attn.weight"]  # tied weights
    partition = torch.randn(padded)  # fp32 master partition, padded like the flat buffer
    state = {
        "module": module,
        "optimizer": {
            "state": {0: {"step": torch.tensor(100.0),
                          "exp_avg": torch.zeros(padded)[:numel],
                          "exp_avg_sq": torch.zeros(padded)[:numel]}},
            "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "params": [0]}],
            "single_partition_of_fp32_groups": [partition[:numel]],
        },
        "global_steps": 100,
        "ds_version": "0.14.0",
    }
    torch.save(state, os.path.join(HERE, "bloated.pt"))


if __name__ == "__main__":
    main()
