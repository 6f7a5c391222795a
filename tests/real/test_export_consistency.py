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
        exports, torch_files = {}, {}
        for name, src in sources.items():
            out = self.path("out", name)
            run("export", src, "--to", out, "--dtype", "bf16")
            exports[name] = read_export(out)
            # the same engine writes a torch file from every container
            torch_files[name] = self.path("out", name + ".pt")
            run("export", src, "--to", torch_files[name], "--dtype", "bf16")
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
                # the torch file holds the same tensors, each alias the same tensor as its owner
                loaded = torch.load(torch_files[name], weights_only=True)
                self.assertEqual(sorted(loaded), sorted(list(want) + list(want_aliases)))
                for k, t in want.items():
                    self.assertEqual(loaded[k].dtype, t.dtype, k)
                    self.assertTrue(torch.equal(as_bytes(loaded[k]), as_bytes(t)), k)
                for alias, owner in want_aliases.items():
                    self.assertEqual(loaded[alias].data_ptr(), loaded[owner].data_ptr(), alias)
        self.assertEqual(ref_tensors["half_buffer"].dtype, torch.bfloat16)
        self.assertEqual(ref_aliases, {"head.weight": "emb.weight"})
        self.assertIn("emb.weight", ref_tensors)
        self.assertEqual(ref_tensors["emb.weight"].dtype, torch.bfloat16)

    def test_the_model_is_chosen_by_one_rule_whatever_holds_it(self):
        """A training checkpoint {model, optimizer, step}: torch.save'd and dcp.save'd (flat
        fqns), each as a .ckz too. Export without options writes the model (under 'model') from
        every one; --all everything; --select picks a sub-tree; the tied head is an alias in
        the torch file's export and bytes of its own in DCP's (which stores it twice)."""
        lin = torch.nn.Linear(4, 3)
        emb = torch.nn.Embedding(5, 3)
        model = {"emb.weight": emb.weight.detach(), "head.weight": emb.weight.detach(),
                 "lin.weight": lin.weight.detach(), "lin.bias": lin.bias.detach()}
        opt = torch.optim.AdamW(list(lin.parameters()) + list(emb.parameters()))
        (lin(torch.ones(2, 4)).sum() + emb(torch.tensor([1])).sum()).backward()
        opt.step()
        ckpt = {"model": model, "optimizer": opt.state_dict(), "step": 7}
        sources = {"torch": self.path("train.pt"), "dcp": self.path("train_dcp")}
        torch.save(ckpt, sources["torch"])
        import torch.distributed.checkpoint as dcp
        dcp.save({"model": dict(model), "optimizer": {
            "state": {str(k): v for k, v in opt.state_dict()["state"].items()}}},
            checkpoint_id=sources["dcp"])
        for name in list(sources):
            run("compress", "-q", sources[name])
            sources[name + ".ckz"] = sources[name] + ".ckz"
        for name, src in sources.items():
            kind = name.split(".")[0]
            with self.subTest(source=name):
                out = self.path("sel", name)
                rep = json.loads(run("export", "--json", src, "--to", out).stdout)
                self.assertEqual(rep["selected"], "model")
                tensors, aliases = read_export(out)
                want = sorted(model) if kind == "dcp" else sorted(k for k in model if k != "head.weight")
                self.assertEqual(sorted(tensors), want)
                self.assertEqual(aliases, {} if kind == "dcp" else {"head.weight": "emb.weight"})
                for k in tensors:
                    self.assertTrue(torch.equal(tensors[k], model[k]), k)
                out = self.path("sub", name)
                rep = json.loads(run("export", "--json", src, "--to", out, "--select", "model.lin").stdout)
                self.assertEqual(rep["selected"], "model.lin")
                self.assertEqual(sorted(read_export(out)[0]), ["bias", "weight"])
                out = self.path("all", name)
                run("export", src, "--to", out, "--all")
                names = read_export(out)[0]
                self.assertIn("model.lin.weight", names)
                self.assertTrue(any(n.startswith("optimizer.state.") and n.endswith(".exp_avg")
                                    for n in names), sorted(names))


if __name__ == "__main__":
    unittest.main()
