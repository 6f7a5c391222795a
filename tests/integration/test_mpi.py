"""ckptool under `mpirun --oversubscribe -np 4`: the per-file commands spread a folder of real
torch checkpoints of uneven sizes (and broken files) over four ranks. Every output must be
byte-identical to a single-process run, the report on stdout identical (text and --json),
the errors identical and printed once, the exit code the same on every rank, and no output
written by two ranks (CKPT_TEST_COMMIT_LOG: every process logs what it puts into place).
Sharded export splits its shards over the ranks and writes the index only when all are in
place. Launch detection refuses N uncoordinated copies before touching a file; that part
runs in every build, MPI or not.

The mpirun tests skip when mpirun is missing, when this ckptool has no MPI built in
(`ckptool --version` says), and in the sanitizer build (Open MPI's libraries leak by
LeakSanitizer's count)."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import torch

from ckpt_testlib import CKPTOOL

SANITIZED = os.environ.get("CKPT_SANITIZED", "0") in ("1", "ON", "TRUE", "true")
MPIRUN = shutil.which("mpirun")
VERSION = subprocess.run([CKPTOOL, "--version"], capture_output=True, text=True).stdout
MPI_BUILT = "MPI: Open MPI" in VERSION
NP = 4

# Per rank: run ckptool, then record its exit code under the rank's number.
RANK_WRAPPER = 'rc=0; "$0" "$@" || rc=$?; echo $rc > "$CKPT_RC_DIR/$OMPI_COMM_WORLD_RANK"; exit $rc'

# Files of very uneven sizes (float32 elements of the flat buffer each one's views cut).
SIZES = [400_000, 3_000, 150_000, 200, 60_000, 10, 30_000, 7_000, 90_000]
# Launcher variables a plain test run must not inherit.
LAUNCH_VARS = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_SIZE",
               "PMI_RANK", "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_STEPID",
               "SLURM_STEP_NUM_TASKS", "WORLD_SIZE", "CKPTOOL_ONE_PROCESS")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(extra)
    return env


def make_checkpoints(folder):
    """Real torch.save files: views into larger flat buffers (shrink cuts them), float32
    (convert halves them), optimizer state (strip drops it); then a truncated copy and a
    file that is no checkpoint at all."""
    os.makedirs(folder)
    for i, n in enumerate(SIZES):
        g = torch.Generator().manual_seed(i)
        flat = torch.randn(2 * n + 8, generator=g)
        obj = {
            "model": {"w": flat[n // 2: n // 2 + n], "b": torch.randn(8, generator=g)},
            "optimizer": {"state": {0: {"exp_avg": torch.randn(n // 4 + 1, generator=g)}}},
            "step": i,
        }
        torch.save(obj, os.path.join(folder, f"ckpt_{i:02d}.pt"))
    with open(os.path.join(folder, "ckpt_00.pt"), "rb") as f:
        whole = f.read()
    with open(os.path.join(folder, "cut.pt"), "wb") as f:
        f.write(whole[: len(whole) // 2])
    with open(os.path.join(folder, "notes.pt"), "wb") as f:
        f.write(b"not a checkpoint\n")


def tree_hashes(folder):
    """relative path -> sha256 of every file below folder."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def error_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("ckptool")]


