"""train --kernel EXERCISE=FILE: a student's kernel, graded first, trains the model in the engine's place.

A run with the three solution kernels follows the engine's run to float32 rounding (measured: the
same losses, the weights within 1e-6), the students' kernels are the ones launched, and the state
records their files; the position-embedding solution, the engine's own sums, gives its gradient bit
for bit. A resume trains on with
the same files and refuses a changed one. A wrong-but-plausible kernel, a stub and a kernel that
passes the grader but not in place, as the trainer runs it, are refused before anything is written.
"""
import argparse
import io
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from andrea_numba import train as tr
from andrea_numba import your_kernels as Y
from andrea_numba.atomic import file_sha256
from andrea_numba.checkpoint import load_checkpoint
from andrea_numba.config import config_from_dict, load_config
from andrea_numba.gpu_model import GPUModel
from andrea_numba.kernels.common import SIMULATOR
from andrea_numba.layout import init_params, n_params
from andrea_numba.runlog import read_loss

pytestmark = [pytest.mark.xdist_group("train_kernel")]     # one worker of `pytest -n` runs the module fixture

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "lessons" / "solutions"
STEPS = 2


def small_config(tmp_path):
    """ANDREA-tiny with one block and one microbatch of 1 x 8 tokens a step (the simulator pays per
    launch), on a small corpus file; no sampling or evaluation before the last step."""
    corpus = tmp_path / "corpus.txt"
    words = "the cat sat on a mat and the dog ran to the old tree".split()
    corpus.write_text(" ".join(np.random.default_rng(0).choice(words, 3000)) + "\n")
    raw = load_config("tiny").to_dict()
    raw["name"] = "ANDREA-tiny-kernel"
    raw["model"]["n_layer"] = 1
    raw["data"]["source"] = str(corpus)
    # warmup_steps=2: the lr of steps 1 and 2 does not depend on train.steps, so a run of 1 step resumed
    # to 2 follows a run of 2
    raw["train"].update(batch_size=1, seq_len=8, n_microbatches=1, steps=STEPS, warmup_steps=2, eval_interval=100,
                        eval_batches=1, checkpoint_interval=1, sample_interval=100, sample_tokens=1)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(raw))
    return path, config_from_dict(raw)


def with_body(name: str, body: str) -> str:
    """The exercise file with its TODO and raise replaced by `body`."""
    text = (ROOT / "lessons" / "exercises" / f"{name}.py").read_text()
    text, n = re.subn(r"    # TODO:.*\n    raise NotImplementedError\(.*\)\n", body, text)
    assert n == 1
    return text


def main_in_process(capsys, *args):
    capsys.readouterr()
    code = tr.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


