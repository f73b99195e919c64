"""Every backward of the twin passes float64 centred differences, and a wrong one is caught."""
import json
import subprocess
import sys

import numpy as np
import pytest

import reference as R
from andrea_numba import gradcheck as G
from andrea_numba.cases import CASES
from andrea_numba.config import load_config
from andrea_numba.layout import param_layout

OPS = {"embed", "layernorm", "attn_qkv", "attn", "attn_out", "mlp", "residual", "dropout", "loss", "attn_flash",
       "residual_layernorm"}


@pytest.mark.parametrize("op", sorted(OPS))
def test_op_backward_matches_centred_differences(op):
    case = CASES[op]
    rows = G.check_op(case)
    inputs = case.make(G.DIMS, np.random.default_rng(0))
    differentiable = {k for k, v in inputs.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f"}
    assert {r["tensor"] for r in rows} == differentiable        # every float input is checked
    for r in rows:
        assert r["rel_err"] <= 1e-7, r


def test_a_wrong_backward_fails_the_check():
    """Plant a missing term (layernorm backward without its mean-subtraction): the check must fail."""
    def wrong_bwd(dout, x, mean, rstd, g):
        dx, dg, db = R.layernorm_bwd(dout, x, mean, rstd, g)
        dxhat = dout * g
        return dx + rstd[..., None] * dxhat.mean(-1, keepdims=True), dg, db

    rows = {r["tensor"]: r for r in G.check_op(CASES["layernorm"], backward=wrong_bwd)}
    assert not rows["x"]["ok"] and rows["x"]["rel_err"] > 1e-2
    assert rows["g"]["ok"] and rows["b"]["ok"]


def test_rel_error():
    assert G.rel_error(np.zeros(3), np.zeros(3)) == 0.0
    assert G.rel_error([1.0, 2.0], [1.0, 2.5]) == pytest.approx(0.5 / 4.5)


def test_numerical_gradient_orders():
    x = np.array([0.3, -1.2])
    f = lambda: float(np.sum(np.sin(x) * x))
    exact = np.cos(x) * x + np.sin(x)
    assert G.rel_error(G.numerical_gradient(f, x), exact) < 1e-9
    assert G.rel_error(G.numerical_gradient(f, x, h=1e-3, order=4), exact) < 1e-11
    assert np.array_equal(x, [0.3, -1.2])                  # restored


@pytest.mark.slow
def test_command_line_json_lists_all_ops_and_the_model():
    p = subprocess.run([sys.executable, "-m", "andrea_numba.gradcheck", "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] is True
    assert {c["op"] for c in out["checks"]} == OPS | {"model"}
    assert all(set(c) == {"op", "tensor", "rel_err", "ok"} for c in out["checks"])
    assert all(c["ok"] and c["rel_err"] <= 1e-7 for c in out["checks"])
    # the whole model (check_model, run once here: every parameter, about 15,000 twin forwards):
    # a row per tensor of the layout, then the flat vector, each to 1e-7
    model = [c for c in out["checks"] if c["op"] == "model"]
    assert model[-1]["tensor"] == "flat gradient" and len(model) == len(param_layout(load_config("tiny").model)) + 1
