"""`ckptool inspect --json` against what real torch reports for the same files."""
import argparse
import collections
import os
import shutil

import numpy as np
import torch

from ckpt_testlib import CkptTestCase, inspect, run


class TaggedTensor(torch.Tensor):
    """A tensor subclass with Python state, as some libraries save."""


def zoo():
    torch.manual_seed(0)
    flat = torch.randn(1000)
    base = torch.randn(6, 8)
    tied = torch.randn(5, 3)
    annotated = torch.randn(3).as_subclass(TaggedTensor)  # pickles via _rebuild_from_type_v2
    annotated.note = "subclass state"
    return {
        "annotated": annotated,
        "model": {
            "flat_view": flat[100:110],
            "matrix_view": flat[200:224].view(4, 6),
            "transposed": base.t(),
            "strided": base[::2, 1::3],
            "expanded": torch.randn(3, 1).expand(3, 4),
            "overlap_a": flat[500:520],
            "overlap_b": flat[510:530],
            "embed": tied,
            "scalar": torch.tensor(3.5),
            "empty": torch.empty(0),
            "empty2d": torch.empty(2, 0, 3),
        },
        "lm_head": tied,  # the same tensor object under a second name
        "params": [torch.nn.Parameter(torch.randn(2, 2)),
                   torch.nn.Parameter(torch.randn(3), requires_grad=False)],
        "tuple": (torch.arange(4), (torch.ones(2, dtype=torch.int8),)),
        "ordered": collections.OrderedDict([("a", torch.zeros(2)), (3, torch.ones(1))]),
        "args": argparse.Namespace(lr=0.1, name="run", weight=torch.full((2,), 7.0)),
        "numpy": np.arange(6, dtype=np.float32).reshape(2, 3),
        "tags": {"x", "y"},
        "huge": 2**100,
        "neg": -(2**80),
        "text": "hello",
    }


