"""The step-through lessons run to the end in the CUDA simulator, print their key numbers and
write their figures. Each lesson runs as a student would run it: `python lessons/0X_....py`."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "lessons"
SIM_ENV = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}

# lesson file -> (strings the output must contain, figures it must write, extra arguments)
CASES = {
    "01_chain_rule.py": (
        ["dL/dx = dL/da * 3", "centred difference", "The two agree to a relative error of",
         "dL/da = sum of both paths", "Only the sum matches"],
        ["01_chain_tangent.png"], []),
    "02_why_reverse_mode.py": (
        ["124,392,960", "n_params = 3,792", "7,584 forwards", "2.038e+12 FLOPs", "years",
         "the largest difference, relative to the largest gradient"],
        ["02_passes.png"], []),
    "04_where_gradients_live.py": (
        ["| h1.mlp.w_2 | [32, 8] | 3,520 | 256 | yes |", "**3,792**", "np.shares_memory(flat, w)",
         "45,512", "1,492,715,528", "memory plan (bytes on the GPU):", "largest: probs 1572.0 MiB",
         "12 x 8192 x 3072"],
        ["04_memory_plan.png"], []),
    "07_tensor_cores.py": (
        ["mma.sync.m16n8k8", "a0 = A[g, t]", "3xTF32: small.big + big.small + big.big",
         "8 at a time, then fp32 adds (matmul v4)", "v4 (3xTF32)", "slot t + 4 holds", "v6 (3xTF32, k renamed)",
         "splitk's choice   8    2304      9          576       97%", "v8 (swizzled tiles), x^T @ x", "small = x - big, truncated by the tensor core (v7)",
         "(128-bit, x4)                            32            16              16"],
        ["07_tensor_cores.png"], []),
    "08_flash_attention.py": (
        ["lse = m + log(l)", "largest |flash - plain|", "att (probabilities, every layer)", "4,608.0",
         "attn_flash_fwd_tf32x3 / _bwd against the twin"],      # the engine's version
        ["08_flash_attention.png"], []),
    "09_skewed_sums.py": (
        ["positions in reverse", "the default corpus:", "positions of its most common token",
         "its list (positions, as links[0] chains them)", "key = token*S + position", "v2 and v3 bit for bit",
         "identical"],
        ["09_skewed_sums.png"], []),
    "10_number_formats.py": (
        ["bf16                8              7                 8", "1 + gap/2 (a tie)    1.0039062500  1.0000000000",
         "weight stays at 1.0000", "the total stops growing", "skip the step, halve S", "double S",
         "differs from the float64 product of the rounded inputs by", "cover k 0..15 once: True",
         "within fp32 rounding: True", "(the M-major read is right: True)", "of the scale off (right: False)"],
        ["10_number_formats.png"], []),
    "05_accumulation.py": (
        ["buffer (kernels)", "twin g1 + g2", "twin, one batch of 2", "Largest |scaled buffer - twin gradient"],
        ["05_grad_norms.png"], []),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_lesson_runs_to_the_end(name, tmp_path):
    expect, figures, extra = CASES[name]
    figs = tmp_path / "figures"
    cmd = [sys.executable, str(LESSONS / name), "--figures", str(figs), *(a.format(tmp=tmp_path) for a in extra)]
    p = subprocess.run(cmd, cwd=ROOT, env=SIM_ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for s in expect:
        assert s in p.stdout, f"{name}: {s!r} not in the output"
    assert "lesson done in" in p.stdout
    for f in figures:
        path = figs / f
        assert path.is_file() and path.stat().st_size > 1000, path
        assert str(path) in p.stdout                       # the lesson prints where its figures are


def test_lesson_06_runs_and_its_per_step_losses_are_bit_equal(tmp_path):
    """Lesson 06 runs to the end (one run: it is the longest lesson), and the resumed run's log and
    checkpoint equal the uninterrupted run's, read from the files it leaves in --out."""
    from andrea_numba.runlog import read_loss
    out, figs = tmp_path / "runs", tmp_path / "figures"
    p = subprocess.run([sys.executable, str(LESSONS / "06_checkpoints_and_resume.py"), "--figures",
                        str(figs), "--out", str(out)],
                       cwd=ROOT, env=SIM_ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for text in ("resumed from", "The checkpoints are identical: True", "02 00 00 00", "int32 n_params = 3,792",
                 "resumed trainer", "lesson done in"):
        assert text in p.stdout, text
    for f in ("06_loss_resumed_run.png", "06_loss_uninterrupted_run.png"):
        assert (figs / f).stat().st_size > 1000 and str(figs / f) in p.stdout
    a, b = out / "A-uninterrupted", out / "B-stopped-and-resumed"
    key = lambda rows: [(r["step"], r["train_loss"], r["grad_norm"], r["lr"]) for r in rows]
    assert key(read_loss(a)) == key(read_loss(b)) and len(read_loss(a)) == 3
    assert (a / "checkpoint.bin").read_bytes() == (b / "checkpoint.bin").read_bytes()
    again = subprocess.run([sys.executable, str(LESSONS / "06_checkpoints_and_resume.py"), "--out", str(out)],
                           cwd=ROOT, env=SIM_ENV, capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "already exists" in again.stderr      # never overwrites a run


def test_common_pauses_only_when_interactive(tmp_path):
    """--interactive waits for Enter between steps; a plain run (CI) never reads stdin."""
    script = tmp_path / "l.py"
    script.write_text("import sys\nsys.path.insert(0, %r)\nimport _common as C\nC.start('t')\n"
                      "C.step('a')\nC.step('b')\nC.finish()\n" % str(LESSONS))
    p = subprocess.run([sys.executable, str(script)], env=SIM_ENV, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60)
    assert p.returncode == 0 and "step 2: b" in p.stdout and "press Enter" not in p.stdout
    p = subprocess.run([sys.executable, str(script), "--interactive"], env=SIM_ENV, capture_output=True,
                       text=True, input="\n", timeout=60)
    assert p.returncode == 0 and p.stdout.count("press Enter") == 1      # between step 1 and step 2


def test_lessons_leave_one_folder_in_the_temporary_directory_and_print_no_warning(tmp_path):
    """Run without --figures, twice, the lessons draw into one reused folder (andrea-lessons/ in
    the temporary directory), not a new folder a run; lesson 03's trace prints no warning (its
    integer work buffers start at -7, not a NaN cast to an integer), and it says why a position
    past T has no gradient."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "NUMBA_ENABLE_CUDASIM": "1"}
    outs = [subprocess.run([sys.executable, "-W", "error::RuntimeWarning", str(LESSONS / name)], env=env,
                           capture_output=True, text=True, timeout=120)
            for name in ("01_chain_rule.py", "01_chain_rule.py", "03_one_backward_step.py")]
    for p in outs:
        assert p.returncode == 0, p.stderr[-2000:]
        assert "Warning" not in p.stdout + p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["andrea-lessons"]
    assert (tmp_path / "andrea-lessons" / "01_chain_tangent.png").is_file()
    trace = outs[2].stdout
    past = [line for line in trace.splitlines() if "finite difference wpe[" in line and ">= T = " in line]
    assert past and all("no token sits there" in line for line in past)
