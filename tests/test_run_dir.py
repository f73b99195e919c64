"""The life of a run directory, from the command line (python -m andrea_numba.train):

  - every refusal is one line on stderr starting "error: ", exit code 2, no traceback, and no file
    of the run directory changed (a fuzz table over checkpoints, state files and arguments);
  - a run killed before its first checkpoint resumes from step 0; stale temporary files of killed
    writes are removed; the lock refuses a second trainer, naming the first one's PID; a finished
    run says so and changes nothing; a moved run directory resumes with its own data;
  - a diverging run stops with one line before the bad step is applied, its checkpoint intact;
  - a run killed at random moments (SIGKILL, SIGTERM, SIGKILL in the middle of a checkpoint write)
    and resumed until it finishes ends with the same checkpoint.bin, best.bin and losses as one
    that was never interrupted.

All of it works on copies of one uninterrupted 4-step run of ANDREA-tiny with one block and dropout
(the `base` fixture, made in this process). The kill test's runs are subprocesses; the fixture starts them in
a thread beside the base run when the kill test is selected, so the two share the machine's cores.
"""
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from andrea_numba import checkpoint as ck
from andrea_numba import train as tr
from andrea_numba.config import load_config
from andrea_numba.layout import n_params
from andrea_numba.runlog import RunLock, read_loss

pytestmark = [pytest.mark.xdist_group("run_dir")]   # one worker of `pytest -n` runs the module: its module fixture once

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONUNBUFFERED": "1",
       "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
STEPS = 4
# The runs here are of ANDREA-tiny with one block (write_config): what a run directory holds and how a
# run stops, resumes and refuses does not depend on the depth, and the simulator pays per launch (the
# harness and the gradient checks cover the two-block model; test_train.small_config does the same).
N = n_params(dataclasses.replace(load_config("tiny").model, n_layer=1))
KILL_TEST = "test_killed_at_random_moments_and_resumed_the_run_ends_the_same"
KILL_SEED = 20261130


def corpus_text() -> str:
    words = "the cat sat on a mat and the dog ran to the old tree".split()
    return " ".join(np.random.default_rng(0).choice(words, 6000)) + "\n"


def write_config(path, **train):
    """ANDREA-tiny with one block, in microbatches of 1 x 8 tokens, dropout 0.1, evaluation and a
    checkpoint every 2 steps, no text samples; the corpus is corpus.txt beside the config (a relative
    path)."""
    raw = load_config("tiny").to_dict()
    raw["name"] = "ANDREA-tiny-rundir"
    raw["model"]["n_layer"] = 1
    raw["data"]["source"] = "corpus.txt"
    raw["train"].update(dict(batch_size=1, seq_len=8, n_microbatches=1, steps=STEPS, lr=3e-2, min_lr=3e-3,
                             warmup_steps=1, dropout=0.1, eval_interval=2, eval_batches=1, checkpoint_interval=2,
                             sample_interval=100, sample_tokens=0), **train)
    Path(path).write_text(json.dumps(raw))
    return Path(path)


def train_cli(*args, cwd=None):
    """python -m andrea_numba.train ARGS in this process: (exit code, stdout lines, stderr lines)."""
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = tr.main([str(a) for a in args])
            except SystemExit as e:                  # argparse's errors (cli.Parser: one line, exit 2)
                code = e.code
    finally:
        os.chdir(old)
    return code, out.getvalue().splitlines(), err.getvalue().splitlines()


