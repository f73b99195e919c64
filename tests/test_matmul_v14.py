"""matmul v14 (lab/wgmma_tile.py): wgmma products from K-major bf16 copies in v13's cp.async ring,
in the simulator (wgmma a NumPy twin there, wgmma.wgmma_warpgroup on the shared array's bytes).

The harness (tests/test_kernels.py) checks v14 on the three product cases at both simulator tiles;
these tests add every transpose (so both transposed copies) with edges in M, N and K at once, on
the cp.async path and on the guarded one, the 4-stage ring over many steps with accumulate, a split
K added slice by slice, operands that are bf16 already (uint16), bit-identical reruns, the
transposing round kernel bit for bit, and the layout arithmetic at the GPU's tiles (v13's swizzle
is wgmma's 64-byte swizzle). Kept small: the simulator runs every thread, 128 a warpgroup.
"""
import functools

import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import half_tile as H
from andrea_numba.kernels import matmul as MM
from lab import matmul as lab_matmul
from lab import operands as lab_operands
from andrea_numba.kernels import wgmma as W
from lab import wgmma_tile as WT
from lab import wgmma_tile as lab_wgmma_tile
from andrea_numba.kernels.common import SIMULATOR
from reference.precision import round_bf16
from test_matmul_v12 import _bf16_product, _operands, _run   # v12's helpers: the same operands, twin and call
from test_matmul_v13 import check_split_slices

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's twins (NUMBA_ENABLE_CUDASIM=1)")
_run = functools.partial(_run, launch=lab_matmul.matmul_v14)          # noqa: F811


def _bits(x):
    """bf16 bit patterns (uint16) of round_bf16(x)."""
    return (round_bf16(x).view(np.uint32) >> 16).astype(np.uint16)


