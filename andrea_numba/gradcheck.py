"""Gradient checks: every backward of the NumPy twin against float64 centred differences.

    python -m andrea_numba.gradcheck          # one row per checked tensor
    python -m andrea_numba.gradcheck --json   # {"ok": bool, "checks": [{"op", "tensor", "rel_err", "ok"}]}

The ops are the op cases of andrea_numba/cases.py: the eight pairs of the kernel table and
dropout, flash attention's twin and the fused residual + LayerNorm (cases.VARIANTS), with their
input makers and upstream gradients. Dropout's mask is a function of a key and the element index, and the key is an input
that is never perturbed: every evaluation draws the same mask, so the check sees the op with its
mask fixed, as the backward does. An op maps inputs to outputs. With a random upstream gradient G
for each output, the scalar
    f(inputs) = sum over outputs of sum(G * output)
has d f / d input = exactly what the op's backward returns when handed G as grad_output. So we
perturb every element of every input and parameter by +-h and compare
    numeric[i] = (f(x + h e_i) - f(x - h e_i)) / (2h)
with the analytic gradient. Relative error (CS231n), taken over the whole tensor:
    rel_err = max_i |a_i - n_i| / max(1e-8, max_i (|a_i| + |n_i|))
above 1e-2 the backward is wrong, around 1e-4 suspicious, at 1e-7 or below right (in float64).
"""
from __future__ import annotations

import json
import sys
from typing import Callable

import numpy as np

import reference as R

from .cases import CASES, OPS, VARIANTS, Dims, OpCase
from .config import load_config
from .layout import init_params

TOL = 1e-7          # a row passes at or below this relative error
H = 1e-5            # centred-difference step in float64


def rel_error(a, n) -> float:
    """max|a - n| / max(1e-8, max(|a| + |n|)) over all elements of the tensor."""
    a, n = np.asarray(a, dtype=np.float64), np.asarray(n, dtype=np.float64)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - n)) / max(1e-8, float(np.max(np.abs(a) + np.abs(n)))))


