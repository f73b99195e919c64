"""kernels/wgmma.py's MN-major layouts without a GPU: the offsets of an MN-major tile, the meaning of
LBO and SBO for an MN-major operand, and the NumPy twin of wgmma reading M-major A and N-major B
through the transpose bits, each swizzle and the plain interleave, against a plain product; then
matmul v17's stage tiles (kernels/wgmma_mn.py): v13's copier places every element where
mnmajor_offset says, and v17's descriptors read exactly the k16 steps of it. Plain NumPy: no
simulated launch (lab/bench/wgmma_probe.py's mn_* variants ask the H200 the same questions).
"""
import numpy as np
import pytest

from andrea_numba.kernels import half_tile as H
from andrea_numba.kernels import wgmma as W
from lab import wgmma as lab_wgmma
from andrea_numba.kernels import wgmma_mn as WM
from reference.precision import round_bf16

MODES = [W.SWIZZLE_128B, W.SWIZZLE_64B, W.SWIZZLE_32B, W.SWIZZLE_NONE]


# ------------------------------------------------------------------------------------------------
# the layout and the descriptor's offsets

def test_an_mn_major_128b_row_holds_64_values_of_m_for_one_k_chunk_swizzled_by_k():
    """Element (m, k): column block m // 64 (128 depth bytes), row k (128 bytes), chunk (m % 64) // 8
    stored at chunk ((m % 64) // 8) ^ (k % 8), value m % 8 in it."""
    for m in (0, 1, 9, 63, 64, 77, 127):
        for k in (0, 1, 7, 8, 13, 63):
            q = (m % 64) // 8
            want = (m // 64) * 128 * 64 + k * 128 + 16 * (q ^ (k % 8)) + 2 * (m % 8)
            assert W.mnmajor_offset(m, k, 64, W.SWIZZLE_128B) == want
    assert W.mnmajor_offset(0, 1, 64, W.SWIZZLE_128B) == 128 + 16        # row 1: chunk 0 at position 1
    assert W.mnmajor_offset(64, 0, 32, W.SWIZZLE_128B) == 4096            # the next block: 32 rows on
    # no swizzle: columns of core matrices, 8 k x 8 m (16-byte rows of m), 128 bytes each
    assert W.mnmajor_offset(1, 1, 64, W.SWIZZLE_NONE) == 16 + 2
    assert W.mnmajor_offset(0, 8, 64, W.SWIZZLE_NONE) == 128
    assert W.mnmajor_offset(8, 0, 64, W.SWIZZLE_NONE) == 64 * 16


def test_swizzled_mn_major_lbo_runs_along_m_and_sbo_along_k_the_plain_one_the_other_way():
    assert W.mnmajor_lbo_sbo(64, W.SWIZZLE_128B) == (8192, 1024)       # matmul v17's BK = 64 stage
    assert W.mnmajor_lbo_sbo(32, W.SWIZZLE_128B) == (4096, 1024)       # and its BK = 32 one
    assert W.mnmajor_lbo_sbo(64, W.SWIZZLE_64B) == (4096, 512)
    assert W.mnmajor_lbo_sbo(16, W.SWIZZLE_32B) == (512, 256)
    assert W.mnmajor_lbo_sbo(64, W.SWIZZLE_NONE) == (128, 1024)        # LBO along K, SBO along M
    assert [W.mnmajor_step_offset(s, W.SWIZZLE_128B) for s in range(4)] == [0, 2048, 4096, 6144]
    # what the hardware reads (the ISA's canonical layout), element (m, k), at start 0:
    addr = W.mnmajor_read_addresses(W.pack_desc(0, 8192, 1024, W.SWIZZLE_128B), 128)
    assert addr.shape == (128, 16)
    assert (addr[0, 0], addr[1, 0], addr[8, 0], addr[0, 1]) == (0, 2, 16, 128 + 16)
    assert (addr[64, 0], addr[0, 8], addr[64, 9]) == (8192, 1024, 8192 + 1024 + 128 + 16)
    plain = W.mnmajor_read_addresses(W.pack_desc(0, 128, 1024, W.SWIZZLE_NONE), 64)
    assert (plain[1, 0], plain[0, 1], plain[0, 8], plain[8, 0]) == (2, 16, 128, 1024)
    core = plain[:8, :8]
    assert sorted(core.reshape(-1).tolist()) == list(range(0, 128, 2))   # a core matrix: 128 contiguous bytes


@pytest.mark.parametrize("mode", MODES)
def test_the_tile_is_a_permutation_of_its_bytes(mode):
    m, k = np.meshgrid(np.arange(128), np.arange(32), indexing="ij")
    off = W.mnmajor_offset(m, k, 32, mode)
    assert sorted(off.reshape(-1).tolist()) == list(range(0, 128 * 32 * 2, 2))


# ------------------------------------------------------------------------------------------------
# the twin of the product with the transpose bits

def _operands(n, K, seed=0):
    rng = np.random.default_rng(seed)
    a = round_bf16(rng.standard_normal((64, K)).astype(np.float32))
    bt = round_bf16(rng.standard_normal((n, K)).astype(np.float32))
    return a, bt, a.astype(np.float64) @ bt.astype(np.float64).T


def _image(a, bt, mode, mn_a, mn_b):
    """Shared-memory image (uint16): A at 0, B^T at the next 1024-byte boundary after A's 64 x K,
    each MN-major (mnmajor_offset's tile, K deep) or K-major (kmajor_offset, 128-byte rows for the
    swizzles, k pairs without), and per k16 step the two descriptors."""
    K = a.shape[1]
    b_base = -(-64 * 2 * max(K, 64) // 1024) * 1024
    image = np.zeros((b_base + 2 * bt.shape[0] * max(K, 64) + 16384) // 2, np.uint16)   # zeros past B
    steps = []
    for x, base, mn in ((a, 0, mn_a), (bt, b_base, mn_b)):
        rows = x.shape[0]
        r, k = np.meshgrid(np.arange(rows), np.arange(K), indexing="ij")
        if mn:
            lbo, sbo = W.mnmajor_lbo_sbo(K, mode)
            off, step = W.mnmajor_offset(r, k, K, mode), (lambda s: W.mnmajor_step_offset(s, mode))
        else:
            lbo, sbo = (128, 16 * K) if mode == W.SWIZZLE_NONE else (16, 8 * W.SWIZZLE_BYTES[mode])
            off = W.kmajor_offset(r, k, rows, mode, lbo, sbo)
            step = (lambda s, rows=rows, lbo=lbo: lab_wgmma.kmajor_step_offset(s, rows, mode, lbo))
        assert len(np.unique(off)) == off.size
        image[(base + off) // 2] = W.bf16_bits(x)
        steps.append([(base + step(s), lbo, sbo, mode) for s in range(K // 16)])
    return image, steps


def _product(image, steps, n, trans, swap=()):
    """The warpgroup's product over all k16 steps; swap: the operands ("a", "b") whose descriptor
    has LBO and SBO exchanged."""
    acc = None
    for s, (sa, sb) in enumerate(zip(*steps)):
        da, db = (W.pack_desc(st, *((sbo, lbo) if name in swap else (lbo, sbo)), m)
                  for name, (st, lbo, sbo, m) in zip("ab", (sa, sb)))
        acc = W.wgmma_warpgroup(image, da, db, n, acc, scale_d=int(s > 0), trans_a=trans[0], trans_b=trans[1])
    return W.fragment_to_matrix(acc)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("trans", [(1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("n, K", [(64, 16), (128, 64), (256, 32)])
def test_the_twin_reads_mn_major_operands_back_as_a_at_b(mode, trans, n, K):
    a, bt, ref = _operands(n, K)
    image, steps = _image(a, bt, mode, *trans)
    out = _product(image, steps, n, trans)
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()


def test_without_the_transpose_bits_an_mn_major_tile_reads_as_another_matrix():
    a, bt, ref = _operands(64, 16)
    image, steps = _image(a, bt, W.SWIZZLE_128B, True, True)
    assert np.abs(_product(image, steps, 64, (1, 1)) - ref).max() <= 1e-6 * np.abs(ref).max()
    assert np.abs(_product(image, steps, 64, (0, 0)) - ref).max() > 0.1 * np.abs(ref).max()


@pytest.mark.parametrize("mode", [W.SWIZZLE_128B, W.SWIZZLE_NONE])
def test_exchanging_lbo_and_sbo_of_an_mn_major_operand_reads_another_matrix(mode):
    """B of n = 128 spans two 64-wide blocks (one block of 8 m without swizzle): both offsets used."""
    a, bt, ref = _operands(128, 64)
    image, steps = _image(a, bt, mode, True, True)
    assert np.abs(_product(image, steps, 128, (1, 1), swap=("b",)) - ref).max() > 0.1 * np.abs(ref).max()
    assert np.abs(_product(image, steps, 128, (1, 1), swap=("a",)) - ref).max() > 0.1 * np.abs(ref).max()


# ------------------------------------------------------------------------------------------------
# matmul v17's stage tiles

def test_v17_operand_layouts():
    """(k16 step bytes, LBO, SBO, mode) of each operand of a stage (wgmma_mn.py, points 2 and 3)."""
    assert WM.operand_layout(True, 64) == (2048, 8192, 1024, W.SWIZZLE_128B)
    assert WM.operand_layout(True, 32) == (2048, 4096, 1024, W.SWIZZLE_128B)
    assert WM.operand_layout(False, 64) == (32, 16, 1024, W.SWIZZLE_128B)    # v15's
    assert WM.operand_layout(False, 32) == (32, 16, 512, W.SWIZZLE_64B)      # v14's


@pytest.mark.parametrize("R, BK", [(256, 64), (128, 64), (64, 32), (128, 32)])
def test_the_copies_land_where_the_mn_major_descriptors_read(R, BK):
    """Block j of an MN-major stage is v13's copier of a BK x 64 piece (rows k of 128 bytes, chunk q
    of row k at q ^ (k & 7): half_tile._word(32)) placed j 128 BK bytes in; that is mnmajor_offset
    for every element, and the descriptor of warpgroup wg (start + wg 128 BK, A's 64 m) or of all R
    (B), at the stage's k16 step ks (start + 2048 ks), reads exactly k 16 ks .. 16 ks + 15."""
    word = H._word(32)
    m, k = np.arange(R)[:, None], np.arange(BK)[None, :]
    placed = (m // 64) * 128 * BK + 4 * word(k, (m % 64) // 8) + 2 * (m % 8)
    assert np.array_equal(placed, W.mnmajor_offset(m, k, BK, W.SWIZZLE_128B))
    step, lbo, sbo, mode = WM.operand_layout(True, BK)
    base = 4096                                                      # a tile start on a 1024-byte boundary
    for first, rows in [(64 * wg, 64) for wg in range(R // 64)] + [(0, R)]:     # A's warpgroups, then B
        for ks in range(BK // 16):
            desc = W.pack_desc(base + first // 64 * lbo + ks * step, lbo, sbo, mode)
            addr = W.mnmajor_read_addresses(desc, rows)
            assert np.array_equal(addr, base + placed[first:first + rows, 16 * ks:16 * ks + 16])