class LaunchDetectionTest(unittest.TestCase):
    """Several copies started by a launcher that cannot coordinate them are refused, with
    exit code 2, before any file is touched. Runs with and without MPI built in."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        make_checkpoints(os.path.join(cls._tmp.name, "src"))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=self._tmp.name)
        shutil.copy(os.path.join(self._tmp.name, "src", "ckpt_00.pt"), self.dir)
        self.before = tree_hashes(self.dir)

    def shrink(self, **env):
        return subprocess.run([CKPTOOL, "shrink", "ckpt_00.pt"], cwd=self.dir,
                              capture_output=True, text=True, env=clean_env(**env), timeout=60)

    def assertRefused(self, p, variable):
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stdout, "")
        self.assertIn(variable, p.stderr)
        self.assertIn("refusing", p.stderr)
        self.assertEqual(tree_hashes(self.dir), self.before)  # nothing written, no temp file

    def test_torchrun_world_size_is_refused(self):
        self.assertRefused(self.shrink(WORLD_SIZE="4"), "WORLD_SIZE=4")

    def test_slurm_step_tasks_are_refused(self):
        self.assertRefused(self.shrink(SLURM_NTASKS="4", SLURM_STEP_ID="0"), "SLURM_NTASKS=4")
        self.assertRefused(self.shrink(SLURM_STEP_NUM_TASKS="3", SLURM_STEP_ID="1"),
                           "SLURM_STEP_NUM_TASKS=3")

    def test_mpirun_variables_without_mpi_built_in_are_refused(self):
        if MPI_BUILT:
            self.skipTest("this ckptool has MPI built in (the mpirun tests cover it)")
        p = self.shrink(OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_RANK="1")
        self.assertRefused(p, "OMPI_COMM_WORLD_SIZE=4")
        self.assertIn("built without MPI", p.stderr)

    def test_mpi_launch_without_the_module_is_refused(self):
        if not MPI_BUILT:
            self.skipTest("this ckptool has no MPI module")
        # A copy of the tool without ckptool-mpi.so beside it: under an MPI launch it must
        # say which file it could not load, and touch nothing.
        bindir = tempfile.mkdtemp(dir=self._tmp.name)
        tool = shutil.copy(CKPTOOL, os.path.join(bindir, "ckptool"))
        p = subprocess.run([tool, "shrink", "ckpt_00.pt"], cwd=self.dir, capture_output=True,
                           text=True, timeout=60,
                           env=clean_env(OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_RANK="1"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stdout, "")
        self.assertIn("cannot load the MPI module", p.stderr)
        self.assertIn("ckptool-mpi.so", p.stderr)
        self.assertEqual(tree_hashes(self.dir), self.before)
        # Outside a launch the same copy runs as one process.
        p = subprocess.run([tool, "shrink", "ckpt_00.pt"], cwd=self.dir, capture_output=True,
                           text=True, timeout=60, env=clean_env())
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("Done.", p.stdout)

    def test_plain_run_does_not_load_open_mpi(self):
        # Open MPI's libraries cost ~6 ms of start-up; only the module links them.
        ldd = shutil.which("ldd")
        if ldd is None:
            self.skipTest("ldd not found")
        needed = subprocess.run([ldd, CKPTOOL], capture_output=True, text=True).stdout
        self.assertIn("libc.so", needed)
        self.assertNotIn("libmpi", needed)
        self.assertNotIn("open-pal", needed)

    def test_batch_script_and_override_run_as_one_process(self):
        # An sbatch script sees SLURM_NTASKS of the whole allocation but is one process.
        p = self.shrink(SLURM_NTASKS="32")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("Done.", p.stdout)
        p = self.shrink(WORLD_SIZE="8", CKPTOOL_ONE_PROCESS="1")
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_version_says_whether_mpi_is_built_in(self):
        self.assertRegex(VERSION, r"MPI: (Open MPI v\d|not built in)")


@unittest.skipUnless(MPIRUN, "mpirun not found (apt-get install openmpi-bin)")
@unittest.skipUnless(MPI_BUILT, "this ckptool was built without MPI (CKPT_MPI=OFF)")
@unittest.skipIf(SANITIZED, "Open MPI's own allocations are reported by LeakSanitizer")
class MpiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.src = os.path.join(cls._tmp.name, "src")
        make_checkpoints(cls.src)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def setUp(self):
        self.work = tempfile.mkdtemp(dir=self._tmp.name)

    def copy(self, name):
        d = os.path.join(self.work, name)
        shutil.copytree(self.src, d)
        return d

    def single(self, cwd, *args):
        logs = tempfile.mkdtemp(dir=self.work)
        p = subprocess.run([CKPTOOL, *args], cwd=cwd, capture_output=True, text=True,
                           env=clean_env(CKPT_TEST_COMMIT_LOG=logs), timeout=120)
        return p, logs

    def mpi(self, cwd, *args, wrapper=RANK_WRAPPER, timeout=120, abort_on_failure="0"):
        """Runs ckptool under mpirun; returns (process, exit code per rank, commit logs)."""
        rcs, logs = tempfile.mkdtemp(dir=self.work), tempfile.mkdtemp(dir=self.work)
        cmd = [MPIRUN, "--oversubscribe", "-np", str(NP), "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        env = clean_env(CKPT_RC_DIR=rcs, CKPT_TEST_COMMIT_LOG=logs,
                        OMPI_MCA_rmaps_base_oversubscribe="1",
                        OMPI_MCA_btl="self,vader", OMPI_MCA_btl_vader_single_copy_mechanism="none",
                        OMPI_MCA_plm="isolated",
                        OMPI_MCA_orte_abort_on_non_zero_status=abort_on_failure)
        p = subprocess.run(cmd + ["sh", "-c", wrapper, CKPTOOL, *args], cwd=cwd,
                           capture_output=True, text=True, env=env, timeout=timeout)
        codes = {}
        for name in os.listdir(rcs):
            with open(os.path.join(rcs, name)) as f:
                codes[int(name)] = int(f.read())
        return p, codes, logs

    def commits(self, logs):
        """pid -> paths that process put into place."""
        out = {}
        for name in os.listdir(logs):
            with open(os.path.join(logs, name)) as f:
                # A folder written whole goes into place by one rename after its files are
                # committed inside a temp folder whose name holds the pid: named alike here.
                out[name] = [re.sub(r"\.[^/]*\.ckptool-tmp-\d+-\d+", "<temp>", os.path.realpath(l))
                             for l in f.read().splitlines()]
        return out

    def assertSameRun(self, single_dir, mpi_dir, args, rc, spread=True):
        """The command in both folders (same relative paths): same outputs, stdout, errors,
        exit code on every rank; each output put into place by one rank only."""
        s, s_logs = self.single(single_dir, *args)
        m, codes, m_logs = self.mpi(mpi_dir, *args)
        self.assertEqual(s.returncode, rc, s.stderr)
        self.assertEqual(codes, {r: rc for r in range(NP)}, m.stderr)
        self.assertEqual(m.stdout, s.stdout)
        self.assertEqual(error_lines(m.stderr), error_lines(s.stderr))
        self.assertEqual(tree_hashes(mpi_dir), tree_hashes(single_dir))
        by_rank = self.commits(m_logs)
        written = [p for paths in by_rank.values() for p in paths]
        self.assertEqual(len(written), len(set(written)), f"written twice: {by_rank}")
        single_written = [p for paths in self.commits(s_logs).values() for p in paths]
        rel = lambda paths, base: sorted(os.path.relpath(p, os.path.realpath(base)) for p in paths)
        self.assertEqual(rel(written, mpi_dir), rel(single_written, single_dir))
        if spread:
            self.assertGreaterEqual(len([p for p in by_rank.values() if p]), 2, by_rank)
        return s, m

    def files(self):
        return sorted(os.listdir(self.src))

    def test_shrink_text_and_json_with_broken_files(self):
        a, b = self.copy("a"), self.copy("b")
        s, _ = self.assertSameRun(a, b, ["shrink", "-d", *self.files()], rc=1)
        self.assertNotIn("Done", s.stdout)  # a failed command prints no success line
        self.assertIn("failed", s.stderr.splitlines()[-1])
        self.assertEqual(len([l for l in s.stderr.splitlines() if "cut.pt" in l]), 1)
        self.assertTrue(any("notes.pt" in l for l in error_lines(s.stderr)))
        a, b = self.copy("a2"), self.copy("b2")
        s, _ = self.assertSameRun(a, b, ["shrink", "--json", *self.files()], rc=1)
        doc = json.loads(s.stdout)
        self.assertEqual(len(doc["files"]), len(SIZES) + 2)

    def test_shrink_folder_to_output_dir(self):
        a, b = self.copy("a"), self.copy("b")
        for d in (a, b):
            for broken in ("cut.pt", "notes.pt"):
                os.remove(os.path.join(d, broken))
        self.assertSameRun(a, b, ["shrink", "-d", "--checkpoint_dir", ".", "--output-dir", "out"],
                           rc=0)
        self.assertEqual(len(os.listdir(os.path.join(b, "out"))), len(SIZES))

    def test_convert_strip_verify(self):
        a, b = self.copy("a"), self.copy("b")
        good = [f for f in self.files() if f.startswith("ckpt_")]
        self.assertSameRun(a, b, ["convert", "--dtype", "bf16", "--output-dir", "bf16",
                                  *self.files()], rc=1)
        self.assertSameRun(a, b, ["convert", "--dtype", "fp16", "--json", "--output-dir", "fp16",
                                  *good], rc=0)
        self.assertSameRun(a, b, ["strip", *self.files()], rc=1)
        self.assertSameRun(a, b, ["strip", "--json", "--dry-run", *good], rc=0, spread=False)
        self.assertSameRun(a, b, ["verify", *self.files()], rc=1, spread=False)
        self.assertSameRun(a, b, ["verify", "-j", "1", "bf16"], rc=0, spread=False)

    def test_compress_and_decompress(self):
        a, b = self.copy("a"), self.copy("b")
        # Any file compresses (broken checkpoints too, when asked: --allow-damaged); then they
        # are gone (--rm).
        self.assertSameRun(a, b, ["compress", "--rm", "--allow-damaged", *self.files()], rc=0)
        self.assertSameRun(a, b, ["compress", "--json", "cut.pt", "ckpt_03.pt"], rc=1,
                           spread=False)
        archives = [f + ".ckz" for f in self.files()]
        self.assertSameRun(a, b, ["decompress", "--rm", "--json", *archives], rc=0)
        self.assertEqual(tree_hashes(b), tree_hashes(self.src))

    def test_reshard_spreads_the_parameters(self):
        """reshard --to universal: every rank writes its share of the parameters into rank 0's
        folder, rank 0 puts it into place; the same files as one process writes."""
        import zero_fixtures as zf
        for stage in (2, 3):
            with self.subTest(stage=stage):
                a = os.path.join(self.work, f"za{stage}")
                b = os.path.join(self.work, f"zb{stage}")
                zf.make_zero_checkpoint(os.path.join(a, "ckpt"), stage, 3, device="cpu")
                shutil.copytree(a, b)
                self.assertSameRun(a, b, ["reshard", "ckpt", "--to", "universal", "-j", "1"], rc=0)
                zero = os.path.join(b, "ckpt", "global_step14_universal", "zero")
                self.assertGreaterEqual(len(os.listdir(zero)), 4)
                # --to zero: every rank writes its share of the 5 ranks' files.
                self.assertSameRun(a, b, ["reshard", "ckpt", "--to", "zero", "--world-size", "5",
                                          "-o", "w5", "-j", "1"], rc=0)
                self.assertEqual(sum("optim_states" in n for n in
                                     os.listdir(os.path.join(b, "w5", "global_step14"))), 5)

    def test_sharded_export_and_a_failed_shard(self):
        a, b = self.copy("a"), self.copy("b")
        args = ["export", "ckpt_00.pt", "--to", "st", "--select", "model", "--max-shard-size",
                "100KB"]
        # model.w (1.6 MB) alone is one shard and model.b another: two shards, one index.
        self.assertSameRun(a, b, args + ["-j", "1"], rc=0)
        self.assertIn("model.safetensors.index.json", os.listdir(os.path.join(b, "st")))
        big = os.path.join(self.work, "big.pt")
        torch.save({f"t{i:02d}": torch.randn(5_000 + 3_000 * i) for i in range(12)}, big)
        a, b = tempfile.mkdtemp(dir=self.work), tempfile.mkdtemp(dir=self.work)
        for d in (a, b):
            shutil.copy(big, d)
        args = ["export", "big.pt", "--to", "st", "--max-shard-size", "100KB"]
        self.assertSameRun(a, b, args, rc=0)
        shards = [f for f in os.listdir(os.path.join(b, "st")) if f.endswith(".safetensors")]
        self.assertGreaterEqual(len(shards), 6)
        # A shard that cannot be written on whichever rank owns it: nothing goes into place (no
        # shard, no index), exit 1 everywhere, the same error as a single process.
        for d in (a, b):
            shutil.rmtree(os.path.join(d, "st"))
        os.environ["CKPTOOL_TEST_FAIL_WRITE"] = sorted(shards)[3]
        try:
            s, m = self.assertSameRun(a, b, args, rc=1)
        finally:
            del os.environ["CKPTOOL_TEST_FAIL_WRITE"]
        self.assertFalse(os.path.exists(os.path.join(b, "st")))
        self.assertEqual(len(error_lines(m.stderr)), 1, m.stderr)
        self.assertIn("CKPTOOL_TEST_FAIL_WRITE", m.stderr)
        # A name of the set taken by a folder: refused before anything is written, and the
        # folder is left as it was.
        for d in (a, b):
            os.makedirs(os.path.join(d, "st", sorted(shards)[3]))
        s, m = self.assertSameRun(a, b, args + ["--force"], rc=1, spread=False)
        self.assertIn("not a file a model export wrote", s.stderr)
        self.assertEqual(os.listdir(os.path.join(b, "st")), [sorted(shards)[3]])

    def test_root_only_commands_and_inspect(self):
        a, b = self.copy("a"), self.copy("b")
        self.assertSameRun(a, b, ["inspect", "ckpt_03.pt", "ckpt_05.pt"], rc=0, spread=False)
        self.assertSameRun(a, b, ["inspect", "notes.pt"], rc=1, spread=False)
        self.assertSameRun(a, b, ["export", "ckpt_01.pt", "--to", "one.safetensors"], rc=0,
                           spread=False)

    def test_mpirun_variables_set_by_hand_are_refused(self):
        # MPI starts as a world of one: not the four ranks the variable promises.
        d = self.copy("d")
        before = tree_hashes(d)
        p = subprocess.run([CKPTOOL, "shrink", "ckpt_00.pt"], cwd=d, capture_output=True,
                           text=True, timeout=60,
                           env=clean_env(OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_RANK="1"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("MPI connected a world of 1", p.stderr)
        self.assertEqual(tree_hashes(d), before)

    def test_ranks_that_see_other_files_stop_before_writing(self):
        b = self.copy("b")
        before = tree_hashes(b)
        # Rank 3 is given one more file than the others: nobody may start.
        wrapper = ('if [ "$OMPI_COMM_WORLD_RANK" = 3 ]; then set -- "$@" ckpt_01.pt; fi; '
                   + RANK_WRAPPER)
        m, codes, logs = self.mpi(b, "shrink", "ckpt_00.pt", "ckpt_02.pt", wrapper=wrapper)
        self.assertEqual(codes, {r: 1 for r in range(NP)}, m.stderr)
        self.assertIn("rank 3 of 4 sees other inputs than rank 0", m.stderr)
        self.assertEqual(m.stdout, "")
        self.assertEqual(tree_hashes(b), before)
        self.assertEqual(self.commits(logs), {})

    def test_a_killed_rank_ends_the_job_and_leaves_whole_files(self):
        a, b = self.copy("a"), self.copy("b")
        good = [f for f in self.files() if f.startswith("ckpt_")]
        s, _ = self.single(a, "shrink", *good)
        self.assertEqual(s.returncode, 0, s.stderr)
        done = tree_hashes(a)
        original = tree_hashes(self.src)
        # Rank 1 is killed (SIGKILL) shortly after it starts; mpirun must end the job.
        wrapper = ('if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then "$0" "$@" & pid=$!; sleep 0.3; '
                   'kill -9 $pid; wait $pid; exit 137; fi; ' + RANK_WRAPPER)
        t0 = time.monotonic()
        m, codes, _ = self.mpi(b, "shrink", *good, wrapper=wrapper, timeout=90,
                              abort_on_failure="1")
        self.assertLess(time.monotonic() - t0, 80)
        self.assertNotEqual(m.returncode, 0)
        for name, digest in tree_hashes(b).items():
            if ".ckptool-tmp-" in name:
                continue  # a killed run's temp file; the next run removes it
            self.assertIn(digest, (original.get(name), done.get(name)), name)


if __name__ == "__main__":
    unittest.main()
