"""The Python peers that bench/run measures beside ckptool, on the same files in the same run.

Run under the project's virtual environment (.venv/bin/python: torch 2.x, DeepSpeed, zipnn, made
by scripts/setup from requirements.txt), not under /usr/bin/python3 (Debian's torch 1.13, which
bench/run uses to make its inputs). Each subcommand times its own work, after its imports (the
interpreter start and `import torch` / `import deepspeed` take seconds and are not what is
compared; the peak RSS bench/run reads from wait4 does include them), and prints one JSON line:
wall, user and sys seconds of that work (getrusage of this process: every thread), plus what it
found. A peer that cannot do the job exits 3 with "TypeName: message" as the last line of
stderr, which bench/run records as that peer's result instead of failing the run.

  zipnn-compress DTYPE SRC DST     ZipNN the way its own file tool (scripts/zipnn_compress_file.py
  zipnn-decompress DTYPE SRC DST   in the zipnn repository) does it: the whole file read, then
                                   ZipNN(is_streaming=True) in 1 MiB chunks with bytearray_dtype
                                   DTYPE (float32, bfloat16, float16: the dtype of the file's
                                   tensors), here with threads=1; the compressed file is the
                                   concatenated chunks, as that tool writes it, plus one byte
                                   (see ZIPNN_PAD below).
  torch-load-mmap PATH             torch.load(PATH, mmap=True, weights_only=True)
  dcp-to-torch-save DIR OUT        torch.distributed.checkpoint.format_utils.dcp_to_torch_save
  zero-to-fp32 DIR OUT             deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint
                                   (DeepSpeed's installed copy), then torch.save of the result
"""
import json
import os
import resource
import sys
import time
import traceback

STREAMING_CHUNK = 1 << 20  # ZipNN's default streaming_chunk, the one its file tool uses

# zipnn 0.5.4 in float32 mode corrupts memory when its input's length is not a multiple of 4
# (seen here: SIGSEGV, or glibc aborting with "malloc(): invalid next size", "double free or
# corruption", from sizes 100001, 300001, 1048579, 3900001 ...; multiples of 4 always restored
# bit for bit; bfloat16 and float16 modes are fine at any length). A torch file's length is
# whatever it is, so the float32 input is padded with zero bytes to a multiple of 4 and the
# compressed file ends with one byte, the pad count (0-3), which decompress drops again: one
# byte more than ZipNN's own output, counted in its size.
ZIPNN_PAD = {"float32": 4}


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        self.r0 = resource.getrusage(resource.RUSAGE_SELF)
        return self

    def __exit__(self, *exc):
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        self.wall = time.perf_counter() - self.t0
        self.user = r1.ru_utime - self.r0.ru_utime
        self.sys = r1.ru_stime - self.r0.ru_stime
        return False

    def result(self, **extra):
        return dict(wall=self.wall, user=self.user, sys=self.sys, cpu=self.user + self.sys, **extra)


def zipnn_instance(dtype):
    import zipnn
    return zipnn.ZipNN(bytearray_dtype=dtype, is_streaming=True, streaming_chunk=STREAMING_CHUNK, threads=1)


def zipnn_compress(dtype, src, dst):
    size = os.path.getsize(src)
    z = zipnn_instance(dtype)
    with Timer() as t:
        with open(src, "rb") as f:
            # A fresh bytearray: ZipNN's compress reorders the bytes of its input in place.
            data = bytearray(f.read())
        pad = -len(data) % ZIPNN_PAD.get(dtype, 1)
        if pad:
            data += bytes(pad)
        out = z.compress(data)
        with open(dst, "wb") as f:
            f.write(out)
            f.write(bytes([pad]))
    return t.result(input_bytes=size, output_bytes=len(out) + 1, padded=pad, zipnn=zipnn_version())


def zipnn_decompress(dtype, src, dst):
    z = zipnn_instance(dtype)
    with Timer() as t:
        with open(src, "rb") as f:
            data = f.read()
        pad = data[-1]
        out = z.decompress(memoryview(data)[:-1])
        with open(dst, "wb") as f:
            f.write(memoryview(out)[:len(out) - pad])
    return t.result(output_bytes=len(out) - pad)


def zipnn_version():
    try:
        from importlib.metadata import version
        return version("zipnn")
    except Exception:  # noqa: BLE001
        return "?"


def torch_load_mmap(path):
    import torch
    with Timer() as t:
        obj = torch.load(path, mmap=True, weights_only=True)
    return t.result(load=t.wall, tensors=len(obj) if isinstance(obj, dict) else None, torch=torch.__version__)


def dcp_to_torch_save(folder, out):
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as convert
    with Timer() as t:
        convert(folder, out)
    return t.result(torch=torch.__version__, tensors=count_tensors(out))


def zero_to_fp32(folder, out):
    import logging
    import torch
    import deepspeed
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    with Timer() as t:
        sd = get_fp32_state_dict_from_zero_checkpoint(folder)
        torch.save(sd, out)
    return t.result(torch=torch.__version__, deepspeed=deepspeed.__version__, tensors=len(sd))


def count_tensors(path):
    """Tensors in a torch file (counted after the timing: a check that the peer wrote them all)."""
    import torch
    obj = torch.load(path, mmap=True, weights_only=True)
    n = 0
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif torch.is_tensor(o):
            n += 1
    return n


COMMANDS = {
    "zipnn-compress": (zipnn_compress, 3),
    "zipnn-decompress": (zipnn_decompress, 3),
    "torch-load-mmap": (torch_load_mmap, 1),
    "dcp-to-torch-save": (dcp_to_torch_save, 2),
    "zero-to-fp32": (zero_to_fp32, 2),
}


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS or len(sys.argv) - 2 != COMMANDS[sys.argv[1]][1]:
        sys.exit(__doc__)
    os.environ.setdefault("TQDM_DISABLE", "1")  # DeepSpeed's progress bars: no terminal to draw on
    fn = COMMANDS[sys.argv[1]][0]
    try:
        res = fn(*sys.argv[2:])
    except Exception as e:  # noqa: BLE001 -- reported, the benchmark goes on
        traceback.print_exc()
        msg = " ".join(str(e).split())
        sys.stderr.write(f"{type(e).__name__}: {msg}\n")
        sys.exit(3)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
