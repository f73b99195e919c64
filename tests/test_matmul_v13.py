"""matmul v13 (kernels/half_tile.py, "matmul v13"): bf16 copies copied to a ring of shared stages by
cp.async, in the simulator (cp.async a plain copy there, commit and wait no-ops).

The harness (tests/test_kernels.py) checks v13 on the three product cases at both simulator tiles;
these tests add every transpose on both copy paths (cp.async chunks where the copies' rows are whole
16-byte chunks, guarded copies where K, M or N is not a multiple of 8), edges in M, N and K at once,
the 4-stage ring (wait_group 2) on a K of many steps, accumulate, a split K added slice by slice,
bit-identical reruns, and the rounding of the copies. Kept small: the simulator runs every thread.
"""
import functools

import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import half_tile as H
from andrea_numba.kernels import matmul as MM
from lab import matmul as lab_matmul
from andrea_numba.kernels.common import SIMULATOR
from reference.precision import round_bf16
from test_matmul_v12 import _bf16_product, _operands, _run   # v12's helpers: the same operands, twin and call

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's twins (NUMBA_ENABLE_CUDASIM=1)")
_run = functools.partial(_run, launch=MM.matmul_bf16)          # noqa: F811


def test_v13_is_a_bf16_version_of_the_ladder():
    assert lab_matmul.VERSIONS["matmul"][13] is MM.matmul_bf16 and MM.matmul_bf16.precision == "bf16"
    assert MM.matmul_bf16.family == "bf16" and MM.TILE_FAMILIES["bf16"].rung == 13
    assert len(MM.matmul_bf16.blocks) >= 2


def test_the_copies_are_the_operands_rounded_to_bf16_ties_to_even():
    """bf16_copies: the bit patterns of round_bf16, each copy in its operand's shape, rows packed,
    b's copy on a 256-byte boundary of the scratch; the tile takes cp.async only for whole chunks."""
    a = np.array([[1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5, np.inf, 1e-40]], np.float32)   # ties go to even
    b = np.arange(24, dtype=np.float32).reshape(3, 8) / 7
    a16, b16 = H.bf16_copies(cuda.to_device(a), cuda.to_device(b))
    assert np.array_equal(a16.copy_to_host(), (round_bf16(a).view(np.uint32) >> 16).astype(np.uint16))
    assert np.array_equal(b16.copy_to_host(), (round_bf16(b).view(np.uint32) >> 16).astype(np.uint16))
    assert H.async_resolve((32, 32, 32, 32, 32), a16, b16) == ("bf16", 32, 32, 32, 32, 32, False, H.STAGES)
    assert H.async_resolve((64, 16, 32, 32, 16, 4), b16, b16)[6:] == (True, 4)


# One block a product (the simulator runs every thread: kept small). Edges in M, N and K at once:
# (24, 16, 40) has whole 16-byte rows (cp.async chunks; K = 40 is a full stage and one of 8 values,
# the other chunks zero-filled); (20, 13, 45) has not (the guarded copies).
CASES_V13 = [(ta, tb, 24, 16, 40) for ta in (False, True) for tb in (False, True)] + \
            [(False, True, 20, 13, 45), (True, False, 20, 13, 45)]


@pytest.mark.parametrize("trans_a, trans_b, M, N, K", CASES_V13)
def test_every_transpose_with_edges_agrees_with_the_bf16_twin(trans_a, trans_b, M, N, K):
    """out starts as NaN, so an element the kernel does not write fails; the one-warp tile, 3 stages."""
    rng = np.random.default_rng(13)
    a, b = _operands(rng, M, N, K, trans_a, trans_b)
    assert H.async_resolve(MM.matmul_bf16.blocks[0], a, b)[6] == (K % 8 == 0)
    ref = _bf16_product(a, b, trans_a, trans_b)
    out = _run(a, b, trans_a, trans_b, np.full((M, N), np.nan, np.float32))
    scale = np.abs(ref).max()
    assert np.abs(out - ref).max() <= 1e-6 * scale                 # fp32 sums of the same exact products
    exact = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    assert np.abs(out - exact).max() > 1e-4 * scale                # and the inputs were rounded to bf16
    if trans_a and trans_b:                                        # a rerun gives the same bits
        assert np.array_equal(out, _run(a, b, trans_a, trans_b, np.zeros((M, N), np.float32)))


