"""Issue 14 groundwork: the DeepSpeed ZeRO fixtures of zero_fixtures.py are laid out as
DeepSpeedEngine.save_checkpoint lays them out (file names, keys, padding, views, storage
locations, enum pickles), and the re-implemented zero_to_fp32 consolidation gives back the
generated model bit for bit, for stages 1, 2, 3 and 1, 2, 3, 5, 11 data-parallel ranks.

No ckptool binary is needed. With DEEPSPEED_ZERO_TO_FP32=<path to DeepSpeed's
deepspeed/utils/zero_to_fp32.py> the real script is run on the same folders too."""
import glob
import os
import pickletools
import re
import shutil
import tempfile
import unittest
import zipfile
from collections import OrderedDict

import torch

import zero_fixtures as zf
from deepspeed.runtime.zero.config import ZeroStageEnum  # py311_stacks, put on sys.path by zero_fixtures

WORLD_SIZES = (1, 2, 3, 5, 11)
# Options varied across the matrix so each combination also covers one variant.
OPTIONS = {
    1: {},
    2: dict(dtype=torch.float16, python311_enum=False),
    3: dict(sub_group_size=40),
    5: dict(views_with_padding=False, device="cpu"),
    11: {},
}
RANK_RE = re.compile(r"zero_pp_rank_(\d+)_mp_rank_(\d+)_")


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def data_pkl(path):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return z.read(name)


def opcodes(pkl):
    return [(op.name, arg) for op, arg, _ in pickletools.genops(pkl)]


def storage_locations(path):
    """The location string of every storage in the file (torch.load hands it to map_location)."""
    seen = []

    def record(storage, location):
        seen.append(location)
        return storage

    torch.load(path, map_location=record, weights_only=False)
    return seen


def storage_size(t):
    return t.untyped_storage().nbytes() // t.element_size() if hasattr(t, "untyped_storage") else t.storage().size()


class ZeroFixtureTestCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="zero_fixtures_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def root(self, name):
        path = os.path.join(self.tmp, name)
        self.assertFalse(os.path.exists(path))
        return path


