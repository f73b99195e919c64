"""FP8: the two eight-bit float formats of Hopper's tensor cores (OCP's FP8), simulated in NumPy.

    E4M3   1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits: 4 significant bits, so neighbours
           2^-3 apart at 1.0 and a rounding moves a value by at most u = 2^-4 of itself (6%).
           Normals from 2^-6 to 448 = 1.75 x 2^8; subnormals down to 2^-9 (a step of 2^-9 below
           2^-6); no infinities (the one pattern past 448 is NaN). For weights and activations.
    E5M2   1 sign bit, 5 exponent bits (bias 15), 2 mantissa bits: u = 2^-3 (12.5%), but the range
           of fp16: normals from 2^-14 to 57344 = 1.75 x 2^15, subnormals down to 2^-16. For
           gradients, whose range matters more than their digits.

Rounding to nearest, ties to even, on the grid of the value's binade: in [2^e, 2^(e+1)) the
representable values are 2^e (1 + k 2^-M), k = 0 .. 2^M - 1 (M mantissa bits), a step of 2^(e-M);
below the smallest normal 2^E the step stays 2^(E-M) (the subnormals). So

    e    = max(floor(log2 |x|), E)                  # the binade (the subnormals share the lowest one's step)
    step = 2^(e - M)
    q    = rint(x / step) * step                    # rint: halfway goes to the even multiple, i.e. the
                                                    # neighbour whose last mantissa bit is 0
    q    = clip(q, -max, max)                       # saturate (the GPU's cvt ... .satfinite)

x / step and q are exact in float64 (step is a power of two), so only the one rounding happens.

Eight bits cannot hold a tensor's values where they fall: a gradient of 1e-6 is below E4M3's
smallest subnormal (2^-9 = 0.002). So a tensor is scaled first, per tensor, from its absolute
maximum (amax), so that its largest value lands on the format's largest:

    s  = max / amax          q = round_fp8(x s)          x ~ q / s

and the product of two scaled tensors is divided by both scales afterwards (cuBLASLt takes the
scales as arguments). What is lost is then what falls below the format's smallest value relative
to the tensor's largest (underflow) and the digits past the mantissa (rounding).
"""
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Format:
    name: str
    mantissa_bits: int       # M
    min_exponent: int        # E: the smallest normal is 2^E
    max_value: float         # the largest finite value

    @property
    def unit_roundoff(self) -> float:
        """The largest relative change a rounding makes to a normal value: 2^-(M + 1)."""
        return 2.0 ** -(self.mantissa_bits + 1)

    @property
    def smallest(self) -> float:
        """The smallest positive value (the smallest subnormal): 2^(E - M)."""
        return 2.0 ** (self.min_exponent - self.mantissa_bits)


E4M3 = Format("e4m3", 3, -6, 448.0)
E5M2 = Format("e5m2", 2, -14, 57344.0)
FORMATS = {f.name: f for f in (E4M3, E5M2)}


