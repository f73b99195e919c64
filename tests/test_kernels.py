"""Every kernel pair, the utility kernels and the whole GPU model agree with the NumPy twin
(in the CUDA simulator at the tiny size), are deterministic, write every output element and add
into parameter gradients: the agreement harness, run as a test."""
import json
import subprocess
import sys

import pytest

from andrea_numba import check

OPS = {"embed", "layernorm", "attn_qkv", "attn", "attn_out", "mlp", "residual", "loss"}
UTILITIES = {"grad_norm", "grad_scale", "adamw", "zero"}


@pytest.fixture(scope="module")
def rows():
    return check.run_checks("tiny", seed=1234)


def test_every_op_pair_and_utility_is_checked(rows):
    ops = {r["op"] for r in rows}
    assert OPS | UTILITIES | {"model"} <= ops
    assert {"embed v1", "attn v1"} <= ops                     # the simple versions stay checked


@pytest.mark.parametrize("op", sorted(OPS | UTILITIES | {"model", "embed v1", "attn v1"}))
def test_kernels_agree_with_the_twin(rows, op):
    mine = [r for r in rows if r["op"] == op]
    assert mine
    for r in mine:
        assert r["ok"], r
        assert r["bitwise_repeat"], r


def test_whole_model_checks_loss_and_every_gradient_tensor(rows):
    from andrea_numba.config import load_config
    from andrea_numba.layout import param_layout
    names = {r["tensor"] for r in rows if r["op"] == "model"}
    assert names == {"loss"} | {"d " + s.name for s in param_layout(load_config("tiny").model)}


def test_command_line_json(tmp_path):
    p = subprocess.run([sys.executable, "-m", "andrea_numba.check", "--json", "--seed", "7", "--ops-only"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["ok"] is True and out["seed"] == 7 and "simulator" in out["device"]
    for r in out["results"]:
        assert {"op", "tensor", "max_abs_err", "rel_err", "tol", "ok"} <= set(r)
    assert "seed 7" in p.stderr