class TestMatrix(ZeroFixtureTestCase):
    """Every stage x world size: consolidation, file names, keys, padding, order."""

    def test_stages_and_world_sizes(self):
        for stage in (1, 2, 3):
            for ws in WORLD_SIZES:
                opts = OPTIONS[ws]
                with self.subTest(stage=stage, world_size=ws, **{k: str(v) for k, v in opts.items()}):
                    root = self.root(f"s{stage}_w{ws}")
                    fx = zf.make_zero_checkpoint(root, stage, ws, **opts)
                    self.check_consolidation(fx)
                    self.check_layout(fx, opts)

    def check_consolidation(self, fx):
        got = zf.reference_consolidate(fx.root)
        zf.assert_state_dicts_bitwise_equal(got, fx.expected, f"stage {fx.stage} ws {fx.world_size}")
        # the expected dict is the generated model as zero_to_fp32 presents it
        trainable = [n for names in fx.param_groups for n in names]
        frozen = fx.frozen if fx.stage >= 2 else []
        self.assertEqual(list(got), fx.buffers + frozen + trainable + list(fx.aliases))
        for n in trainable:
            self.assertEqual(got[n].dtype, torch.float32)
            self.assertTrue(zf.bitwise_equal(got[n], fx.model[n]), n)
        for n in frozen:  # left in the 16-bit training dtype
            self.assertTrue(zf.bitwise_equal(got[n], fx.model[n].to(fx.dtype)), n)
        for n in fx.frozen:
            if fx.stage == 1:
                self.assertNotIn(n, got)  # stage 1 saves no frozen_param_shapes
        for n in fx.buffers:  # floating buffers come back float32, integer ones as they are
            want = fx.model[n].float() if fx.model[n].is_floating_point() else fx.model[n]
            self.assertEqual(got[n].dtype, want.dtype, n)
            self.assertTrue(zf.bitwise_equal(got[n], want), n)
        for alias, owner in fx.aliases.items():
            self.assertIs(got[alias], got[owner])
        self.assertIn("layers.0.attn.scale", got)
        self.assertEqual(got["layers.0.attn.scale"].shape, torch.Size([]))

    def check_layout(self, fx, opts):
        stage, ws, dtype = fx.stage, fx.world_size, fx.dtype
        prefix = "bf16_" if dtype == torch.bfloat16 else ""
        # --- names
        self.assertEqual(sorted(os.listdir(fx.root)), sorted(["latest", "zero_to_fp32.py", fx.tag]))
        with open(os.path.join(fx.root, "latest")) as f:
            self.assertEqual(f.read(), fx.tag)
        optim = [f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(ws)]
        if stage == 3:
            models = [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(ws)]
        else:
            models = ["mp_rank_00_model_states.pt"]
        self.assertEqual(sorted(os.listdir(fx.folder)), sorted(models + optim))
        self.assertEqual(fx.model_files, models)  # digit-aware: rank 10 after rank 9
        self.assertEqual(fx.optim_files, optim)
        # --- model states
        group_names = [list(g) for g in fx.param_groups]
        for r, name in enumerate(models):
            sd = load(os.path.join(fx.folder, name))
            self.assertEqual(list(sd), list(zf.MODEL_STATE_KEYS))
            self.assertIsInstance(sd["module"], OrderedDict)
            self.assertEqual(list(sd["module"]), list(fx.model))
            self.assertEqual(sd["buffer_names"], fx.buffers)
            self.assertIsNone(sd["optimizer"])
            self.assertIsInstance(sd["param_shapes"], list)
            self.assertEqual([list(d) for d in sd["param_shapes"]], group_names)
            for d in sd["param_shapes"]:
                self.assertIsInstance(d, OrderedDict)
                for n, shape in d.items():
                    self.assertIs(type(shape), torch.Size)
                    self.assertEqual(shape, fx.model[n].shape)
            if stage == 1:
                self.assertIsNone(sd["frozen_param_shapes"])
                self.assertIsNone(sd["frozen_param_fragments"])
            else:
                self.assertEqual(list(sd["frozen_param_shapes"]), fx.frozen)
                self.assertEqual(list(sd["frozen_param_fragments"]), fx.frozen)
                for n in fx.frozen:
                    frag = sd["frozen_param_fragments"][n]
                    self.assertEqual(frag.dtype, dtype)
                    if stage == 2:
                        self.assertEqual(frag.shape, fx.model[n].shape)
                    else:
                        self.assertEqual(frag.shape, (-(-fx.model[n].numel() // ws),))
            self.assertEqual(sd["shared_params"], fx.aliases if r == 0 else {})
            self.assertEqual(sd["dp_world_size"], ws)
            self.assertEqual(sd["mp_world_size"], 1)
            self.assertEqual(sd["checkpoint_parallel_dimensions"], {"pp_degree": 1, "tp_degree": 1})
            self.assertEqual(sd["ds_config"]["zero_optimization"]["stage"], stage)
            self.assertEqual(sd["ds_version"], zf.DEEPSPEED_VERSION)
            self.assertEqual(sd["global_steps"], 14)
            for n, t in sd["module"].items():
                if n in fx.buffers:
                    self.assertTrue(zf.bitwise_equal(t, fx.model[n]), n)
                elif stage == 3:
                    self.assertEqual((t.dtype, t.numel()), (dtype, 0), n)  # free_param placeholder
                else:
                    self.assertTrue(zf.bitwise_equal(t, fx.model[n].to(dtype)), n)
        # --- optimizer states
        for r, name in enumerate(optim):
            self.assertEqual([int(x) for x in RANK_RE.search(name).groups()], [r, 0])
            sd = load(os.path.join(fx.folder, name))
            self.assertEqual(list(sd), list(zf.OPTIM_FILE_KEYS))
            osd = sd["optimizer_state_dict"]
            self.assertIs(type(osd["zero_stage"]), ZeroStageEnum)
            self.assertEqual(int(osd["zero_stage"]), stage)
            self.assertEqual(osd["dynamic_loss_scale"], dtype == torch.float16)
            self.assertIs(osd["overflow"], False)
            scaler = osd["loss_scaler"]
            self.assertEqual(type(scaler).__module__, "deepspeed.runtime.fp16.loss_scaler")
            self.assertEqual(type(scaler).__name__, "DynamicLossScaler" if dtype == torch.float16 else "LossScaler")
            if stage == 3:
                self.assertEqual(list(osd), list(zf.ZERO3_OPTIM_KEYS))
                self.assertEqual(osd["partition_count"], ws)
                inner = osd["optimizer_state_dict"]
                self.assertEqual(set(inner), {"state", "param_groups"})
                flats = osd["fp32_flat_groups"]
                self.assertEqual(len(flats), len(fx.param_groups))
                for i, names in enumerate(fx.param_groups):
                    want = sum(-(-fx.model[n].numel() // ws) for n in names)  # ceil(numel / ws) per param
                    self.assertEqual(flats[i].numel(), want)
                    self.assertEqual(flats[i].dtype, torch.float32)
                    self.assertEqual(set(inner["state"][i]), {"step", "exp_avg", "exp_avg_sq"})
                    self.assertEqual(inner["state"][i]["exp_avg"].numel(), want)
                self.assertEqual(sorted(i for g in inner["param_groups"] for i in g["params"]),
                                 list(range(len(flats))))
            else:
                self.assertEqual(list(osd), list(zf.ZERO12_OPTIM_KEYS))
                self.assertEqual(osd["partition_count"], [ws] * len(fx.param_groups))
                self.assertEqual(osd["clip_grad"], 1.0)
                base = osd["base_optimizer_state"]
                self.assertEqual(set(base), {"state", "param_groups"})
                for g, names in enumerate(fx.param_groups):
                    numel = sum(fx.model[n].numel() for n in names)
                    padded = -(-numel // (2 * ws)) * (2 * ws)
                    ps = padded // ws
                    lean = osd["single_partition_of_fp32_groups"][g]
                    real = max(0, min(ps, numel - r * ps))
                    self.assertEqual(lean.numel(), real)
                    self.assertEqual(osd["group_paddings"][g], ps - real)
                    # the saved piece is a view whose storage still holds the rank's padding
                    want_storage = ps if opts.get("views_with_padding", True) else real
                    self.assertEqual(storage_size(lean), want_storage)
                    self.assertEqual(set(base["state"][g]), {"step", "exp_avg", "exp_avg_sq"})
                    self.assertEqual(base["state"][g]["exp_avg"].numel(), ps)  # elastic_checkpoint off: padded
                    self.assertEqual(base["param_groups"][g]["params"], [g])
                    maps = osd["param_slice_mappings"][g]
                    self.assertEqual(sum(a.numel for a in maps.values()), real)
                    offsets, off = {}, 0
                    for n in names:
                        offsets[n] = off
                        off += fx.model[n].numel()
                    for n, a in maps.items():  # start is relative to this rank's partition
                        self.assertEqual(type(a).__module__, "deepspeed.utils.tensor_fragment")
                        lo = r * ps + a.start - offsets[n]
                        self.assertTrue(zf.bitwise_equal(lean[a.start:a.start + a.numel],
                                                         fx.model[n].reshape(-1)[lo:lo + a.numel]), n)


class TestRankOrder(ZeroFixtureTestCase):
    def test_natural_keys(self):
        names = [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(12)]
        shuffled = sorted(names)  # lexicographic: 0, 1, 10, 11, 2, ...
        self.assertNotEqual(shuffled, names)
        self.assertEqual(sorted(shuffled, key=zf.natural_keys), names)
        self.assertEqual(sorted([f"bf16_{n}" for n in shuffled], key=zf.natural_keys), [f"bf16_{n}" for n in names])

    def test_lexicographic_order_gives_a_wrong_model(self):
        for stage in (2, 3):
            with self.subTest(stage=stage):
                fx = zf.make_zero_checkpoint(self.root(f"order{stage}"), stage, 11)
                files = sorted(os.listdir(fx.folder))
                self.assertNotEqual([f for f in files if f.endswith("_optim_states.pt")], fx.optim_files)
                wrong = zf.reference_consolidate(fx.root, sort_key=None)
                differ = [n for n in fx.expected if not zf.bitwise_equal(wrong[n], fx.expected[n])]
                self.assertTrue(differ)
                right = zf.reference_consolidate(fx.root)
                zf.assert_state_dicts_bitwise_equal(right, fx.expected)


class TestBytes(ZeroFixtureTestCase):
    def test_storage_locations(self):
        fx = zf.make_zero_checkpoint(self.root("loc3"), 3, 11)
        for r in (0, 9, 10):
            locs = set(storage_locations(os.path.join(fx.folder, fx.model_files[r])))
            self.assertEqual(locs, {f"cuda:{r % 8}", "cpu"})  # frozen fragments: ds_tensor.cpu()
            self.assertEqual(set(storage_locations(os.path.join(fx.folder, fx.optim_files[r]))), {f"cuda:{r % 8}"})
        with self.assertRaises(RuntimeError):  # as a GPU node's file: no CUDA here
            torch.load(os.path.join(fx.folder, fx.optim_files[0]), weights_only=False)
        fx = zf.make_zero_checkpoint(self.root("loc2"), 2, 2)
        self.assertEqual(set(storage_locations(os.path.join(fx.folder, fx.model_files[0]))), {"cuda:0", "cpu"})
        fx = zf.make_zero_checkpoint(self.root("loc_cpu"), 2, 2, device="cpu", offload=True)
        for f in fx.model_files + fx.optim_files:
            self.assertEqual(set(storage_locations(os.path.join(fx.folder, f))), {"cpu"})
        fx = zf.make_zero_checkpoint(self.root("offload"), 2, 2, offload=True)
        self.assertEqual(set(storage_locations(os.path.join(fx.folder, fx.optim_files[1]))), {"cpu"})

    def test_enum_pickles(self):
        fx = zf.make_zero_checkpoint(self.root("enum311"), 2, 2)
        ops = opcodes(data_pkl(os.path.join(fx.folder, fx.optim_files[0])))
        i = ops.index(("GLOBAL", "deepspeed.runtime.zero.config ZeroStageEnum"))
        self.assertIn(("GLOBAL", "__builtin__ getattr"), ops[:i])
        self.assertEqual(next(a for n, a in ops[i:] if n == "BINUNICODE"), "gradients")
        fx = zf.make_zero_checkpoint(self.root("enum310"), 3, 2, python311_enum=False)
        ops = opcodes(data_pkl(os.path.join(fx.folder, fx.optim_files[0])))
        self.assertNotIn(("GLOBAL", "__builtin__ getattr"), ops)
        i = ops.index(("GLOBAL", "deepspeed.runtime.zero.config ZeroStageEnum"))
        names = [n for n, _ in ops[i + 1:i + 6]]
        self.assertIn(("BININT1", 3), ops[i + 1:i + 4])
        self.assertIn("REDUCE", names)
        self.assertIs(load(os.path.join(fx.folder, fx.optim_files[0]))["optimizer_state_dict"]["zero_stage"],
                      ZeroStageEnum.weights)

    def test_stage12_module_params_share_the_flat_buffer(self):
        fx = zf.make_zero_checkpoint(self.root("flat"), 1, 5)
        module = load(os.path.join(fx.folder, fx.model_files[0]))["module"]
        for names in fx.param_groups:
            numel = sum(fx.model[n].numel() for n in names)
            padded = -(-numel // 10) * 10
            ptrs = {module[n].data_ptr() - module[n].storage_offset() * module[n].element_size() for n in names}
            self.assertEqual(len(ptrs), 1)  # one storage per group: bit16_groups_flat[i]
            self.assertEqual(storage_size(module[names[0]]), padded)
        self.assertEqual(module["lm_head.weight"].data_ptr(), module["embed.weight"].data_ptr())
        self.assertEqual(module._metadata[""], {"version": 1})

    def test_padding_contents(self):
        fx = zf.make_zero_checkpoint(self.root("pad3"), 3, 5)
        last = load(os.path.join(fx.folder, fx.optim_files[-1]))["optimizer_state_dict"]["fp32_flat_groups"]
        self.assertTrue(torch.isnan(torch.cat(last)).any())  # uninitialized memory in DeepSpeed: NaN here
        fx = zf.make_zero_checkpoint(self.root("pad2"), 2, 5)
        lean = load(os.path.join(fx.folder, fx.optim_files[-1]))["optimizer_state_dict"][
            "single_partition_of_fp32_groups"][0]
        whole = torch.empty(0).set_(lean.storage(), 0, (storage_size(lean),))
        self.assertEqual(whole[lean.numel():].abs().sum().item(), 0.0)  # align_dense_tensors zeros

    def test_fp32_stage3_groups_are_views_of_one_buffer(self):
        fx = zf.make_zero_checkpoint(self.root("fp32"), 3, 3, dtype=torch.float32, sub_group_size=40)
        self.assertTrue(fx.optim_files[0].startswith("zero_pp_rank_0_"))
        flats = load(os.path.join(fx.folder, fx.optim_files[1]))["optimizer_state_dict"]["fp32_flat_groups"]
        self.assertGreater(len(flats), 3)
        total = sum(f.numel() for f in flats)
        self.assertEqual({storage_size(f) for f in flats}, {total})
        zf.assert_state_dicts_bitwise_equal(zf.reference_consolidate(fx.root), fx.expected)

    def test_stage3_sub_groups(self):
        # stage3.py::_create_fp16_sub_groups closes a sub-group once its partition numel reaches
        # sub_group_size (>=). Group 0 per-rank numels with 3 ranks: 32, 64, 43, 43.
        fx = zf.make_zero_checkpoint(self.root("sub32"), 3, 3, sub_group_size=32)
        self.assertEqual(fx.param_groups[:3], [["embed.weight"], ["layers.0.attn.qkv.weight"],
                                               ["layers.0.mlp.fc1.weight"]])
        fx = zf.make_zero_checkpoint(self.root("sub100"), 3, 3, sub_group_size=100)
        self.assertEqual(fx.param_groups[0], ["embed.weight", "layers.0.attn.qkv.weight", "layers.0.mlp.fc1.weight"])
        zf.assert_state_dicts_bitwise_equal(zf.reference_consolidate(fx.root), fx.expected)
        fx = zf.make_zero_checkpoint(self.root("sub_default"), 3, 3)
        self.assertEqual(len(fx.param_groups), 3)  # default 1e9: one sub-group per param group

    def test_cast_buffers_and_exclude_frozen(self):
        fx = zf.make_zero_checkpoint(self.root("castbuf"), 2, 3, cast_buffers=True)
        got = zf.reference_consolidate(fx.root, exclude_frozen_parameters=True)
        self.assertNotIn("pos_embed.weight", got)
        inv = "layers.0.attn.rotary.inv_freq"
        self.assertTrue(zf.bitwise_equal(got[inv], fx.model[inv].to(torch.bfloat16).float()))
        self.assertFalse(zf.bitwise_equal(got[inv], fx.model[inv]))

    def test_custom_groups(self):
        groups = [[("a.weight", (7, 3)), ("a.bias", (7,))], [("b.scale", ()), ("b.weight", (2, 2, 2))]]
        for stage in (1, 2, 3):
            with self.subTest(stage=stage):
                fx = zf.make_zero_checkpoint(self.root(f"custom{stage}"), stage, 3, groups=groups)
                self.assertEqual(fx.aliases, {"tied.weight": "a.weight"})
                zf.assert_state_dicts_bitwise_equal(zf.reference_consolidate(fx.root), fx.expected)


class TestErrors(ZeroFixtureTestCase):
    def test_folder_errors(self):
        fx = zf.make_zero_checkpoint(self.root("errs"), 2, 3)
        os.remove(os.path.join(fx.root, "latest"))
        with self.assertRaises(ValueError) as cm:
            zf.reference_consolidate(fx.root)
        self.assertEqual(str(cm.exception), f"Unable to find 'latest' file at {os.path.join(fx.root, 'latest')}")
        with self.assertRaises(FileNotFoundError) as cm:
            zf.reference_consolidate(fx.root, "global_step15")
        self.assertEqual(str(cm.exception), f"Directory '{os.path.join(fx.root, 'global_step15')}' doesn't exist")
        os.remove(os.path.join(fx.folder, fx.optim_files[1]))
        with self.assertRaises(ValueError) as cm:
            zf.reference_consolidate(fx.root, fx.tag)
        self.assertEqual(str(cm.exception),
                         f"Expected 3 of '*_optim_states.pt' under '{fx.folder}' but found 2 files. Possibly due to an "
                         "overwrite of an old checkpoint, or a checkpoint didn't get saved by one or more processes.")

    def test_refused_checkpoints(self):
        cases = [
            ("bf16_optimizer", lambda r: zf.make_bf16_optimizer_checkpoint(r, 3)),
            ("tp_stage2", lambda r: zf.make_tensor_parallel_checkpoint(r, 2, 3)),
            ("tp_stage3", lambda r: zf.make_tensor_parallel_checkpoint(r, 3, 2)),
            ("moe", lambda r: zf.make_moe_checkpoint(r, 2, 3)),
            ("universal_stage2", lambda r: zf.make_universal_checkpoint(r, 2, 3)),
            ("universal_stage3", lambda r: zf.make_universal_checkpoint(r, 3, 2)),
            ("autoep_zero3", lambda r: zf.make_autoep_zero3_checkpoint(r, 2)),
        ]
        for name, make in cases:
            with self.subTest(name):
                rf = make(self.root(name))
                with self.assertRaises(rf.error_type) as cm:
                    zf.reference_consolidate(rf.root, rf.tag)
                self.assertIs(type(cm.exception), rf.error_type)
                self.assertEqual(str(cm.exception), rf.error_message)
                getattr(self, f"check_{name.split('_stage')[0]}")(rf)

    def check_bf16_optimizer(self, rf):
        self.assertEqual(rf.files, [f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(3)] +
                         ["mp_rank_00_model_states.pt"])
        osd = load(os.path.join(rf.folder, rf.files[2]))["optimizer_state_dict"]
        self.assertEqual(list(osd), list(zf.BF16_OPTIMIZER_KEYS))
        self.assertNotIn("zero_stage", osd)
        model = load(os.path.join(rf.folder, rf.files[-1]))
        self.assertEqual(model["ds_config"]["data_types"], {"grad_accum_dtype": "fp32"})

    def check_tp(self, rf):
        self.assertIn("mp_rank_01", " ".join(rf.files))
        mp = sorted({RANK_RE.search(f).group(2) for f in rf.files if RANK_RE.search(f)})
        self.assertEqual(mp, ["00", "01"])
        model = load(os.path.join(rf.folder, next(f for f in rf.files if f.endswith("01_model_states.pt"))))
        self.assertEqual(model["mp_world_size"], 2)
        self.assertEqual(model["checkpoint_parallel_dimensions"]["tp_degree"], 2)

    def check_moe(self, rf):
        self.assertEqual([f for f in rf.files if f.startswith("layer_")],
                         [f"layer_0_expert_{e}_mp_rank_00_model_states.pt" for e in range(3)])
        expert = load(os.path.join(rf.folder, "layer_0_expert_1_mp_rank_00_model_states.pt"))
        self.assertEqual(list(expert), ["layers.0.moe.deepspeed_moe.experts.deepspeed_experts.1.weight"])
        main = load(os.path.join(rf.folder, "mp_rank_00_model_states.pt"))
        self.assertEqual(main["num_experts"], [3])
        self.assertIn("layers.0.moe.deepspeed_moe.gate.wg.weight", main["module"])
        self.assertIs(type(main["param_shapes"][0]["embed.weight"]), tuple)  # clone_tensors_for_torch_save
        osd = load(os.path.join(rf.folder, "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt"))["optimizer_state_dict"]
        self.assertEqual(osd["partition_count"], [3, 3, 3, 1])

    def check_universal(self, rf):
        with open(os.path.join(rf.root, "latest_universal")) as f:
            self.assertEqual(f.read(), rf.tag)
        self.assertNotIn("optim_states", " ".join(rf.files))
        self.assertIn("zero", rf.files)
        fp32 = load(os.path.join(rf.folder, "zero", "embed.weight", "fp32.pt"))
        if "mp_rank_00_model_states.pt" in rf.files:
            self.assertEqual(set(fp32), {"cat_dim", "param"})
            self.assertEqual(fp32["param"].shape, (12, 8))
        else:
            self.assertEqual(fp32.shape, (96,))

    def check_autoep_zero3(self, rf):
        sd = load(os.path.join(rf.folder, "zero_pp_rank_1_mp_rank_00_model_states.pt"))
        self.assertEqual(sd["ds_autoep_layers"][0]["checkpoint_format"], "zero3_partitioned")


def real_zero_to_fp32():
    """DeepSpeed's own deepspeed/utils/zero_to_fp32.py: $DEEPSPEED_ZERO_TO_FP32, else the one
    scripts/setup installs into .venv (requirements.txt pins DeepSpeed)."""
    if os.environ.get("DEEPSPEED_ZERO_TO_FP32"):
        return os.environ["DEEPSPEED_ZERO_TO_FP32"]
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".venv")
    found = glob.glob(os.path.join(root, "lib", "python3*", "site-packages", "deepspeed", "utils",
                                   "zero_to_fp32.py"))
    return found[0] if found else None


class TestRealScript(ZeroFixtureTestCase):
    def test_same_result_as_deepspeed(self):
        """The imitation fixtures, consolidated by DeepSpeed's real script (under this torch,
        with shims for what it imports), equal what the fixtures expect."""
        script = real_zero_to_fp32()
        self.assertTrue(script and os.path.exists(script),
                        "DeepSpeed's zero_to_fp32.py not found: run scripts/setup (it makes .venv)")
        for stage in (1, 2, 3):
            for ws in (2, 11):
                with self.subTest(stage=stage, world_size=ws):
                    fx = zf.make_zero_checkpoint(self.root(f"real{stage}_{ws}"), stage, ws, **OPTIONS[ws])
                    res = zf.run_real_zero_to_fp32(script, fx.root)
                    self.assertEqual(res[0], "ok", res)
                    zf.assert_state_dicts_bitwise_equal(res[1], fx.expected)
        rf = zf.make_moe_checkpoint(self.root("real_moe"), 2, 2)
        self.assertEqual(zf.run_real_zero_to_fp32(script, rf.root, rf.tag),
                         ("error", rf.error_type.__name__, rf.error_message))


if __name__ == "__main__":
    unittest.main()
