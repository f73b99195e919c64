"""The LayerNorm's parameter gradients in two stages (layernorm_bwd v4, residual_layernorm_bwd v2):
k_layernorm_bwd_params_partial writes a partial sum per chunk of rows to the work buffer, and
k_layernorm_bwd_params_sum adds the chunks in order into dg, db (+=). Checked against NumPy in
float64 at a size with several row chunks and a channel count that is not a multiple of the
block's CX channels (so the bounds tests run), with a last chunk shorter than the others."""
import numpy as np
import pytest

from andrea_numba.kernels import layernorm as ln
from andrea_numba.kernels.common import SIMULATOR, cdiv

N, C = 23, 12                       # C % PARAM_CX != 0 in the simulator (8) and on a GPU (32)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C)).astype(np.float32)
    dout = rng.standard_normal((N, C)).astype(np.float32)
    mean = x.mean(axis=1).astype(np.float32)
    rstd = (1.0 / np.sqrt(x.var(axis=1) + 1e-5)).astype(np.float32)
    return dout, x, mean, rstd


def _exact(dout, x, mean, rstd, rows=slice(None)):
    """(sum of dout * xhat, sum of dout) over `rows`, per channel, in float64."""
    d, xhat = dout[rows].astype(np.float64), (x[rows] - mean[rows, None]).astype(np.float64) * rstd[rows, None]
    return (d * xhat).sum(axis=0), d.sum(axis=0)


def _run(dg0, db0, work_size, args):
    from numba import cuda
    dg, db = cuda.to_device(dg0), cuda.to_device(db0)
    work = cuda.to_device(np.full(work_size, np.nan, np.float32))        # poisoned: every read is written
    ln.layernorm_bwd_params_two_stage(dg, db, work, *(cuda.to_device(a) for a in args))
    cuda.synchronize()
    return dg.copy_to_host(), db.copy_to_host(), work.copy_to_host()


def test_the_chunks_come_from_the_shapes_and_fit_the_work_buffer():
    R = ln.param_chunks(N, C, 10**6)
    assert R > 1 and C % ln.PARAM_CX != 0
    assert R == ln.param_chunks(N, C, 10**6)                            # the shapes alone: the same launch
    assert (R - 1) * cdiv(N, R) < N                                      # no empty chunk
    assert ln.param_chunks(N, C, 2 * C) == 1                             # as many as fit: 2 R C floats
    assert ln.param_chunks(N, C, 2 * C * 2 + 1) <= 2
    if not SIMULATOR:
        assert ln.param_chunks(8192, 768, 16 * 768 * 768) * cdiv(768, ln.PARAM_CX) >= 264    # 24 blocks in v2
    with pytest.raises(ValueError):
        ln.param_chunks(N, C, 2 * C - 1)


@pytest.mark.parametrize("work_size", [10**4, 2 * C], ids=["R>1", "R=1"])
def test_two_stage_sums_agree_with_numpy_accumulate_and_repeat_bitwise(work_size):
    args = _inputs()
    rng = np.random.default_rng(1)
    dg0, db0 = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    dg, db, work = _run(dg0, db0, work_size, args)
    eg, eb = _exact(*args)
    np.testing.assert_allclose(dg - dg0.astype(np.float64), eg, rtol=1e-4, atol=1e-5)    # += into dg, db
    np.testing.assert_allclose(db - db0.astype(np.float64), eb, rtol=1e-4, atol=1e-5)
    # stage 1's partial sums, chunk by chunk, at the front of the work buffer
    R = ln.param_chunks(N, C, work_size)
    rows = cdiv(N, R)
    part = work[:2 * R * C].reshape(2, R, C)
    for chunk in range(R):
        pg, pb = _exact(*args, rows=slice(chunk * rows, (chunk + 1) * rows))
        np.testing.assert_allclose(part[0, chunk], pg, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(part[1, chunk], pb, rtol=1e-4, atol=1e-5)
    assert np.all(np.isnan(work[2 * R * C:]))                            # nothing past the partials
    # stage 2 adds the chunks in order 0, 1, ..., R-1 in float32
    sg, sb = part[0, 0].copy(), part[1, 0].copy()
    for chunk in range(1, R):
        sg, sb = sg + part[0, chunk], sb + part[1, chunk]
    assert np.array_equal(dg, dg0 + sg) and np.array_equal(db, db0 + sb)
    again = _run(dg0, db0, work_size, args)
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip((dg, db, work), again))   # bit-identical
