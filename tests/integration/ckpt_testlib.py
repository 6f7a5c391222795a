"""Shared helpers for integration tests: run the ckptool binary, and describe a real torch
object the way `ckptool inspect` names things, so the two can be compared."""
import json
import os
import struct
import subprocess
import tempfile
import unittest

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
CKPTOOL = os.environ.get("CKPTOOL") or os.path.join(HERE, "..", "..", "build", "ckptool")
FIXTURES = os.environ.get("CKPT_FIXTURES_DIR") or os.path.join(HERE, "..", "fixtures")


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_json(path):
    with open(path) as f:
        return json.load(f)


def run(*args, expect=0, cwd=None):
    """Runs ckptool (in `cwd` if given); asserts the exit code when `expect` is not None."""
    p = subprocess.run([CKPTOOL, *map(str, args)], capture_output=True, text=True, timeout=300,
                       cwd=cwd)
    if expect is not None and p.returncode != expect:
        raise AssertionError(
            f"ckptool {' '.join(map(str, args))} exited {p.returncode}, expected {expect}\n"
            f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        )
    return p


def inspect(path, *flags):
    """The single file report of `ckptool inspect --json path` (with `flags`, e.g. --trust M)."""
    doc = json.loads(run("inspect", "--json", path, *flags).stdout)
    assert len(doc["files"]) == 1, doc
    return doc["files"][0]


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def key_text(k):
    return k if isinstance(k, str) else str(k)


