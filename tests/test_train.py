"""Training end to end in the CUDA simulator at the tiny size: the loss falls, a run stopped by
SIGTERM resumes bit-exactly, SIGUSR1 checkpoints and continues, checkpoints are atomic, nothing is
allocated on the device inside the loop, every launch and copy goes to the run's one stream, a step
waits for the GPU once, a resumed run trains on the tokens it started with, and bad input gets one
clear line and exit code 2.

Most tests share two runs of one 5-step config (the `runs` fixture), made side by side so that
they take the time of one on a machine of two cores: run A in this process, every device
allocation, kernel launch, copy and host sync recorded while it trains; run B from the command
line in a subprocess, stopped by SIGUSR1 and SIGTERM, then resumed."""
import collections
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from andrea_numba import checkpoint as ck
from andrea_numba import train as tr
from andrea_numba.atomic import file_sha256
from andrea_numba.config import config_from_dict, load_config
from andrea_numba.kernels.common import SIMULATOR
from andrea_numba.layout import n_params
from andrea_numba.runlog import read_loss, read_samples

pytestmark = [pytest.mark.xdist_group("train")]   # one worker of `pytest -n` runs the module: its module fixture once

SIM_ENV = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONUNBUFFERED": "1"}
STEPS = 10          # enough that run B is still training when the test's SIGTERM comes, under load
EVALS = len(set(range(2, STEPS + 1, 2)) | {STEPS})   # eval_interval 2, and the last step


def corpus_text() -> str:
    """A small corpus, the same on every Python: words drawn by a seeded generator. Its few frequent
    bytes are quick to learn, so STEPS steps of 16 tokens lower the loss by far more than noise does."""
    words = "the cat sat on a mat and the dog ran to the old tree".split()
    return " ".join(np.random.default_rng(0).choice(words, 6000)) + "\n"


def small_config(tmp_path, name="tiny-test.json", corpus=None, **train):
    """ANDREA-tiny with one block (the trainer's logic does not depend on the depth, and the
    simulator pays per launch: the harness and the gradient checks cover the two-block model) and
    microbatches small enough for the simulator (1 x 8 tokens, 2 per step), trained on the text
    file `corpus` (default: the config's, the standard library's source)."""
    raw = load_config("tiny").to_dict()
    raw["name"] = "ANDREA-tiny-test"
    raw["model"]["n_layer"] = 1
    if corpus is not None:
        raw["data"]["source"] = str(corpus)
    raw["train"].update(dict(batch_size=1, seq_len=8, n_microbatches=2, steps=STEPS, lr=3e-2, min_lr=3e-3,
                             warmup_steps=1, eval_interval=2, eval_batches=1, checkpoint_interval=100,
                             sample_interval=100, sample_tokens=3), **train)
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return path, config_from_dict(raw)


def run_train(*args, **kw):
    return subprocess.run([sys.executable, "-m", "andrea_numba.train", *map(str, args)], env=SIM_ENV,
                          capture_output=True, text=True, **kw)


def losses(run_dir):
    return [(r["step"], r["train_loss"], r.get("val_loss"), r["lr"], r["grad_norm"]) for r in read_loss(run_dir)]


def files(run_dir):
    """Every file under run_dir and its bytes (to prove a refusal changed nothing)."""
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def main_in_process(capsys, *args):
    """python -m andrea_numba.train ARGS, in this process: (exit code, stderr lines)."""
    capsys.readouterr()
    code = tr.main([str(a) for a in args])
    return code, capsys.readouterr().err.strip().splitlines()


# ----------------------------------------------------------------------------------------------
# what happens on the device while a run trains

ALLOCATORS = ("device_array", "device_array_like", "to_device", "pinned_array", "mapped_array", "managed_array")
PHASES = ("train_step", "evaluate", "generate", "save", "_write_checkpoint", "_write_best", "host_state")
Event = collections.namedtuple("Event", "phase kind name stream array")


