"""Shared helpers for the real-stack tests (run under .venv/bin/python: torch 2.13 and the real
libraries). Fixtures are written at test time by the library under test; results are loaded back
by that same library."""
import json
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CKPTOOL = os.environ.get("CKPTOOL") or os.path.join(ROOT, "build", "ckptool")
SANITIZED = os.environ.get("CKPT_SANITIZED", "0") in ("1", "ON", "TRUE", "true")
# The Python package the build made (BUILD/python, with ckptool._core); the package's tests
# put it first on sys.path.
PACKAGE = os.environ.get("CKPT_PYTHON_PACKAGE") or os.path.join(ROOT, "build", "python")


def run(*args, expect=0, env=None, timeout=600):
    """Runs ckptool; asserts the exit code when `expect` is not None."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.run([CKPTOOL, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=full_env)
    if expect is not None and p.returncode != expect:
        raise AssertionError(
            f"ckptool {' '.join(map(str, args))} exited {p.returncode}, expected {expect}\n"
            f"stdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}")
    return p


def run_json(*args, expect=0):
    return json.loads(run(*args, "--json", expect=expect).stdout)


def python(script, *args, cwd=None, env=None, timeout=900):
    """Runs a Python snippet in a fresh interpreter of this venv (torch state, process groups
    and RNG start clean); returns its stdout. Raises with the output on failure."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONWARNINGS", "ignore")
    p = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                       text=True, cwd=cwd, env=full_env, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"python snippet failed ({p.returncode})\nstdout:\n{p.stdout[-4000:]}"
                             f"\nstderr:\n{p.stderr[-6000:]}")
    return p.stdout


class TempDirTest(unittest.TestCase):
    """A test case with self.tmp, a fresh folder removed afterwards."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ckpt-real-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)


def assert_same_tensors(case, a, b, msg=""):
    """Two name -> tensor dicts hold the same names, dtypes, shapes and bytes."""
    import torch
    case.assertEqual(sorted(a), sorted(b), msg)
    for k in a:
        x, y = a[k], b[k]
        case.assertEqual(x.dtype, y.dtype, f"{msg} {k}")
        case.assertEqual(tuple(x.shape), tuple(y.shape), f"{msg} {k}")
        case.assertTrue(torch.equal(as_bytes(x), as_bytes(y)), f"{msg} {k}: bytes differ")


def as_bytes(t):
    """A tensor's values as raw bytes (NaN payloads and -0.0 compared exactly)."""
    import torch
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


CACHE = os.environ.get("CKPT_FIXTURE_CACHE") or os.path.join(ROOT, ".cache", "real-fixtures")


def module_script(path, *also):
    """The `python -c` text that runs the module at `path` as a fixture script: it imports the
    module (torch.multiprocessing pickles the worker by reference) and runs its main(argv). The
    SHA-256 of the module (and of the modules `also` names, which it imports) is in the text, so
    fixture()'s cache follows edits of them."""
    h = hashlib.sha256()
    for f in (path, *also):
        with open(os.path.abspath(f), "rb") as fh:
            h.update(fh.read())
    name = os.path.splitext(os.path.basename(path))[0]
    here = os.path.dirname(os.path.abspath(path))
    return (f"# {name}.py {h.hexdigest()}\n"
            f"import sys\nsys.path.insert(0, {here!r})\n"
            f"import {name}\n{name}.main(sys.argv[1:])\n")


def free_port():
    """A TCP port free on this machine now (a process group's rendezvous)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(worker, nprocs, make_args):
    """torch.multiprocessing.spawn(worker, args=make_args(port), nprocs=nprocs) on a free port,
    started again (up to 3 times) when another process took the port first or a rank was killed
    by a signal (gloo's threads aborting, pytorch issue 190489). Any other failure is raised."""
    import torch.multiprocessing as mp
    last = None
    for _ in range(3):
        try:
            mp.spawn(worker, args=make_args(free_port()), nprocs=nprocs)
            return
        except Exception as e:  # noqa: BLE001
            text = str(e).lower()
            if "address already in use" not in text and "signal" not in text:
                raise
            last = e
    raise last


def fixture(name, script, *args, into):
    """Copies into `into` (a folder, created) what `script` writes when run as
    `python -c script OUT *args` with OUT an empty folder. The script runs once per distinct
    (script, args, requirements.txt): the result is kept under .cache/real-fixtures/ so that
    the normal and the sanitizer runs of the suite train each model once. Tests only ever see
    a fresh copy, so nothing they do reaches the cache. Returns `into`."""
    import fcntl
    import hashlib
    h = hashlib.sha256()
    for part in (script, *map(str, args)):
        h.update(part.encode() + b"\0")
    with open(os.path.join(ROOT, "requirements.txt"), "rb") as f:
        h.update(f.read())
    done = os.path.join(CACHE, f"{name}-{h.hexdigest()[:16]}")
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(done):
            work = done + ".partial"
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            python(script, work, *args, cwd=work)
            os.rename(work, done)
    shutil.copytree(done, into, symlinks=True, dirs_exist_ok=True)
    return into