class Capture:
    """stdout and stderr of tr.main, read in parts (a module fixture has no capsys)."""

    def __enter__(self):
        self.saved, self.buf = (sys.stdout, sys.stderr), io.StringIO()
        sys.stdout = sys.stderr = self.buf
        return self

    def read(self):
        text = self.buf.getvalue()
        self.buf.seek(0)
        self.buf.truncate()
        return text

    def __exit__(self, *exc):
        sys.stdout, sys.stderr = self.saved


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The engine's run, and the same run with the three solution kernels (copies, so a test may
    change one): one step, then --resume to the second, every kernel launch of the steps recorded."""
    root = tmp_path_factory.mktemp("kernel_runs")
    cfg_path, cfg = small_config(root)
    engine = tr.Trainer(cfg, root / "engine", log=lambda s: None)
    engine.setup()
    engine.run()
    files = {}
    for name in Y.SLOTS:
        files[name] = root / "mine" / f"{name}.py"
        files[name].parent.mkdir(exist_ok=True)
        shutil.copy(SOLUTIONS / f"{name}.py", files[name])
    flags = [a for name, f in files.items() for a in ("--kernel", f"{name}={f}")]
    launched = []
    with pytest.MonkeyPatch.context() as mp, Capture() as cap:
        if SIMULATOR:
            from numba.cuda.simulator.kernel import FakeCUDAKernel
            launch = FakeCUDAKernel.__getitem__
            mp.setattr(FakeCUDAKernel, "__getitem__",
                       lambda k, config: (launched.append((k.fn.__name__, k.fn.__code__.co_filename)),
                                          launch(k, config))[1])
        first = tr.main([str(a) for a in ("--config", cfg_path, "--out", root / "mine" / "run", "--steps", 1, *flags)])
        first_out = cap.read()
        second = tr.main([str(a) for a in ("--resume", root / "mine" / "run", "--steps", STEPS)])
        second_out = cap.read()
    return dict(root=root, cfg=cfg, cfg_path=cfg_path, engine=root / "engine", run=root / "mine" / "run", files=files,
                codes=(first, second), outs=(first_out, second_out), launched=launched)


@pytest.mark.slow
def test_the_solution_kernels_train_as_the_engine_does(runs):
    assert runs["codes"] == (0, 0), runs["outs"]
    mine, engine = read_loss(runs["run"]), read_loss(runs["engine"])
    assert [r["step"] for r in mine] == [r["step"] for r in engine] == [1, 2]
    # the loss of every step within float32 rounding of the engine's (measured: equal); the gradient
    # norm too (the loss's dx and dwte come from the tiled matmul, not 3xTF32 with split-K)
    for a, b in zip(mine, engine):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5), (a, b)
    n = n_params(runs["cfg"].model)
    w_mine = load_checkpoint(runs["run"] / "checkpoint.bin", n)[1]
    w_engine = load_checkpoint(runs["engine"] / "checkpoint.bin", n)[1]
    assert not np.array_equal(w_mine, w_engine)          # another kernel ran: not the same bits ...
    assert np.max(np.abs(w_mine - w_engine)) < 1e-5      # ... but the same weights to float32 rounding


@pytest.mark.slow
@pytest.mark.skipif(not SIMULATOR, reason="records the simulator's launches")
def test_the_students_kernels_are_launched_and_the_engines_are_not(runs):
    mine = {str(f.resolve()) for f in runs["files"].values()}
    by_file = {}
    for name, file in runs["launched"]:
        by_file.setdefault(name, set()).add(str(Path(file).resolve()))
    # each exercise's kernel from the student's file, one launch per microbatch of each step at least
    for kernel in ("k_layernorm_bwd", "k_loss_bwd", "k_embed_bwd_wpe", "k_layernorm_bwd_params"):
        assert by_file.get(kernel, set()) & mine, (kernel, by_file.get(kernel))
    # the engine's kernels that the students' replace: not one launch (the checks at the run's widths
    # launch the students' only); the engine's dwte stays
    for kernel in ("k_layernorm_bwd_multirow", "k_layernorm_bwd_params_partial", "k_layernorm_bwd_params_sum"):
        assert kernel not in by_file, kernel
    assert "k_embed_bwd_sorted" in by_file and "k_embed_bwd_sort" in by_file
    engine_wpe = str((ROOT / "andrea_numba" / "kernels" / "embed.py").resolve())
    assert engine_wpe not in by_file["k_embed_bwd_wpe"]
    assert by_file["k_loss_bwd"] == {str(runs["files"]["k_loss_bwd"].resolve())}


@pytest.mark.slow
def test_the_log_and_the_state_say_whose_kernels_ran_and_a_resume_keeps_them(runs):
    first, second = runs["outs"]
    for out in (first, second):
        assert "layernorm backward (LNf's" in out and "loss backward" in out and "position-embedding backward" in out
        for name, rows in (("k_layernorm_bwd", "3/3 rows agree; at this run's widths: 3/3"),
                           ("k_loss_bwd", "2/2 rows agree; at this run's widths: 2/2"),
                           ("k_embed_bwd_wpe", "1/1 rows agree; at this run's widths: 2/2")):   # and the engine's dwte
            assert f"your kernel from {runs['files'][name]} (graded: {rows})" in out
    assert f"resumed from {runs['run'] / 'checkpoint.bin'} at step 1" in second
    state = json.loads((runs["run"] / ".state.json").read_text())
    assert set(state["kernels"]) == set(Y.SLOTS)
    for name, f in runs["files"].items():
        r = state["kernels"][name]
        assert Path(r["file"]) == f.resolve() and r["sha256"] == file_sha256(f) and r["op"] == Y.SLOTS[name].op
    assert "kernels" not in json.loads((runs["engine"] / ".state.json").read_text())


@pytest.mark.slow
def test_a_resume_refuses_a_changed_or_missing_kernel_file_and_a_new_kernel_flag(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs["run"], run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    f = runs["files"]["k_loss_bwd"]
    original = f.read_text()
    try:
        f.write_text(original + "\n# changed after the run started\n")
        code, _, err = main_in_process(capsys, "--resume", run, "--steps", STEPS + 1)
        assert code == 2 and len(err) == 1 and "which has changed since" in err[0] and "k_loss_bwd" in err[0], err
        f.unlink()
        code, _, err = main_in_process(capsys, "--resume", run, "--steps", STEPS + 1)
        assert code == 2 and len(err) == 1 and "which is gone" in err[0], err
    finally:
        f.write_text(original)
    code, _, err = main_in_process(capsys, "--resume", run, "--steps", STEPS + 1, "--kernel",
                                   f"k_loss_bwd={SOLUTIONS / 'k_loss_bwd.py'}")
    assert code == 2 and len(err) == 1 and "--kernel cannot be given with --resume" in err[0], err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_the_position_embedding_kernel_gives_the_engines_gradient_bit_for_bit(tmp_path):
    """k_embed_bwd_wpe's solution sums over b in the engine's order: one forward and backward with its
    adapter (the engine's dwte, then the student's dwpe) gives every gradient the engine's bits."""
    _, cfg = small_config(tmp_path)
    mine = Y.prepare([("k_embed_bwd_wpe", SOLUTIONS / "k_embed_bwd_wpe.py")], cfg)
    tokens = np.random.default_rng(1).integers(0, cfg.model.vocab_size, (2, 1, 8)).astype(np.int32)
    grads = []
    for kernels in ([], mine):
        model = GPUModel(cfg.model, 1, 8)
        Y.install(model, kernels)
        assert (model.kernels["embed"][1] is mine[0].launch) == bool(kernels)
        model.params.copy_to_device(init_params(cfg.model, 1))
        model.forward(tokens[0], tokens[1])
        model.backward()
        grads.append(model.grads.copy_to_host())
    assert np.array_equal(grads[0], grads[1]) and np.any(grads[1] != 0)