def test_the_four_stage_ring_accumulates_over_many_steps():
    """out += a^T @ b on the two-warp tile with 4 stages (wait_group 2): K = 136 is 5 steps (the last
    a quarter full), so the ring wraps around onto stage 0 while stages 1..3 hold copies."""
    rng = np.random.default_rng(14)
    M, N, K = 40, 16, 136
    a, b = _operands(rng, M, N, K, True, False)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    block = MM.matmul_bf16.blocks[1]
    assert H.async_resolve(block, a, b)[6:] == (True, 4)
    out = _run(a, b, True, False, o0, accumulate=True, block=block)
    ref = o0 + _bf16_product(a, b, True, False)
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()


def check_split_slices(launch, N, seed):
    """With a work buffer a weight gradient's long K is cut into slices (S > 1): block z leaves its
    slice's partial product in work[z], and out = o0 + ((work[0] + work[1]) + work[2] ...) in fp32,
    bit for bit (k_splitk_sum's fixed order, no atomics); each partial is its slice's product.
    (v14's tests call it with their launcher.)"""
    rng = np.random.default_rng(seed)
    M, K = 8, 192
    a, b = _operands(rng, M, N, K, True, False)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    work = cuda.to_device(np.zeros(MM.splitk_work(8), np.float32))
    S, ksplit = MM.splitk(M, N, K, 1, launch.blocks[0], work)
    assert S > 1
    out = _run(a, b, True, False, o0, work=work, accumulate=True, launch=launch)
    parts = work.copy_to_host()[:S * M * N].reshape(S, M, N)
    total = parts[0]
    for s in range(1, S):
        total = total + parts[s]
        sl = slice(s * ksplit, min(K, (s + 1) * ksplit))
        ref = _bf16_product(a[sl], b[sl], True, False)
        assert np.abs(parts[s] - ref).max() <= 1e-6 * np.abs(ref).max()
    assert np.array_equal(out, o0 + total)
    ref = o0 + _bf16_product(a, b, True, False)
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()


def test_a_split_product_adds_its_slices_in_order():
    check_split_slices(MM.matmul_bf16, 24, 15)


@pytest.mark.parametrize("block", [(128, 128, 32, 64, 32), (128, 64, 32, 64, 32), (64, 64, 32, 32, 32)])
@pytest.mark.parametrize("trans_a", [False, True])
def test_the_gpu_tiles_write_chunks_without_bank_conflicts(block, trans_a):
    """The cp.async chunks at the GPU's tiles: each group of 8 consecutive lanes (one 128-byte
    shared-memory request of 16-byte writes) hits 8 different 16-byte positions of a line, and a
    thread's chunks cover the stage exactly once. (ldmatrix reads: test_matmul_v12's.)"""
    BM, BN, BK, WM, WN = block
    threads = 32 * (BM // WM) * (BN // WN)
    for R, k_outer in ((BM, trans_a), (BN, not trans_a)):
        stored = (BK, R) if k_outer else (R, BK)
        CPR = stored[1] // 8
        word = H._word(stored[1] // 2)
        e = np.arange(stored[0] * CPR)
        words = word(e // CPR, e % CPR)
        assert sorted(words) == list(range(0, R * BK // 2, 4))        # every chunk of the stage, once
        assert (stored[0] * CPR) % threads == 0
        for q in range(0, len(e), 8):                                  # consecutive lanes: consecutive e
            assert len(set((words[q:q + 8] // 4) % 8)) == 8, (stored, q)


@pytest.mark.parametrize("accumulate", [False, True])
def test_the_engines_split_k_sum_gives_the_labs_v1_bits(accumulate):
    """k_splitk_sum (the engine's, over flat views) and the lab's k_splitk_sum_v1 (over [M, N] views,
    the sum of the rungs before v8): out (+)= ((work[0] + work[1]) + ...) + work[S-1] in fp32, the
    same additions in the same order, so the same bits; M, N odd (more elements than a block)."""
    rng = np.random.default_rng(13)
    S, M, N = 5, 7, 9
    work = (rng.standard_normal((S, M, N)) * 10.0 ** rng.integers(-4, 4, (S, M, N))).astype(np.float32)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    want = work[0].copy()
    for z in range(1, S):
        want += work[z]
    if accumulate:
        want = o0 + want
    outs = []
    for launch in (MM.splitk_sum, lab_matmul.splitk_sum_v1):
        out = cuda.to_device(o0.copy())
        launch(out, cuda.to_device(work), accumulate, 0)
        outs.append(out.copy_to_host())
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    assert np.array_equal(outs[0].view(np.uint32), want.view(np.uint32))
    assert MM.k_splitk_sum.fn.__name__ == "k_splitk_sum" and lab_matmul.k_splitk_sum_v1.fn.__name__ == "k_splitk_sum_v1"