def round_fp8(x, fmt: Format):
    """x (any shape) rounded to the nearest value of fmt (ties to even), saturating at +-max
    (infinities too); NaN stays NaN. Returned as float64 (every fp8 value is one exactly)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    finite = np.isfinite(x)
    _, k = np.frexp(np.where(finite & (a > 0), a, 1.0))     # a = m 2^k, 0.5 <= m < 1: binade k - 1
    e = np.maximum(k - 1, fmt.min_exponent)
    step = np.ldexp(1.0, e - fmt.mantissa_bits)
    q = np.where(finite, np.rint(np.where(finite, x, 0.0) / step) * step, np.copysign(np.inf, x))
    q = np.clip(q, -fmt.max_value, fmt.max_value)
    return np.where(np.isnan(x), x, q)


@dataclass(frozen=True)
class Quantized:
    values: np.ndarray       # round_fp8(x s) / s: what the fp8 tensor stands for, float64
    scale: float             # s = max / amax (1 for an all-zero tensor)
    amax: float
    underflow: float         # fraction of the nonzero values that became 0
    saturated: float         # fraction of the values beyond amax, clipped to +-max (none with the
                             # tensor's own amax; some with a delayed scale from an older, smaller one)


def _amax(x):
    return np.max(np.abs(x)) if x.size else x.dtype.type(0)


def _scale(amax, fmt: Format, dtype):
    """max / amax in dtype (the quantize kernels': fp32), 1 for an amax of 0 (or not finite)."""
    return dtype(fmt.max_value) / dtype(amax) if amax > 0 and np.isfinite(amax) else dtype(1)


def quantize(x, fmt: Format, amax: float | None = None) -> Quantized:
    """x scaled per tensor (s = max / amax; amax of x itself unless given: a delayed scale from a
    history), rounded to fmt with saturation, and scaled back."""
    x = np.asarray(x, dtype=np.float64)
    amax = float(_amax(x)) if amax is None else amax
    scale = float(_scale(amax, fmt, np.float64))
    q = round_fp8(x * scale, fmt)
    nonzero = x != 0
    under = float(np.mean(q[nonzero] == 0)) if nonzero.any() else 0.0
    sat = float(np.mean(np.abs(x) > amax)) if x.size else 0.0
    return Quantized(q / scale, scale, amax, under, sat)


# ------------------------------------------------------------------------------------------------
# Bit patterns, and the GPU's arithmetic (the quantize kernels: andrea_numba/kernels/fp8.py)
#
# An FP8 value is stored as one byte: sign << 7 | exponent << M | mantissa, the exponent biased by
# 1 - E (E4M3: 7, E5M2: 15); exponent 0 holds the subnormals (mantissa x 2^(E - M)) and zero.
# The GPU quantizes in fp32: scale = max / amax in fp32, y = x * scale in fp32 (one fp32 rounding,
# which the float64 quantize above does not make), then rounds y to the format (cvt.rn.satfinite).

def encode(v, fmt: Format):
    """Values of fmt (round_fp8's results, finite) as their uint8 bit patterns."""
    v = np.asarray(v, dtype=np.float64)
    M, bias = fmt.mantissa_bits, 1 - fmt.min_exponent
    sign = np.signbit(v).astype(np.uint8) << 7
    a = np.abs(v)
    _, k = np.frexp(np.where(a > 0, a, 1.0))
    e = k - 1
    sub = (a < 2.0 ** fmt.min_exponent)
    man_sub = np.rint(a / 2.0 ** (fmt.min_exponent - M))
    man_norm = np.rint((np.ldexp(a, -e) - 1.0) * 2 ** M)
    exp = np.where(sub, 0, e + bias)
    man = np.where(sub, man_sub, man_norm)
    return (sign | (exp.astype(np.uint8) << M) | man.astype(np.uint8)).astype(np.uint8)


def decode(codes, fmt: Format):
    """uint8 bit patterns of fmt as float64 values (E4M3's 0x7F / 0xFF: NaN; E5M2's top exponent:
    inf and NaN)."""
    c = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    M, bias = fmt.mantissa_bits, 1 - fmt.min_exponent
    sign = np.where(c >> 7, -1.0, 1.0)
    exp, man = (c >> M) & ((1 << (7 - M)) - 1), c & ((1 << M) - 1)
    v = np.where(exp == 0, man * 2.0 ** (fmt.min_exponent - M), (1 + man / 2 ** M) * np.exp2(exp - bias))
    top = (1 << (7 - M)) - 1
    if fmt is E4M3:
        v = np.where((exp == top) & (man == (1 << M) - 1), np.nan, v)
    else:
        v = np.where(exp == top, np.where(man == 0, np.inf, np.nan), v)
    return sign * v


def quantize_fp32(x, fmt: Format):
    """(uint8 codes, fp32 amax, fp32 scale) of x quantized as the GPU's kernels do: amax = max |x|
    and scale = max / amax (1 for an all-zero x) in fp32, y = x * scale in fp32, y rounded to fmt
    with saturation."""
    x = np.asarray(x, dtype=np.float32)
    amax = _amax(x)
    scale = _scale(amax, fmt, np.float32)
    y = x * scale                                          # float32 * float32: one fp32 rounding
    return encode(round_fp8(y, fmt), fmt), amax, scale


def descale_fp32(amax, fmt: Format):
    """amax / max in fp32 (1 for amax 0): what the GPU's products multiply an FP8 operand's sums by
    (kernels/fp8.py's stats[0]; not 1 / scale, which would round twice)."""
    amax = np.float32(amax)
    return np.float32(amax / np.float32(fmt.max_value)) if amax > 0 and np.isfinite(amax) else np.float32(1)


def quantize_gpu(x, fmt: Format) -> Quantized:
    """x quantized as the GPU quantizes a product's operand (quantize_fp32: x in fp32, its fp32 amax
    and scale, the bytes), standing for decode(codes) * descale: the values the FP8 product
    multiplies. The twins' FP8 products (reference.precision.fp8_mm) use this, so that a GPU product
    and its twin multiply the same numbers."""
    x32 = np.asarray(x, dtype=np.float32)
    codes, amax, scale = quantize_fp32(x32, fmt)
    values = decode(codes, fmt) * np.float64(descale_fp32(amax, fmt))
    nonzero = x32 != 0
    under = float(np.mean(values[nonzero] == 0)) if nonzero.any() else 0.0
    return Quantized(values, float(scale), float(amax), under, 0.0)
