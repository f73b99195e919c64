"""The lab's warp tiles (andrea_numba/kernels/warp_tile.py holds the engine's and what every family
shares): the tile families of matmul v3 and v4, the first warp tiles of the ladder, and of v5, v6,
v7 and v10, the other options of make_split_tile (lab/split_tile.py's k-major tiles). lab/matmul.py
registers them in matmul.TILE_FAMILIES by the rung that runs them.

matmul v3 and v4 compute a BM x BN tile of out = op(a) @ op(b) per block, like matmul v2, with the
four changes of warp_tile.py's docstring (warps owning sub-tiles in the fragment layout, 128-bit
copies a stage ahead, two shared stages, a K range for split-K), on its padded shared tiles that
keep each operand's orientation (_copier). v3 and v4 share that layout; only the inner step
differs (_kstep):
    v3 (SIMT): for each k, read this thread's TM values of op(a) and TN values of op(b) from shared
       memory into registers and add their outer product into acc (TM * TN multiply-adds).
    v4 (3xTF32): read the warp's A and B fragments, split each value into its TF32 parts and add
       three tensor-core products a fragment, each 8-deep product added to acc in fp32 (the step
       flash attention's tf32x3 kernels still take).

v5-v7 and v10 keep v4's warps, fragment layout and split-K on lab/split_tile.py's k-major tiles
(its docstring tells what each changed): v5 splits each value once, on its way into shared memory
(two planes); v6 keeps one plane of raw values, split as each thread reads its fragments; v7 hands
the tensor core x - big as it is (the small part's low bits truncated there: three instructions a
split instead of five); v10 rounds each value to bf16 as it is read, one mma.sync m16n8k16 a
fragment a stage. The engine's matmul_tf32x3 (v8) is v7 on swizzled tiles, matmul_fp16 (v11) v10
in fp16.
"""
import functools

from numba import cuda

from andrea_numba.kernels.tile_loop import WARP, make_pipeline
from andrea_numba.kernels.warp_tile import *  # noqa: F401,F403  (the engine's tiles and helpers)
from andrea_numba.kernels.warp_tile import _copier, _kstep, fragment_tile, kmajor_tile
from lab.split_tile import tile_mma_split


def _tile_mma(trans_a, trans_b, BM, BN, BK, WM, WN, tensor_cores, vec):
    """Build tile_mma(acc, a, b, kb, ke): acc += this thread's share of the block's tile of
    op(a)[:, kb:ke] @ op(b)[kb:ke, :]."""
    WARPS_N = BN // WN
    THREADS = WARP * (BM // WM) * WARPS_N
    # stored tile shapes (rows x columns of the stored matrix) and shared pitches
    RA, CA, PA = (BK, BM, BM + 8) if trans_a else (BM, BK, BK + 4)
    RB, CB, PB = (BN, BK, BK + 4) if trans_b else (BK, BN, BN + 8)
    fetch_a, put_a, EA = _copier(RA, CA, PA, THREADS, vec)
    fetch_b, put_b, EB = _copier(RB, CB, PB, THREADS, vec)
    step = _kstep(trans_a, trans_b, WM // 16, WN // 8, tensor_cores)


    @cuda.jit(device=True)
    def stage(acc, sa, sb, wm0, wn0, g, t):
        for kk in range(0, BK, 8):
            step(acc, sa, sb, kk, wm0, wn0, g, t)

    return make_pipeline(trans_a, trans_b, BM, BN, BK, WM, WN, (fetch_a, put_a, EA, (RA, PA)),
                         (fetch_b, put_b, EB, (RB, PB)), stage), THREADS


def make_warp_tile(tile, tensor_cores):
    """Everything a kernel needs for one warp tile of padded shared tiles (matmul v3, v4), the same
    names as matmul.make_tile:
        mma_nn, mma_nt, mma_tn, mma_tt     acc += a @ b, a @ b^T, a^T @ b, a^T @ b^T over all of K
        mma[(trans_a, trans_b)]            the same over k in [kb, ke): f(acc, a, b, kb, ke)
        row(i), col(j), zero(acc), store(out, acc, accumulate)
        TM, TN, THREADS, grid(M, N, z)
    tile = (family, BM, BN, BK, WM, WN, vec); tensor_cores: the 8-deep step on mma.sync (3xTF32), else
    SIMT multiply-adds; vec: 128-bit copies (the caller checked the alignment: resolve())."""
    family, BM, BN, BK, WM, WN, vec = tile
    assert BM % WM == 0 and BN % WN == 0 and WM % 16 == 0 and WN % 8 == 0 and BK % 8 == 0, f"tile {tile}"
    ranged = {}
    for ta in (False, True):
        for tb in (False, True):
            ranged[(ta, tb)], THREADS = _tile_mma(ta, tb, BM, BN, BK, WM, WN, tensor_cores, vec)
    return fragment_tile(ranged, BM, BN, BK, WM, WN, THREADS)


def make_split_tile(tile, presplit, split_mode, swizzle, half=None):
    """A warp tile of lab/split_tile.py's k-major tiles (BK = 16), the names of warp_tile.kmajor_tile,
    built by tile_mma_split with these options: presplit (the TF32 parts made once, on the way into
    shared memory), split_mode (lab/split_tile.SPLITS), swizzle (the swizzled rows and 128-bit stores
    of transposed operands), half ("bf16" or "fp16": the values rounded to that format as read, one
    mma.sync m16n8k16 a fragment a stage). tile = (family, BM, BN, BK, WM, WN, vec). At
    presplit=False, swizzle=True it gives the engine's tiles' bits: split_mode="trunc" those of
    make_tf32x3_tile, half="fp16" those of make_fp16_tile (tests/test_split_tile.py)."""
    return kmajor_tile(tile, functools.partial(tile_mma_split, presplit=presplit, split_mode=split_mode,
                                               swizzle=swizzle, half=half))


def make_v3_tile(tile):
    """matmul v3's tile: padded shared tiles, SIMT multiply-adds."""
    return make_warp_tile(tile, tensor_cores=False)


def make_v4_tile(tile):
    """matmul v4's tile: padded shared tiles, 3xTF32 on tensor cores."""
    return make_warp_tile(tile, tensor_cores=True)


def make_v5_tile(tile):
    """matmul v5's tile: split planes (the TF32 parts made once, on the way into shared memory)."""
    return make_split_tile(tile, presplit=True, split_mode="round", swizzle=False)


def make_v6_tile(tile):
    """matmul v6's tile: one plane of raw values, both parts rounded as the fragments are read."""
    return make_split_tile(tile, presplit=False, split_mode="round", swizzle=False)


def make_v7_tile(tile):
    """matmul v7's tile: v6's, the small part's low bits left for the tensor core to drop."""
    return make_split_tile(tile, presplit=False, split_mode="trunc", swizzle=False)


def make_v10_tile(tile):
    """matmul v10's tile: the engine's swizzled k-major tiles, each value rounded to bf16 as read."""
    return make_split_tile(tile, presplit=False, split_mode="round", swizzle=True, half="bf16")