def snapshot(run_dir) -> dict:
    """sha256 of every file under run_dir, by relative path."""
    run_dir = Path(run_dir)
    return {p.relative_to(run_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def losses(run_dir):
    return [(r["step"], r["train_loss"], r.get("val_loss"), r["lr"], r["grad_norm"]) for r in read_loss(run_dir)]


def ck_step(path) -> int:
    return int(np.fromfile(path, dtype="<i4", count=1)[0])


# ----------------------------------------------------------------------------------------------
# the kill test's runs (subprocesses), driven from a thread

def _popen(root, run, env=None):
    args = ["--resume", run.name] if (run / ".state.json").exists() else \
        ["--config", "run.json", "--out", run.name, "--data", "corpus.txt"]
    return subprocess.Popen([sys.executable, "-m", "andrea_numba.train", *args, "--log-every", "1"], cwd=root,
                            env={**ENV, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(pred, proc, timeout=120):
    t0 = time.time()
    while not pred():
        if proc.poll() is not None or time.time() - t0 > timeout:
            return False
        time.sleep(0.02)
    return True


def _n_lines(path) -> int:
    try:
        return len(path.read_bytes().splitlines())
    except FileNotFoundError:
        return 0


def kill_sequence(root: Path, out: SimpleNamespace):
    """SIGKILL during startup, SIGKILL at a random moment after a step, SIGKILL while checkpoint.bin's
    temporary file waits for its rename (atomic.py's test hook), SIGTERM at a random moment after a
    step; then --resume until the run is finished. The moments come from a seeded generator, in
    units of the time the process took to its first step (so a slow machine scales them)."""
    rng, run = random.Random(KILL_SEED), root / "killed"
    out.procs = []

    def finish(p, how):
        stdout, stderr = p.communicate(timeout=300)
        out.procs.append(SimpleNamespace(how=how, code=p.returncode, stdout=stdout, stderr=stderr))
        return out.procs[-1]

    try:
        p = _popen(root, run)                                            # 1. SIGKILL while it starts
        time.sleep(rng.uniform(0.2, 1.5))
        p.kill()
        finish(p, "SIGKILL at start")
        p, t0 = _popen(root, run), time.time()                           # 2. SIGKILL inside a step
        lines = _n_lines(run / ".loss.json")
        if _wait(lambda: _n_lines(run / ".loss.json") > lines, p):
            time.sleep(rng.uniform(0.0, 1.0) * (time.time() - t0))
        p.kill()
        finish(p, "SIGKILL in a step")
        p = _popen(root, run, {"ANDREA_TEST_RENAME_PAUSE": "2:checkpoint.bin"})   # 3. SIGKILL mid-write
        out.caught_mid_write = _wait(lambda: any(run.glob(".checkpoint.bin.*.tmp")), p)
        p.kill()
        finish(p, "SIGKILL in a checkpoint write")
        p, t0 = _popen(root, run), time.time()                           # 4. SIGTERM inside a step
        lines = _n_lines(run / ".loss.json")
        if _wait(lambda: _n_lines(run / ".loss.json") > lines, p):
            time.sleep(rng.uniform(0.0, 0.5) * (time.time() - t0))
        p.send_signal(signal.SIGTERM)
        term = finish(p, "SIGTERM in a step")
        term.checkpoint_step = ck_step(run / "checkpoint.bin") if (run / "checkpoint.bin").exists() else None
        for _ in range(4):                                               # 5. resume until finished
            state = run / ".state.json"
            if state.exists() and json.loads(state.read_text())["step"] == STEPS:
                break
            finish(_popen(root, run), "resume")
        out.error = None
    except BaseException as e:                  # reported by the kill test, not by the others
        out.error = e


@pytest.fixture(scope="module")
def base(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("rundir")
    (root / "corpus.txt").write_text(corpus_text())
    write_config(root / "run.json")
    killed = SimpleNamespace(error=RuntimeError("the kill sequence did not run"), procs=[])
    driver = None
    if any(item.name == KILL_TEST for item in request.session.items):
        driver = threading.Thread(target=kill_sequence, args=(root, killed), daemon=True)
        driver.start()
    code, out, err = train_cli("--config", "run.json", "--out", "base", "--data", "corpus.txt", "--log-every", 1,
                               cwd=root)
    assert code == 0 and err == [], (out, err)
    return SimpleNamespace(root=root, run=root / "base", cfg=root / "run.json", out=out, driver=driver, killed=killed)


@pytest.fixture
def run(base, tmp_path):
    """A copy of the finished base run."""
    dst = tmp_path / "run"
    shutil.copytree(base.run, dst)
    return dst


def test_the_base_run_writes_best_bin_and_elapsed_time(base):
    state = json.loads((base.run / ".state.json").read_text())
    rows = read_loss(base.run)
    vals = [(r["val_loss"], r["step"]) for r in rows if "val_loss" in r]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)) and len(vals) == 2
    best_val, best_step = min(vals)
    assert state["best"] == {"file": "best.bin", "step": best_step, "val_loss": best_val,
                             "sha256": hashlib.sha256((base.run / "best.bin").read_bytes()).hexdigest()}
    assert ck_step(base.run / "best.bin") == best_step
    assert f"best: val {best_val:.4f} at step {best_step} -> best.bin" in base.out
    assert all(r["elapsed_s"] > 0 for r in rows) and state["timings"]["elapsed_s"] >= rows[-1]["elapsed_s"]
    assert state["config"]["data"]["source"] == str((base.root / "corpus.txt").resolve())   # outside: absolute
    assert state["data"]["dir"] == "data"                                                  # inside: relative
    assert (base.run / ".lock").read_text().strip().isdigit()


# ----------------------------------------------------------------------------------------------
# refusals: one line, exit code 2, nothing changed

def _write(name, data):
    def mutate(run):
        (run / name).write_bytes(data(run) if callable(data) else data)
    return mutate


def _flip(name, byte):
    def data(run):
        raw = bytearray((run / name).read_bytes())
        raw[byte] ^= 0x10
        return bytes(raw)
    return _write(name, data)


def _state(edit):
    def mutate(run):
        state = json.loads((run / ".state.json").read_text())
        edit(state)
        (run / ".state.json").write_text(json.dumps(state))
    return mutate


def _other_size(state):
    state["config"]["model"]["n_layer"] = 3


def _size_12m(state):
    state["config"] = load_config("12M").to_dict()


def _no_lr(state):
    del state["config"]["train"]["lr"]


def _random(n):
    return lambda run: np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()


CHECKPOINT_BYTES = ck.checkpoint_bytes(N)
RESUME = ("--resume", "{run}")
NEW = ("--config", "{cfg}", "--out", "{run}")
REFUSALS = {
    # checkpoints
    "checkpoint truncated": (_write("checkpoint.bin", lambda r: (r / "checkpoint.bin").read_bytes()[:-100]),
                             RESUME, "is truncated"),
    "checkpoint cut inside its header": (_write("checkpoint.bin", lambda r: (r / "checkpoint.bin").read_bytes()[:5]),
                                         RESUME, "is truncated"),
    "checkpoint empty": (_write("checkpoint.bin", b""), RESUME, "is empty"),
    "checkpoint of random bytes": (_write("checkpoint.bin", _random(CHECKPOINT_BYTES)), RESUME, "is corrupt"),
    "checkpoint of a few random bytes": (_write("checkpoint.bin", _random(1000)), RESUME, "is corrupt"),
    "checkpoint header n_params wrong": (_flip("checkpoint.bin", 4), RESUME, "is corrupt"),
    "checkpoint header step negative": (_write("checkpoint.bin", lambda r: b"\xff\xff\xff\xff" +
                                               (r / "checkpoint.bin").read_bytes()[4:]), RESUME, "is corrupt"),
    "checkpoint with one bit flipped": (_flip("checkpoint.bin", 1000), RESUME, "does not match the sha256 recorded"),
    "checkpoint of another model size": (lambda r: ck.save_checkpoint(r / "checkpoint.bin", 2, *[np.ones(100, np.float32)] * 3),
                                         RESUME, f"holds 100 parameters but the config needs {N:,}: it belongs to "
                                                 "another model size"),
    "checkpoint missing but on record": (lambda r: (r / "checkpoint.bin").unlink(), RESUME, "checkpoint.bin is missing"),
    "best.bin with one bit flipped": (_flip("best.bin", 1000), RESUME, "best.bin does not match the sha256 recorded"),
    "best.bin truncated": (_write("best.bin", lambda r: (r / "best.bin").read_bytes()[:99]), RESUME, "is truncated"),
    # state files
    "state not JSON": (_write(".state.json", b'{"step": 4, "config": '), RESUME, "is not valid JSON"),
    "state without config": (_state(lambda s: s.pop("config")), RESUME, "holds no run config"),
    "state of a list": (_write(".state.json", b"[1, 2]"), RESUME, "holds no run config"),
    "state config of another size": (_state(_other_size), RESUME, "it belongs to another model size"),
    "state config of 12M": (_state(_size_12m), RESUME, "too big for the CUDA simulator"),
    "state config without train.lr": (_state(_no_lr), RESUME, "missing field 'train.lr'"),
    "state without step": (_state(lambda s: s.pop("step")), RESUME, "has no step count"),
    "state step not a number": (_state(lambda s: s.update(step="4")), RESUME, "'step' is not an integer"),
    "state best not a record": (_state(lambda s: s.update(best="best.bin")), RESUME, "'best' is not a record"),
    "state data not an object": (_state(lambda s: s.update(data=[])), RESUME, "'data' is not an object"),
    # arguments
    "--steps 0": (None, NEW + ("--steps", "0"), "argument --steps: must be a positive integer"),
    "--steps -3": (None, NEW + ("--steps", "-3"), "argument --steps: must be a positive integer"),
    "--steps 1.5": (None, NEW + ("--steps", "1.5"), "argument --steps: must be an integer"),
    "--steps x (resume)": (None, RESUME + ("--steps", "x"), "argument --steps: must be an integer"),
    "--batch-size 0": (None, NEW + ("--batch-size", "0"), "argument --batch-size: must be a positive integer"),
    "--microbatches -1": (None, NEW + ("--microbatches", "-1"), "argument --microbatches: must be a positive"),
    "--seq-len abc": (None, NEW + ("--seq-len", "abc"), "argument --seq-len: must be an integer"),
    "--seq-len beyond the context": (None, NEW + ("--seq-len", "17"), "exceeds model.context_length"),
    "--seed -1": (None, NEW + ("--seed", "-1"), "argument --seed: must be an integer from 0 to 2,147,483,647"),
    "--seed 2^31": (None, NEW + ("--seed", str(2 ** 31)), "argument --seed: must be an integer from 0 to"),
    "--log-every 0": (None, RESUME + ("--log-every", "0"), "argument --log-every: must be a positive integer"),
    "--precision x": (None, NEW + ("--precision", "x"), "field 'train.precision' must be one of fp32, bf16, fp16"),
    "--resume --precision": (None, RESUME + ("--precision", "bf16"), "--precision cannot be given with --resume"),
    "--products x": (None, NEW + ("--products", "x"), "field 'train.products' must be one of numba, cublas"),
    "--resume --products": (None, RESUME + ("--products", "cublas"), "--products cannot be given with --resume"),
    "--compile-workers -1": (None, NEW + ("--compile-workers", "-1"), "argument --compile-workers: must be an integer >= 0"),
    "--compile-workers x (resume)": (None, RESUME + ("--compile-workers", "x"), "argument --compile-workers: must be an"),
    "--out a file": (None, ("--config", "{cfg}", "--out", "{run}/checkpoint.bin"), "is a file, not a directory"),
    "--resume a file": (None, ("--resume", "{run}/best.bin"), "is a file, not a run directory"),
    "--resume no run": (None, ("--resume", "{run}/data"), "has no .state.json"),
    "a new run into a run": (None, NEW, "already holds a run: continue it with --resume"),
    "--resume --steps below the run's": (None, RESUME + ("--steps", "3"), "at step 4 already"),
    "--resume --steps below the run's, the way on": (None, RESUME + ("--steps", "3"), "give --steps 5 or more to train on"),
    "--resume a missing directory": (None, ("--resume", "{run}/gone"), "gone does not exist: give the directory of a run"),
    "--resume --data": (None, RESUME + ("--data", "{cfg}"), "--data cannot be given with --resume"),
    "--resume --batch-size": (None, RESUME + ("--batch-size", "2"), "--batch-size cannot be given with --resume"),
    "--resume --seq-len": (None, RESUME + ("--seq-len", "4"), "--seq-len cannot be given with --resume"),
    "--resume --seed": (None, RESUME + ("--seed", "1"), "--seed cannot be given with --resume"),
    "--resume --microbatches": (None, RESUME + ("--microbatches", "2"), "--microbatches cannot be given with"),
    "--resume --out": (None, RESUME + ("--out", "{run}"), "--out cannot be given with --resume"),
    "--resume --size": (None, RESUME + ("--size", "tiny"), "argument --size: not allowed with argument --resume"),
    "--resume --config": (None, RESUME + ("--config", "{cfg}"), "argument --config: not allowed with argument"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_in_one_line_and_nothing_changes(case, base, run):
    mutate, args, message = REFUSALS[case]
    if mutate is not None:
        mutate(run)
    before = snapshot(run)
    code, out, err = train_cli(*[a.format(run=run, cfg=base.cfg) for a in args], cwd=base.root)
    assert code == 2, (out, err)
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert message in err[0], err[0]
    assert "Traceback" not in "\n".join(out + err)
    if "checkpoint" in case and "another model size" not in case:
        assert "another model size" not in err[0]
    assert snapshot(run) == before


# ----------------------------------------------------------------------------------------------
# the run directory's life

def test_a_finished_run_says_so_and_changes_nothing(run):
    before = snapshot(run)
    code, out, err = train_cli("--resume", run)
    assert code == 0 and err == []
    assert out == [f"{run} is finished: it trained all {STEPS} of its steps; to train it further, give more steps: "
                   f"--resume {run} --steps {2 * STEPS} (nothing was changed)"]
    assert snapshot(run) == before


def test_the_lock_refuses_a_second_trainer_and_dies_with_its_holder(base, run):
    lock = RunLock(run)
    lock.claim()                                   # this process is the first trainer
    try:
        before = snapshot(run)
        for args in (("--resume", run, "--steps", STEPS + 2), ("--config", base.cfg, "--out", run)):
            code, out, err = train_cli(*args, cwd=base.root)
            assert code == 2 and len(err) == 1, err
            assert err[0] == (f"error: {run} is in use by another trainer (PID {os.getpid()}): wait for it to finish, "
                              f"or stop it (SIGTERM saves a checkpoint) and then --resume {run}")
            assert snapshot(run) == before
    finally:
        lock.release()
    # a holder killed with SIGKILL leaves no stale lock: the kernel drops it with the process
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from andrea_numba.runlog import RunLock; "
                               "RunLock(sys.argv[1]).claim(); print('held', flush=True); time.sleep(60)", str(run)],
                              env=ENV, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(tr.RunDirError, match=f"PID {holder.pid}"):
        RunLock(run).check()
    holder.kill()
    holder.wait()
    lock = RunLock(run)
    lock.check()                                   # free again
    lock.release()


def test_a_run_killed_before_its_first_checkpoint_resumes_from_step_0_and_stale_files_go(base, run):
    for name in ("checkpoint.bin", "best.bin", ".loss.json"):
        (run / name).unlink()

    def first_moments(state):                  # what a run killed during its first step leaves
        state.update(step=0, checkpoint_sha256=None, previous_checkpoint_sha256=None, best=None)
        state["config"]["train"]["steps"] = 1
    _state(first_moments)(run)
    stale = {".checkpoint.bin.k1ll3d00.tmp": 100, "..state.json.abcd_123.tmp": 50, ".best.bin.x.tmp": 25,
             "data/.train.bin.q9w8e7r6.tmp": 10}
    for name, size in stale.items():
        (run / name).write_bytes(b"x" * size)
    before = snapshot(run)
    code, out, err = train_cli("--config", base.cfg, "--out", run, cwd=base.root)   # a new run pointed at it
    assert code == 2 and len(err) == 1
    assert "stopped before its first checkpoint: start it again from step 0 with --resume" in err[0]
    assert snapshot(run) == before
    code, out, err = train_cli("--resume", run)
    assert code == 0 and err == [], err
    assert f"{run} has no checkpoint yet (the run stopped before its first one): training it again from step 0" in out
    assert "removed 4 temporary file(s) left by an interrupted write (185 bytes freed)" in out
    assert not any((run / name).exists() for name in stale)
    assert ck_step(run / "checkpoint.bin") == 1
    assert losses(run)[0][:2] == losses(base.run)[0][:2]          # step 1 as the uninterrupted run had it


def test_a_moved_run_directory_resumes_with_its_own_data(base, tmp_path):
    a, b = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    shutil.copytree(base.run, a)
    a.rename(b)                                    # mv runs/a runs/b
    shutil.rmtree(b / "data")                      # prepared again from the corpus on record
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out, err = train_cli("--resume", os.path.relpath(b, elsewhere), "--steps", STEPS + 1, cwd=elsewhere)
    assert code == 0 and err == [], err
    assert not a.exists() and list(elsewhere.iterdir()) == []       # nothing at the old path or the cwd
    assert ck_step(b / "checkpoint.bin") == STEPS + 1 and (b / "data" / "train.bin").exists()
    assert snapshot(b / "data") == snapshot(base.run / "data")
    state = json.loads((b / ".state.json").read_text())
    assert state["data"]["dir"] == "data"
    per_step = state["tokens_seen"] // (STEPS + 1)          # the done line: the run's tokens, and this process's
    done = [line for line in out if line.startswith("done:")]
    assert len(done) == 1 and f"{state['tokens_seen']:,} tokens in the run" in done[0], out
    assert f"this process: {per_step:,} tokens" in done[0], done
    assert done[0].count("MFU unknown over its steps") == 2, done   # the run's and this process's: no peak here
    assert any(line.startswith(f"step {STEPS + 1:>6}/") and "tok/s | MFU unknown | ETA" in line for line in out), out


def test_a_corpus_inside_the_run_directory_is_recorded_relative_to_it(base, tmp_path):
    run = tmp_path / "r"
    shutil.copytree(base.run, run)
    shutil.copy(base.root / "corpus.txt", run / "book.txt")
    state = json.loads((run / ".state.json").read_text())
    state["config"]["data"]["source"] = "book.txt"            # as a run trained on runs/x/book.txt records it
    cfg = tr.resume_config(run, state, None)
    assert cfg.data.source == str(run / "book.txt")
    trainer = tr.Trainer(cfg, run, log=lambda s: None)
    trainer.setup(resume=True)
    trainer.write_state()
    assert json.loads((run / ".state.json").read_text())["config"]["data"]["source"] == "book.txt"


def test_a_signal_seen_by_the_loop_always_comes_with_a_checkpoint(base, run):
    """The loop reads the signal flags once a step: a SIGTERM landing just after its checkpoint test
    can no longer stop the run without a checkpoint of the step it finished."""
    state = json.loads((run / ".state.json").read_text())
    trainer = tr.Trainer(tr.resume_config(run, state, STEPS + 2), run, log=lambda s: None)
    trainer.setup(resume=True)
    reads = []

    class LateSignal(tr.Trainer):              # the flag turns on after the loop first looked at it
        @property
        def stop_requested(self):
            reads.append(1)
            return len(reads) > 1          # read 1: before the loop; read 2: after step 5

        @stop_requested.setter
        def stop_requested(self, value):
            pass
    trainer.__class__ = LateSignal
    assert trainer.run() == 0
    assert trainer.step == STEPS + 1 == ck_step(run / "checkpoint.bin")


def test_a_checkpoint_of_non_finite_weights_is_never_written(run):
    state = json.loads((run / ".state.json").read_text())
    trainer = tr.Trainer(tr.resume_config(run, state, None), run, log=lambda s: None)
    trainer.setup(resume=True)
    before = snapshot(run)
    bad = np.full(N, np.nan, np.float32)
    trainer.model.params.copy_to_device(bad, stream=trainer.stream)
    with pytest.raises(tr.TrainError, match=f"the weights at step {STEPS} hold NaN or infinite values, so no "
                                            f"checkpoint was written and the last checkpoint .* is intact"):
        trainer.checkpoint()
    with pytest.raises(ck.CheckpointError, match="refusing to write"):
        ck.save_checkpoint(run / "best.bin", STEPS, bad, bad, bad)
    assert snapshot(run) == before


@pytest.mark.parametrize("slow_writer", [False, True])
def test_divergence_stops_before_the_bad_step_with_one_line(base, tmp_path, monkeypatch, slow_writer):
    """lr 1e20 without clipping: step 1 takes the weights to ~1e20, step 2's loss is NaN. k_adamw
    does not apply step 2, the trainer stops, and step 1's checkpoint stays, finite. Step 1's
    checkpoint is written while step 2 runs: with its write slowed down (slow_writer), the line
    still names it, once it is on disk."""
    if slow_writer:
        real = tr.save_checkpoint
        monkeypatch.setattr(tr, "save_checkpoint", lambda *a, **k: (time.sleep(1.0), real(*a, **k))[1])
    (tmp_path / "corpus.txt").write_text(corpus_text())
    write_config(tmp_path / "run.json", lr=1e20, min_lr=0.0, clip_norm=0.0, warmup_steps=0, steps=3,
                 eval_interval=100, checkpoint_interval=1)
    code, out, err = train_cli("--config", "run.json", "--out", "d", cwd=tmp_path)
    assert code == 2 and len(err) == 1, err
    assert err[0] == ("error: training diverged at step 2 (loss nan, gradient norm nan): the step was not applied "
                      "and the last checkpoint (d/checkpoint.bin, step 1) is intact; lower train.lr (now 1e+20; try "
                      "1e+19), turn clipping on (train.clip_norm is 0, i.e. off; 1.0 is usual) and warm up "
                      "(train.warmup_steps is 0; a few percent of train.steps is usual) in the config, then start a "
                      "new run (--config FILE --out NEW_DIR)")
    d = tmp_path / "d"
    state = json.loads((d / ".state.json").read_text())
    step, params, *_ = ck.load_checkpoint(d / "checkpoint.bin", N, state["checkpoint_sha256"])   # finite
    assert step == 1 == state["step"] and np.abs(params).max() > 1e18
    assert not (d / "best.bin").exists() and [r["step"] for r in read_loss(d)] == [1]


def test_early_stop_finishes_the_run_and_a_resume_knows_it(tmp_path, monkeypatch):
    """train.early_stop = 2, an evaluation every step, validation losses scripted: best at step 2,
    no better at steps 3 and 4: the run checkpoints step 4 and finishes with best.bin at step 2;
    --resume then says it is finished and changes nothing."""
    (tmp_path / "corpus.txt").write_text(corpus_text())
    write_config(tmp_path / "run.json", steps=8, eval_interval=1, early_stop=2, checkpoint_interval=100)
    scripted = iter([5.0, 4.0, 4.5, 4.2, 3.0, 3.0, 3.0, 3.0])
    monkeypatch.setattr(tr.Trainer, "evaluate", lambda self: next(scripted))
    code, out, err = train_cli("--config", "run.json", "--out", "d", cwd=tmp_path)
    assert code == 0, err
    assert any("early stop at step 4: 2 evaluations without a validation loss below 4.0000 (step 2" in s for s in out)
    d = tmp_path / "d"
    state = json.loads((d / ".state.json").read_text())
    assert state["step"] == 4 and state["best"]["step"] == 2 and ck_step(d / "best.bin") == 2
    assert [r["step"] for r in read_loss(d)] == [1, 2, 3, 4]
    before = snapshot(d)
    code, out, err = train_cli("--resume", "d", cwd=tmp_path)
    assert code == 0 and not err and "stopped early at step 4" in out[-1], (out, err)
    assert snapshot(d) == before


# ----------------------------------------------------------------------------------------------
# killed at random moments

@pytest.mark.slow
def test_killed_at_random_moments_and_resumed_the_run_ends_the_same(base):
    base.driver.join(timeout=600)
    killed = base.killed
    if killed.error is not None:
        raise killed.error
    run = base.root / "killed"
    for p in killed.procs:
        assert "Traceback" not in p.stderr, (p.how, p.stderr)
        if p.how in ("resume", "SIGTERM in a step"):
            assert p.code in (0, -signal.SIGTERM), (p.how, p.code, p.stderr)
            assert p.code != 0 or p.stderr == "", (p.how, p.stderr)
    assert killed.caught_mid_write                       # the kill landed between the write and the rename
    after = killed.procs[killed.procs.index(next(p for p in killed.procs if p.how == "SIGKILL in a checkpoint write")) + 1]
    # checkpoint.bin's temporary file, and .state.json's if the kill came while the checkpoint's record
    # was being written into it (just before the checkpoint's rename)
    assert re.search(r"removed [1-9][0-9]* temporary file\(s\) left by an interrupted write", after.stdout), after.stdout
    term = next(p for p in killed.procs if p.how == "SIGTERM in a step")
    if "stopped by signal at step" in term.stdout:       # SIGTERM: a checkpoint of the last finished step
        stopped = int(term.stdout.split("stopped by signal at step ")[1].split(";")[0])
        finished = [int(line.split("/")[0].split()[-1]) for line in term.stdout.splitlines() if line.startswith("step ")]
        assert term.code == 0 and term.checkpoint_step == stopped == max(finished)
    assert killed.procs[-1].code == 0
    assert not any(run.glob(".*.tmp"))
    for name in ("checkpoint.bin", "best.bin"):
        assert (run / name).read_bytes() == (base.run / name).read_bytes(), name
    assert losses(run) == losses(base.run)
    state, want = (json.loads((d / ".state.json").read_text()) for d in (run, base.run))
    assert state["best"] == want["best"] and state["step"] == STEPS
