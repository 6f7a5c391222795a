"""One export engine: the same model exported from a torch file, a Hugging Face model folder, a
torch.distributed.checkpoint folder, a DeepSpeed ZeRO folder and a .ckz archive of each gives
the same tensors (names, dtypes, shapes, bytes), the same --dtype rule (float32, float16 and
bfloat16 tensors become bf16, as DeepSpeed's converter makes them) and the same tied-name records (the first name in the source's order kept, the
others recorded as aliases), whatever holds the model.

The model is the one real DeepSpeed 0.19 trained (real_ds_train.py, ZeRO-2, tied embedding and
head, an int64 buffer); the other containers are written by their own libraries (torch.save,
safetensors, torch.distributed.checkpoint.save) from DeepSpeed's own consolidation."""
import contextlib
import io
import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import torch  # noqa: E402

import real_ds_train  # noqa: E402
from real_common import safetensors_header  # noqa: E402
from stacklib import TempDirTest, as_bytes, fixture, run  # noqa: E402


def read_export(folder):
    """name -> tensor of every safetensors file in `folder`, and the aliases recorded."""
    from safetensors.torch import load_file
    tensors, aliases = {}, {}
    for n in sorted(os.listdir(folder)):
        if not n.endswith(".safetensors"):
            continue
        p = os.path.join(folder, n)
        tensors.update(load_file(p))
        meta = safetensors_header(p).get("__metadata__", {})
        aliases.update({k: v for k, v in meta.items() if k != "format"})
    return tensors, aliases


class ExportConsistency(TempDirTest):
    def test_every_container_exports_the_same_model(self):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        root = fixture("ds-s2_fp32", real_ds_train.script(), "train", 2, "fp32", 0,
                       into=self.path("ds"))
        zero = os.path.join(root, "ckpt")
        with contextlib.redirect_stdout(io.StringIO()):
            sd = get_fp32_state_dict_from_zero_checkpoint(zero)
        sd["half_buffer"] = torch.arange(6, dtype=torch.float16)  # float16: becomes bf16 too
        tied = [k for k in sd if k != "emb.weight" and sd[k] is sd.get("emb.weight")]
        self.assertEqual(tied, ["head.weight"])
        sources = {"zero": zero}
        sources["torch"] = self.path("model.pt")
        torch.save(sd, sources["torch"])
        import torch.distributed.checkpoint as dcp
        sources["dcp"] = self.path("dcp")
        dcp.save(dict(sd), checkpoint_id=sources["dcp"])
        # a Hugging Face model folder as transformers writes one: tied weights stored once
        # (the config says they are tied), safetensors with {"format": "pt"}
        from safetensors.torch import save_file
        sources["hf"] = self.path("hf")
        os.makedirs(sources["hf"])
        save_file({k: v.contiguous() for k, v in sd.items() if k != "head.weight"},
                  os.path.join(sources["hf"], "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(sources["hf"], "config.json"), "w") as f:
            json.dump({"tie_word_embeddings": True}, f)
        for name in list(sources):
            run("compress", "-q", sources[name])
            sources[name + ".ckz"] = sources[name] + ".ckz"
        exports = {}
        for name, src in sources.items():
            out = self.path("out", name)
            run("export", src, "--to", out, "--dtype", "bf16")
            exports[name] = read_export(out)
        ref_tensors, ref_aliases = exports["torch"]
        for name, (tensors, aliases) in exports.items():
            kind = name.split(".")[0]
            want, want_aliases = dict(ref_tensors), dict(ref_aliases)
            if kind == "zero":  # DeepSpeed's own model: no half_buffer
                del want["half_buffer"]
            if kind == "hf":  # the folder holds the tied weight once and records no tie
                want_aliases = {}
            if kind == "dcp":  # DCP writes a tied weight's bytes under each name, no tie
                want["head.weight"] = want["emb.weight"]
                want_aliases = {}
            with self.subTest(source=name):
                self.assertEqual(sorted(tensors), sorted(want))
                for k, t in want.items():
                    self.assertEqual(tensors[k].dtype, t.dtype, k)
                    self.assertEqual(tuple(tensors[k].shape), tuple(t.shape), k)
                    self.assertTrue(torch.equal(as_bytes(tensors[k]), as_bytes(t)), k)
                self.assertEqual(aliases, want_aliases)
        self.assertEqual(ref_tensors["half_buffer"].dtype, torch.bfloat16)
        self.assertEqual(ref_aliases, {"head.weight": "emb.weight"})
        self.assertIn("emb.weight", ref_tensors)
        self.assertEqual(ref_tensors["emb.weight"].dtype, torch.bfloat16)


if __name__ == "__main__":
    unittest.main()
