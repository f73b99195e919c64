"""Flash attention v11 (bf16 products) and v12 (fp16) (kernels/attn_flash_lowp.py) and the twin at a
precision (reference/attn.py under products_in): the fp32 twin is the one it was, bit for bit; the
low-precision twin stays within a stated bound of the fp32 twin and rounds something (it is not the
fp32 twin); the kernels agree with the twin at their precision to fp32 rounding, at shapes of
several query and key tiles, with and without dropout, and rerun bit for bit. (The harness rows of
v11 and v12 at every simulator block, against the twin at their precision and against the fp32
twin, are checked in test_kernels.py.) About 5 s in the simulator."""
import math

import numpy as np
import pytest
from numba import cuda

import reference as R
from andrea_numba import check
from andrea_numba.kernels import attn_flash
from lab import attn_flash as lab_attn_flash
from reference.dropout import dropout_factor

pytestmark = [pytest.mark.xdist_group("attn_flash")]
KEY = 0x5EED1234
U = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}       # unit roundoff of the products' inputs


def _inputs(seed, B, T, C, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, T, C)).astype(dtype) for _ in range(4)]     # q, k, v, dy


def test_fp32_twin_is_the_flash_formula_bit_for_bit():
    """At fp32 (products_in("fp32") or none) the twin computes what it did before precisions: the
    same NumPy expressions, in the same order, give the same bits."""
    B, T, C, H = 2, 21, 16, 2
    q, k, v, dy = _inputs(0, B, T, C)
    heads = lambda x: x.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
    merge = lambda x: x.transpose(0, 2, 1, 3).reshape(B, T, C)
    qh, kh, vh, dyh = map(heads, (q, k, v, dy))
    scale = 1.0 / math.sqrt(C // H)
    s = np.where(np.triu(np.ones((T, T), bool), k=1), -np.inf, (qh @ kh.transpose(0, 1, 3, 2)) * scale)
    m = s.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True))
    p = np.exp(s - lse)
    f = dropout_factor(p.shape, 0.25, KEY, np.float64)
    y = merge((p * f) @ vh)
    ds = p * (f * (dyh @ vh.transpose(0, 1, 3, 2)) - (dyh * heads(y)).sum(axis=-1)[..., None])
    want = (y, lse[..., 0], merge((ds @ kh) * scale), merge((ds.transpose(0, 1, 3, 2) @ qh) * scale),
            merge((p * f).transpose(0, 1, 3, 2) @ dyh))
    for ctx in (R.products_in(None), R.products_in("fp32")):
        with ctx:
            y2, lse2 = R.attn_flash_fwd(q, k, v, H, 0.25, KEY)
            got = (y2, lse2, *R.attn_flash_bwd(dy, q, k, v, y, lse[..., 0], H, 0.25, KEY))
        for a, b in zip(got, want):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_twin_within_a_bound_of_the_fp32_twin(precision):
    """Every output of the twin at bf16 (fp16) lies within 8 u of the largest value of the fp32
    twin's output (u = 2^-8, 2^-11: the rounding of a product's inputs), and at least u / 64 away
    somewhere (the products are rounded). Measured: 0.11-2.4 u (bf16), 0.21-3.3 u (fp16) here."""
    u = U[precision]
    for seed, (B, T, C, H) in enumerate([(2, 21, 16, 2), (1, 37, 24, 2), (1, 64, 64, 1)]):
        q, k, v, dy = _inputs(seed, B, T, C)
        y, lse = R.attn_flash_fwd(q, k, v, H, 0.25, KEY)
        ref = (y, lse, *R.attn_flash_bwd(dy, q, k, v, y, lse, H, 0.25, KEY))
        with R.products_in(precision):
            y2, lse2 = R.attn_flash_fwd(q, k, v, H, 0.25, KEY)
            got = (y2, lse2, *R.attn_flash_bwd(dy, q, k, v, y, lse, H, 0.25, KEY))
        for name, a, r in zip(("y", "lse", "dq", "dk", "dv"), got, ref):
            rel = np.max(np.abs(a - r)) / np.max(np.abs(r))
            assert u / 64 < rel < 8 * u, (precision, seed, name, rel / u)


