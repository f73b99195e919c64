"""Training end to end in the CUDA simulator at the tiny size: the loss falls, a run stopped by
SIGTERM resumes bit-exactly, SIGUSR1 checkpoints and continues, checkpoints are atomic, nothing is
allocated on the device inside the loop, and bad input gets one clear line and exit code 2."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from andrea_numba import checkpoint as ck
from andrea_numba import train as tr
from andrea_numba.config import config_from_dict, load_config
from andrea_numba.layout import n_params
from andrea_numba.runlog import read_loss

SIM_ENV = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONUNBUFFERED": "1"}


def small_config(tmp_path, **train):
    """ANDREA-tiny with microbatches small enough for the simulator (1 x 8 tokens, 2 per step)."""
    raw = load_config("tiny").to_dict()
    raw["name"] = "ANDREA-tiny-test"
    raw["train"].update(dict(batch_size=1, seq_len=8, n_microbatches=2, steps=4, lr=3e-2, min_lr=3e-3,
                             warmup_steps=1, eval_interval=2, eval_batches=1, checkpoint_interval=100,
                             sample_interval=100, sample_tokens=4), **train)
    path = tmp_path / "tiny-test.json"
    path.write_text(json.dumps(raw))
    return path, config_from_dict(raw)


def run_train(*args, **kw):
    return subprocess.run([sys.executable, "-m", "andrea_numba.train", *map(str, args)], env=SIM_ENV,
                          capture_output=True, text=True, **kw)


def losses(run_dir):
    return [(r["step"], r["train_loss"], r.get("val_loss"), r["lr"], r["grad_norm"]) for r in read_loss(run_dir)]


def test_loss_falls_and_no_device_allocation_inside_the_loop(tmp_path, monkeypatch):
    _, cfg = small_config(tmp_path, steps=8)
    trainer = tr.Trainer(cfg, tmp_path / "run", log=lambda s: None)
    trainer.setup()
    from numba import cuda

    def forbidden(*a, **k):
        raise AssertionError("device allocation inside the training loop")
    for name in ("device_array", "device_array_like", "to_device", "pinned_array", "mapped_array", "managed_array"):
        if hasattr(cuda, name):
            monkeypatch.setattr(cuda, name, forbidden)
    assert trainer.run() == 0                                # 8 steps, evaluations, a sample, a checkpoint
    log = read_loss(tmp_path / "run")
    assert [r["step"] for r in log] == list(range(1, 9))
    first, last = np.mean([r["train_loss"] for r in log[:2]]), np.mean([r["train_loss"] for r in log[-2:]])
    assert last < first - 0.2, (first, last)
    assert log[-1]["val_loss"] < log[1]["val_loss"]
    samples = [json.loads(s) for s in (tmp_path / "run" / ".samples.json").read_text().splitlines()]
    assert samples[-1]["step"] == 8 and isinstance(samples[-1]["text"], str)
    state = json.loads((tmp_path / "run" / ".state.json").read_text())
    assert state["step"] == 8 and state["tokens_seen"] == 8 * 2 * 8
    assert (tmp_path / "run" / "checkpoint.bin").stat().st_size == ck.checkpoint_bytes(n_params(cfg.model))


def _wait_for(pred, proc, timeout=240):
    t0 = time.time()
    while not pred():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.05)


def test_sigterm_then_resume_is_bit_exact_and_sigusr1_continues(tmp_path):
    cfg_path, cfg = small_config(tmp_path, steps=5)
    # the run that is never stopped
    p = run_train("--config", cfg_path, "--out", tmp_path / "a")
    assert p.returncode == 0, p.stderr
    # the run that gets SIGUSR1 after step 1 and SIGTERM after the checkpoint it asked for
    b = tmp_path / "b"
    proc = subprocess.Popen([sys.executable, "-m", "andrea_numba.train", "--config", str(cfg_path), "--out", str(b),
                             "--log-every", "1"], env=SIM_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: len(read_loss(b)) >= 1, proc)
    proc.send_signal(signal.SIGUSR1)
    _wait_for(lambda: (b / "checkpoint.bin").exists(), proc)
    usr1_step = json.loads((b / ".state.json").read_text())["step"]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    stopped = json.loads((b / ".state.json").read_text())["step"]
    assert 1 <= usr1_step <= stopped < 5, (usr1_step, stopped)      # SIGUSR1 went on training
    assert f"stopped by signal at step {stopped}" in out
    p = run_train("--resume", b)
    assert p.returncode == 0, p.stderr
    assert f"resumed from {b / 'checkpoint.bin'} at step {stopped}" in p.stdout
    assert losses(b) == losses(tmp_path / "a")                       # the same values, bit for bit
    assert (b / "checkpoint.bin").read_bytes() == (tmp_path / "a" / "checkpoint.bin").read_bytes()
    lines = (b / ".loss.json").read_text().splitlines()
    assert len(lines) == 5                                           # appended, nothing lost or repeated


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
    assert list(header) == [3, 6] and len(before) == 8 + 3 * 4 * 6  # the spec's layout


def test_bad_checkpoints_are_refused_with_one_line(tmp_path):
    n = 6
    a = np.ones(n, np.float32)
    path = tmp_path / "c.bin"
    sha = ck.save_checkpoint(path, 2, a, a, a)
    good = path.read_bytes()
    path.write_bytes(good[:-4])
    with pytest.raises(ck.CheckpointError, match="truncated or corrupt"):
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


def test_sample_on_kernels_and_twin_then_refuse_a_corrupt_checkpoint(tmp_path):
    cfg_path, _ = small_config(tmp_path, steps=1)
    run = tmp_path / "r"
    assert run_train("--config", cfg_path, "--out", run).returncode == 0
    texts = []
    for extra in ([], ["--cpu"]):
        p = subprocess.run([sys.executable, "-m", "andrea_numba.sample", str(run), "--prompt", "def ", "--tokens", "6",
                            "--seed", "3", *extra], env=SIM_ENV, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith("def ")
        texts.append(p.stdout)
    assert texts[0] == texts[1]           # the kernels and the twin sample the same tokens
    data = bytearray((run / "checkpoint.bin").read_bytes())
    data[100] ^= 0xFF
    (run / "checkpoint.bin").write_bytes(bytes(data))
    p = run_train("--resume", run, "--steps", 2)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1
    assert "does not match the sha256" in p.stderr
    again = run_train("--config", cfg_path, "--out", run)          # never overwrite an existing run
    assert again.returncode == 2 and "--resume" in again.stderr


@pytest.mark.parametrize("args,message", [
    (["--data", "no/such/file.txt"], "not found"),
    (["--size", "7B"], "unknown size '7B'"),
    (["--batch-size", "0"], "train.batch_size"),
    (["--resume", "no/such/run"], "no .state.json"),
])
def test_bad_input_gives_one_line_and_exit_2(tmp_path, args, message):
    p = run_train(*args, "--out", tmp_path / "x") if "--resume" not in args else run_train(*args)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert message in p.stderr
    assert not (tmp_path / "x" / "checkpoint.bin").exists()


def test_memory_plan_refuses_and_suggests_a_smaller_microbatch():
    cfg = load_config("120M")
    plan = tr.memory_plan(cfg)
    total = sum(r[2] for r in plan)
    assert {"params", "grads", "optimizer", "activations", "scratch", "sampler"} == {r[0] for r in plan}
    P = n_params(cfg.model)
    assert sum(r[2] for r in plan if r[1] in ("params", "grads", "adam_m", "adam_v")) == 4 * 4 * P
    assert tr.check_fits(cfg, free_bytes=2 * total) == total
    with pytest.raises(tr.TrainError, match=r"--batch-size \d+ --microbatches \d+") as e:
        tr.check_fits(cfg, free_bytes=8 * 2**30)                    # an 8 GB card
    assert "GiB" in str(e.value) and "\n" not in str(e.value)
