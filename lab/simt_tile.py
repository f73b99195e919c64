"""SIMT tiles at the classic SGEMM recipe: matmul v9 (family "v9").

matmul v3 multiplies with plain fp32 multiply-adds (SIMT) on the tensor-core fragment layout of
warp_tile.py, which suits mma.sync and not the multiply-adds: for every k a thread reads each of
its TM + TN operand values from shared memory with its own 32-bit load, one load for every four
multiply-adds, and shared memory (128 bytes a clock per multiprocessor) runs out long before the
fp32 units do. It ran at 12-21 TFLOP/s on the H200, cuBLAS SGEMM at 45-53.

v9 arranges the work the way fast SGEMMs do (cuBLAS's SIMT kernels, CUTLASS's SIMT GEMM):

1. Both operands are stored k-major in shared memory, sa[k, m] and sb[k, n], so a thread's 4
   consecutive rows (or columns) at one k are 4 consecutive floats: one 128-bit load.

2. A thread owns a TM x TN patch of out made of 4 x 4 blocks. Lanes form an 8 x 4 grid inside the
   warp, g = lane >> 2 (0..7) and t = lane & 3 (0..3), as in the mma fragment layout:

       rows    wm0 + 32 p + 4 g + i        p = 0 .. WM/32 - 1,  i = 0 .. 3     (acc row 4 p + i)
       columns wn0 + 16 q + 4 t + j        q = 0 .. WN/16 - 1,  j = 0 .. 3     (acc column 4 q + j)

   For each k the thread loads its TM values of op(a) and TN of op(b) with TM/4 + TN/4 128-bit
   loads and does TM * TN multiply-adds: with TM = TN = 8 (the GPU tiles), 4 loads for 64
   multiply-adds, where v3 made 16. A warp's load of sa[k, wm0 + 32 p + 4 g ..] asks for 8
   different 16-byte pieces (one 128-byte row segment: one pass of shared memory, the lanes of
   equal g sharing theirs by broadcast); its load of sb[k, wn0 + 16 q + 4 t ..] for 4.

3. The copy into shared memory. An operand stored with k along its rows (a [M, K], or b^T stored
   [N, K]) is transposed on the way in: each thread loads 4 consecutive k of one row (128 bits)
   and stores them as 4 floats down a column of the k-major tile. With BK = 8 the 32 lanes of a
   warp cover 16 rows x 2 groups of 4 k; the pitch BM + 4 (or BN + 4) puts k and k + 4 half a
   bank row apart (4 (BM + 4) = 16 mod 32 banks), so each of the 4 stores is conflict-free. An
   operand stored with k down its columns (a^T, or b [K, N]) is already k-major: straight
   128-bit copies of rows.

The K loop, the two shared stages and split-K are tile_loop.py's, as for v3 to v8. Each output is
one thread's chain of multiply-adds in k order: deterministic, and as accurate as v3 (the same
fp32 fused multiply-adds in a different grouping of threads).
"""
import functools
from types import SimpleNamespace

from numba import cuda, float32

from andrea_numba.kernels.common import cdiv
from andrea_numba.kernels.ptx import load4
from andrea_numba.kernels.tile_loop import WARP, make_pipeline
from andrea_numba.kernels.warp_tile import _copier, make_epilogue, whole_k


