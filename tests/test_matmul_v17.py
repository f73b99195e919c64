"""matmul v17, matmul_bf16_wgmma_cp_async (kernels/wgmma_mn.py): v15's wgmma ring on the bf16 copies as they are stored, an operand
with k down its columns filling MN-major stage tiles that wgmma reads through its transpose bits,
in the simulator (wgmma the NumPy twin there, wgmma.wgmma_warpgroup with the same bits).

v17 changes only where the values sit in shared memory: the same sums in the same order as v15, so
every product here is compared with v15's bit for bit, besides the bf16 twin. Every transpose with
edges in M, N and K (the dynamic tile, 64 x 128 x 64, 4 stages: B N-major spans two column blocks),
with no transposed copy made (the transposing round kernel would raise); the copier's guarded path
(a stored row of 37 values) with an operand that is bf16 already; the static tile (64 x 64 x 32,
3 stages) over 7 steps with accumulate; split K added in slice order. Kept to one block a launch
where it can: the simulator runs 128 threads a warpgroup. Harness rows: tests/test_kernels.py.
"""
import functools

import numpy as np
import pytest
from numba import cuda

from lab import matmul as MM                        # the whole ladder: the engine's products and the lab's
from lab import matmul as lab_matmul
from lab import operands as lab_operands
from andrea_numba.kernels import wgmma_mn as WM
from lab import wgmma_ring as WR
from andrea_numba.kernels.common import SIMULATOR
from reference.precision import round_bf16
from test_matmul_v12 import _bf16_product, _operands, _run   # v12's helpers: the same operands, twin and call

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's twins (NUMBA_ENABLE_CUDASIM=1)")
_v17 = functools.partial(_run, launch=MM.matmul_bf16_wgmma_cp_async)
DYNAMIC, STATIC = MM.matmul_bf16_wgmma_cp_async.blocks                       # (64, 128, 64, 64, 128, 4), (64, 64, 32, 64, 64, 3)


def _bits(x):
    """bf16 bit patterns (uint16) of round_bf16(x): an operand a model saved rounded."""
    return (round_bf16(x).view(np.uint32) >> 16).astype(np.uint16)