class DeviceRecorder:
    """Records, in the simulator, every device allocation, kernel launch (with the stream of its
    launch configuration), copy between host and device (with its stream and host array) and host
    sync, each with the Trainer method it happened in (its phase; "loop" outside them)."""

    def __init__(self):
        self.events, self.calls, self.local = [], collections.Counter(), threading.local()

    @property
    def phase(self):                    # per thread: the file writer's thread has phases of its own
        return getattr(self.local, "phase", "loop")

    @phase.setter
    def phase(self, name):
        self.local.phase = name

    def add(self, kind, name, stream=None, array=None):
        self.events.append(Event(self.phase, kind, name, stream, array))

    def patch(self, mp):
        from numba import cuda
        from numba.cuda.simulator import api
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        from numba.cuda.simulator.kernel import FakeCUDAKernel

        def alloc(name, fn):
            return lambda *a, **k: (self.add("alloc", name), fn(*a, **k))[1]
        for name in ALLOCATORS:
            if hasattr(cuda, name):
                mp.setattr(cuda, name, alloc(name, getattr(cuda, name)))
        launch, to_device, to_host = FakeCUDAKernel.__getitem__, FakeCUDAArray.copy_to_device, FakeCUDAArray.copy_to_host

        def configure(kernel, config):              # kernel[grid, block, stream, shared]
            self.add("launch", kernel.fn.__name__, config[2] if len(config) > 2 else 0)
            return launch(kernel, config)

        def copy_to_device(arr, ary, stream=0):
            self.add("copy", "to_device", stream, ary)
            return to_device(arr, ary, stream=stream)

        def copy_to_host(arr, ary=None, stream=0):
            self.add("copy", "to_host", stream, ary)
            return to_host(arr, ary, stream=stream)
        mp.setattr(FakeCUDAKernel, "__getitem__", configure)
        mp.setattr(FakeCUDAArray, "copy_to_device", copy_to_device)
        mp.setattr(FakeCUDAArray, "copy_to_host", copy_to_host)
        mp.setattr(api.stream, "synchronize", lambda stream: self.add("sync", "stream.synchronize", stream))
        mp.setattr(cuda, "synchronize", lambda: self.add("sync", "cuda.synchronize (the whole device)", 0))

    def watch(self, trainer):
        """Name the phase of each event after the Trainer method that is running."""
        for name in PHASES:
            setattr(trainer, name, self.phased(name, getattr(trainer, name)))

    def phased(self, name, method):
        def run(*args, **kw):
            outer, self.phase = self.phase, name
            self.calls[name] += 1
            try:
                return method(*args, **kw)
            finally:
                self.phase = outer
        return run

    def count(self, kind, phase, name=None):
        return sum(e.kind == kind and e.phase == phase and name in (None, e.name) for e in self.events)


# ----------------------------------------------------------------------------------------------
# the two shared runs

def _wait_for(pred, proc, timeout=240):
    t0 = time.time()
    while not pred():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.05)


def stop_and_resume(cfg_path, corpus, b, out):
    """Run B: SIGUSR1 after step 1, SIGTERM once the checkpoint it asked for is on disk; then the
    corpus file changes (a resumed run trains on its own tokens, so it must not matter) and
    `--resume` finishes the run. Results (or the error) go into `out`."""
    proc = subprocess.Popen([sys.executable, "-m", "andrea_numba.train", "--config", str(cfg_path), "--out", str(b),
                             "--log-every", "1", "--no-graph"], env=SIM_ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: len(read_loss(b)) >= 1, proc)
        proc.send_signal(signal.SIGUSR1)
        _wait_for(lambda: (b / "checkpoint.bin").exists(), proc)
        out.usr1_step = json.loads((b / ".state.json").read_text())["step"]
        proc.send_signal(signal.SIGTERM)
        out.stop_stdout, out.stop_stderr = proc.communicate(timeout=240)
        out.stop_code = proc.returncode
        out.stopped = json.loads((b / ".state.json").read_text())["step"]
        corpus.write_text(corpus.read_text() + "a line added after the run was stopped\n")
        out.resume = run_train("--resume", b, timeout=240)
    except BaseException as e:                 # reported by the test that reads B, not by the others
        out.error = e
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    corpus_a, corpus_b = root / "corpus-a.txt", root / "corpus-b.txt"
    for corpus in (corpus_a, corpus_b):
        corpus.write_text(corpus_text())
    cfg_path_a, cfg = small_config(root, "a.json", corpus_a)
    cfg_path_b, _ = small_config(root, "b.json", corpus_b)
    b = SimpleNamespace(error=None)
    driver = threading.Thread(target=stop_and_resume, args=(cfg_path_b, corpus_b, root / "b", b))
    driver.start()
    try:
        trainer = tr.Trainer(cfg, root / "a", log=lambda s: None)
        trainer.setup()
        record = DeviceRecorder()
        with pytest.MonkeyPatch.context() as mp:
            if SIMULATOR:
                record.patch(mp)
            record.watch(trainer)
            code = trainer.run()
    finally:
        driver.join(timeout=600)
    return SimpleNamespace(a=root / "a", b=root / "b", b_result=b, cfg=cfg, cfg_path=cfg_path_a, corpus=corpus_a,
                           trainer=trainer, record=record, code=code)


