"""matmul v15 (lab/wgmma_ring.py): v14's wgmma products with one wgmma group in flight and a deeper
ring (BK = 64 stages of 128-byte rows in dynamic shared memory), in the simulator (wgmma a NumPy twin
there, wgmma.wgmma_warpgroup on the shared array's bytes).

The harness (tests/test_kernels.py) checks v15 on the three product cases at both simulator tiles
(64 x 16 x 64 with 4 stages in dynamic shared memory, 64 x 8 x 32 with 3 in static). These tests add
every transpose with edges in M, N and K, on the cp.async path and the guarded one; a K of many
steps, so the ring goes round several times with the stage refills of the wait-1 order; split K;
bit-identical reruns; and the layout arithmetic at the GPU's tiles (v13's copier with rows of 8
chunks is wgmma's 128-byte swizzle). What the simulator cannot check: the asynchrony (the waits and
fences are no-ops there) and the 1024-byte alignment of the dynamic ring (its array starts at 0).
"""
import functools

import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import half_tile as H
from lab import matmul as MM                        # the whole ladder: the engine's products and the lab's
from lab import matmul as lab_matmul
from andrea_numba.kernels import wgmma as W
from lab import wgmma_ring as WR
from andrea_numba.kernels.common import SIMULATOR
from test_matmul_v12 import _bf16_product, _operands, _run   # v12's helpers: the same operands, twin and call
from test_matmul_v13 import check_split_slices

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's twins (NUMBA_ENABLE_CUDASIM=1)")
_run = functools.partial(_run, launch=MM.matmul_v15)          # noqa: F811
DYNAMIC, STATIC = MM.matmul_v15.blocks                        # (64, 16, 64, 64, 16, 4), (64, 8, 32, 64, 8, 3)