def test_v17_is_a_bf16_version_of_the_ladder_with_v15s_stages():
    assert lab_matmul.VERSIONS["matmul"][17] is MM.matmul_bf16_wgmma_cp_async and MM.matmul_bf16_wgmma_cp_async.precision == "bf16"
    assert MM.matmul_bf16_wgmma_cp_async.family == "bf16_wgmma_cp_async" and MM.TILE_FAMILIES["bf16_wgmma_cp_async"].rung == 17
    assert DYNAMIC[2] == 64 and DYNAMIC[5] == 4 and STATIC[2] == 32 and STATIC[5] == 3
    assert MM.MN_TILES["gpu"] == MM.RING_TILES["gpu"]
    for block in MM.MN_TILES["gpu"] + MM.MN_TILES["sim"]:
        t = WM.make_mn_tile(("bf16_wgmma_cp_async", *block[:5], True, block[5]))
        v15 = WR.make_ring_tile(("v15", *block[:5], True, block[5]))
        assert t.THREADS == v15.THREADS == 128 * (block[0] // 64) and (t.TM, t.TN) == (v15.TM, v15.TN)
        assert t.SHARED == v15.SHARED                        # the MN-major tiles take the same bytes
        assert set(t.mma) == {(False, False), (False, True), (True, False), (True, True)}
    with pytest.raises(AssertionError):                       # an MN-major row is 64 values of m or n
        WM.make_mn_tile(("bf16_wgmma_cp_async", 64, 16, 64, 64, 16, True, 4))


def _v15(a, b, trans_a, trans_b, out0, **kwargs):
    """matmul v15's out for op(a) @ op(b). Its kernel is always a16 @ b16^T on K-major bf16 copies
    (a16 = op(a), b16 = op(b)^T); handed op(a) and op(b)^T stored K-major it makes those copies with
    the plain round instead of the transposing one (the same bits: test_matmul_v14 checks it), which
    saves the simulator seconds of the transposing kernel's threads."""
    a_k = np.ascontiguousarray(a.T if trans_a else a)
    b_k = np.ascontiguousarray(b if trans_b else b.T)
    return _run(a_k, b_k, False, True, out0, launch=MM.matmul_v15, **kwargs)


def _no_transposed_copy(*args, **kwargs):
    raise AssertionError("v17 made a transposed copy")


# (40, 48, 72): one block of 64 x 128 (40 rows and 48 columns of it inside), K a full stage of 64
# and one of 8 values (the rest zero-filled); stored rows of 40, 48 and 72 values: cp.async chunks.
# (37, 45): a stored row of 37 or 45 values takes the copier's guarded path.
CASES = [(False, False, 40, 48, 72), (False, True, 40, 48, 72), (True, False, 40, 48, 72), (True, True, 37, 45, 72)]


@pytest.mark.parametrize("trans_a, trans_b, M, N, K", CASES)
def test_every_transpose_gives_v15s_bits_without_a_transposed_copy(trans_a, trans_b, M, N, K, monkeypatch):
    """out starts as NaN (an element not written fails); a^T @ b adds into out (the weight
    gradient); a^T @ b^T gives v17 a as bf16 bits already (uint16: used as it is) and v15 the floats."""
    rng = np.random.default_rng(17)
    a, b = _operands(rng, M, N, K, trans_a, trans_b)
    accumulate = (trans_a, trans_b) == (True, False)
    o0 = rng.standard_normal((M, N)).astype(np.float32) if accumulate else np.full((M, N), np.nan, np.float32)
    a17 = _bits(a) if (trans_a, trans_b) == (True, True) else a
    with monkeypatch.context() as patch:
        patch.setattr(lab_operands, "round_into_t", _no_transposed_copy)     # the lab's transposing copy (v14, v15)
        out = _v17(a17, b, trans_a, trans_b, o0, accumulate=accumulate, block=DYNAMIC)
        if trans_a:                                                # (the patch bites: v15's copies need it)
            with pytest.raises(AssertionError, match="transposed copy"):
                MM.wgmma_copies(cuda.to_device(a), cuda.to_device(b), trans_a, trans_b)
    ref = (o0 if accumulate else 0) + _bf16_product(a, b, trans_a, trans_b)
    scale = np.abs(ref).max()
    assert np.abs(out - ref).max() <= 1e-6 * scale                 # fp32 sums of the same exact products
    exact = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    assert np.abs(out - exact).max() > 1e-4 * scale                # and the inputs were rounded to bf16
    assert np.array_equal(out, _v15(a, b, trans_a, trans_b, o0, accumulate=accumulate, block=DYNAMIC))


def test_the_static_ring_goes_round_with_v15s_bits():
    """out += a^T @ b over 7 steps of 32 (the last partial): the 3-stage ring goes round 2.3 times,
    both operands MN-major in 64-byte-deep blocks (LBO 4096)."""
    rng = np.random.default_rng(7)
    M, N, K = 24, 40, 208
    a, b = _operands(rng, M, N, K, True, False)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    assert (K + STATIC[2] - 1) // STATIC[2] == 7
    out = _v17(a, b, True, False, o0, accumulate=True, block=STATIC)
    ref = o0 + _bf16_product(a, b, True, False)
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()
    assert np.array_equal(out, _v15(a, b, True, False, o0, accumulate=True, block=STATIC))


def test_a_split_product_adds_its_slices_in_order_with_v15s_bits():
    """K = 192 on the static tile: 3 slices of 64 (S > 1), block z's partial product in work[z], out =
    o0 + ((work[0] + work[1]) + work[2]) in fp32 (k_splitk_sum's order, no atomics), each
    partial its slice's product; v15's bits at the same block and split."""
    rng = np.random.default_rng(19)
    M, N, K = 8, 16, 192
    a, b = _operands(rng, M, N, K, True, False)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    work = cuda.to_device(np.zeros(MM.splitk_work(8), np.float32))
    S, ksplit = MM.splitk(M, N, K, 1, STATIC, work)
    assert S == 3 and ksplit == 64
    out = _v17(a, b, True, False, o0, work=work, accumulate=True, block=STATIC)
    parts = work.copy_to_host()[:S * M * N].reshape(S, M, N)
    for s in range(S):
        sl = slice(s * ksplit, min(K, (s + 1) * ksplit))
        ref = _bf16_product(a[sl], b[sl], True, False)
        assert np.abs(parts[s] - ref).max() <= 1e-6 * np.abs(ref).max()
    total = parts[0]
    for s in range(1, S):
        total = total + parts[s]
    assert np.array_equal(out, o0 + total)
    assert np.array_equal(out, _v15(a, b, True, False, o0, work=work, accumulate=True, block=STATIC))
