"""The lab's bf16 tiles read by ldmatrix (andrea_numba/kernels/half_tile.py holds the engine's): the
tile of matmul v12 (family "v12"), which rounds the fp32 operands on their way into shared memory.

matmul v10 (lab/split_tile.py) keeps fp32 values in shared memory and every lane rounds its fragment
values to bf16 as it reads them: each value crosses shared memory as 4 bytes and is converted
once for every warp that reads it (the A tile by each of the BN/WN warps of a row). v12 is built
the way fast half-precision GEMMs are (cuBLAS, CUTLASS): the values are rounded once, on their way
into shared memory, and shared memory holds bf16, 2 bytes a value, read by ldmatrix straight
into the registers of the mma.sync fragments. Same math as v10: the inputs rounded to bf16
(nearest, ties to even), products exact, sums in fp32; another order of the sums, so other bits
than v10's, the same bits at every run.

One stage (BK = 32 values of k) on its way, for each operand:

    global fp32  --ld.global.v4-->  registers (4 floats a chunk, issued before the current
                                    stage's products: in flight while the tensor cores work)
                 --cvt.rn.bf16x2--> two bf16x2 words a chunk (ties to even, two values an instruction)
                 --st.shared.v2-->  the other shared stage (8 bytes a chunk, swizzled)
    barrier (one a stage: the two shared stages alternate, tile_loop.make_pipeline)
    shared bf16  --ldmatrix.x4-->   a warp's fragments, then mma.sync m16n8k16: the engine's stage
                                    (half_tile.py, points 1-4: the tiles, lane addresses, swizzle)

The stores: each lane writes 8 bytes (4 values) with st.shared.v2, served 16 lanes (128 bytes) at
a time. 16 consecutive lanes cover 64 consecutive values of the stored rows: one whole line of
bf16, either two k-inner rows r, r + 1 (r even: both halves of the line, each row's 4 chunks
permuted among themselves) or 8 aligned chunks of one k-outer row (permuted among themselves by
the XOR with r & 7). 16 different 8-byte slots: no conflict. At the 128 x 128 tile each thread
issues 4 + 4 ld.global.v4, 16 cvt.rn.bf16x2 and 8 st.shared.v2 a stage (lab/bench/ptxcheck.py --v12
counts them in the PTX).

matmul v13, the engine's matmul_bf16, splits the rounding from the product. v12 moves fp32 operands
through registers: every thread loads 2 x 16 floats a stage (48 staging registers with the
addresses), rounds them (cvt) and stores them (st.shared), and only two shared stages fit beside
that. v13 rounds each operand once into a bf16 copy (k_round_bf16, v12's bits of rounding) and
copies the copies' 16-byte chunks to shared memory with cp.async (no staging registers, half the
bytes of v12's fp32 loads) into a ring of 3 or 4 stages, then v12's swizzle, ldmatrix and
mma.sync: v12's bits where the split of K is the same.
"""
from numba import cuda

from andrea_numba.kernels.half_tile import *  # noqa: F401,F403  (the engine's tiles and helpers)
from andrea_numba.kernels.half_tile import _dev, _stage, _word
from andrea_numba.kernels.common import nonneg
from andrea_numba.kernels.ptx import bf16x2, store2
from andrea_numba.kernels.split_tile import chunk_fetcher
from andrea_numba.kernels.tile_loop import WARP, make_pipeline
from andrea_numba.kernels.warp_tile import fragment_tile


def _chunk_word(R, Cc):
    """chunk_word(e): the word of the shared tile (R rows of Cc / 2 words) where the two bf16x2 words
    of 4-float chunk e of an R x Cc stored tile go: stored row e // (Cc / 4), columns 4 (e % (Cc / 4))..,
    half of the 16-byte chunk (e % (Cc / 4)) // 2 of that row."""
    CPR = Cc // 4
    word = _word(Cc // 2)

    def chunk_word(e):
        r, c4 = e // CPR, e % CPR
        return word(r, c4 >> 1) + 2 * (c4 & 1)
    return _dev(chunk_word)


def _copier(R, Cc, THREADS, vec):
    """fetch(regs, g, r0, c0, rlim, clim): this thread's 4-float chunks of the R x Cc tile of the
    stored matrix g at (r0, c0) into registers (zero outside rows < rlim, columns < clim; vec:
    one 128-bit load a chunk, the caller checked the alignment); put(s, regs): each chunk rounded
    to two bf16x2 words, stored with one 64-bit store at its swizzled place in the tile s (R rows
    of Cc / 2 words). Chunk e = thread + j THREADS is stored row e // (Cc / 4), columns 4 (e % (Cc / 4)).."""
    CPR = Cc // 4                                     # chunks a stored row
    CH = R * CPR // THREADS                           # chunks a thread
    assert CH * THREADS == R * CPR, f"a {R} x {Cc} tile does not split into 4-float chunks over {THREADS} threads"
    chunk_word = _chunk_word(R, Cc)

    @cuda.jit(device=True)
    def chunk(b, j):
        """(stored row offset, stored column offset) of thread b's chunk j: e = b + j THREADS."""
        e = nonneg(b) + j * THREADS
        return e // CPR, (e % CPR) * 4

    fetch = chunk_fetcher(chunk, CH, vec)                 # split_tile's: the 128-bit loads a stage ahead

    @cuda.jit(device=True)
    def put(s, regs):
        for j in range(CH):
            e = nonneg(cuda.threadIdx.x) + j * THREADS
            store2(s, chunk_word(e), bf16x2(regs[4 * j], regs[4 * j + 1]), bf16x2(regs[4 * j + 2], regs[4 * j + 3]))
    return fetch, put, 4 * CH


@functools.cache
def make_half_tile(tile):
    """Everything a kernel needs for one bf16 ldmatrix tile, the names of warp_tile.make_warp_tile
    (mma, mma_nn .. mma_tt, row, col, zero, store, TM, TN, THREADS, BK, grid).
    tile = ("v12", BM, BN, BK, WM, WN, vec): BK = 32; vec: 128-bit global loads (warp_tile.resolve).
    The shared stages are tile_loop's float32 arrays, each 32-bit element holding a bf16 pair
    (written by store2, read by ldmatrix, never as a float): the K loop is make_pipeline's."""
    family, BM, BN, BK, WM, WN, vec = tile
    assert family == "v12", family
    assert BK == BK_HALF, f"bf16 ldmatrix tiles take BK = {BK_HALF}, got {BK}"
    assert BM % WM == 0 and BN % WN == 0 and WM % 16 == 0 and WN % 16 == 0, f"tile {tile}"
    MI, NI = WM // 16, WN // 8
    THREADS = WARP * (BM // WM) * (BN // WN)
    ranged = {}
    for ta in (False, True):
        for tb in (False, True):
            # stored tiles: a [M, K] -> BM x BK, a^T [K, M] -> BK x BM; b^T [N, K] -> BN x BK, b [K, N] -> BK x BN
            fetch_a, put_a, EA = _copier(*((BK, BM) if ta else (BM, BK)), THREADS, vec)
            fetch_b, put_b, EB = _copier(*((BN, BK) if tb else (BK, BN)), THREADS, vec)
            ranged[(ta, tb)] = make_pipeline(ta, tb, BM, BN, BK, WM, WN, (fetch_a, put_a, EA, (BM * BK // 2,)),
                                             (fetch_b, put_b, EB, (BN * BK // 2,)), _stage(ta, tb, BM, BN, MI, NI))

    return fragment_tile(ranged, BM, BN, BK, WM, WN, THREADS)      # row, col, the epilogue: warp_tile's