def walk_tensors(obj, path="", out=None, seen=None):
    """name -> tensor for every tensor reachable from obj, named like ckptool names them."""
    if out is None:
        out, seen = {}, set()
    join = lambda part: f"{path}.{part}" if path else str(part)
    if isinstance(obj, torch.Tensor):
        out[path] = obj
        if obj.is_quantized and obj.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            # The quantizer's own tensors, which the file stores beside the values.
            out[join("scales")] = obj.q_per_channel_scales()
            out[join("zero_points")] = obj.q_per_channel_zero_points()
        return out
    if id(obj) in seen:
        return out
    seen.add(id(obj))
    if isinstance(obj, dict):
        for k, v in obj.items():
            walk_tensors(v, join(key_text(k)), out, seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            walk_tensors(v, join(i), out, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for k, v in vars(obj).items():
            walk_tensors(v, join(k), out, seen)
    seen.discard(id(obj))
    return out


def storage_of(t):
    return t.storage()


def reach(t):
    """[begin, end) bytes of its storage that tensor t can reach."""
    es = t.element_size()
    if t.numel() == 0:
        return (0, 0)
    span = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    begin = t.storage_offset() * es
    return (begin, begin + (span + 1) * es)


def union_size(ranges):
    total, cur = 0, None
    for b, e in sorted(r for r in ranges if r[1] > r[0]):
        if cur and b <= cur[1]:
            cur[1] = max(cur[1], e)
        else:
            if cur:
                total += cur[1] - cur[0]
            cur = [b, e]
    if cur:
        total += cur[1] - cur[0]
    return total


class CkptTestCase(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)

    def assertReportMatchesTorch(self, report, obj):
        """Every tensor torch sees is in the report with the same metadata, and storages
        group, size and count used bytes the way torch's own objects say."""
        expected = walk_tensors(obj)
        rows = {}
        for row in report["tensors"]:
            self.assertNotIn(row["name"], rows, f"duplicate name {row['name']}")
            rows[row["name"]] = row
        self.assertEqual(sorted(rows), sorted(expected))
        storages = {s["key"]: s for s in report["storages"]}
        key_to_ptr, ranges = {}, {}
        for name, t in expected.items():
            row = rows[name]
            with self.subTest(tensor=name):
                self.assertEqual(row["dtype"], dtype_name(t.dtype))
                self.assertEqual(row["shape"], list(t.shape))
                self.assertEqual(row["stride"], list(t.stride()))
                self.assertEqual(row["offset"], t.storage_offset())
                self.assertEqual(row["requires_grad"], t.requires_grad)
                self.assertEqual(row["kind"] == "parameter", isinstance(t, torch.nn.Parameter))
                st = storage_of(t)
                self.assertEqual(storages[row["storage"]]["bytes"], st.nbytes())
                ptr = st.data_ptr() if st.nbytes() else ("empty", row["storage"])
                self.assertEqual(key_to_ptr.setdefault(row["storage"], ptr), ptr,
                                 "one ckptool storage maps to several torch storages")
                ranges.setdefault(row["storage"], set()).add(reach(t))
        self.assertEqual(len(set(key_to_ptr.values())), len(key_to_ptr),
                         "one torch storage maps to several ckptool storages")
        for key, rs in ranges.items():
            self.assertEqual(storages[key]["used_bytes"], union_size(rs), key)
        self.assertEqual(report["storage_bytes"], sum(s["bytes"] for s in report["storages"]))
        self.assertEqual(report["wasted_bytes"], report["storage_bytes"] - report["used_bytes"])
        self.assertEqual(sum(b["bytes"] for b in report["byte_map"]), report["file_bytes"])
        self.assertEqual(report["file_bytes"], os.path.getsize(report["path"]))


def tensor_bytes(t):
    """A tensor's values as raw bytes (bitwise, NaN-safe)."""
    if t.is_quantized:
        t = t.int_repr()
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same_object(test, a, b, path="<root>"):
    """a and b (loaded by torch) are equal: same structure and values, tensors bitwise
    with the same dtype, shape, stride, requires_grad and Parameter-ness."""
    import numpy as np

    test.assertEqual(type(a), type(b), path)
    if isinstance(a, torch.Tensor):
        test.assertEqual(a.dtype, b.dtype, path)
        test.assertEqual(a.shape, b.shape, path)
        test.assertEqual(a.stride(), b.stride(), path)
        test.assertEqual(a.requires_grad, b.requires_grad, path)
        test.assertEqual(tensor_bytes(a), tensor_bytes(b), path)
    elif isinstance(a, dict):
        test.assertEqual(list(a.keys()), list(b.keys()), path)
        for k in a:
            assert_same_object(test, a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        test.assertEqual(len(a), len(b), path)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_object(test, x, y, f"{path}.{i}")
    elif isinstance(a, np.ndarray):
        test.assertTrue(np.array_equal(a, b), path)
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        assert_same_object(test, vars(a), vars(b), path)
    else:
        test.assertEqual(a, b, path)


def assert_same_aliasing(test, a, b):
    """Tensors that shared a storage still do, at the same distance; others still don't."""
    ta, tb = walk_tensors(a), walk_tensors(b)
    test.assertEqual(sorted(ta), sorted(tb))
    names = [n for n in sorted(ta) if ta[n].numel() > 0]
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            sa = storage_of(ta[x]).data_ptr() == storage_of(ta[y]).data_ptr()
            sb = storage_of(tb[x]).data_ptr() == storage_of(tb[y]).data_ptr()
            test.assertEqual(sa, sb, f"{x} and {y}: shared storage {sa} became {sb}")
            if sa:
                test.assertEqual(ta[x].storage_offset() - ta[y].storage_offset(),
                                 tb[x].storage_offset() - tb[y].storage_offset(), f"{x} vs {y}")
            test.assertEqual(ta[x] is ta[y], tb[x] is tb[y], f"{x} and {y}: tensor identity")


def assert_torch_layout(test, path):
    """The zip has torch's layout: every storage record 64-byte aligned, records data/0,
    data/1, ... contiguous in key order (what torch >= 2.x assumes when it computes
    offsets from .format_version), no compression, CRCs right."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        test.assertIsNone(z.testzip())
        prefix = infos[0].filename.split("/")[0]
        test.assertEqual(infos[0].filename, prefix + "/data.pkl")
        data = sorted((i for i in infos if i.filename.startswith(prefix + "/data/")),
                      key=lambda i: int(i.filename.rsplit("/", 1)[1]))
        test.assertEqual([i.filename.rsplit("/", 1)[1] for i in data], [str(k) for k in range(len(data))])
    with open(path, "rb") as f:
        raw = f.read()
    prev_end = None
    for info in data:
        test.assertEqual(info.compress_type, zipfile.ZIP_STORED)
        name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
        start = info.header_offset + 30 + name_len + extra_len
        test.assertEqual(start % 64, 0, info.filename)
        if prev_end is not None:
            test.assertEqual(info.header_offset, prev_end, f"{info.filename} is not contiguous")
        prev_end = start + info.file_size + 16


def read_safetensors(test, path):
    """Independent reader: json + numpy, checking the format's rules."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    test.assertEqual(n % 8, 0, "header padded to 8 bytes")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    buf = data[8 + n:]
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    pos = 0
    for b, e in spans:
        test.assertEqual(b, pos, "offsets contiguous from 0")
        pos = e
    test.assertEqual(pos, len(buf), "no trailing bytes")
    np_types = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16, "I64": np.int64,
                "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_, "F64": np.float64}
    out = {}
    for name, v in header.items():
        b, e = v["data_offsets"]
        out[name] = (v["dtype"], np.frombuffer(buf[b:e], dtype=np_types[v["dtype"]]).reshape(v["shape"]))
    return meta, out