WRONG_LAYERNORM = """\
    buf = cuda.shared.array(MAX_BLOCK, float32)
    row = cuda.blockIdx.x
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    C = x.shape[1]
    s1 = float32(0.0)
    for c in range(tid, C, nt):
        s1 += dout[row, c] * g[c]
    m1 = block_sum(buf, s1) * (float32(1.0) / float32(C))      # mean(dxhat), but not xhat * mean(dxhat * xhat)
    for c in range(tid, C, nt):
        dx[row, c] = rstd[row] * (dout[row, c] * g[c] - m1)
"""
# right on separate buffers (the grader's), wrong in place (the trainer's: dlogits is probs): thread 0
# reads probs at the target after the block has overwritten it
NOT_IN_PLACE_LOSS = """\
    row = cuda.blockIdx.x
    for v in range(cuda.threadIdx.x, probs.shape[1], cuda.blockDim.x):
        dlogits[row, v] = probs[row, v] * scale
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        dlogits[row, targets[row]] = (probs[row, targets[row]] - float32(1.0)) * scale
"""


@pytest.mark.parametrize("name,body,words", [
    ("k_layernorm_bwd", WRONG_LAYERNORM, ["does not pass the grader (fail, 2/3 rows agree): dx wrong",
                                          "did you subtract both means"]),
    ("k_loss_bwd", None, ["does not pass the grader (not implemented): not implemented yet (the TODO in"]),
    ("k_loss_bwd", NOT_IN_PLACE_LOSS, ["passes the grader but not at this run's widths", "dx wrong",
                                       "the trainer runs it in place"]),
], ids=["wrong", "stub", "not_in_place"])
def test_a_kernel_that_does_not_agree_trains_nothing(tmp_path, capsys, name, body, words):
    cfg_path, _ = small_config(tmp_path)
    f = tmp_path / f"{name}.py"
    f.write_text(with_body(name, body) if body else (ROOT / "lessons" / "exercises" / f"{name}.py").read_text())
    code, out, err = main_in_process(capsys, "--config", cfg_path, "--out", tmp_path / "run", "--kernel", f"{name}={f}")
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: --kernel {name}: "), err
    assert all(w in err[0] for w in words), err[0]
    assert out == "" and not (tmp_path / "run").exists()


@pytest.mark.parametrize("text,words", [
    ("k_layernorm_bwd", "must be EXERCISE=FILE"),
    ("=x.py", "must be EXERCISE=FILE"),
    ("k_nope=x.py", "unknown exercise 'k_nope': choose from k_layernorm_bwd, k_loss_bwd, k_embed_bwd_wpe"),
    ("layernorm_bwd=x.py", "layernorm_bwd is a NumPy exercise, and the trainer runs kernels; the kernel exercise "
                           "of its op is k_layernorm_bwd"),
    ("embed_bwd=x.py", "the kernel exercise of its op is k_embed_bwd_wpe"),
    ("k_residual_add_bwd=x.py", "k_residual_add_bwd cannot train: the model has no residual-add backward"),
    ("k_loss_bwd=no/such.py", "file 'no/such.py' does not exist"),
])
def test_the_flag_is_checked_in_one_line(text, words):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        Y.flag(text)
    assert words in str(e.value), str(e.value)


def test_a_kernel_exercise_trains_at_fp32_whatever_the_configs_precision():
    # the 12M config trains in bf16; the exercises are fp32 kernels, so --kernel makes the run fp32
    # unless --precision is given, and a precision other than fp32 is refused by prepare's check
    assert load_config("12M").train.precision == "bf16"
    k = "k_layernorm_bwd=lessons/exercises/k_layernorm_bwd.py"
    assert tr.build_config(tr.parser().parse_args(["--size", "12M", "--kernel", k])).train.precision == "fp32"
    assert tr.build_config(tr.parser().parse_args(["--size", "12M"])).train.precision == "bf16"
    cfg = tr.build_config(tr.parser().parse_args(["--size", "12M", "--kernel", k, "--precision", "bf16"]))
    with pytest.raises(Y.KernelError, match="fp32 recipe only"):
        Y._check_fp32(cfg)
