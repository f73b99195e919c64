"""The FP8 formats of reference/fp8.py (issue 12's simulated FP8): every one of the 256 bit patterns
of E4M3 and E5M2, decoded from the OCP FP8 definitions, is a fixed point of round_fp8; a value
halfway between two neighbours goes to the one whose last mantissa bit is 0; everything past the
largest value saturates; and per-tensor scaling maps a tensor's amax onto the format's largest value,
losing to underflow what lies more than the format's range below it."""
import numpy as np
import pytest

from reference.fp8 import E4M3, E5M2, quantize, round_fp8


def _decode(fmt):
    """{value: mantissa bits} of every finite value of fmt, from its bit patterns (sign, exponent,
    mantissa) as the OCP FP8 formats define them."""
    M, bias = fmt.mantissa_bits, 1 - fmt.min_exponent
    E = 7 - M                                          # exponent bits
    out = {}
    for exp in range(2 ** E):
        for man in range(2 ** M):
            if fmt is E4M3 and exp == 2 ** E - 1 and man == 2 ** M - 1:
                continue                               # E4M3's NaN
            if fmt is E5M2 and exp == 2 ** E - 1:
                continue                               # E5M2's infinities and NaNs
            v = (man / 2 ** M) * 2.0 ** (1 - bias) if exp == 0 else (1 + man / 2 ** M) * 2.0 ** (exp - bias)
            out[v] = out[-v] = man
    return out


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_every_value_is_a_fixed_point_and_midpoints_go_to_the_even_neighbour(fmt):
    table = _decode(fmt)
    values = np.array(sorted(table))
    assert values.max() == fmt.max_value and values[values > 0].min() == fmt.smallest
    assert len(values) == (253 if fmt is E4M3 else 247)      # 254 / 248 patterns, +0 and -0 one value
    np.testing.assert_array_equal(round_fp8(values, fmt), values)
    lo, hi = values[:-1], values[1:]
    mid = (lo + hi) / 2
    even = np.array([a if table[a] % 2 == 0 else b for a, b in zip(lo, hi)])   # last mantissa bit 0
    np.testing.assert_array_equal(round_fp8(mid, fmt), even)
    np.testing.assert_array_equal(round_fp8(mid + (hi - lo) * 1e-3, fmt), hi)   # just past halfway
    np.testing.assert_array_equal(round_fp8(mid - (hi - lo) * 1e-3, fmt), lo)
    try:
        import ml_dtypes                                            # the library the issue names, where installed
    except ImportError:
        return
    dt = ml_dtypes.float8_e4m3fn if fmt is E4M3 else ml_dtypes.float8_e5m2
    x = np.random.default_rng(1).standard_normal(5000) * np.logspace(-5, 2.5, 5000)
    x = x[np.abs(x) <= fmt.max_value]        # past it ml_dtypes gives NaN or inf; we saturate, as .satfinite
    np.testing.assert_array_equal(round_fp8(x, fmt), x.astype(dt).astype(np.float64))


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_saturation_nan_and_the_unit_roundoff(fmt):
    big = np.array([fmt.max_value * 1.01, 1e30, np.inf, -np.inf, -1e30])
    np.testing.assert_array_equal(round_fp8(big, fmt), [fmt.max_value, fmt.max_value, fmt.max_value,
                                                        -fmt.max_value, -fmt.max_value])
    assert np.isnan(round_fp8(np.nan, fmt))
    assert round_fp8(fmt.smallest / 2, fmt) == 0 and round_fp8(fmt.smallest * 0.51, fmt) == fmt.smallest
    rng = np.random.default_rng(2)                  # normals: |error| <= u |x| / (1 + u), reached just past
    x = rng.uniform(1, 2, 20000) * 2.0 ** rng.integers(fmt.min_exponent, 8, 20000)   # 2^e + half a step
    rel = np.abs(round_fp8(x, fmt) - x) / x
    u = fmt.unit_roundoff
    assert rel.max() <= u / (1 + u) and rel.max() > 0.95 * u / (1 + u)


def test_per_tensor_scaling_maps_amax_to_the_largest_value_and_counts_underflow():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(4096) * 1e-4                     # far below E4M3's range unscaled
    assert np.mean(round_fp8(x, E4M3) == 0) > 0.99            # unscaled: nearly all lost
    q = quantize(x, E4M3)
    assert q.amax == np.max(np.abs(x)) and q.scale == E4M3.max_value / q.amax
    assert np.max(np.abs(q.values)) == q.amax and q.saturated == 0.0
    assert np.max(np.abs(q.values - x) / np.abs(x)) < 0.2 and q.underflow < 0.01
    wide = np.concatenate([[1.0], np.full(100, 1e-6)])       # 1e-6 of amax: below E4M3's 2^-9 / 448
    assert quantize(wide, E4M3).underflow == pytest.approx(100 / 101) and quantize(wide, E5M2).underflow == 0.0
    stale = quantize(np.array([0.5, 2.0, -4.0]), E4M3, amax=1.0)    # a delayed scale from a smaller amax
    assert stale.saturated == pytest.approx(2 / 3) and list(stale.values) == [0.5, 1.0, -1.0]
    assert quantize(np.zeros(3), E5M2).scale == 1.0 and quantize(np.zeros(3), E5M2).underflow == 0.0
