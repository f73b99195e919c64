"""residual_layernorm_bwd v5 (kernels/layernorm.py): stage 1 of the parameter sums fused into the dx
kernel, a partial sum per row block in the work buffer, then k_layernorm_bwd_params_sum_tree. dx and
df must be v4's bits; dg, db v4's sums in another grouping (close, not equal), added (+=) into
non-zero values. Checked at a row count that leaves the last block part empty, a channel count
that leaves the last window of channels part empty (more than one window), with df a separate
array and df = dx = dresid (as the engine passes them); the partials against float64, stage 2's
order in float32, a rerun bit for bit, and v4's path when the work buffer is too small."""
import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import layernorm as L
from lab import layernorm as lab_layernorm
from andrea_numba.kernels.common import SIMULATOR, cdiv

f32 = np.float32
N, C = 23, 13                 # N % RW != 0; C > W = TPR * RW (8 in the simulator) and C % W != 0
BLOCKS = L.ROW_BLOCKS["sim" if SIMULATOR else "gpu"]


def _inputs(seed=5):
    rng = np.random.default_rng(seed)
    resid = rng.standard_normal((N, C)).astype(f32)
    mean = resid.mean(axis=1).astype(f32)
    rstd = (1 / np.sqrt(resid.var(axis=1) + 1e-5)).astype(f32)
    g = (1 + 0.5 * rng.standard_normal(C)).astype(f32)
    dresid, dout = rng.standard_normal((N, C)).astype(f32), rng.standard_normal((N, C)).astype(f32)
    dg0, db0 = rng.standard_normal(C).astype(f32), rng.standard_normal(C).astype(f32)
    return dict(dresid=dresid, dout=dout, resid=resid, mean=mean, rstd=rstd, g=g), dg0, db0


def _bwd(version, a, dg0, db0, block, alias, work_size=4 * N * C):
    dr = cuda.to_device(a["dresid"])
    dx = dr if alias else cuda.device_array((N, C), f32)
    df = dx if alias else cuda.device_array((N, C), f32)
    dg, db = cuda.to_device(dg0), cuda.to_device(db0)
    work = cuda.to_device(np.full(work_size, np.nan, f32))             # poisoned scratch
    lab_layernorm.VERSIONS["residual_layernorm_bwd"][version](dx, df, dg, db, work, dr, *(cuda.to_device(a[k]) for k in
                                                  ("dout", "resid", "mean", "rstd", "g")), block=block)
    cuda.synchronize()
    return [x.copy_to_host() for x in (dx, df, dg, db, work)]


@pytest.mark.parametrize("alias", [False, True], ids=["df apart", "df=dx=dresid"])
@pytest.mark.parametrize("block", BLOCKS)
def test_v5_gives_v4s_dx_and_its_params_within_rounding(block, alias):
    a, dg0, db0 = _inputs()
    tpr, rw = block
    R = cdiv(N, rw)
    assert N % rw and C > tpr * rw and C % (tpr * rw)
    u = _bwd(4, a, dg0, db0, block, alias)
    v = _bwd(5, a, dg0, db0, block, alias)
    for name, p, q in zip(("dx", "df"), u, v):
        assert p.tobytes() == q.tobytes(), name                         # v4's bits
    for name, p, q in zip(("dg", "db"), u[2:4], v[2:4]):
        np.testing.assert_allclose(q, p, rtol=1e-5, atol=1e-6, err_msg=name)
    # += into dg, db: the float64 sums over all rows added to the values before
    d = a["dout"].astype(np.float64)
    xhat = (a["resid"] - a["mean"][:, None]).astype(np.float64) * a["rstd"][:, None]
    np.testing.assert_allclose(v[2] - dg0.astype(np.float64), (d * xhat).sum(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(v[3] - db0.astype(np.float64), d.sum(0), rtol=1e-4, atol=1e-5)
    # stage 1: block b's rows b RW .. b RW + RW - 1 (fewer in the last) at the front of work
    work = v[4]
    part = work[:2 * R * C].reshape(2, R, C)
    for b in range(R):
        rows = slice(b * rw, (b + 1) * rw)
        np.testing.assert_allclose(part[0, b], (d * xhat)[rows].sum(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(part[1, b], d[rows].sum(0), rtol=1e-5, atol=1e-6)
    assert np.all(np.isnan(work[2 * R * C:]))                           # nothing past the partials
    # stage 2 in float32: thread ty adds chunks ty, ty + RY, ... in order, then the tree over ty
    ry = L.PARAM_RY
    for w, (before, after) in enumerate(((dg0, v[2]), (db0, v[3]))):
        acc = np.zeros((ry, C), f32)
        for k in range(R):
            acc[k % ry] += part[w, k]
        h = ry // 2
        while h:
            acc[:h] += acc[h:2 * h]
            h //= 2
        assert np.array_equal(after, before + acc[0]), w
    again = _bwd(5, a, dg0, db0, block, alias)
    assert all(p.tobytes() == q.tobytes() for p, q in zip(v, again))   # deterministic, work included


def test_v5_without_room_for_its_partials_runs_v4():
    a, dg0, db0 = _inputs(seed=7)
    block = BLOCKS[0]
    small = 2 * cdiv(N, block[1]) * C - 1                                # one float short of v5's partials
    u, v = _bwd(4, a, dg0, db0, block, True, small), _bwd(5, a, dg0, db0, block, True, small)
    assert all(p.tobytes() == q.tobytes() for p, q in zip(u, v))
