"""matmul v12 (lab/half_tile.py): bf16 shared tiles read by ldmatrix, in the simulator.

The harness (tests/test_kernels.py) checks v12 on the three product cases at both simulator tiles;
these tests add what it does not reach: a^T @ b^T, edges in M, N and K at once, accumulate, a
split K added slice by slice, bit-identical reruns, the warp twins of ldmatrix and mma.sync
against the fragment layout, and the bank arithmetic of the swizzle at the GPU's tiles.
"""
import numpy as np
import pytest
from numba import cuda

from lab import matmul as MM                        # the whole ladder: the engine's products and the lab's
from lab import matmul as lab_matmul
from andrea_numba.kernels.common import SIMULATOR
from reference.precision import round_bf16

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's twins (NUMBA_ENABLE_CUDASIM=1)")


def _operands(rng, M, N, K, trans_a, trans_b):
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    return a, b


def _bf16_product(a, b, trans_a, trans_b):
    """op(a) @ op(b) of the bf16-rounded inputs in float64 (every product of two bf16 is exact)."""
    a, b = round_bf16(a).astype(np.float64), round_bf16(b).astype(np.float64)
    return (a.T if trans_a else a) @ (b.T if trans_b else b)


def _run(a, b, trans_a, trans_b, out0, work=None, accumulate=False, block=None, launch=MM.matmul_v12):
    out = cuda.to_device(out0.copy())
    launch(out, work, cuda.to_device(a), cuda.to_device(b), trans_a=trans_a, trans_b=trans_b,
           accumulate=accumulate, block=block)
    return out.copy_to_host()


def test_v12_is_a_bf16_version_of_the_ladder():
    assert lab_matmul.VERSIONS["matmul"][12] is MM.matmul_v12 and MM.matmul_v12.precision == "bf16"
    assert MM.matmul_v12.family == "v12" and MM.TILE_FAMILIES["v12"].rung == 12      # its tiles: family "v12"


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_every_transpose_with_edges_in_m_n_and_k_agrees_with_the_bf16_twin(trans_a, trans_b):
    """M, N past a tile edge, K = 45: one full stage of 32 and a partial one; out starts as NaN,
    so an element the kernel does not write fails."""
    rng = np.random.default_rng(12)
    M, N, K = 37, 35, 45
    a, b = _operands(rng, M, N, K, trans_a, trans_b)
    ref = _bf16_product(a, b, trans_a, trans_b)
    out = _run(a, b, trans_a, trans_b, np.full((M, N), np.nan, np.float32))
    scale = np.abs(ref).max()
    assert np.abs(out - ref).max() <= 1e-6 * scale                 # fp32 sums of the same exact products
    exact = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    assert np.abs(out - exact).max() > 1e-4 * scale                # and the inputs were rounded to bf16


def test_the_second_tile_accumulates_into_out():
    """out += a^T @ b^T on the two-warp tile (64 rows: the GPU's swizzle of 128-byte rows)."""
    rng = np.random.default_rng(13)
    M, N, K = 70, 20, 33
    a, b = _operands(rng, M, N, K, True, True)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    out = _run(a, b, True, True, o0, accumulate=True, block=MM.matmul_v12.blocks[1])
    ref = o0 + _bf16_product(a, b, True, True)
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()


def test_a_split_product_adds_its_slices_in_order_and_reruns_bit_identically():
    """With a work buffer a weight gradient's long K is cut into slices (S > 1): the result is o0
    plus the products of the slices added in slice order, bit for bit, at every run."""
    rng = np.random.default_rng(14)
    M, N, K = 8, 24, 200
    a, b = _operands(rng, M, N, K, True, False)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    block = MM.matmul_v12.blocks[0]
    work = cuda.to_device(np.zeros(MM.splitk_work(8), np.float32))
    S, ksplit = MM.splitk(M, N, K, 1, block, work)
    assert S > 1
    outs = [_run(a, b, True, False, o0, work=work, accumulate=True) for _ in range(2)]
    assert np.array_equal(outs[0], outs[1])
    total = None
    for s in range(S):
        sl = slice(s * ksplit, min(K, (s + 1) * ksplit))
        part = _run(np.ascontiguousarray(a[sl]), np.ascontiguousarray(b[sl]), True, False, np.zeros((M, N), np.float32))
        total = part if total is None else total + part
    assert np.array_equal(outs[0], o0 + total)
    ref = o0 + _bf16_product(a, b, True, False)
    assert np.abs(outs[0] - ref).max() <= 1e-6 * np.abs(ref).max()


# The warp twins (kernels/ptx.py) against the fragment layout of mma.m16n8k16, independently of
# half_tile's addressing: a 16 x 16 A and a 16 x 8 B in plain (unswizzled) shared tiles, each
# stored both ways, loaded by ldmatrix_warp with the row addresses the PTX ISA prescribes.