class InspectMatchesTorch(CkptTestCase):
    def check(self, name, obj, **save_kwargs):
        p = self.path(name)
        torch.save(obj, p, **save_kwargs)
        report = inspect(p)
        loaded = torch.load(p)
        self.assertReportMatchesTorch(report, loaded)
        return report

    def test_zoo_zip(self):
        r = self.check("zoo.pt", zoo())
        self.assertEqual(r["format"], "torch-zip")
        self.assertEqual(r["pickle_protocol"], 2)
        # The slice drags its 1000-element storage along: mostly waste.
        self.assertGreater(r["wasted_bytes"], 3000)
        globals_ = set(r["globals"])
        self.assertIn("argparse.Namespace", globals_)
        self.assertIn("torch._utils._rebuild_tensor_v2", globals_)
        self.assertIn("torch._tensor._rebuild_from_type_v2", globals_)
        self.assertEqual(r["unsafe_globals"], [])
        self.assertIn("argparse.Namespace", r["weights_only_refused_globals"])
        names = [t["name"] for t in r["tensors"]]
        kinds = {t["name"]: t["kind"] for t in r["tensors"]}
        self.assertEqual(kinds["annotated"], "subclass:test_inspect.TaggedTensor")
        self.assertIn("lm_head", names)
        self.assertIn("model.embed", names)

    def test_protocols_and_legacy_agree(self):
        reports = {
            "p2": self.check("p2.pt", zoo()),
            "p4": self.check("p4.pt", zoo(), pickle_protocol=4),
            "p5": self.check("p5.pt", zoo(), pickle_protocol=5),
            "legacy": self.check("legacy.pt", zoo(), _use_new_zipfile_serialization=False),
        }
        self.assertEqual(reports["p4"]["pickle_protocol"], 4)
        self.assertEqual(reports["legacy"]["format"], "torch-legacy")
        base = reports["p2"]
        for name, r in reports.items():
            with self.subTest(variant=name):
                self.assertEqual(r["storage_bytes"], base["storage_bytes"])
                self.assertEqual(r["used_bytes"], base["used_bytes"])
                self.assertEqual(len(r["tensors"]), len(base["tensors"]))

    def test_adamw_state_after_a_step(self):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(5, 8)).sum().backward()
        opt.step()
        ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 1}
        r = self.check("trainer.ckpt", ckpt)
        keys = {k["key"]: k for k in r["by_key"]}
        self.assertEqual(set(keys), {"model", "optimizer"})
        # Adam keeps two moments per parameter (plus a step counter): about 2x the weights.
        self.assertGreater(keys["optimizer"]["storage_bytes"], 2 * keys["model"]["storage_bytes"] - 1)
        names = {t["name"] for t in r["tensors"]}
        self.assertIn("optimizer.state.0.exp_avg_sq", names)
        self.assertIn("model.0.weight", names)

    def test_flat_state_dict_rolls_up_by_first_component_as_its_safetensors_twin(self):
        torch.manual_seed(3)
        sd = {"encoder.0.weight": torch.randn(4, 4), "encoder.0.bias": torch.randn(4),
              "decoder.0.weight": torch.randn(2, 4), "scale": torch.randn(1)}
        r = self.check("flat.pt", sd)
        rows = {k["key"]: (k["tensors"], k["tensor_bytes"]) for k in r["by_key"]}
        self.assertEqual(rows, {"encoder": (2, 80), "decoder": (1, 32), "scale": (1, 4)})
        st = self.path("flat.safetensors")
        run("export", self.path("flat.pt"), "--to", st)
        twin = {k["key"]: (k["tensors"], k["tensor_bytes"]) for k in inspect(st)["by_key"]}
        self.assertEqual(twin, rows)

    def test_every_dtype(self):
        torch.manual_seed(2)
        x = torch.randn(4, 3)
        obj = {dtype_name: x.to(getattr(torch, dtype_name)) for dtype_name in
               ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                "uint8", "bool", "complex64", "complex128"]}
        obj["qint8"] = torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)
        obj["quint8"] = torch.quantize_per_tensor(x, 0.1, 10, torch.quint8)
        obj["qint32"] = torch.quantize_per_tensor(x, 0.1, 0, torch.qint32)
        obj["per_channel"] = torch.quantize_per_channel(
            x, torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0, 1, 2, 3]), 0, torch.qint8)
        r = self.check("dtypes.bin", obj)
        by_name = {t["name"]: t for t in r["tensors"]}
        self.assertEqual(by_name["qint8"]["kind"], "qtensor")
        self.assertEqual(by_name["bfloat16"]["dtype"], "bfloat16")
        # Per-channel scales and zero points are tensors too (inside the quantizer params).
        self.assertTrue(any(n.startswith("per_channel") for n in by_name))

    def test_sparse_tensor_components(self):
        i = torch.tensor([[0, 1, 1], [2, 0, 2]])
        v = torch.tensor([3.0, 4.0, 5.0])
        sp = torch.sparse_coo_tensor(i, v, (2, 3))
        p = self.path("sparse.pt")
        torch.save({"sp": sp}, p)
        r = inspect(p)
        rows = {t["name"]: t for t in r["tensors"]}
        loaded = torch.load(p)["sp"]
        self.assertEqual(rows["sp.indices"]["shape"], list(loaded._indices().shape))
        self.assertEqual(rows["sp.values"]["shape"], list(loaded._values().shape))
        self.assertEqual(rows["sp.values"]["kind"], "sparse.values")

    def test_folder_finds_checkpoints_by_content(self):
        folder = self.path("run")
        os.makedirs(os.path.join(folder, "sub"))
        torch.save({"a": torch.ones(2)}, os.path.join(folder, "model.weights"))  # odd name
        torch.save({"b": torch.ones(3)}, os.path.join(folder, "sub", "pytorch_model.bin"))
        with open(os.path.join(folder, "config.json"), "w") as f:
            f.write('{"hidden": 4}')
        with open(os.path.join(folder, "notes.pt"), "w") as f:
            f.write("not a checkpoint despite the name")
        import json
        doc = json.loads(run("inspect", "--json", folder).stdout)
        found = sorted(os.path.relpath(f["path"], folder) for f in doc["files"])
        self.assertEqual(found, ["model.weights", os.path.join("sub", "pytorch_model.bin")])

    def test_safetensors_file(self):
        shutil.copy(os.path.join(os.environ.get("CKPT_FIXTURES_DIR", ""), "small.safetensors"),
                    self.path("m.safetensors"))
        r = inspect(self.path("m.safetensors"))
        self.assertEqual(r["format"], "safetensors")
        rows = {t["name"]: t for t in r["tensors"]}
        self.assertEqual(rows["a.weight"]["shape"], [2, 2])
        self.assertEqual(rows["a.weight"]["stride"], [2, 1])
        self.assertEqual(rows["a.bias"]["dtype"], "bfloat16")
        self.assertEqual(r["metadata"], {"format": "pt"})
        self.assertEqual(sum(b["bytes"] for b in r["byte_map"]), r["file_bytes"])

    def test_human_report_mentions_waste_and_top_tensors(self):
        p = self.path("zoo.pt")
        torch.save(zoo(), p)
        out = run("inspect", "-n", "3", p).stdout
        self.assertIn("FILE BYTES", out)
        self.assertIn("tensor data (unused)", out)
        self.assertIn("LARGEST TENSORS (top 3 of", out)
        self.assertIn("argparse.Namespace", out)


if __name__ == "__main__":
    import unittest
    unittest.main()