def _run(version, block, q, k, v, dy, p, n_head):
    """Forward, then backward on the forward's y and lse; outputs and work buffer poisoned with NaN."""
    fwd, bwd = lab_attn_flash.flash_pair(version)
    B, T, C = q.shape
    nan = lambda *shape: cuda.to_device(np.full(shape, np.nan, np.float32))
    q_d, k_d, v_d, dy_d = (cuda.to_device(a) for a in (q, k, v, dy))
    y, lse = nan(B, T, C), nan(B, n_head, T)
    fwd(y, lse, q_d, k_d, v_d, n_head, p, KEY, block=block)
    dq, dk, dv, d_rowdot = nan(B, T, C), nan(B, T, C), nan(B, T, C), nan(B, n_head, T)
    bwd(dq, dk, dv, d_rowdot, dy_d, q_d, k_d, v_d, y, lse, n_head, p, KEY, block=block)
    return {name: a.copy_to_host() for name, a in dict(y=y, lse=lse, dq=dq, dk=dk, dv=dv, d_rowdot=d_rowdot).items()}


# (version, dropout p, block, shape B, T, C, H, runs). v11 at block (1, 8), hs = 8 (padded to a
# k step of 16): two query tiles of 16 and three key tiles of 8 (half k16 steps over the keys),
# run twice. v12 at block (2, 16), hs = 12 (padded to 16), without dropout: two warps, two query
# tiles of 32 and three key tiles of 16, the last tiles partial.
RUNS = [pytest.param((11, 0.25, (1, 8), (1, 21, 16, 2), 2), id="v11-bf16-dropout"),
        pytest.param((12, 0.0, (2, 16), (1, 37, 24, 2), 1), id="v12-fp16-hs12-no-dropout")]


@pytest.mark.parametrize("run", RUNS)
def test_kernels_agree_with_the_twin_at_their_precision(run):
    """Against the twin under products_in(the launcher's precision), with the kernel's own y and
    lse as the backward's saved inputs (as the engine runs them): fp32 rounding apart (the harness's
    OP_TOL, and rel_err < 1e-5). Against the fp32 twin: within 8 u, as the twin itself. Reruns
    give the same bits."""
    version, p, block, (B, T, C, H), reruns = run
    fwd, bwd = lab_attn_flash.flash_pair(version)
    precision = fwd.precision
    assert bwd.precision == precision
    q, k, v, dy = _inputs(1, B, T, C, np.float32)
    got = [_run(version, block, q, k, v, dy, p, H) for _ in range(reruns)]
    q64, k64, v64, dy64 = (a.astype(np.float64) for a in (q, k, v, dy))
    y_k, lse_k = (got[0][n].astype(np.float64) for n in ("y", "lse"))

    def twin(at):
        with R.products_in(at):
            y, lse = R.attn_flash_fwd(q64, k64, v64, H, p, KEY)
            dq, dk, dv = R.attn_flash_bwd(dy64, q64, k64, v64, y_k, lse_k, H, p, KEY)
        return dict(y=y, lse=lse, dq=dq, dk=dk, dv=dv)
    ref, ref32 = twin(precision), twin("fp32")
    for name, r in ref.items():
        row = check.compare("attn_flash", name, got[0][name], r, check.OP_TOL)
        assert row["ok"] and row["rel_err"] < 1e-5, (block, row)
        far = np.max(np.abs(got[0][name] - ref32[name])) / np.max(np.abs(ref32[name]))
        assert far < 8 * U[precision], (name, far)
    np.testing.assert_allclose(got[0]["d_rowdot"], (dy64 * y_k).reshape(B, T, H, -1).sum(-1).transpose(0, 2, 1),
                               rtol=1e-5, atol=1e-6)           # D = dy . y, fp32, never rounded
    for again in got[1:]:
        for name in got[0]:
            assert np.array_equal(got[0][name], again[name]), name


def test_versions_pair_by_precision():
    """flash_pair gives v11 and v12 their own forwards and the fp32 backwards v9 and v10 v8's
    forward; every version of the ladder is checked against the twin at its precision (.precision)."""
    for version, want in {8: (8, 8), 9: (8, 9), 10: (8, 10), 11: (11, 11), 12: (12, 12)}.items():
        fwd, bwd = lab_attn_flash.flash_pair(version)
        table = lab_attn_flash.VERSIONS
        assert (fwd, bwd) == (table["attn_flash_fwd"][want[0]], table["attn_flash_bwd"][want[1]])
    assert [getattr(lab_attn_flash.VERSIONS["attn_flash_fwd"][v], "precision", None) for v in (8, 11, 12)] == \
        [None, "bf16", "fp16"]
