"""The FP8 quantize kernels (andrea_numba/kernels/fp8.py) against the twin's fp32 path
(reference.fp8.quantize_fp32): the same amax, the same fp32 scale, the same byte for every value, in
both formats, for a tensor whose values span the formats' whole range after scaling (subnormals,
ties, zeros of both signs, negative values) and for an all-zero tensor."""
import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import fp8 as K
from reference.fp8 import E4M3, E5M2, decode, quantize_fp32


def _run(x, fmt):
    codes = cuda.device_array(x.size, np.uint8)
    amax_scale = cuda.device_array(2, np.float32)
    partial = cuda.device_array(K.AMAX_BLOCKS, np.float32)
    K.quantize_v1(codes, amax_scale, partial, cuda.to_device(x), fmt)
    return codes.copy_to_host(), amax_scale.copy_to_host()


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_the_kernels_give_the_twins_bytes(fmt):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(150) * np.logspace(-9, 0, 150)).astype(np.float32)
    x[:4] = [0.0, -0.0, 1.0, -1.0]
    top = np.float32(np.max(np.abs(x)))
    x[4] = top * np.float32(0.5 + 2.0 ** -5)          # x s exactly halfway between two E4M3 values
    codes, amax_scale = _run(x, fmt)
    want, amax, scale = quantize_fp32(x, fmt)
    assert amax_scale[0] == amax and amax_scale[1] == scale
    np.testing.assert_array_equal(codes, want)
    assert codes[1] == 0x80 and codes[0] == 0                     # -0 keeps its sign
    assert np.max(np.abs(decode(codes, fmt))) == fmt.max_value    # amax lands on the largest value
    lost = (decode(codes, fmt) == 0) & (x != 0)                   # the underflowed: at most half the
    assert np.array_equal(lost, (np.abs(x * scale) <= fmt.smallest / 2) & (x != 0))   # smallest step (ties: 0)
    assert lost.sum() > (3 if fmt is E4M3 else -1)


def test_an_all_zero_tensor_has_scale_1_and_zero_bytes():
    codes, amax_scale = _run(np.zeros(40, np.float32), E4M3)
    assert list(amax_scale) == [0.0, 1.0] and not codes.any()