def best_steps(run_dir):
    """The steps whose validation loss was lower than every one before: where best.bin was written."""
    steps, best = [], math.inf
    for r in read_loss(run_dir):
        if "val_loss" in r and r["val_loss"] < best:
            steps.append(r["step"])
            best = r["val_loss"]
    return steps


@pytest.mark.slow
def test_loss_falls(runs):
    assert runs.code == 0
    log = read_loss(runs.a)
    assert [r["step"] for r in log] == list(range(1, STEPS + 1))
    first, last = np.mean([r["train_loss"] for r in log[:2]]), np.mean([r["train_loss"] for r in log[-2:]])
    assert last < first - 0.2, (first, last)
    assert log[-1]["val_loss"] < log[1]["val_loss"]
    samples = read_samples(runs.a)
    assert samples[-1]["step"] == STEPS and isinstance(samples[-1]["text"], str)
    state = json.loads((runs.a / ".state.json").read_text())
    assert state["step"] == STEPS and state["tokens_seen"] == STEPS * 2 * 8
    assert state["launches"] == ("eager (the CUDA simulator runs no graphs)" if SIMULATOR else "graph")
    assert (runs.a / "checkpoint.bin").stat().st_size == ck.checkpoint_bytes(n_params(runs.cfg.model))
    # best.bin: the checkpoint of the lowest validation loss, on record in the state
    best = state["best"]
    vals = [r for r in log if "val_loss" in r]
    low = min(vals, key=lambda r: r["val_loss"])
    assert best["file"] == "best.bin" and best["step"] == low["step"] == best_steps(runs.a)[-1]
    assert best["val_loss"] == low["val_loss"] and best["sha256"] == file_sha256(runs.a / "best.bin")
    assert ck.load_checkpoint(runs.a / "best.bin", n_params(runs.cfg.model), best["sha256"])[0] == best["step"]
    # elapsed_s: the run's wall time since launch, growing step by step
    elapsed = [r["elapsed_s"] for r in log]
    assert all(0 < a < b for a, b in zip(elapsed, elapsed[1:])), elapsed
    assert state["timings"]["elapsed_s"] >= elapsed[-1]


@pytest.mark.slow
@pytest.mark.skipif(not SIMULATOR, reason="records the simulator's launches and copies")
def test_the_loop_allocates_nothing_and_uses_one_stream(runs):
    rec, stream = runs.record, runs.trainer.stream
    assert [e for e in rec.events if e.kind == "alloc"] == []
    saved = sorted(set(best_steps(runs.a)) | {STEPS})     # steps that wrote best.bin or checkpoint.bin
    assert dict(rec.calls) == {"train_step": STEPS, "evaluate": EVALS, "generate": 1, "save": len(saved),
                               "host_state": len(saved), "_write_checkpoint": 1,
                               "_write_best": len(best_steps(runs.a))}
    for phase in ("train_step", "evaluate", "generate"):
        assert rec.count("launch", phase) > 0 and rec.count("copy", phase, "to_device") > 0, phase
    # weights, m and v copied once per step that saves, for best.bin and checkpoint.bin alike
    assert rec.count("copy", "host_state", "to_host") == 3 * len(saved)
    # the files are written from those copies, in the file writer's thread, which touches no GPU
    assert rec.count("copy", "_write_checkpoint") == rec.count("copy", "_write_best") == 0
    # every launch, copy and sync of the loop on the run's own stream: none on the legacy default
    # stream (0), none on another stream, no cuda.synchronize() of the whole device
    stray = [e for e in rec.events if e.kind != "alloc" and e.stream is not stream]
    assert stray == [], stray[:5]


