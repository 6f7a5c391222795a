"""No false alarm on intact checkpoints: every checkpoint the real libraries write here (the
other real-stack tests' trained fixtures, plus models transformers saves, files safetensors and
accelerate write, torch.distributed.checkpoint folders and files from torch 2.13 and Debian's
torch 1.13, legacy and zip formats) passes `verify`, `verify --structure`, gets a manifest and
then matches it; `latest` names the newest of each run folder. At least 50 checkpoints."""
import os
import shutil
import subprocess
import sys
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import real_dcp_save  # noqa: E402
import real_ds_train  # noqa: E402
import real_hf_train  # noqa: E402,F401 (sets HF_HUB_OFFLINE before transformers is imported)
import torch  # noqa: E402

from real_common import fixture_script  # noqa: E402
from stacklib import TempDirTest, fixture, run  # noqa: E402

HF = fixture_script("real_hf_train.py")
LIGHTNING = fixture_script("real_lit_train.py")
TORCH2 = fixture_script("real_torch_train.py", 4097, 6)

# Debian's torch 1.13: model and optimizer states in the zip format and the legacy one.
TORCH113 = r"""
import os, sys, torch
out = sys.argv[1]
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                          torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10))
opts = {"sgd": torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
        "adam": torch.optim.Adam(net.parameters(), lr=1e-3, amsgrad=True)}
for name, opt in opts.items():
    for _ in range(2):
        opt.zero_grad()
        net(torch.randn(4, 3, 8, 8)).sum().backward()
        opt.step()
    state = {"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 2,
             "rng": torch.get_rng_state()}
    torch.save(state, os.path.join(out, f"t113_{name}.pt"))
    torch.save(state, os.path.join(out, f"t113_{name}_legacy.pt"),
               _use_new_zipfile_serialization=False)
half = {k: v.half() if v.is_floating_point() else v for k, v in net.state_dict().items()}
torch.save(half, os.path.join(out, "t113_half.pt"))
w = torch.randn(16, 16)
torch.save({"w": w, "wt": w.t(), "row": w[3], "cols": w[:, 2:5]}, os.path.join(out, "t113_views.pt"))
"""


def transformers_models(folder):
    """Tiny models of five families, each saved as safetensors and as pytorch_model.bin."""
    import transformers as tf
    made = []
    configs = {
        "gpt2": tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=200, n_positions=32),
        "bert": tf.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                              intermediate_size=64, vocab_size=200),
        "t5": tf.T5Config(num_layers=2, d_model=32, d_ff=64, num_heads=2, d_kv=16, vocab_size=200),
        "llama": tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                num_attention_heads=2, num_key_value_heads=1, vocab_size=200),
        "mistral": tf.MistralConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                    num_attention_heads=2, num_key_value_heads=1, vocab_size=200),
    }
    for name, cfg in configs.items():
        torch.manual_seed(0)
        model = tf.AutoModel.from_config(cfg) if name == "bert" else (
            tf.AutoModelForSeq2SeqLM.from_config(cfg) if name == "t5"
            else tf.AutoModelForCausalLM.from_config(cfg))
        for safe in (True, False):
            d = os.path.join(folder, f"{name}-{'safetensors' if safe else 'bin'}")
            model.save_pretrained(d, safe_serialization=safe)
            made.append(d)
    return made


def safetensors_files(folder):
    """Every dtype safetensors stores, empty and 0-d tensors, metadata; and a shared-storage save."""
    from safetensors.torch import save_file, save_model
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    dtypes = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
              torch.int16, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn,
              torch.float8_e5m2]
    every = {str(d).split(".")[1]: (torch.randn(5, 3) * 10).to(d) for d in dtypes}
    save_file(every, os.path.join(folder, "dtypes.safetensors"))
    save_file({"empty": torch.zeros(0, 4), "scalar": torch.tensor(3.5), "v": torch.arange(7)},
              os.path.join(folder, "shapes.safetensors"), metadata={"format": "pt", "step": "9"})
    lin = torch.nn.Linear(8, 8)
    tied = torch.nn.ModuleDict({"a": lin, "b": torch.nn.Linear(8, 8)})
    tied.b.weight = lin.weight
    save_model(tied, os.path.join(folder, "tied.safetensors"))
    return [os.path.join(folder, n) for n in ("dtypes.safetensors", "shapes.safetensors",
                                              "tied.safetensors")]


def accelerate_state(folder):
    """accelerate's save_state: model.safetensors, optimizer.bin, scheduler.bin, random states."""
    from accelerate import Accelerator
    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    model, opt, sched = acc.prepare(model, opt, sched)
    acc.backward(model(torch.randn(2, 16)).sum())
    opt.step()
    sched.step()
    acc.save_state(folder)
    return folder