def _transposer(R, Cc, P, THREADS, vec):
    """fetch as warp_tile._copier's (this thread's share of an R x Cc tile of the stored matrix,
    4-float chunks along its rows when vec); put(s, regs): stored element (r, c) to s[c, r], rows
    of pitch P: the tile transposed into k-major shared memory."""
    fetch, _, E = _copier(R, Cc, P, THREADS, vec)
    if vec:
        CH, CPR = E // 4, Cc // 4         # chunks per thread, chunks per stored row

        @cuda.jit(device=True)
        def put(s, regs):
            for j in range(CH):
                e = cuda.threadIdx.x + j * THREADS
                r, c = e // CPR, (e % CPR) * 4
                for i in range(4):                       # 4 values of k down column r
                    s[c + i, r] = regs[4 * j + i]
    else:
        @cuda.jit(device=True)
        def put(s, regs):
            for j in range(E):
                e = cuda.threadIdx.x + j * THREADS
                s[e % Cc, e // Cc] = regs[j]
    return fetch, put, E


def _stage(BK, RM, RN, PA, PB):
    """stage(acc, sa, sb, wm0, wn0, g, t): acc += this thread's outer products over the BK values
    of k of one shared stage (sa [BK, PA], sb [BK, PB], k-major)."""
    TM, TN = 4 * RM, 4 * RN

    @cuda.jit(device=True)
    def stage(acc, sa, sb, wm0, wn0, g, t):
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        for k in range(BK):
            for p in range(RM):              # op(a)[wm0 + 32 p + 4 g + i, k], i = 0..3: one 128-bit load
                ra[4 * p], ra[4 * p + 1], ra[4 * p + 2], ra[4 * p + 3] = load4(sa, k * PA + wm0 + 32 * p + 4 * g)
            for q in range(RN):              # op(b)[k, wn0 + 16 q + 4 t + j], j = 0..3
                rb[4 * q], rb[4 * q + 1], rb[4 * q + 2], rb[4 * q + 3] = load4(sb, k * PB + wn0 + 16 * q + 4 * t)
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += ra[i] * rb[j]
    return stage


def _tile_mma(trans_a, trans_b, BM, BN, BK, WM, WN, vec):
    """tile_mma(acc, a, b, kb, ke) on k-major shared tiles (the module docstring)."""
    THREADS = WARP * (BM // WM) * (BN // WN)
    PA, PB = BM + 4, BN + 4
    # a^T (stored [K, M]) and b (stored [K, N]) are k-major already; a [M, K] and b^T [N, K] are transposed
    copy_a = _copier(BK, BM, PA, THREADS, vec) if trans_a else _transposer(BM, BK, PA, THREADS, vec)
    copy_b = _transposer(BN, BK, PB, THREADS, vec) if trans_b else _copier(BK, BN, PB, THREADS, vec)
    stage = _stage(BK, WM // 32, WN // 16, PA, PB)
    return make_pipeline(trans_a, trans_b, BM, BN, BK, WM, WN, (*copy_a, (BK, PA)), (*copy_b, (BK, PB)), stage)


@functools.cache
def make_simt_tile(tile):
    """The names make_warp_tile gives (mma, mma_nn .. mma_tt, row, col, zero, store, TM, TN,
    THREADS, BK, grid) for tile = ("v9", BM, BN, BK, WM, WN, vec): (BM/WM) x (BN/WN) warps,
    each WM x WN outputs (WM a multiple of 32, WN of 16), BK a multiple of 4."""
    family, BM, BN, BK, WM, WN, vec = tile
    assert family == "v9" and BM % WM == 0 and BN % WN == 0 and WM % 32 == 0 and WN % 16 == 0 and BK % 4 == 0, \
        f"tile {tile}"
    RM, RN = WM // 32, WN // 16
    TM, TN = 4 * RM, 4 * RN
    WARPS_N = BN // WN
    THREADS = WARP * (BM // WM) * WARPS_N
    ranged = {(ta, tb): _tile_mma(ta, tb, BM, BN, BK, WM, WN, vec) for ta in (False, True) for tb in (False, True)}

    @cuda.jit(device=True)
    def row(i):
        """Row of out that acc[i, :] belongs to: wm0 + 32 (i // 4) + 4 g + i % 4."""
        warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
        return cuda.blockIdx.y * BM + (warp // WARPS_N) * WM + (i // 4) * 32 + 4 * (lane >> 2) + i % 4

    @cuda.jit(device=True)
    def col(j):
        """Column of out that acc[:, j] belongs to: wn0 + 16 (j // 4) + 4 t + j % 4."""
        warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
        return cuda.blockIdx.x * BN + (warp % WARPS_N) * WN + (j // 4) * 16 + 4 * (lane & 3) + j % 4

    zero, store = make_epilogue(row, col, TM, TN)
    return SimpleNamespace(mma=ranged, **whole_k(ranged), row=row, col=col, zero=zero, store=store, TM=TM, TN=TN,
                           THREADS=THREADS, BK=BK, grid=lambda M, N, z=1: (cdiv(N, BN), cdiv(M, BM), z))
