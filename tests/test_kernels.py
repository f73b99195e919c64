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


@pytest.fixture(scope="module")
def rows():
    return check.run_checks("tiny", seed=1234)


@pytest.mark.slow
def test_every_version_at_every_block_size_has_a_harness_row(rows):
    """A new version in a module's VERSIONS is checked without another edit; one the harness misses fails."""
    seen = {(r["op"], r.get("kernel"), r.get("version"), r.get("block")) for r in rows}
    for case in CASES.values():
        for direction in ("fwd", "bwd") if case.bwd else ("fwd",):
            kernel = case.fwd if direction == "fwd" else case.bwd
            for version, launch in case.versions(direction).items():
                assert len(launch.blocks) >= 2, f"{launch.__name__}: check at two block sizes or more"
                for block in launch.blocks:
                    key = (case.op, kernel, version, str(block).replace(" ", ""))
                    assert key in seen, f"no harness row for {key}"


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(CASES))
def test_kernels_agree_with_the_twin(rows, op):
    mine = [r for r in rows if r["op"] == op]
    assert mine
    for r in mine:
        assert r["ok"], r
        assert r["bitwise_repeat"], r


@pytest.mark.slow
def test_whole_model_checks_loss_and_every_gradient_tensor(rows):
    from andrea_numba.config import load_config
    from andrea_numba.layout import param_layout
    model = [r for r in rows if r["op"] == "model"]
    assert {r["tensor"] for r in model} == {"loss"} | {"d " + s.name for s in param_layout(load_config("tiny").model)}
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