def dcp_steps(root):
    """torch.distributed.checkpoint from one process, a model and an optimizer as
    get_state_dict gives them, at three steps: step_1 .. step_3."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
    opt = torch.optim.Adam(model.parameters())
    made = []
    for step in (1, 2, 3):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        msd, osd = get_state_dict(model, opt)
        d = os.path.join(root, f"step_{step}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
            dcp.save({"model": msd, "optim": osd, "step": step}, checkpoint_id=d)
        made.append(d)
    return made


class IntactCheckpointsTest(TempDirTest):
    def collect(self):
        """checkpoints (paths) and run folders with the newest checkpoint each should name."""
        cache = self.path("fx")
        ckpts, runs = [], {}
        hf = fixture("hf-trainer", HF, into=os.path.join(cache, "hf"))
        ckpts += [os.path.join(hf, "run", n) for n in ("checkpoint-6", "checkpoint-9")]
        ckpts += [os.path.join(hf, n) for n in ("sharded", "bin")]
        runs[os.path.join(hf, "run")] = "checkpoint-9"
        lt = fixture("lightning", LIGHTNING, into=os.path.join(cache, "lt"))
        for sub in ("ckpts", "best"):
            ckpts += sorted(os.path.join(lt, sub, n) for n in os.listdir(os.path.join(lt, sub)))
        ckpts.append(os.path.join(lt, "final.pt"))
        runs[os.path.join(lt, "ckpts")] = "epoch=3-step=16.ckpt"
        t2 = fixture("torch2-train", TORCH2, into=os.path.join(cache, "t2"))
        ckpts += sorted(os.path.join(t2, n) for n in os.listdir(t2) if n.endswith(".pt"))
        for name, stage, dtype, align in (("s1_fp32", 1, "fp32", 0), ("s1_bf16", 1, "bf16", 0),
                                          ("s2_fp32", 2, "fp32", 0), ("s2_bf16", 2, "bf16", 0),
                                          ("s2_bf16_align", 2, "bf16", 1),
                                          ("s3_fp32", 3, "fp32", 0), ("s3_bf16", 3, "bf16", 0)):
            root = fixture(f"ds-{name}", real_ds_train.script(), "train", stage, dtype, align,
                           into=os.path.join(cache, f"ds-{name}"))
            ckpts.append(os.path.join(root, "ckpt"))
            runs[os.path.join(root, "ckpt")] = "global_step3"
        for name, mode, world in (("plain_2", "plain", 2), ("plain_4", "plain", 4),
                                  ("fsdp2_2", "fsdp2", 2), ("fsdp2_4", "fsdp2", 4)):
            root = fixture(f"dcp-{name}", real_dcp_save.script(), mode, world,
                           into=os.path.join(cache, f"dcp-{name}"))
            ckpts.append(os.path.join(root, "ckpt"))
        t113 = self.path("t113")
        os.makedirs(t113)
        subprocess.run(["/usr/bin/python3", "-c", TORCH113, t113], check=True)
        ckpts += sorted(os.path.join(t113, n) for n in os.listdir(t113))
        ckpts += transformers_models(self.path("transformers"))
        ckpts += safetensors_files(self.path("safetensors"))
        ckpts.append(accelerate_state(self.path("accelerate")))
        ckpts += dcp_steps(self.path("dcp-run"))
        runs[self.path("dcp-run")] = "step_3"
        return ckpts, runs

    def test_no_false_alarm_on_intact_checkpoints(self):
        ckpts, runs = self.collect()
        self.assertGreaterEqual(len(ckpts), 50)
        for ck in ckpts:
            with self.subTest(checkpoint=os.path.relpath(ck, self.tmp)):
                r = run("verify", ck, expect=None)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertNotIn("problem", r.stderr)
                r = run("verify", "--structure", ck, expect=None)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                run("manifest", ck)
                r = run("verify", ck, expect=None)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn("matches", r.stdout)
        for root, newest in runs.items():
            with self.subTest(run=os.path.relpath(root, self.tmp)):
                for mode in ([], ["--structure"]):
                    r = run("latest", *mode, root, expect=None)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertEqual(r.stdout.strip(), os.path.join(root, newest))
                    self.assertEqual(r.stderr, "")
        print(f"\n{len(ckpts)} intact checkpoints: no alarm; {len(runs)} runs: latest names the newest")


if __name__ == "__main__":
    unittest.main()
