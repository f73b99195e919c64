"""Every version of every kernel launcher, at every block size it declares, agrees with the NumPy
twin (in the CUDA simulator at the tiny size, at shapes that cross tile edges), is deterministic,
writes every output element and adds into parameter gradients; so does the whole GPU model, whose
tolerance is tight enough to fail a gradient tensor that is 1% off. The agreement harness, run
as a test."""
import json
import subprocess
import sys

import numpy as np
import pytest

from andrea_numba import check
from andrea_numba.cases import CASES

UTILITIES = {"grad_norm", "grad_scale", "adamw", "zero", "matmul"}


def expected_rows(case) -> set:
    """(op, kernel, version, block) of every version of the case's launchers at every block size."""
    keys = set()
    for direction in ("fwd", "bwd") if case.bwd else ("fwd",):
        kernel = case.fwd if direction == "fwd" else case.bwd
        for version, launch in case.versions(direction).items():
            assert len(launch.blocks) >= 2, f"{launch.__name__}: check at two block sizes or more"
            keys |= {(case.op, kernel, version, str(block).replace(" ", "")) for block in launch.blocks}
    return keys


# One harness run per op (not one for all): each is a test of its own, so `pytest -n` spreads them
# over the CPU's cores.
@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(CASES))
def test_kernels_agree_with_the_twin(op):
    """Every version of the op's launchers at every block size it declares has a harness row (a new
    version in a module's VERSIONS is checked without another edit; one the harness misses fails),
    agrees with the twin and reruns bit-identically."""
    rows = check.run_checks("tiny", seed=1234, model=False, only=[op])
    mine = [r for r in rows if r["op"] == op]
    assert mine and len(mine) == len(rows)
    seen = {(r["op"], r.get("kernel"), r.get("version"), r.get("block")) for r in mine}
    missing = expected_rows(CASES[op]) - seen
    assert not missing, f"no harness row for {sorted(missing)[:5]}"
    for r in mine:
        assert r["ok"], r
        assert r["bitwise_repeat"], r


@pytest.mark.slow
def test_whole_model_checks_loss_and_every_gradient_tensor():
    from andrea_numba.config import load_config
    from andrea_numba.layout import param_layout
    model = check.run_checks("tiny", seed=1234, ops=False)
    assert {r["op"] for r in model} == {"model", "model, flash attention"}
    for op in ("model", "model, flash attention"):
        assert {r["tensor"] for r in model if r["op"] == op} == \
            {"loss"} | {"d " + s.name for s in param_layout(load_config("tiny").model)}
    assert all(r["ok"] and r["bitwise_repeat"] for r in model)


def test_the_model_tolerance_fails_a_gradient_tensor_one_percent_off():
    """The kernels' float32 gradient passes; the same tensor scaled by 1.01 (or by 0.99) fails."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(500)
    kernel_like = (ref + ref * rng.standard_normal(500) * 1e-6).astype(np.float32)   # float32-grade error
    assert check.compare("model", "d w", kernel_like, ref, check.MODEL_TOL)["ok"]
    for f in (1.01, 0.99):
        assert not check.compare("model", "d w", (ref * f).astype(np.float32), ref, check.MODEL_TOL)["ok"]


def test_command_line_json(tmp_path):
    p = subprocess.run([sys.executable, "-m", "andrea_numba.check", "--json", "--seed", "7", "--op", "residual",
                        "--op", "zero"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["ok"] is True and out["seed"] == 7 and "simulator" in out["device"]
    assert {r["op"] for r in out["results"]} == {"residual", "zero"}
    for r in out["results"]:
        assert {"op", "kernel", "version", "block", "tensor", "max_abs_err", "rel_err", "tol", "ok"} <= set(r)
    assert "seed 7" in p.stderr
    p = subprocess.run([sys.executable, "-m", "andrea_numba.check", "--op", "softmax"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "unknown op 'softmax'" in p.stderr
