"""Helpers shared by the real-library tests (test_torch2, test_safetensors_lib, test_hf_trainer,
test_lightning) on top of stacklib: naming tensors the way `ckptool inspect` does, comparing
whole loaded objects exactly, exact float comparison of losses, trees of files, policies."""
import hashlib
import json
import os
import struct

from stacklib import run, run_json  # noqa: F401 (re-exported for the test modules)


def read_source(name):
    """The text of a module beside this one: fixture scripts embed the training code they share
    with the tests, so the fixture cache key (the script text) changes whenever that code does."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)) as f:
        return f.read()


def fixture_script(name, *args):
    """The text of tests/real/<name> run as a fixture script: its make_fixture(OUT, *args)."""
    call = ", ".join(["sys.argv[1]", *map(repr, args)])
    return read_source(name) + f"\nimport sys\nmake_fixture({call})\n"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree(root):
    """relative path -> sha256 (files), 'link:<target>' (symlinks), 'dir' (folders), with the mode
    bits of files, for comparing folders exactly."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
            elif os.path.isdir(p):
                out[rel] = "dir"
            else:
                out[rel] = (sha256(p), oct(os.stat(p).st_mode & 0o7777))
    return out


def float_bits(values):
    """Floats as the hex of their IEEE-754 double bits: equal lists mean bit-identical values
    (a float32 loss turned into a Python float is exact)."""
    return [struct.pack("<d", float(v)).hex() for v in values]


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def walk_tensors(obj, path="", out=None, seen=None):
    """name -> tensor for every tensor reachable from obj, named as ckptool names key paths (dict
    keys as text, list/tuple indices in decimal, object attributes by name, joined with '.')."""
    import torch
    if out is None:
        out, seen = {}, set()

    def join(part):
        return f"{path}.{part}" if path else str(part)

    if isinstance(obj, torch.Tensor):
        out[path] = obj
        return out
    if id(obj) in seen:
        return out
    seen.add(id(obj))
    if isinstance(obj, dict):
        for k, v in obj.items():
            walk_tensors(v, join(k if isinstance(k, str) else str(k)), out, seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            walk_tensors(v, join(i), out, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for k, v in vars(obj).items():
            walk_tensors(v, join(k), out, seen)
    seen.discard(id(obj))
    return out


def raw(t):
    """A tensor's bytes as stored (bitwise: NaN payloads, -0.0 and sub-byte dtypes exact)."""
    import torch
    t = t.detach()
    if t.is_nested:
        return b"".join(raw(x) for x in t.unbind())
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same_object(case, a, b, path="<root>", strides=True):
    """a and b (both loaded by torch) are equal: same structure and values; tensors bitwise with
    the same type, dtype, shape, requires_grad (and stride unless strides=False)."""
    import numpy as np
    import torch
    case.assertEqual(type(a), type(b), path)
    if isinstance(a, torch.Tensor):
        case.assertEqual(a.dtype, b.dtype, path)
        case.assertEqual(a.is_nested, b.is_nested, path)
        if a.is_nested:
            case.assertEqual([tuple(x.shape) for x in a.unbind()], [tuple(x.shape) for x in b.unbind()], path)
        else:
            case.assertEqual(tuple(a.shape), tuple(b.shape), path)
            if strides:
                case.assertEqual(a.stride(), b.stride(), path)
        case.assertEqual(a.requires_grad, b.requires_grad, path)
        case.assertEqual(raw(a), raw(b), f"{path}: bytes differ")
    elif isinstance(a, dict):
        case.assertEqual(list(a.keys()), list(b.keys()), path)
        for k in a:
            assert_same_object(case, a[k], b[k], f"{path}.{k}", strides)
    elif isinstance(a, (list, tuple)):
        case.assertEqual(len(a), len(b), path)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_object(case, x, y, f"{path}.{i}", strides)
    elif isinstance(a, np.ndarray):
        case.assertEqual(a.dtype, b.dtype, path)
        case.assertTrue(np.array_equal(a, b), path)
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        assert_same_object(case, vars(a), vars(b), path, strides)
    else:
        case.assertEqual(a, b, path)


def storage_ptr(t):
    return t.untyped_storage().data_ptr()


def reach(t):
    """[begin, end) bytes of its storage that tensor t can reach."""
    es = t.element_size()
    if t.numel() == 0:
        return (0, 0)
    span = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    begin = t.storage_offset() * es
    return (begin, begin + (span + 1) * es)


def assert_same_sharing(case, a, b, msg=""):
    """Aliasing survives: tensors of a whose bytes overlap (views of one another, tied weights)
    share a storage in b at the same byte distance; tensors that did not share a storage in a do
    not share one in b. (Views of one storage that never overlap may be split apart: that is what
    shrink does with the gap between them.)"""
    ta, tb = walk_tensors(a), walk_tensors(b)
    case.assertEqual(sorted(ta), sorted(tb), msg)
    names = [n for n in sorted(ta) if ta[n].numel() > 0 and not ta[n].is_nested]
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            sa = storage_ptr(ta[x]) == storage_ptr(ta[y])
            sb = storage_ptr(tb[x]) == storage_ptr(tb[y])
            (bx, ex), (by, ey) = reach(ta[x]), reach(ta[y])
            overlap = sa and bx < ey and by < ex
            if overlap:
                case.assertTrue(sb, f"{msg} {x} and {y} overlapped in one storage; now apart")
            if not sa:
                case.assertFalse(sb, f"{msg} {x} and {y} did not share a storage; now they do")
            if sa and sb:  # in elements of x's dtype (convert halves distances in bytes)
                case.assertEqual((reach(ta[x])[0] - reach(ta[y])[0]) / ta[x].element_size(),
                                 (reach(tb[x])[0] - reach(tb[y])[0]) / tb[x].element_size(),
                                 f"{msg} {x} vs {y}: distance in the storage changed")


def assert_converted(case, got, src, dtype, name="", every_float=False):
    """got is src converted to dtype as torch rounds it (float32 sources, as convert does; with
    every_float, also float16 and bfloat16 ones, as export --dtype does; others unchanged),
    bit for bit except that a NaN need only stay a NaN (the README keeps its sign and makes it
    quiet; torch's vectorised path writes 0xffff)."""
    import torch
    sources = (torch.float32, torch.float16, torch.bfloat16) if every_float else (torch.float32,)
    want = src.to(dtype) if src.dtype in sources else src
    case.assertEqual(got.dtype, want.dtype, name)
    case.assertEqual(tuple(got.shape), tuple(want.shape), name)
    if src.dtype in (torch.float16, torch.bfloat16) and src.dtype != want.dtype:
        g, w = got.detach().reshape(-1), want.detach().reshape(-1)
        nan = torch.isnan(w.float())
        case.assertTrue(torch.equal(torch.isnan(g.float()), nan), f"{name}: NaNs moved")
        case.assertEqual(raw(g[~nan]), raw(w[~nan]), f"{name}: not torch's rounding")
    elif want.dtype in (torch.bfloat16, torch.float16) and src.dtype == torch.float32:
        g, w = got.detach().reshape(-1), want.detach().reshape(-1)
        nan = torch.isnan(w.float())
        case.assertTrue(torch.equal(torch.isnan(g.float()), nan), f"{name}: NaNs moved")
        case.assertEqual(raw(g[~nan]), raw(w[~nan]), f"{name}: not torch's rounding")
        # sign bits read from the bits (torch's float16 -> float32 drops a NaN's sign)
        case.assertTrue(torch.equal(g[nan].view(torch.int16) < 0, src.detach().reshape(-1)[nan].view(torch.int32) < 0),
                        f"{name}: a NaN changed sign")
    else:
        case.assertEqual(raw(got), raw(want), name)


def numpy_safe_globals():
    """What torch.load(weights_only=True) needs to read numpy RNG states (np.random.get_state()),
    the allowlist torch's own error message tells users to add."""
    import numpy as np
    return [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32)),
            np._core.numeric._frombuffer]  # protocol 5 pickles arrays through _frombuffer


