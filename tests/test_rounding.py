"""The roundings to bf16, fp16 and FP8 checked against tables of every value of each format, built
here from the formats' definitions (sign, exponent field, mantissa field), not from any rounding
routine: the twin's (reference/precision.py, reference/fp8.py), the simulator's stand-ins for the
GPU's conversions (kernels/ptx.py: sim_round_bf16, sim_round_fp16, the bf16x2 / f16x2 twins), the
engine's bf16 copy kernel (kernels/operands.py: k_round_bf16) and the decoder's rounding (ptx.bf16_value)
must each agree with the table. So the
twin and the simulator, which are written apart, cannot share a bug that the checks then miss."""
import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import operands, ptx
from andrea_numba.kernels.common import SIMULATOR
from reference import fp8 as F
from reference.precision import round_bf16, round_fp16

# (exponent bits, mantissa bits, has infinities): every format's finite non-negative values by code
FORMATS = {"bf16": (8, 7, True), "fp16": (5, 10, True), "e4m3": (4, 3, False), "e5m2": (5, 2, True)}


def table(exp_bits, man_bits, has_inf):
    """The finite non-negative values of the format, in code order (= value order), as float64:
    exponent field 0: subnormals m 2^(1 - bias - M); else (1 + m / 2^M) 2^(e - bias). E4M3 (no
    infinities) keeps every exponent field but the all-ones mantissa of the top one (its NaN)."""
    bias = 2 ** (exp_bits - 1) - 1
    values = []
    for e in range(2 ** exp_bits - (1 if has_inf else 0)):
        for m in range(2 ** man_bits):
            if not has_inf and e == 2 ** exp_bits - 1 and m == 2 ** man_bits - 1:
                continue
            values.append(m * 2.0 ** (1 - bias - man_bits) if e == 0 else (1 + m / 2 ** man_bits) * 2.0 ** (e - bias))
    return np.array(values)


def by_table(x, name, saturate=False):
    """x rounded to the nearest value of the table, ties to the even code (its lowest bit 0); past
    the largest value plus half its step: infinity (saturate: the largest value); NaN stays NaN."""
    vals = table(*FORMATS[name])
    step = vals[-1] - vals[-2]
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    i = np.clip(np.searchsorted(vals, a), 1, len(vals) - 1)        # vals[i - 1] <= a <= vals[i]
    lo, hi = vals[i - 1], vals[i]
    pick_hi = (hi - a < a - lo) | ((hi - a == a - lo) & (i % 2 == 0))   # code i even: hi on a tie
    r = np.where(a <= vals[0], vals[0], np.where(pick_hi, hi, lo))
    over = a >= vals[-1] + step / 2 if not saturate else a > vals[-1]
    top = vals[-1] if saturate else np.inf
    r = np.where(a > vals[-1], np.where(over, top, vals[-1]), r)
    return np.where(np.isnan(x), np.nan, np.copysign(r, x))


def test_the_tables_hold_the_formats_known_values():
    assert table(*FORMATS["fp16"])[-1] == 65504 and table(*FORMATS["fp16"])[1] == 2.0 ** -24
    assert table(*FORMATS["bf16"])[-1] == float.fromhex("0x1.fep127")
    assert table(*FORMATS["e4m3"])[-1] == 448 and table(*FORMATS["e5m2"])[-1] == 57344
    assert len(table(*FORMATS["e4m3"])) == 127 and table(*FORMATS["e4m3"])[1] == 2.0 ** -9


def values(name, n=20000, seed=0):
    """float32 values that probe a format: random bit patterns over the format's range, every
    halfway point between neighbours (ties), the points just beside them, the subnormals, the
    overflow threshold, zeros, infinities and NaN."""
    rng = np.random.default_rng(seed)
    vals = table(*FORMATS[name])
    mids = (vals[1:] + vals[:-1]) / 2
    pick = rng.choice(len(mids), size=min(len(mids), 4000), replace=False)
    mids = mids[pick].astype(np.float32)
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))])
    lo, hi = np.log2(vals[1]) - 2, min(np.log2(vals[-1]) + 1.5, 127.9)
    rand = (2.0 ** rng.uniform(lo, hi, n)).astype(np.float32)
    step = vals[-1] - vals[-2]
    with np.errstate(over="ignore"):                  # (bf16's overflow threshold is float32's infinity)
        edge = np.array([0.0, vals[-1], vals[-1] + step / 2, vals[-1] + step / 2 * 0.999, vals[-1] * 1.5, np.inf],
                        np.float32)
    x = np.concatenate([mids, near, rand, edge])
    return np.concatenate([x, -x, np.array([np.nan], np.float32)])