def test_v14_is_a_bf16_version_of_the_ladder():
    assert lab_matmul.VERSIONS["matmul"][14] is lab_matmul.matmul_v14 and lab_matmul.matmul_v14.precision == "bf16"
    assert lab_matmul.matmul_v14.family == "v14" and MM.TILE_FAMILIES["v14"].rung == 14
    assert len(lab_matmul.matmul_v14.blocks) >= 2
    for block in lab_matmul.WGMMA_TILES["gpu"] + lab_matmul.WGMMA_TILES["sim"]:
        t = WT.make_wgmma_tile(("v14", *block[:5], True, block[5] if len(block) > 5 else WT.STAGES))
        assert t.THREADS == 128 * (block[0] // 64) and (t.TM, t.TN) == (2, block[1] // 4)


# One or four blocks a product. (70, 20, 40): two tiles along M and N (64 x 16), K = 40 a full stage
# and one of 8 values (the rest zero-filled); K % 8 == 0, so cp.async chunks. K = 45: guarded copies.
CASES_V14 = [(ta, tb, 70, 20, 40) for ta in (False, True) for tb in (False, True)] + \
            [(False, False, 20, 13, 45), (True, True, 20, 13, 45)]


@pytest.mark.parametrize("trans_a, trans_b, M, N, K", CASES_V14)
def test_every_transpose_with_edges_agrees_with_the_bf16_twin(trans_a, trans_b, M, N, K):
    """out starts as NaN, so an element the kernel does not write fails; the n16 tile, 3 stages."""
    rng = np.random.default_rng(14)
    a, b = _operands(rng, M, N, K, trans_a, trans_b)
    a16, b16 = lab_matmul.wgmma_copies(a, b, trans_a, trans_b)
    assert a16.shape == (M, K) and b16.shape == (N, K)                # both K-major
    assert lab_wgmma_tile.wgmma_resolve(lab_matmul.matmul_v14.blocks[0], a16, b16)[6] == (K % 8 == 0)
    ref = _bf16_product(a, b, trans_a, trans_b)
    out = _run(a, b, trans_a, trans_b, np.full((M, N), np.nan, np.float32))
    scale = np.abs(ref).max()
    assert np.abs(out - ref).max() <= 1e-6 * scale                 # fp32 sums of the same exact products
    exact = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    assert np.abs(out - exact).max() > 1e-4 * scale                # and the inputs were rounded to bf16
    if (trans_a, trans_b, K) == (True, False, 40):                  # a rerun gives the same bits
        assert np.array_equal(out, _run(a, b, trans_a, trans_b, np.zeros((M, N), np.float32)))


def test_the_four_stage_ring_accumulates_over_many_steps():
    """out += a^T @ b on the n8 tile with 4 stages (wait_group 2): K = 136 is 5 steps (the last a
    quarter full), so the ring wraps around onto stage 0 while stages 1..3 hold copies."""
    rng = np.random.default_rng(15)
    M, N, K = 40, 8, 136
    a, b = _operands(rng, M, N, K, True, False)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    block = lab_matmul.matmul_v14.blocks[1]
    assert len(block) == 6 and block[5] == 4 and block[1] == 8
    out = _run(a, b, True, False, o0, accumulate=True, block=block)
    ref = o0 + _bf16_product(a, b, True, False)
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()


def test_a_split_product_adds_its_slices_in_order():
    """v13's check (test_matmul_v13.check_split_slices): the slices' partials in work, added in order."""
    check_split_slices(lab_matmul.matmul_v14, 16, 16)


def test_operands_already_in_bf16_give_the_same_bits():
    """A saved bf16 activation (uint16) is used as it is when K-major (a [M, K]) and has its bits
    transposed when not (b [K, N]): the same bits as the fp32 operands rounded by the launcher."""
    rng = np.random.default_rng(17)
    M, N, K = 20, 13, 40
    a, b = _operands(rng, M, N, K, False, False)
    want = _run(a, b, False, False, np.zeros((M, N), np.float32))
    a16 = cuda.to_device(_bits(a))
    a16c, b16c = lab_matmul.wgmma_copies(a16, cuda.to_device(_bits(b)), False, False)
    assert np.array_equal(a16c.copy_to_host(), _bits(a)) and np.array_equal(b16c.copy_to_host(), _bits(b).T)
    out = cuda.to_device(np.zeros((M, N), np.float32))
    lab_matmul.matmul_v14(out, None, a16, cuda.to_device(_bits(b)))
    assert np.array_equal(out.copy_to_host(), want)


@pytest.mark.parametrize("R, C", [(37, 45), (8, 3), (1, 17)])
def test_the_transposed_copy_is_round_bf16_bit_for_bit(R, C):
    """k_round_bf16_t_v1 (round_into_t): dst [C, R] rows packed = bf16(src[i, j]) at dst[j, i], ties to
    even, NaN kept a NaN, the same bits as reference/precision.round_bf16; a uint16 source moved as
    it is. Odd shapes: tiles cut at both edges; the slot past R * C is left alone."""
    rng = np.random.default_rng(R * C)
    src = rng.standard_normal((R, C)).astype(np.float32)
    src.flat[:4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, np.inf, 1e-40][:src.size]     # ties go to even
    if src.size > 4:
        src.flat[4] = np.nan
    dst = cuda.to_device(np.full(R * C + 5, 7, np.uint16))
    lab_operands.round_into_t(dst, cuda.to_device(src))
    got = dst.copy_to_host()
    want = _bits(src).T.reshape(-1)
    nan = np.isnan(src.T.reshape(-1))
    assert np.array_equal(got[:R * C][~nan], want[~nan]) and (got[R * C:] == 7).all()
    assert ((got[:R * C][nan] & 0x7F80) == 0x7F80).all() and (got[:R * C][nan] & 0x7F).any()
    bits = rng.integers(0, 1 << 16, (R, C)).astype(np.uint16)
    lab_operands.round_into_t(dst, cuda.to_device(bits))
    assert np.array_equal(dst.copy_to_host()[:R * C], bits.T.reshape(-1))


@pytest.mark.parametrize("rows", [128, 64, 16, 8])
def test_the_copies_land_where_the_64_byte_swizzle_expects_them(rows):
    """The GPU's tiles (A: 128 or 64 rows, B^T: 128) and the simulator's (16, 8): v13's k-inner chunk
    placement (chunk q of row r at q ^ ((r >> 1) & 3)) is wgmma.kmajor_offset's 64-byte swizzle for
    every element, and a descriptor (SBO 512, LBO 16, mode 2) at the tile start, + 32 bytes for the
    second k16 step, reads exactly the values k 0..15 and 16..31 of every row (the twin's addresses)."""
    word = H._word(16)                                         # rows of 16 words: BK = 32 bf16
    r, k = np.arange(rows)[:, None], np.arange(32)[None, :]
    placed = 4 * word(r, k // 8) + 2 * (k % 8)                 # byte of element (r, k) as the copier puts it
    assert np.array_equal(placed, W.kmajor_offset(r, k, rows, W.SWIZZLE_64B))
    for start in range(0, rows, 64):                           # warpgroup wg's A at row 64 wg (B^T: all rows)
        n = min(rows, 64)
        for ks in range(2):
            desc = W.pack_desc(1024 + start * 64 + 32 * ks, WT.LBO, WT.SBO, W.SWIZZLE_64B)
            addr = W.kmajor_read_addresses(desc, n)            # [n, 16]: what wgmma reads
            assert np.array_equal(addr, 1024 + placed[start:start + n, 16 * ks:16 * ks + 16])
    desc = W.pack_desc(1024, WT.LBO, WT.SBO, W.SWIZZLE_64B)      # B^T of rows x 16 read whole (N = rows)
    assert np.array_equal(W.kmajor_read_addresses(desc, rows), 1024 + placed[:, :16])
