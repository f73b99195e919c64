"""Flash attention v14 (kernels/attn_flash_bf16.py, its end): v13 writing its outputs in bf16 where only
bf16 products read them. With a uint16 y16 the forward writes y (v13's bits) and y16 = y rounded to
bf16 (ties to even, the rounding of the products' operand copies); with uint16 dq, dk, dv the
backward writes v13's values rounded the same way. So the products of the engine's bf16o model see
the bits they saw when they rounded v13's fp32 outputs themselves. Without y16 and with float32
outputs (the harness's call) v14 is v13: in the simulator, the same launches on the same buffers
(recorded, not run: test_kernels.launches_recorded), so v13's bits. Shapes as test_attn_flash_bf16's:
partial tiles, dropout, two warps where one skips tiles."""
import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import attn_flash
from lab import attn_flash as lab_attn_flash
from andrea_numba.kernels.common import SIMULATOR
from reference.precision import round_bf16
from test_attn_flash_lowp import KEY, _run
from test_kernels import launches_recorded

pytestmark = [pytest.mark.xdist_group("attn_flash")]


def _launches(version, block, out, dev, p, H):
    """The launches of the version's forward and backward (as test_attn_flash_lowp._run calls them, on
    the buffers given), recorded instead of run (test_kernels.launches_recorded)."""
    fwd, bwd = lab_attn_flash.flash_pair(version)
    record = []
    with launches_recorded(record):
        fwd(out["y"], out["lse"], dev["q"], dev["k"], dev["v"], H, p, KEY, block=block)
        bwd(out["dq"], out["dk"], out["dv"], out["d_rowdot"], dev["dy"], dev["q"], dev["k"], dev["v"], out["y"],
            out["lse"], H, p, KEY, block=block)
    assert record
    return record


def _bits16(a):
    """float values as the uint16 bf16 bit patterns round_bf16 gives."""
    return (round_bf16(a).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("p, shape, block", [(0.25, (1, 37, 16, 2), (2, 16)), (0.0, (2, 21, 8, 2), (1, 16))],
                         ids=["hs8-T37-dropout-two-warps", "hs4-B2-T21"])
def test_v14_writes_v13s_values_rounded_to_bf16(p, shape, block):
    B, T, C, H = shape
    rng = np.random.default_rng(5)
    q, k, v, dy = (rng.standard_normal((B, T, C)).astype(np.float32) for _ in range(4))
    ref = _run(13, block, q, k, v, dy, p, H)                       # v13: fp32 outputs
    fwd, bwd = lab_attn_flash.flash_pair(14)
    assert (fwd, bwd) == (attn_flash.attn_flash_fwd_bf16_out16, attn_flash.attn_flash_bwd_bf16_out16)
    dev = {n: cuda.to_device(a) for n, a in dict(q=q, k=k, v=v, dy=dy).items()}
    nan = lambda *s: cuda.to_device(np.full(s, np.nan, np.float32))
    if SIMULATOR:      # v14 called as the harness calls it launches v13's kernels on the same buffers: v13's bits
        out = dict(y=nan(B, T, C), lse=nan(B, H, T), dq=nan(B, T, C), dk=nan(B, T, C), dv=nan(B, T, C),
                   d_rowdot=nan(B, H, T))
        assert _launches(13, block, out, dev, p, H) == _launches(14, block, out, dev, p, H)
    else:
        same = _run(14, block, q, k, v, dy, p, H)
        for name in ref:
            np.testing.assert_array_equal(same[name], ref[name], err_msg=name)
    junk = lambda: cuda.to_device(np.full((B, T, C), 0xFFFF, np.uint16))     # (a NaN's bits: every word is written)
    y, lse, y16 = nan(B, T, C), nan(B, H, T), junk()
    fwd(y, lse, dev["q"], dev["k"], dev["v"], H, p, KEY, y16=y16, block=block)
    np.testing.assert_array_equal(y.copy_to_host(), ref["y"])
    np.testing.assert_array_equal(lse.copy_to_host(), ref["lse"])
    np.testing.assert_array_equal(y16.copy_to_host(), _bits16(ref["y"]))
    d16 = {n: junk() for n in ("dq", "dk", "dv")}
    d_rowdot = nan(B, H, T)
    bwd(d16["dq"], d16["dk"], d16["dv"], d_rowdot, dev["dy"], dev["q"], dev["k"], dev["v"], y, lse, H, p, KEY,
        block=block)
    np.testing.assert_array_equal(d_rowdot.copy_to_host(), ref["d_rowdot"])
    for n, a in d16.items():
        np.testing.assert_array_equal(a.copy_to_host(), _bits16(ref[n]), err_msg=n)