def same(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    return f"{int(bad.sum())} of {bad.size} differ, e.g. {np.flatnonzero(bad)[:3]}" if bad.any() else ""


@pytest.mark.parametrize("name, twin, sim", [("bf16", round_bf16, ptx.sim_round_bf16),
                                             ("fp16", round_fp16, ptx.sim_round_fp16)])
def test_bf16_and_fp16_the_twin_and_the_simulator_agree_with_the_table(name, twin, sim):
    x = values(name)
    want = by_table(x, name)
    assert not same(twin(x), want), ("the twin", same(twin(x), want))
    assert not same(sim(x), want), ("the simulator", same(sim(x), want))


@pytest.mark.skipif(not SIMULATOR, reason="on a GPU ptx.bf16x2 and ptx.f16x2 are the PTX itself (device functions); "
                                          "the kernels' tests below check it there")
@pytest.mark.parametrize("name, pack", [("bf16", ptx.bf16x2), ("fp16", ptx.f16x2)])
def test_the_simulators_conversion_twins_pack_the_tables_bits(name, pack):
    """bf16x2 / f16x2 (the simulator's cvt.rn.*x2.f32): the pair's 16-bit patterns, low first."""
    x = values(name, n=300)[:600]
    want = by_table(x, name).astype(np.float32)
    if name == "bf16":
        want_bits = want.view(np.uint32) >> 16
    else:
        with np.errstate(over="ignore"):
            want_bits = want.astype(np.float16).view(np.uint16).astype(np.uint32)
    for i in range(0, len(x) - 1, 2):
        got = np.uint32(np.int32(pack(x[i], x[i + 1])).view(np.uint32))
        if np.isnan(x[i]) or np.isnan(x[i + 1]):
            continue
        assert (got & 0xFFFF, got >> 16) == (want_bits[i], want_bits[i + 1]), (x[i], x[i + 1])


def test_the_engines_bf16_copy_kernel_agrees_with_the_table():
    """k_round_bf16 (the operand copies of the bf16 products), run in the simulator or on a GPU."""
    x = values("bf16", n=100)[:256].reshape(16, 16)
    out = cuda.to_device(np.zeros(x.size, np.uint16))
    operands.k_round_bf16[(1, 4), 4](out, cuda.to_device(x.view(np.uint32)), True)
    got = (out.copy_to_host().astype(np.uint32) << 16).view(np.float32).reshape(x.shape)
    assert not same(got, by_table(x, "bf16")), same(got, by_table(x, "bf16"))


@cuda.jit
def _k_bf16_value(out, x):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = ptx.bf16_value(x[i])


def test_the_decoders_bf16_rounding_agrees_with_the_table():
    """ptx.bf16_value (how a bf16 decoder rounds each product's inputs: kernels/decode.py, _in), run
    in the simulator or on a GPU."""
    x = values("bf16", n=100)[:256]
    out = cuda.to_device(np.zeros(x.size, np.float32))
    _k_bf16_value[4, 64](out, cuda.to_device(x))
    assert not same(out.copy_to_host(), by_table(x, "bf16")), same(out.copy_to_host(), by_table(x, "bf16"))


@pytest.mark.parametrize("fmt", [F.E4M3, F.E5M2], ids=lambda f: f.name)
def test_fp8_the_twin_agrees_with_the_table(fmt):
    """reference.fp8.round_fp8 saturates at the largest value (infinities too), as the GPU's
    saturating conversion does; encode then decode gives the same values."""
    x = values(fmt.name)
    want = by_table(x, fmt.name, saturate=True)
    got = F.round_fp8(x, fmt)
    assert not same(got, want), same(got, want)
    finite = np.isfinite(x)
    assert not same(F.decode(F.encode(want[finite], fmt), fmt), want[finite])