def numerical_gradient(f: Callable[[], float], x: np.ndarray, h: float = H, order: int = 2) -> np.ndarray:
    """Centred difference of the scalar f() with respect to every element of x (x is perturbed
    in place and restored). f must read x each time it is called.
      order 2: (f(x+h) - f(x-h)) / 2h                                  error O(h^2)
      order 4: (-f(x+2h) + 8 f(x+h) - 8 f(x-h) + f(x-2h)) / 12h        error O(h^4)
    Order 4 is for deep compositions (the whole model), where the O(h^2) error of a step large
    enough to beat rounding is itself near 1e-7."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)    # views: writes reach x and grad

    def f_at(i, value):
        flat[i] = value
        return f()

    for i in range(flat.size):
        old = flat[i]
        if order == 2:
            gflat[i] = (f_at(i, old + h) - f_at(i, old - h)) / (2 * h)
        else:
            gflat[i] = (-f_at(i, old + 2 * h) + 8 * f_at(i, old + h)
                        - 8 * f_at(i, old - h) + f_at(i, old - 2 * h)) / (12 * h)
        flat[i] = old
    return grad


# The op checks' sizes: tiny, in float64; V = 7 < B*T so token ids repeat; T_max > T so rows of
# wpe past T must get exactly zero gradient.
DIMS = Dims(B=2, T=5, C=8, H=2, V=7, T_max=7)


def op_values(case: OpCase, seed: int = 0, dims: Dims = DIMS):
    """(values, outs, upstream) of check_op: the float64 inputs, the forward's outputs and one random
    upstream gradient G per output. The backward is called with all three."""
    values = case.make(dims, np.random.default_rng(seed))
    outs = case.forward(values)
    return values, outs, case.upstream_for(outs, np.random.default_rng(seed + 1))


def check_op(case: OpCase, seed: int = 0, dims: Dims = DIMS, backward=None) -> list[dict]:
    """Rows {"op", "tensor", "rel_err", "ok"} for every differentiable tensor of one op (a case
    of andrea_numba.cases). backward: a function with the twin's signature to check in its place
    (the exercise grader passes the student's)."""
    values, outs, upstream = op_values(case, seed, dims)             # values: read by f below

    def f():
        now = case.forward(values)
        return float(sum(np.sum(g * now[case.upstream[u]]) for u, g in upstream.items()))

    analytic = case.backward({**values, **outs, **upstream}, twin=backward)
    rows = []
    for name in case.differentiable():
        err = rel_error(analytic["d" + name], numerical_gradient(f, values[name]))
        rows.append({"op": case.op, "tensor": name, "rel_err": err, "ok": err <= TOL})
    return rows


MODEL_DROPOUT = 0.1


def check_model(size: str = "tiny", seed: int = 0, batch: int = 2) -> list[dict]:
    """The whole model's flat gradient (every parameter) against centred differences, one row per
    tensor of the layout plus one row for the whole flat vector. A training forward: dropout on
    (p = MODEL_DROPOUT at every site) with one fixed key, so every evaluation draws the same masks."""
    from .layout import param_layout

    cfg = load_config(size)
    m = cfg.model
    rng = np.random.default_rng(seed)
    # a larger init than GPT-2's 0.02 so every path carries gradients well above rounding noise
    params = init_params(m, seed).astype(np.float64)
    params += 0.1 * rng.standard_normal(params.shape)
    T = min(cfg.train.seq_len, m.context_length)
    tokens = rng.integers(0, m.vocab_size, size=(batch, T))
    targets = rng.integers(0, m.vocab_size, size=(batch, T))
    key = R.dropout_key(seed, 0, 0)
    loss, acts = R.model_forward(params, m, tokens, targets, MODEL_DROPOUT, key)
    analytic = R.model_backward(params, m, acts)
    numeric = numerical_gradient(lambda: float(R.model_forward(params, m, tokens, targets, MODEL_DROPOUT, key)[0]),
                                 params, h=1e-4, order=4)
    rows = []
    for s in param_layout(m):
        err = rel_error(analytic[s.offset:s.end], numeric[s.offset:s.end])
        rows.append({"op": "model", "tensor": s.name, "rel_err": err, "ok": err <= TOL})
    err = rel_error(analytic, numeric)
    rows.append({"op": "model", "tensor": "flat gradient", "rel_err": err, "ok": err <= TOL})
    return rows


def run_all(seed: int = 0, progress: bool = False) -> list[dict]:
    rows = []
    for case in (CASES[op] for op in OPS + VARIANTS):
        rows += check_op(case, seed)
        if progress:
            print(f"  checked {case.op}", file=sys.stderr, flush=True)
    rows += check_model("tiny", seed)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'op':<10} {'tensor':<16} {'rel_err':>10}  result", "-" * 46]
    for r in rows:
        lines.append(f"{r['op']:<10} {r['tensor']:<16} {r['rel_err']:>10.2e}  {'pass' if r['ok'] else 'FAIL'}")
    n_bad = sum(not r["ok"] for r in rows)
    lines.append("-" * 46)
    lines.append(f"{len(rows) - n_bad}/{len(rows)} tensors pass at rel_err <= {TOL:.0e} (float64, h={H:.0e})")
    return "\n".join(lines)


def main(argv=None) -> int:
    from . import cli
    ap = cli.Parser(prog="python -m andrea_numba.gradcheck",
                    description="Check every backward of the NumPy twin against float64 centred differences.")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--seed", type=cli.seed, default=0, help="seed of the random inputs (default 0)")
    args = ap.parse_args(argv)
    rows = run_all(args.seed, progress=not args.json)
    ok = all(r["ok"] for r in rows)
    if args.json:
        print(json.dumps({"ok": ok, "checks": rows}, indent=1))
    else:
        print(format_table(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
