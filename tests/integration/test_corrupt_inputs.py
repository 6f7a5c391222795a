"""Broken files through the real command line: every fixture truncated at every byte (a dense
sample for the large example) and with each byte of its headers and directories flipped.

For each broken file, `inspect` either reports it or prints exactly one line,
"ckptool: error: <file>: <what is wrong>", and `verify` lists at least one problem for every
file that inspect could not read and for every truncation. The process never dies of a
signal, never reports an internal error, never leaks (LeakSanitizer in the sanitizer build)
and never makes a huge allocation (address-space limit, or ASan's allocation limit)."""
import io
import json
import os
import resource
import struct
import subprocess
import zipfile

from ckpt_testlib import CKPTOOL, FIXTURES, HERE, CkptTestCase

EXAMPLE = os.path.join(HERE, "..", "..", "examples", "bloated.pt")
SANITIZED = os.environ.get("CKPT_SANITIZED") == "1"  # set by CMake for -DCKPT_SANITIZE=ON builds
MEMORY_LIMIT = 1 << 30  # no broken file may make ckptool allocate anywhere near this
BATCH = 64  # files per ckptool run


def limit_memory():
    if not SANITIZED:  # ASan reserves terabytes of shadow memory up front
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def environment():
    env = dict(os.environ)
    # Any sanitizer report (leak, overflow, allocation beyond the limit) gets its own exit code.
    env["ASAN_OPTIONS"] = (f"exitcode=86:allocator_may_return_null=0:"
                           f"max_allocation_size_mb={MEMORY_LIMIT >> 20}:detect_leaks=1")
    env["UBSAN_OPTIONS"] = "halt_on_error=1:exitcode=87:print_stacktrace=1"
    env["LSAN_OPTIONS"] = "exitcode=88"
    return env


def zip_structure(data, with_pickle):
    """Byte ranges of a zip that are structure rather than tensor data: each local header
    (with its name and extra field), each data descriptor, everything after the last record
    (central directory, end records) and, when asked, the pickle record."""
    ranges, end = [], 0
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for i in z.infolist():
            name_len, extra_len = struct.unpack_from("<HH", data, i.header_offset + 26)
            start = i.header_offset + 30 + name_len + extra_len
            stop = start + i.compress_size
            ranges += [(i.header_offset, start), (stop, stop + 16)]
            if with_pickle and i.filename.endswith("data.pkl"):
                ranges.append((start, stop))
            end = max(end, stop + 16)
    ranges.append((end, len(data)))
    return ranges


def variants(name, data, dense):
    """(label, bytes) for every truncation (or a dense sample) and every header-byte flip."""
    n = len(data)
    cuts = range(n) if not dense else sorted(set(range(0, 512)) | set(range(n - 512, n)) |
                                              set(range(512, n - 512, 4099)))
    for cut in cuts:
        yield f"{name}.cut{cut}", data[:cut], True
    if data[:2] == b"PK":
        flips = sorted({o for b, e in zip_structure(data, with_pickle=not dense) for o in range(b, e)})
    elif name.endswith(".safetensors"):
        flips = range(min(n, 8 + struct.unpack_from("<Q", data)[0]))
    else:  # legacy: the magic, protocol and sys_info pickles, the key list, the size fields
        flips = range(min(n, 512))
    for off in flips:
        yield f"{name}.flip{off}", data[:off] + bytes([data[off] ^ 0xFF]) + data[off + 1:], False


class CorruptInputTest(CkptTestCase):
    def run_batch(self, paths, *args):
        return subprocess.run([CKPTOOL, *args, *paths], capture_output=True, text=True, timeout=600,
                              preexec_fn=limit_memory, env=environment())

    def check_batch(self, batch):
        paths = [p for p, _ in batch]
        r = self.run_batch(paths, "inspect", "--json")
        if r.returncode not in (0, 1):
            # Name the file that did it: rerun them one by one.
            for p in paths:
                one = self.run_batch([p], "inspect", "--json")
                self.assertIn(one.returncode, (0, 1), f"{p}: exit {one.returncode}\n{one.stderr[-3000:]}")
            self.fail(f"batch exit {r.returncode}\n{r.stderr[-3000:]}")
        self.assertNotIn("internal error", r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual([f["path"] for f in doc["files"]], paths)
        errors = [line for line in r.stderr.splitlines()]
        unreadable = [f["path"] for f in doc["files"] if "error" in f]
        # One line per unreadable file, naming it, saying what is wrong; nothing else.
        self.assertEqual(len(errors), len(unreadable), r.stderr)
        for line, p in zip(errors, unreadable):
            self.assertTrue(line.startswith(f"ckptool: error: {p}: "), line)
            self.assertGreater(len(line), len(f"ckptool: error: {p}: ") + 5, line)
            self.assertNotIn("\n", line)
        self.assertEqual(r.returncode, 1 if unreadable else 0)

        v = self.run_batch(paths, "verify", "-q", "-j", "2")
        self.assertIn(v.returncode, (0, 1), f"verify exit {v.returncode}\n{v.stderr[-3000:]}")
        self.assertNotIn("internal error", v.stdout + v.stderr)
        flagged = set()
        for line in v.stdout.splitlines():
            owner = next((p for p in paths if line.startswith(p + ": ")), None)
            self.assertIsNotNone(owner, f"verify line names no file: {line}")
            flagged.add(owner)
        must_flag = set(unreadable) | {p for p, truncated in batch if truncated}
        self.assertEqual(must_flag - flagged, set(), "verify passed a broken file")
        self.assertEqual(v.returncode, 1 if flagged else 0)
        return len(unreadable)

    def torture(self, source, dense=False):
        with open(source, "rb") as f:
            data = f.read()
        name = os.path.basename(source)
        total = rejected = 0
        batch = []
        for label, blob, truncated in variants(name, data, dense):
            p = self.path(label)
            with open(p, "wb") as f:
                f.write(blob)
            batch.append((p, truncated))
            if len(batch) == BATCH:
                rejected += self.check_batch(batch)
                total += len(batch)
                for q, _ in batch:
                    os.remove(q)
                batch = []
        if batch:
            rejected += self.check_batch(batch)
            total += len(batch)
        print(f"\n{name}: {total} broken files, {rejected} refused with a one-line error", end="")
        self.assertGreater(rejected, 0)

    def test_zip_fixture(self):
        self.torture(os.path.join(FIXTURES, "small.pt"))

    def test_legacy_fixture(self):
        self.torture(os.path.join(FIXTURES, "small_legacy.pt"))

    def test_safetensors_fixture(self):
        self.torture(os.path.join(FIXTURES, "small.safetensors"))

    def test_example_checkpoint_dense_sample(self):
        self.torture(EXAMPLE, dense=True)


if __name__ == "__main__":
    import unittest
    unittest.main()
