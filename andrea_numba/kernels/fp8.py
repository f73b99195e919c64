"""FP8 quantization on the GPU (issue 12): a tensor's absolute maximum by a fixed tree, its scale, and
its values cast to E4M3 or E5M2 bytes. NumPy twin: reference/fp8.py (quantize_fp32, encode).

    k_amax_partial_v1   partial[b] = max |x[i]| over block b's grid-stride share (a tree in shared
                        memory; a maximum does not depend on the order, so neither do its bits)
    k_amax_final_v1     amax_scale = [amax, scale]: amax = max of the partials, scale = max / amax
                        in fp32 (1 where amax is 0), the format's largest value over the tensor's
    k_quantize_v1       codes[i] = the byte of round_fp8(x[i] * scale) (one fp32 multiply, then
                        round to nearest even on the binade's grid, saturating at +-max)

The rounding is done with exact arithmetic on powers of two (frexp, a division by a power of two, a
floor, a tie-to-even test), so the simulator's Python floats and the GPU's fp32 give the same byte.
Hopper has the instruction for it (cvt.rn.satfinite.e4m3x2.f32); the simulator has no inline PTX,
and this form is one a student can follow: the GPU rung with the instruction is still to come.
These kernels are the first piece of issue 12's GPU part, checked against the twin in the simulator
(tests/test_fp8_kernels.py); the E4M3 products through cuBLASLt that will read their bytes are not
written yet.
"""
import math

import numpy as np
from numba import cuda, float32, uint8

from .common import MAX_BLOCK, SIMULATOR, block_max, cdiv

AMAX_BLOCKS = 4 if SIMULATOR else 264           # k_amax_partial_v1's grid (its partials)
THREADS = 32 if SIMULATOR else 256


@cuda.jit
def k_amax_partial_v1(partial, x):
    """partial[blockIdx.x] = max |x[i]| over i = thread, thread + grid threads, ... (x flat)."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    m = float32(0.0)
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        m = max(m, abs(x[i]))
    m = block_max(buf, m)
    if cuda.threadIdx.x == 0:
        partial[cuda.blockIdx.x] = m


@cuda.jit
def k_amax_final_v1(amax_scale, partial, fmax):
    """amax_scale[0] = max of the partials, amax_scale[1] = fmax / amax (fp32; 1 for amax = 0)."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    m = float32(0.0)
    for i in range(cuda.threadIdx.x, partial.shape[0], cuda.blockDim.x):
        m = max(m, partial[i])
    m = block_max(buf, m)
    if cuda.threadIdx.x == 0:
        amax_scale[0] = m
        amax_scale[1] = fmax / m if m > float32(0.0) else float32(1.0)


def make_quantize(M: int, E: int, fmax: float):
    """k_quantize_v1 for a format of M mantissa bits, smallest normal 2^E, largest value fmax."""
    BIAS = 1 - E
    SUB_STEP = float32(2.0 ** (E - M))        # the subnormals' spacing (and the lowest binade's)
    MIN_NORMAL = float32(2.0 ** E)
    MAX = float32(fmax)
    ONE, HALF, SCALE_M = float32(1.0), float32(0.5), float32(1 << M)     # (fp32 constants: no fp64 code)

    @cuda.jit(device=True)
    def to_byte(y):
        """The byte of y rounded to the format: sign, then |y| on its binade's grid of 2^M steps
        (ties to the even step), saturating at MAX."""
        sign = 128 if math.copysign(ONE, y) < 0 else 0      # (-0 too: its byte is 0x80)
        a = abs(y)
        if not a < MAX:                          # at or past the largest value (or inf): saturate
            a = MAX
        else:
            _, k = math.frexp(a)                  # a = m 2^k, 0.5 <= m < 1: the binade 2^(k-1)
            e = max(k - 1, E)
            step = math.ldexp(ONE, e - M)         # a power of two: a / step and t * step are exact
            t = a / step
            f = math.floor(t)
            r = t - f
            if r > HALF or (r == HALF and int(f) & 1):       # past halfway, or halfway from an odd step
                f += ONE
            a = f * step
            if a > MAX:
                a = MAX
        if a < MIN_NORMAL:                       # a subnormal (or zero): exponent field 0
            return uint8(sign | int(a / SUB_STEP))
        _, k = math.frexp(a)
        e = k - 1
        man = int((math.ldexp(a, -e) - ONE) * SCALE_M)
        return uint8(sign | ((e + BIAS) << M) | man)

    @cuda.jit
    def k_quantize_v1(codes, x, amax_scale):
        """codes[i] = the byte of x[i] * scale rounded to the format (x, codes flat)."""
        i = cuda.grid(1)
        if i < x.shape[0]:
            codes[i] = to_byte(x[i] * amax_scale[1])
    return k_quantize_v1


_QUANTIZE = {}


def quantize_v1(codes, amax_scale, partial, x, fmt, stream=0):
    """codes (uint8, x's size) = x quantized per tensor to fmt (reference.fp8.Format); amax_scale
    (float32 [2]) = [amax, scale]; partial (float32 [AMAX_BLOCKS]) the reduction's scratch."""
    xf = x.reshape(x.size)
    if fmt.name not in _QUANTIZE:
        _QUANTIZE[fmt.name] = make_quantize(fmt.mantissa_bits, fmt.min_exponent, fmt.max_value)
    k_amax_partial_v1[partial.shape[0], THREADS, stream](partial, xf)
    k_amax_final_v1[1, THREADS, stream](amax_scale, partial, np.float32(fmt.max_value))
    _QUANTIZE[fmt.name][cdiv(xf.size, THREADS), THREADS, stream](codes.reshape(codes.size), xf, amax_scale)
