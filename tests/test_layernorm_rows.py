"""residual_layernorm v2 (forward) and v3, v4 (backward), kernels/layernorm.py: the row in registers,
stage 2's loads ahead of its adds. They must give the bits of v1 (forward) and v2 (backward): the same channels visited in the same
order by the same lanes, the same float32 operations. Checked at a row width that is not a
multiple of the lanes (the last lane's last register holds no channel), at a row count that
leaves a block half empty, with dx written over dresid (as the engine does) and with a separate
df, and with dg and db accumulated into non-zero values; repeated bit for bit."""
import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import layernorm as L
from lab import layernorm as lab_layernorm
from andrea_numba.kernels.common import SIMULATOR

f32 = np.float32


def _inputs(N, C, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C)).astype(f32)
    f = (0.5 * rng.standard_normal((N, C))).astype(f32)
    g = (1 + 0.5 * rng.standard_normal(C)).astype(f32)
    b = (0.5 * rng.standard_normal(C)).astype(f32)
    return x, f, g, b, rng


def _fwd(version, x, f, g, b, block):
    N, C = x.shape
    resid, out = cuda.device_array((N, C), f32), cuda.device_array((N, C), f32)
    mean, rstd = cuda.device_array(N, f32), cuda.device_array(N, f32)
    lab_layernorm.VERSIONS["residual_layernorm_fwd"][version](resid, out, mean, rstd, cuda.to_device(x), cuda.to_device(f),
                                                  cuda.to_device(g), cuda.to_device(b), 1e-5, block=block)
    cuda.synchronize()
    return [a.copy_to_host() for a in (resid, out, mean, rstd)]


def _bwd(version, dresid, dout, resid, mean, rstd, g, dg0, db0, block, alias):
    N, C = resid.shape
    dr = cuda.to_device(dresid)
    dx = dr if alias else cuda.device_array((N, C), f32)
    df = dx if alias else cuda.device_array((N, C), f32)
    dg, db = cuda.to_device(dg0), cuda.to_device(db0)
    work = cuda.to_device(np.full(4 * N * C, 7.0, f32))                 # poisoned scratch
    lab_layernorm.VERSIONS["residual_layernorm_bwd"][version](dx, df, dg, db, work, dr, cuda.to_device(dout), cuda.to_device(resid),
                                                  cuda.to_device(mean), cuda.to_device(rstd), cuda.to_device(g),
                                                  block=block)
    cuda.synchronize()
    return [a.copy_to_host() for a in (dx, df, dg, db)]


BLOCKS = L.ROW_BLOCKS["sim" if SIMULATOR else "gpu"]


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("N,C", [(5, 11), (3, 8)])
def test_register_rows_give_the_bits_of_before(N, C, block):
    x, f, g, b, rng = _inputs(N, C, seed=N * 100 + C)
    before, after = _fwd(1, x, f, g, b, block), _fwd(2, x, f, g, b, block)
    for name, u, v in zip(("resid", "out", "mean", "rstd"), before, after):
        assert u.tobytes() == v.tobytes(), name
    assert _fwd(2, x, f, g, b, block)[1].tobytes() == after[1].tobytes()          # rerun: the same bits
    resid, _, mean, rstd = before
    dresid, dout = rng.standard_normal((N, C)).astype(f32), rng.standard_normal((N, C)).astype(f32)
    dg0, db0 = rng.standard_normal(C).astype(f32), rng.standard_normal(C).astype(f32)
    for alias in (True, False):
        u = _bwd(2, dresid, dout, resid, mean, rstd, g, dg0, db0, block, alias)
        for version in (3, 4):
            v = _bwd(version, dresid, dout, resid, mean, rstd, g, dg0, db0, block, alias)
            for name, p, q in zip(("dx", "df", "dg", "db"), u, v):
                assert p.tobytes() == q.tobytes(), (version, name, alias)
            assert not np.array_equal(v[2], dg0) and np.isfinite(v[0]).all()  # dg accumulated, dx written


def test_residual_layernorm_fwd_v3_writes_bf16_as_its_fp32_output_rounded():
    """v3 (four channels a load) with a uint16 out writes the ties-to-even bf16 bits of what it writes
    with an fp32 out; resid, mean and rstd the same either way; within float32 rounding of v1."""
    from reference.precision import round_bf16
    rng = np.random.default_rng(31)
    N, C = 5, 24
    x, f = (rng.standard_normal((N, C)).astype(np.float32) for _ in range(2))
    g, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    outs = {}
    for name, dtype, version in (("fp32", np.float32, 3), ("bf16", np.uint16, 3), ("v1", np.float32, 1)):
        resid, out = cuda.device_array((N, C), np.float32), cuda.to_device(np.zeros((N, C), dtype))
        mean, rstd = cuda.device_array(N, np.float32), cuda.device_array(N, np.float32)
        assert L.fits_vec4(resid, out, cuda.to_device(x), cuda.to_device(f))
        lab_layernorm.VERSIONS["residual_layernorm_fwd"][version](resid, out, mean, rstd, cuda.to_device(x), cuda.to_device(f),
                                                       cuda.to_device(g), cuda.to_device(b), 1e-5)
        outs[name] = [a.copy_to_host() for a in (resid, out, mean, rstd)]
    bits = (round_bf16(outs["fp32"][1]).view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(outs["bf16"][1], bits)
    for i in (0, 2, 3):
        assert outs["bf16"][i].tobytes() == outs["fp32"][i].tobytes()
    for i in range(4):
        np.testing.assert_allclose(outs["fp32"][i], outs["v1"][i], rtol=2e-6, atol=2e-6)
