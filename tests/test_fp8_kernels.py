"""The FP8 quantize kernels (andrea_numba/kernels/fp8.py) against the twin's fp32 path
(reference.fp8.quantize_fp32): the same amax, the same fp32 scale and descale, the same byte for
every value, in both formats and both layouts (as it lies, and transposed: the K-major copies the
FP8 products read), every row padded with zero bytes to 16, and the underflowed values counted; for
a tensor whose values span the formats' whole range after scaling (subnormals, ties, zeros of both
signs, negative values) and for an all-zero tensor. andrea_numba.fp8's quantize_rows (the check
command's first rows) is run too."""
import numpy as np
import pytest
from numba import cuda

from andrea_numba import fp8 as cmd
from andrea_numba.kernels import fp8 as K
from reference.fp8 import E4M3, E5M2, decode, descale_fp32, quantize_fp32


def _run(x, fmt, transpose=False):
    R, C = x.shape
    rows, ld = (C, K.padded(R)) if transpose else (R, K.padded(C))
    codes = cuda.to_device(np.full(rows * ld, 0xAB, np.uint8))        # poisoned: the padding must be written
    stats = cuda.device_array(K.STATS, np.float32)
    count = cuda.to_device(np.full(1, 99, np.int32))                   # k_amax_final zeroes it
    partial = cuda.device_array(K.AMAX_BLOCKS, np.float32)
    out = K.quantize(codes, stats, count, partial, cuda.to_device(x), fmt, transpose=transpose)
    assert out.shape == (rows, ld)
    return out.copy_to_host(), stats.copy_to_host(), int(count.copy_to_host()[0])


@pytest.mark.parametrize("transpose", [False, True], ids=["as-is", "transposed"])
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_the_kernels_give_the_twins_bytes(fmt, transpose):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(150) * np.logspace(-9, 0, 150)).astype(np.float32)
    x[:4] = [0.0, -0.0, 1.0, -1.0]
    top = np.float32(np.max(np.abs(x)))
    x[4] = top * np.float32(0.5 + 2.0 ** -5)          # x s exactly halfway between two E4M3 values
    x = x.reshape(10, 15)
    codes, stats, count = _run(x, fmt, transpose)
    want, amax, scale = quantize_fp32(x, fmt)
    want = want.T if transpose else want
    assert stats[2] == amax and stats[1] == scale and stats[0] == descale_fp32(amax, fmt) and stats[3] == 0
    k = want.shape[1]
    np.testing.assert_array_equal(codes[:, :k], want)
    assert not codes[:, k:].any()                                 # the padding: zero bytes
    flat = codes[:, :k].T.reshape(-1) if transpose else codes[:, :k].reshape(-1)
    assert flat[1] == 0x80 and flat[0] == 0                       # -0 keeps its sign
    assert np.max(np.abs(decode(want, fmt))) == fmt.max_value     # amax lands on the largest value
    lost = (decode(quantize_fp32(x, fmt)[0], fmt) == 0) & (x != 0)                     # the underflowed: at most half
    assert np.array_equal(lost, (np.abs(x * scale) <= fmt.smallest / 2) & (x != 0))   # the smallest step (ties: 0)
    assert count == lost.sum() and lost.sum() > (3 if fmt is E4M3 else -1)


def test_an_all_zero_tensor_has_scale_1_and_zero_bytes():
    codes, stats, count = _run(np.zeros((4, 10), np.float32), E4M3)
    assert list(stats) == [1.0, 1.0, 0.0, 0.0] and not codes.any() and count == 0


def test_the_check_commands_quantize_rows_agree():
    rows = cmd.quantize_rows()
    assert len(rows) == 2 * 2 * len(cmd.QUANT_SHAPES) and all(r["ok"] for r in rows)