@pytest.mark.slow
@pytest.mark.skipif(not SIMULATOR, reason="records the simulator's launches and copies")
def test_a_step_waits_for_the_gpu_once_and_copies_through_pinned_buffers(runs):
    rec, t, cfg = runs.record, runs.trainer, runs.cfg.train
    # the host syncs of docs/host-syncs.md: one per step, evaluation and checkpoint, one per sample
    # drawn on the decoder (its 3 tokens fit seq_len)
    assert rec.count("sync", "train_step") == rec.count("copy", "train_step", "to_host") == STEPS
    assert rec.count("sync", "evaluate") == rec.count("copy", "evaluate", "to_host") == EVALS
    saved = set(best_steps(runs.a)) | {STEPS}
    assert rec.count("sync", "host_state") == len(saved)                     # once per step that saves
    assert rec.count("sync", "_write_checkpoint") == rec.count("sync", "_write_best") == 0
    assert rec.count("sync", "generate") == rec.count("copy", "generate", "to_host") == 1
    assert rec.count("sync", "loop") == 0
    # a step's inputs (token batches; dropout keys, lr and bias corrections) travel in two copies
    # from the pinned buffers allocated at setup, the step's statistics into one
    assert rec.count("copy", "train_step", "to_device") == 2 * STEPS
    pinned = {"train_step": (t.batches_host, t.scalars_host), "evaluate": (t.eval_x, t.eval_y),
              "generate": (t.sample_buf, t.decoder.tokens_host, t.decoder.uniform_host, t.decoder.draw_host,
                           t.decoder.temperature_host)}
    for e in rec.events:
        if e.kind == "copy" and e.name == "to_device":
            assert any(np.shares_memory(e.array, buf) for buf in pinned.get(e.phase, ())), e
        if e.kind == "copy" and e.name == "to_host" and e.phase in ("train_step", "evaluate"):
            assert e.array is t.stats_host, e


@pytest.mark.slow
def test_sigterm_then_resume_is_bit_exact_and_sigusr1_continues(runs):
    b, res = runs.b, runs.b_result
    if res.error is not None:
        raise res.error
    assert res.stop_code == 0, res.stop_stderr
    assert 1 <= res.usr1_step <= res.stopped < STEPS, (res.usr1_step, res.stopped)   # SIGUSR1 went on training
    assert f"stopped by signal at step {res.stopped}" in res.stop_stdout
    assert "launches: eager, kernel by kernel (--no-graph)" in res.stop_stdout       # the flag, in the log
    assert "launches: eager, kernel by kernel (the CUDA simulator runs no graphs)" in res.resume.stdout
    # the corpus file changed after the stop: the resumed run trains on its own tokens all the same
    assert res.resume.returncode == 0, res.resume.stderr
    assert f"resumed from {b / 'checkpoint.bin'} at step {res.stopped}" in res.resume.stdout
    assert losses(b) == losses(runs.a)                                   # the same values, bit for bit
    assert (b / "checkpoint.bin").read_bytes() == (runs.a / "checkpoint.bin").read_bytes()
    assert read_samples(b)[-1]["text"] == read_samples(runs.a)[-1]["text"]
    lines = (b / ".loss.json").read_text().splitlines()
    assert len(lines) == STEPS                                           # appended, nothing lost or repeated


