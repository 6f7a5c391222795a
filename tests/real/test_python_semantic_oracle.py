"""The semantic oracle (fuzz/semantic_oracle.py): ckptool's safety verdict (ckptool._core.
judge_pickle) against what Python's unpickler really does when torch.load(weights_only=False)
reads a pickle the verdict calls SAFE.

  - real files written by torch 2.13 load through the oracle as torch.load loads them (its
    proxies are transparent), with no failure;
  - the oracle itself catches each attack technique when told to load it regardless of the
    findings, with a fixed set of accepted names (so a verdict that missed one would be
    caught);
  - every file of fuzz/corpus/semantic/ (seeds and the regressions the fuzzer found) replays
    without a failure: the verdict flags it, or loading it runs nothing the file chose;
  - a short deterministic fuzz run exercises the mutator.

The package under test is the one the build just made (CKPT_PYTHON_PACKAGE: BUILD/python)."""
import io
import os
import subprocess
import sys
import tempfile
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from stacklib import PACKAGE, ROOT  # noqa: E402

sys.path.insert(0, PACKAGE)
FUZZ = os.path.join(ROOT, "fuzz")
sys.path.insert(0, FUZZ)
CORPUS = os.path.join(FUZZ, "corpus", "semantic")

import numpy  # noqa: E402
import torch  # noqa: E402

import make_semantic_seeds  # noqa: E402
import semantic_oracle as oracle  # noqa: E402

# What the oracle reports for each hand-made technique when it loads the pickle whatever the
# verdict's findings (None: loading it runs nothing the file chose).
EXPECTED = {
    "plant_setstate": "planted", "plant_setstate_laundered": "planted",
    "plant_extend": "planted", "plant_append": "planted", "plant_add": "planted",
    "plant_extend_ordereddict": "planted", "plant_keys_ordereddict": "planted",
    "plant_keys_dict": "planted", "plant_keys_accepted": "planted",
    "launder_max_called": "call-global", "launder_map_sorted": "call-global",
    "launder_filter_list": "call-global", "launder_rebuild_from_type": "call-global",
    "launder_randomstate_ctor": "call-global", "launder_defaultdict_factory": None,
    "direct_map_print": "call-global", "getattr_enum_read": None,
    "getattr_read_mapped": "call-global", "getattr_read_write_text": "call-global",
    # A module only stored runs nothing (it is imported, as any global is); reading from it is
    # a failure (getattr's, here).
    "getattr_read_module": "getattr", "module_global": None, "module_global_torch": None,
    "module_dotted_stack_global": "module", "module_dotted_class": "module",
    "reconstruct_userdict_setitem": "reconstruct", "reconstruct_plain": None,
    "reconstruct_inst_noargs": None, "class_switch_slotstate": "class-switch",
    "class_switch_parameter_state": "class-switch", "parameter_state_planted_keys": "planted",
    "rebuild_from_type_subclass": None, "patch_class_slotstate": "mutate-global",
    "patch_registry": "mutate-global", "patch_registry_max": "mutate-global",
    "direct_print": "call-global", "direct_getattr_call": "call-global",
    "newobj_starmap": "reconstruct", "stop_storage_nul_module": "unlisted",
    "stop_build_on_storagetype": "planted", "stop_setitem_persistent_id": "unlisted",
    "stop_build_noop_on_tuple": "unlisted", "stop_build_on_function": "mutate-global",
}


# The names the oracle's own test takes as accepted (any other is only referenced), so that
# what it expects does not move with the verdict.
ACCEPT = {
    "argparse.Namespace", "types.SimpleNamespace", "collections.OrderedDict",
    "collections.Counter", "collections.defaultdict", "builtins.max", "builtins.min",
    "builtins.sorted", "builtins.list", "builtins.dict", "builtins.set", "builtins.map",
    "builtins.filter", "builtins.object", "copyreg.__newobj__", "copyreg._reconstructor",
    "torch._tensor._rebuild_from_type_v2", "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_parameter_with_state", "torch.Tensor", "torch.FloatStorage",
    "numpy.random._pickle.__randomstate_ctor", "pathlib.Path", "uuid.SafeUUID",
}


def same(a, b, path="root"):
    """Asserts that the oracle's load and torch.load's are the same value."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.layout == b.layout, path
        assert a.requires_grad == b.requires_grad, path
        if a.is_quantized:
            a, b = a.dequantize(), b.dequantize()
        if a.is_sparse:
            a, b = a.to_dense(), b.to_dense()
        assert torch.equal(a, b), f"{path}: tensor values differ"
    elif isinstance(a, numpy.ndarray):
        assert a.dtype == b.dtype and numpy.array_equal(a, b), path
    elif isinstance(a, numpy.random.RandomState):
        same(a.get_state(legacy=False), b.get_state(legacy=False), path)
    elif isinstance(a, numpy.random.Generator):
        same(a.bit_generator.state, b.bit_generator.state, path)
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
        if hasattr(a, "default_factory"):
            assert a.default_factory is b.default_factory, path
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


class SemanticOracleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        oracle._init()

    def test_real_files_load_as_torch_loads_them(self):
        refused = []
        for name, obj in make_semantic_seeds.real_seeds():
            with self.subTest(name):
                buf = io.BytesIO()
                torch.save(obj, buf)
                buf.seek(0)
                expected = torch.load(buf, weights_only=False)
                with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
                    prefix = z.namelist()[0].split("/")[0] + "/"
                    records = {n[len(prefix):]: z.read(n) for n in z.namelist()}
                pkl = records.pop("data.pkl")
                # As the verdict has it: a file it calls SAFE loads with no failure.
                out = oracle.check(pkl, records=records)
                if out.safe:
                    self.assertEqual(out.violations, [])
                    self.assertIsNone(out.error)
                    same(out.result, expected)
                else:
                    refused.append(name)
                # Every name accepted: the oracle's machinery is transparent.
                out = oracle.check(pkl, records=records, accept_all=True)
                self.assertEqual(out.violations, [])
                self.assertIsNone(out.error)
                same(out.result, expected)
        if refused:
            print(f"\nreal files the verdict refuses: {', '.join(refused)}", file=sys.stderr)

    def test_oracle_catches_each_technique(self):
        seeds = make_semantic_seeds.hostile_seeds()
        self.assertEqual(sorted(EXPECTED), sorted(n[len("hostile_"):] for n in seeds))
        for name, data in seeds.items():
            with self.subTest(name):
                out = oracle.check(data, accept=ACCEPT)
                got = out.violations[0].category if out.violations else None
                self.assertEqual(got, EXPECTED[name[len("hostile_"):]],
                                 f"{out.violations or out.error}")

    def test_corpus_replays_without_failure(self):
        failures = []
        names = sorted(os.listdir(CORPUS))
        self.assertGreater(len(names), 20)
        for name in names:
            with open(os.path.join(CORPUS, name), "rb") as f:
                out = oracle.check(f.read())
            if out.violations:
                failures.append(f"{name}: {out.violations[0]}")
        self.assertEqual(failures, [], "\n".join(failures))

    def test_short_fuzz_run(self):
        with tempfile.TemporaryDirectory(prefix="ckpt-semantic-") as tmp:
            env = dict(os.environ, PYTHONPATH=PACKAGE)
            p = subprocess.run(
                [sys.executable, os.path.join(FUZZ, "semantic_oracle.py"), tmp, CORPUS,
                 "-runs=20000", "-seed=1", "-max_len=4096", "-timeout=30", "-rss_limit_mb=6144",
                 f"-artifact_prefix={tmp}/"],
                capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr[-6000:])


if __name__ == "__main__":
    unittest.main()