def test_v15_is_a_bf16_version_of_the_ladder():
    assert lab_matmul.VERSIONS["matmul"][15] is MM.matmul_v15 and MM.matmul_v15.precision == "bf16"
    assert MM.matmul_v15.family == "v15" and MM.TILE_FAMILIES["v15"].rung == 15
    assert DYNAMIC[2] == 64 and DYNAMIC[5] == 4 and STATIC[2] == 32 and STATIC[5] == 3
    for block in MM.RING_TILES["gpu"] + MM.RING_TILES["sim"]:
        t = WR.make_ring_tile(("v15", *block[:5], True, block[5]))
        assert t.THREADS == 128 * (block[0] // 64) and (t.TM, t.TN) == (2, block[1] // 4)
        ring = block[5] * (block[0] + block[1]) * 2 * block[2]
        assert t.SHARED == (ring + 1024 if block[2] == 64 else 0)
    first, four = MM.RING_TILES["gpu"][:2]                     # 3 stages of 32 KiB (two blocks a multiprocessor)
    assert WR.make_ring_tile(("v15", *first[:5], True, first[5])).SHARED == 97 * 1024     # + 1 KiB to align
    assert WR.make_ring_tile(("v15", *four[:5], True, four[5])).SHARED == 129 * 1024      # 4 stages


# (70, 20, 72): two tiles along M (64 rows) and two or three along N (16 or 8), K a full 64 stage and
# one of 8 values (the rest zero-filled); K % 8 == 0: cp.async chunks. K = 45: the guarded copies.
CASES = [(ta, tb, 70, 20, 72, DYNAMIC) for ta in (False, True) for tb in (False, True)] + \
        [(False, False, 20, 13, 45, DYNAMIC), (True, True, 20, 13, 45, DYNAMIC), (False, True, 70, 20, 72, STATIC)]


@pytest.mark.parametrize("trans_a, trans_b, M, N, K, block", CASES)
def test_every_transpose_with_edges_agrees_with_the_bf16_twin(trans_a, trans_b, M, N, K, block):
    """out starts as NaN, so an element the kernel does not write fails."""
    rng = np.random.default_rng(15)
    a, b = _operands(rng, M, N, K, trans_a, trans_b)
    a16, b16 = MM.wgmma_copies(a, b, trans_a, trans_b)
    assert WR.ring_resolve(block, a16, b16)[6] == (K % 8 == 0)
    ref = _bf16_product(a, b, trans_a, trans_b)
    out = _run(a, b, trans_a, trans_b, np.full((M, N), np.nan, np.float32), block=block)
    scale = np.abs(ref).max()
    assert np.abs(out - ref).max() <= 1e-6 * scale                 # fp32 sums of the same exact products
    exact = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    assert np.abs(out - exact).max() > 1e-4 * scale                # and the inputs were rounded to bf16


@pytest.mark.parametrize("block, K", [(DYNAMIC, 408), (STATIC, 208)])
def test_many_steps_go_round_the_ring(block, K):
    """out += a^T @ b over 7 steps (the last partial): the 4-stage ring goes round 1.75 times (2.3 for
    3 stages), each refill landing in the stage step s - 2 read; a rerun gives the same bits."""
    rng = np.random.default_rng(K)
    M, N = 40, block[1]
    a, b = _operands(rng, M, N, K, True, False)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    assert (K + block[2] - 1) // block[2] == 7
    out = _run(a, b, True, False, o0, accumulate=True, block=block)
    ref = o0 + _bf16_product(a, b, True, False)
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()
    if block == STATIC:
        assert np.array_equal(out, _run(a, b, True, False, o0, accumulate=True, block=block))


def test_a_split_product_adds_its_slices_in_order():
    """v13's check (test_matmul_v13.check_split_slices: K = 192) on the static tile, BK = 32 (at
    BK = 64, K = 192 is too short to split: see the next test)."""
    def launch(*args, **kwargs):
        return MM.matmul_v15(*args, **{**kwargs, "block": STATIC})
    launch.blocks = (STATIC,)
    check_split_slices(launch, 16, 16)


def test_a_split_product_on_the_dynamic_ring():
    """K = 512 on the 64-wide stages: sliced (S > 1), every slice through the dynamic ring, summed
    in order to the twin's product."""
    rng = np.random.default_rng(18)
    M, N, K = 8, 16, 512
    a, b = _operands(rng, M, N, K, True, False)
    work = cuda.to_device(np.zeros(MM.splitk_work(8), np.float32))
    S, _ = MM.splitk(M, N, K, 1, DYNAMIC, work)
    assert S > 1
    out = _run(a, b, True, False, np.zeros((M, N), np.float32), work=work, block=DYNAMIC)
    ref = _bf16_product(a, b, True, False)
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()


@pytest.mark.parametrize("rows", [256, 128, 16, 8])
def test_the_copies_land_where_the_128_byte_swizzle_expects_them(rows):
    """BK = 64: v13's copier places chunk q of row r at q ^ (r & 7) (half_tile._word(32)), which is
    wgmma.kmajor_offset's 128-byte swizzle (mode 1) for every element; descriptors (SBO 1024, LBO 16,
    mode 1) at the tile start + 64 wg rows + 32 ks bytes read exactly k 16 ks .. 16 ks + 15 of every
    row, for the four k16 steps of a stage."""
    word = H._word(32)                                         # rows of 32 words: BK = 64 bf16
    r, k = np.arange(rows)[:, None], np.arange(64)[None, :]
    placed = 4 * word(r, k // 8) + 2 * (k % 8)                 # byte of element (r, k) as the copier puts it
    assert np.array_equal(placed, W.kmajor_offset(r, k, rows, W.SWIZZLE_128B))
    row, swizzle, sbo = WR.LAYOUT[64]
    assert (row, swizzle, sbo) == (128, W.SWIZZLE_128B, 1024)
    for start in range(0, rows, 64):                           # warpgroup wg's A at row 64 wg (B^T: all rows)
        n = min(rows, 64)
        for ks in range(4):
            desc = W.pack_desc(2048 + start * row + 32 * ks, WR.LBO, sbo, swizzle)
            addr = W.kmajor_read_addresses(desc, n)            # [n, 16]: what wgmma reads
            assert np.array_equal(addr, 2048 + placed[start:start + n, 16 * ks:16 * ks + 16])