@pytest.mark.slow
def test_sample_on_kernels_and_twin_then_refuse_a_corrupt_checkpoint(runs, tmp_path, capsys):
    procs = [subprocess.Popen([sys.executable, "-m", "andrea_numba.sample", str(runs.a), "--prompt", "the ",
                               "--tokens", "4", "--seed", "3", *extra], env=SIM_ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for extra in ([], ["--cpu"])]
    texts = []
    for p in procs:                                 # the two run side by side
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        assert out.startswith("the ")
        texts.append(out)
    assert texts[0] == texts[1]           # the kernels and the twin sample the same tokens
    run = tmp_path / "r"
    shutil.copytree(runs.a, run)
    data = bytearray((run / "checkpoint.bin").read_bytes())
    data[100] ^= 0xFF
    (run / "checkpoint.bin").write_bytes(bytes(data))
    before = files(run)
    code, err = main_in_process(capsys, "--resume", run, "--steps", STEPS + 1)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ")
    assert "does not match the sha256" in err[0]
    assert files(run) == before
    code, err = main_in_process(capsys, "--config", runs.cfg_path, "--out", run)   # never overwrite a run
    assert code == 2 and len(err) == 1 and "--resume" in err[0]


@pytest.mark.slow
def test_resume_refuses_tokens_that_changed(runs, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(runs.a, run)
    tokens = bytearray((run / "data" / "train.bin").read_bytes())
    tokens[10] ^= 1
    (run / "data" / "train.bin").write_bytes(bytes(tokens))
    before = files(run)
    code, err = main_in_process(capsys, "--resume", run)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert "train.bin' does not match the sha256 recorded in .state.json" in err[0]
    assert files(run) == before                                      # nothing written, nothing lost


@pytest.mark.slow
def test_resume_without_tokens_prepares_them_again_only_from_the_same_corpus(runs, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(runs.a, run)
    tokens = files(run / "data")
    shutil.rmtree(run / "data")
    trainer = tr.Trainer(runs.cfg, run, log=lambda s: None)
    trainer.setup(resume=True)                                 # what --resume does before its first step
    assert files(run / "data") == tokens                       # prepared again, to the same bytes
    shutil.rmtree(run / "data")
    original = runs.corpus.read_text()
    runs.corpus.write_text(original.replace("cat", "cow", 1))
    try:
        before = files(run)
        code, err = main_in_process(capsys, "--resume", run, "--steps", STEPS + 1)
    finally:
        runs.corpus.write_text(original)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert f"the corpus {runs.corpus} changed since the run was prepared" in err[0]
    assert files(run) == before and not (run / "data").exists()


# ----------------------------------------------------------------------------------------------
# files and input, without training

def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.bin"
    a = np.arange(6, dtype=np.float32)
    sha = ck.save_checkpoint(path, 3, a, a, a)
    before = path.read_bytes()

    def crash(*args):
        raise KeyboardInterrupt("killed during the rename")
    from andrea_numba import atomic
    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        ck.save_checkpoint(path, 4, a + 1, a, a)
    assert path.read_bytes() == before                              # the last good checkpoint is intact
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.bin"]   # no temporary left behind
    step, params, *_, got_sha = ck.load_checkpoint(path, 6, sha)
    assert step == 3 and np.array_equal(params, a) and got_sha == sha
    header = np.frombuffer(before[:8], dtype="<i4")
    assert list(header) == [3, 6] and len(before) == 8 + 3 * 4 * 6  # int32 step, int32 n, 3 x n float32


def test_bad_checkpoints_are_refused_with_one_line(tmp_path):
    n = 6
    a = np.ones(n, np.float32)
    path = tmp_path / "c.bin"
    sha = ck.save_checkpoint(path, 2, a, a, a)
    good = path.read_bytes()
    path.write_bytes(good[:-4])
    with pytest.raises(ck.CheckpointError, match="truncated: 76 bytes of the 80"):
        ck.load_checkpoint(path, n)
    path.write_bytes(good[:5])
    with pytest.raises(ck.CheckpointError, match="truncated"):
        ck.load_checkpoint(path, n)
    path.write_bytes(good[:20] + bytes([good[20] ^ 1]) + good[21:])
    with pytest.raises(ck.CheckpointError, match="does not match the sha256"):
        ck.load_checkpoint(path, n, sha)
    path.write_bytes(good)
    with pytest.raises(ck.CheckpointError, match="holds 6 parameters but the config needs 7"):
        ck.load_checkpoint(path, 7)
    with pytest.raises(ck.CheckpointError, match="not found"):
        ck.load_checkpoint(tmp_path / "none.bin", n)


@pytest.mark.parametrize("args,message", [
    (["--data", "no/such/file.txt"], "not found"),
    (["--size", "7B"], "unknown size '7B'"),
    (["--batch-size", "0"], "argument --batch-size: must be a positive integer, got '0'"),
    (["--resume", "no/such/run"], "no/such/run does not exist: give the directory of a run"),
])
def test_bad_input_gives_one_line_and_exit_2(tmp_path, args, message):
    p = run_train(*args, "--out", tmp_path / "x") if "--resume" not in args else run_train(*args)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert message in p.stderr
    assert not (tmp_path / "x" / "checkpoint.bin").exists()


def test_memory_plan_refuses_and_suggests_a_smaller_microbatch():
    raw = load_config("120M").to_dict()
    raw["train"]["precision"] = "fp32"           # (the config's is bf16)
    cfg = config_from_dict(raw)
    plan = tr.memory_plan(cfg)
    total = sum(r[2] for r in plan)
    assert {"params", "grads", "optimizer", "activations", "scratch", "step", "sampler"} == {r[0] for r in plan}
    assert "sampler" in {r[0] for r in tr.memory_plan(load_config("120M"))}       # bf16: a decoder too
    raw["train"]["precision"] = "fp16"           # no decoder: its sampler runs the whole forward
    assert "sampler" not in {r[0] for r in tr.memory_plan(config_from_dict(raw))}
    raw["train"]["precision"] = "fp32"
    P = n_params(cfg.model)
    assert sum(r[2] for r in plan if r[1] in ("params", "grads", "adam_m", "adam_v")) == 4 * 4 * P
    assert tr.check_fits(cfg, free_bytes=2 * total) == total
    with pytest.raises(tr.PlanError, match=r"--batch-size \d+ --microbatches \d+") as e:
        tr.check_fits(cfg, free_bytes=8 * 2**30)                    # an 8 GB card
    assert "GiB" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("bad", [(np.nan, 1.0), (1.0, np.nan), (np.inf, 1.0), (1.0, -np.inf), (np.nan, np.inf)])
def test_adamw_skips_the_step_on_a_non_finite_loss_or_norm(bad):
    """The divergence guard of both AdamW kernels and their twins: with a NaN or infinite loss or
    gradient norm in stats, params, m and v stay as they were, bit for bit; with finite stats the
    step is taken. Version 2 (the engine's) clears the gradient either way."""
    from numba import cuda

    import reference as R
    from lab import optim as lab_optim
    rng = np.random.default_rng(0)
    n = 300
    p, g, m = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    v = rng.random(n).astype(np.float32)
    decay = (rng.random(n) < 0.5).astype(np.uint8)
    t, lr, b1, b2, eps, wd = 7, 1e-2, 0.9, 0.95, 1e-8, 0.1
    hyper = R.adamw_hyper(t, lr, b1, b2).astype(np.float32)
    for stats, changes in ((np.array(bad, np.float32), False), (np.array([3.0, 0.5], np.float32), True)):
        for version in (1, 2):
            dev = [cuda.to_device(a) for a in (p, m, v, g)]
            if version == 1:
                lab_optim.adamw_grid_stride(dev[0], dev[3], dev[1], dev[2], cuda.to_device(decay), t, lr, b1, b2, eps, wd,
                               cuda.to_device(stats))
                twin = R.adamw(p, g, m, v, decay, t, lr, b1, b2, eps, wd, stats)
            else:
                lab_optim.adamw_v2(dev[0], dev[3], dev[1], dev[2], cuda.to_device(decay), cuda.to_device(hyper),
                               b1, b2, eps, wd, cuda.to_device(stats))
                twin = R.adamw_zero(p, g, m, v, decay, hyper, b1, b2, eps, wd, stats)
                twin = (twin[0], *twin[2:])
                assert not dev[3].copy_to_host().any()                  # the gradient is cleared
            for before, kernel, ref in zip((p, m, v), dev, twin):
                after = kernel.copy_to_host()
                if changes:
                    assert not np.array_equal(after, before) and not np.array_equal(ref, before)
                else:
                    assert after.tobytes() == before.tobytes() and ref.tobytes() == before.tobytes()


def test_adamw_v2_is_v1_then_zero_bit_for_bit():
    """The engine's AdamW (lr and bias corrections read from the device, the gradient cleared)
    takes exactly v1's step: the same float32 values in the same operations."""
    from numba import cuda

    import reference as R
    from lab import optim as lab_optim
    rng = np.random.default_rng(1)
    n = 1000
    p, g, m = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    v = rng.random(n).astype(np.float32)
    decay = cuda.to_device((rng.random(n) < 0.5).astype(np.uint8))
    stats = cuda.to_device(np.array([3.0, 0.5], np.float32))
    for t, lr in ((1, 1e-3), (7, 3e-2), (500, 6e-4)):
        one, two = [[cuda.to_device(a) for a in (p, g, m, v)] for _ in range(2)]
        lab_optim.adamw_grid_stride(one[0], one[1], one[2], one[3], decay, t, lr, 0.9, 0.95, 1e-8, 0.1, stats)
        lab_optim.zero(one[1])
        hyper = cuda.to_device(R.adamw_hyper(t, lr, 0.9, 0.95).astype(np.float32))
        lab_optim.adamw_v2(two[0], two[1], two[2], two[3], decay, hyper, 0.9, 0.95, 1e-8, 0.1, stats)
        for a, b in zip(one, two):
            assert a.copy_to_host().tobytes() == b.copy_to_host().tobytes()
