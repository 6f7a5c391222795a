"""Bloated checkpoints as training frameworks write them, built with real torch."""
import argparse
import collections

import numpy as np
import torch


def deepspeed_like(seed=0, hidden=32, layers=3, with_python_objects=True):
    """Per-layer views into one padded flat buffer (ZeRO / pipeline engines), tied and
    overlapping views, non-contiguous views, Adam state as slices of padded partitions."""
    torch.manual_seed(seed)
    shapes = []
    for i in range(layers):
        shapes += [(f"layers.{i}.w", (hidden, hidden)), (f"layers.{i}.b", (hidden,))]
    numel = sum(int(np.prod(s)) for _, s in shapes)
    flat = torch.randn(2 * numel + 100)  # another rank's partition and padding ride along
    module, off = collections.OrderedDict(), 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        module[name] = flat[off:off + n].view(shape)
        off += n
    module["head.w"] = module["layers.0.w"]  # tied: the same tensor object twice
    module["layers.0.w_t"] = module["layers.0.w"].t()  # non-contiguous alias of the same bytes
    window = torch.randn(1000)
    module["overlap.a"] = window[100:200]
    module["overlap.b"] = window[150:250]  # overlaps a: must still alias after shrink
    module["strided"] = torch.randn(20, 20)[::3, 1::4]
    module["scalar"] = torch.tensor(2.5)[()]
    module["empty"] = torch.randn(50)[10:10]
    module["half"] = torch.randn(300).half()[40:80]
    module["param"] = torch.nn.Parameter(torch.randn(4, 4)[1:3])
    module["frozen"] = torch.nn.Parameter(torch.randn(6)[2:5], requires_grad=False)
    partition = torch.randn(2 * numel)
    state = {
        "module": module,
        "optimizer": {
            "state": {0: {"step": torch.tensor(10),
                          "exp_avg": torch.zeros(2 * numel)[:numel],
                          "exp_avg_sq": torch.ones(2 * numel)[:numel]}},
            "param_groups": [{"params": [0], "weight_decay": 0}],
            "fp32_groups": [partition[:numel], partition[numel:numel + 10]],
        },
        "global_steps": 10,
        "ds_version": "0.14.0",
        "lists": [torch.arange(100)[::7], (torch.arange(10)[3:5],)],
    }
    if with_python_objects:
        state["args"] = argparse.Namespace(lr=0.001, seed=seed, name="run")
        state["numpy"] = np.arange(12, dtype=np.float32).reshape(3, 4)
        state["tags"] = {"a", "b"}
        state["huge"] = 2 ** 100
        state["lr"] = 3e-4
    return state


def clean(seed=1):
    """Nothing to drop: every storage is exactly one tensor."""
    torch.manual_seed(seed)
    return {"w": torch.randn(8, 8), "b": torch.randn(8), "step": 3}