def _bf16_words(x):
    """Rows of x (even length) as bf16x2 words, the first value of each pair in the low half."""
    bits = round_bf16(x).view(np.uint32) >> 16
    return (bits[..., 0::2] | (bits[..., 1::2] << 16)).astype(np.uint32).view(np.int32)


def test_ldmatrix_and_mma_twins_give_the_product_from_either_layout():
    from andrea_numba.kernels.ptx import ldmatrix_warp, mma_bf16_warp
    rng = np.random.default_rng(15)
    A = round_bf16(rng.standard_normal((16, 16)).astype(np.float32))
    B = round_bf16(rng.standard_normal((16, 8)).astype(np.float32))
    lane = np.arange(32)
    i, r = lane >> 3, lane & 7                      # lane 8 i + r gives row r of matrix i
    # A row-major [m, k] (8 words a row): matrix i = rows 8 (i & 1).., k 8 (i >> 1)..
    fa = ldmatrix_warp(_bf16_words(A).reshape(-1), (8 * (i & 1) + r) * 8 + 4 * (i >> 1))
    # A^T stored [k, m], read with .trans: matrix i = k rows 8 (i >> 1).., m 8 (i & 1)..
    fa_t = ldmatrix_warp(_bf16_words(A.T.copy()).reshape(-1), (8 * (i >> 1) + r) * 8 + 4 * (i & 1), trans=True)
    assert np.array_equal(fa, fa_t)
    # B^T stored [n, k] (8 words a row of 16 k): matrix i = rows n, k 8 (i & 1).. (matrices 2, 3 repeat 0, 1)
    fb = ldmatrix_warp(_bf16_words(B.T.copy()).reshape(-1), r * 8 + 4 * (i & 1))[:, :2]
    # B stored [k, n] (4 words a row of 8 n), read with .trans: b0 = k rows 0..7, b1 = k rows 8..15
    fb_t = ldmatrix_warp(_bf16_words(B).reshape(-1), (8 * (i & 1) + r) * 4, trans=True)[:, :2]
    assert np.array_equal(fb, fb_t)
    d = mma_bf16_warp(fa, fb)
    g, t = lane >> 2, lane & 3
    D = A.astype(np.float64) @ B
    want = np.stack([D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]], axis=-1)
    assert np.abs(d - want).max() <= 1e-5 * np.abs(D).max()
    wrong = mma_bf16_warp(fa[:, [1, 0, 2, 3]], fb)  # a0 and a1 swapped: rows g and g + 8 of A trade places
    assert np.abs(wrong - want).max() > 0.1 * np.abs(D).max()


@pytest.mark.parametrize("block", [(128, 128, 32, 64, 32), (128, 64, 32, 64, 32), (64, 64, 32, 32, 32)])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, True)])
def test_the_gpu_tiles_read_and_store_shared_memory_without_bank_conflicts(block, trans_a, trans_b):
    """The bank arithmetic of half_tile.py's swizzle at the GPU's tiles: each ldmatrix request (8
    lanes, 16 bytes each) hits 8 different 16-byte positions of a 128-byte line, and each half-warp
    of 64-bit stores 16 different 8-byte positions. Without the swizzle the same reads conflict."""
    from andrea_numba.kernels import half_tile as H
    from lab import half_tile as lab_half_tile
    BM, BN, BK, WM, WN = block
    threads = 32 * (BM // WM) * (BN // WN)
    lane = np.arange(32)
    for R, k_outer, W, bits in (        # (tile rows (m or n), rows are k, words a row, the lane bits of mn and k)
            (BM, trans_a, BM // 2 if trans_a else BK // 2, (3, 4)),
            (BN, not trans_b, BN // 2 if not trans_b else BK // 2, (4, 3))):
        index = H._frag_index(not k_outer, W, *bits)
        conflicts_unswizzled = False
        for base in range(0, R, 16):
            for ks in range(2):
                words = index(base, ks, lane)
                for i in range(4):                                             # one request per matrix
                    assert len(set((words[8 * i:8 * i + 8] // 4) % 8)) == 8, (base, ks, i)
                # the same rows and chunks without the swizzle
                mn = base + 8 * ((lane >> bits[0]) & 1)
                k = 16 * ks + 8 * ((lane >> bits[1]) & 1)
                r, q = (k + (lane & 7), mn >> 3) if k_outer else (mn + (lane & 7), k >> 3)
                raw = (r * W + 4 * q) // 4 % 8
                conflicts_unswizzled |= any(len(set(raw[8 * i:8 * i + 8])) < 8 for i in range(4))
        assert conflicts_unswizzled
        # stores: the stored tile is 32 x R (k outer) or R x 32 (k inner), a 4-float chunk a lane
        stored = (BK, R) if k_outer else (R, BK)
        chunk_word = lab_half_tile._chunk_word(*stored)
        for j in range(stored[0] * stored[1] // 4 // threads):
            for warp in range(threads // 32):
                for half in range(2):
                    e = j * threads + 32 * warp + 16 * half + np.arange(16)
                    assert len(set((chunk_word(e) // 2) % 16)) == 16, (stored, j, warp, half)
