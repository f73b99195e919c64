"""Every backward of the twin passes float64 centred differences, and a wrong one is caught."""
import json
import subprocess
import sys

import numpy as np
import pytest

import reference as R
from andrea_numba import gradcheck as G

OPS = {"embed", "layernorm", "attn_qkv", "attn", "attn_out", "mlp", "residual", "loss"}


@pytest.mark.parametrize("case", G.op_cases(), ids=lambda c: c.op)
def test_op_backward_matches_centred_differences(case):
    rows = G.check_op(case)
    assert {r["tensor"] for r in rows} == set(case.inputs)
    for r in rows:
        assert r["rel_err"] <= 1e-7, r


def test_whole_model_flat_gradient():
    rows = G.check_model("tiny")
    assert rows[-1]["tensor"] == "flat gradient"
    for r in rows:
        assert r["rel_err"] <= 1e-7, r


def test_a_wrong_backward_fails_the_check():
    """Plant a missing term (layernorm backward without its mean-subtraction): the check must fail."""
    case = next(c for c in G.op_cases() if c.op == "layernorm")

    def wrong_bwd(dout, x, g, b):
        _, mean, rstd = R.layernorm_fwd(x, g, b)
        dx, dg, db = R.layernorm_bwd(dout, x, mean, rstd, g)
        dxhat = dout * g
        return {"x": dx + rstd[..., None] * dxhat.mean(-1, keepdims=True), "g": dg, "b": db}

    case.backward = wrong_bwd
    rows = {r["tensor"]: r for r in G.check_op(case)}
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


def test_command_line_json_lists_all_ops_and_the_model():
    p = subprocess.run([sys.executable, "-m", "andrea_numba.gradcheck", "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] is True
    assert {c["op"] for c in out["checks"]} == OPS | {"model"}
    assert all(set(c) == {"op", "tensor", "rel_err", "ok"} for c in out["checks"])
    assert all(c["ok"] and c["rel_err"] <= 1e-7 for c in out["checks"])
