"""residual_layernorm_bwd v6 (kernels/layernorm.py): v5 with an optional d16 (uint16 [N, C]) that receives
the bf16 bit pattern of every dx value (round to nearest, ties to even) in the same pass. Without d16,
v6's dx, df, dg, db are v5's bits; with it, still v5's bits, and d16 is dx rounded to bf16, checked
against integer arithmetic on dx's float32 bits and, for a row of hand-picked values (ties to even
either way, a carry into the exponent, the largest finite value rounding to inf, subnormals),
against bit patterns written out by hand. dout = 0 on a row makes dx = dresid exactly there, so that
row's dx holds exactly the values picked. The sizes of test_residual_layernorm_v5 (a ragged last block
of rows, more than one window of channels), with df a separate array and df = dx = dresid."""
import numpy as np
import pytest
from numba import cuda
from test_residual_layernorm_v5 import BLOCKS, C, N, _inputs as _v5_inputs   # v5's sizes and values

from andrea_numba.kernels import layernorm as L
from lab import layernorm as lab_layernorm
from andrea_numba.kernels.common import cdiv

f32 = np.float32
# (float32 bits, bf16 bits rounded to nearest, ties to even): row TIES of dresid, with dout = 0 there
PICKED = [(0x3F808000, 0x3F80),     # 1 + 2^-8: a tie, the even neighbour below
          (0x3F818000, 0x3F82),     # a tie, the even neighbour above
          (0xBF808000, 0xBF80),     # the first tie, negative
          (0xBF818000, 0xBF82),
          (0x3F808001, 0x3F81),     # just past the tie: up
          (0x3F807FFF, 0x3F80),     # just short of it: down
          (0x3F7FFFFF, 0x3F80),     # below 1 by an ulp: carries into the exponent, 1.0
          (0x7F7FFFFF, 0x7F80),     # fp32's largest: past bf16's largest finite + half an ulp, inf
          (0x7F7F7FFF, 0x7F7F),     # bf16's largest finite, short of the tie
          (0x00018000, 0x0002),     # a subnormal tie, odd below: up to even
          (0x00008000, 0x0000),     # the smallest subnormal tie: down to 0
          (0x80018000, 0x8002),     # the subnormal tie, negative
          (0x40490FDB, 0x4049)]     # pi
TIES = 5                            # the row that holds them
assert len(PICKED) == C


def _inputs(seed=5):
    """v5's test values, with row TIES of dresid the PICKED values and dout = 0 there."""
    a, dg0, db0 = _v5_inputs(seed)
    a["dresid"][TIES] = np.array([b for b, _ in PICKED], np.uint32).view(f32)
    a["dout"][TIES] = 0
    return a, dg0, db0


def _bwd(version, a, dg0, db0, block, alias, half=False, work_size=4 * N * C):
    """dx, df, dg, db, work after the call (and d16 with half), as test_residual_layernorm_v5's _bwd."""
    dr = cuda.to_device(a["dresid"])
    dx = dr if alias else cuda.device_array((N, C), f32)
    df = dx if alias else cuda.device_array((N, C), f32)
    dg, db = cuda.to_device(dg0), cuda.to_device(db0)
    work = cuda.to_device(np.full(work_size, np.nan, f32))             # poisoned scratch
    extra = {}
    if half:
        extra["d16"] = d16 = cuda.to_device(np.full((N, C), 0xDEAD, np.uint16))
    lab_layernorm.VERSIONS["residual_layernorm_bwd"][version](dx, df, dg, db, work, dr, *(cuda.to_device(a[k]) for k in
                                                  ("dout", "resid", "mean", "rstd", "g")), block=block, **extra)
    cuda.synchronize()
    out = [x.copy_to_host() for x in (dx, df, dg, db, work)]
    return out + [d16.copy_to_host()] if half else out


def _bf16_bits(x):
    """float32 -> bf16 bits, round to nearest, ties to even, in integers (no NaN here)."""
    b = x.view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("alias", [False, True], ids=["df apart", "df=dx=dresid"])
@pytest.mark.parametrize("block", BLOCKS)
def test_v6_is_v5_and_d16_is_dx_in_bf16(block, alias):
    a, dg0, db0 = _inputs()
    v5 = _bwd(5, a, dg0, db0, block, alias)
    v6 = _bwd(6, a, dg0, db0, block, alias)                             # without d16
    for name, p, q in zip(("dx", "df", "dg", "db", "work"), v5, v6):
        assert p.tobytes() == q.tobytes(), name                         # v5's bits
    *w, d16 = _bwd(6, a, dg0, db0, block, alias, half=True)
    for name, p, q in zip(("dx", "df", "dg", "db", "work"), v5, w):
        assert p.tobytes() == q.tobytes(), f"{name} with d16"           # still v5's bits
    dx = w[0]
    assert np.array_equal(dx[TIES].view(np.uint32), [b for b, _ in PICKED])   # dx = dresid + 0 there
    np.testing.assert_array_equal(d16, _bf16_bits(dx))                  # every element written, RNE
    np.testing.assert_array_equal(d16[TIES], [h for _, h in PICKED])     # the hand-picked roundings


def test_v6_without_room_for_its_partials_runs_v4_and_takes_no_d16():
    a, dg0, db0 = _inputs(seed=7)
    block = BLOCKS[0]
    small = 2 * cdiv(N, block[1]) * C - 1                               # one float short of the partials
    u, v = _bwd(4, a, dg0, db0, block, True, work_size=small), _bwd(6, a, dg0, db0, block, True, work_size=small)
    assert all(p.tobytes() == q.tobytes() for p, q in zip(u, v))
    with pytest.raises(AssertionError, match="writes d16 only with work"):
        _bwd(6, a, dg0, db0, block, True, half=True, work_size=small)