def torch_load(path, mmap=False, numpy=False):
    """torch.load(weights_only=True), with numpy RNG state allowed when numpy=True."""
    import torch
    if numpy:
        with torch.serialization.safe_globals(numpy_safe_globals()):
            return torch.load(path, weights_only=True, mmap=mmap, map_location="cpu")
    return torch.load(path, weights_only=True, mmap=mmap, map_location="cpu")


def inspect_one(path):
    """The one-file report of `ckptool inspect --json path`."""
    doc = run_json("inspect", path)
    if len(doc["files"]) != 1:
        raise AssertionError(f"inspect {path}: {len(doc['files'])} file reports")
    return doc["files"][0]


def assert_report_matches(case, report, obj):
    """inspect --json lists exactly the tensors torch sees in obj, each with torch's name, dtype,
    shape, stride, offset, requires_grad and Parameter-ness; the byte map adds up."""
    import torch
    expected = walk_tensors(obj)
    rows = {}
    for row in report["tensors"]:
        case.assertNotIn(row["name"], rows, f"duplicate row {row['name']}")
        rows[row["name"]] = row
    plain = {n: t for n, t in expected.items() if not t.is_nested}
    for name, t in plain.items():
        case.assertIn(name, rows, f"{report['path']}: no row for {name}")
        row = rows[name]
        case.assertEqual(row["dtype"], dtype_name(t.dtype), name)
        case.assertEqual(row["shape"], list(t.shape), name)
        case.assertEqual(row["stride"], list(t.stride()), name)
        case.assertEqual(row["offset"], t.storage_offset(), name)
        case.assertEqual(row["requires_grad"], t.requires_grad, name)
        case.assertEqual(row["kind"] == "parameter", isinstance(t, torch.nn.Parameter), name)
    case.assertEqual(sum(b["bytes"] for b in report["byte_map"]), report["file_bytes"])
    case.assertEqual(report["file_bytes"], os.path.getsize(report["path"]))
    case.assertEqual(report["problems"], [], report["path"])
    return rows


def write_policy(root, text):
    path = os.path.join(root, "ckptool.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def apply(root, *args, expect=0):
    """`ckptool apply ROOT --json --settle 0`: (events, exit code). Each event is one JSON line."""
    p = run("apply", root, "--json", "--yes", "--settle", "0", *args, expect=expect)
    events = [json.loads(line) for line in p.stdout.splitlines() if line.strip().startswith("{")]
    return events, p


def read_json(path):
    with open(path) as f:
        return json.load(f)


def safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))
