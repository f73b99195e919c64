"""Matrix products: the workhorse under attn_qkv, attn_out, mlp and the tied output projection.

    out[M, N] = op(a) @ op(b)        or, with accumulate, out += op(a) @ op(b)
    op(a) = a [M, K], or a^T when trans_a (a stored [K, M]);  op(b) = b [K, N], or b^T (b stored [N, K])

The three shapes a linear layer y = x @ W needs:
    forward         y  = x @ W               matmul(y, x, W)
    grad of input   dx = dy @ W^T            matmul(dx, dy, W, trans_b=True)
    grad of weight  dW += x^T @ dy           matmul(dW, x, dy, trans_a=True, accumulate=True)

v1, k_matmul_v1: one thread per output element, a plain loop over K. Every thread reads a whole
row of a and a whole column of b from global memory: easy to read, slow.

v2, k_matmul_v2: shared-memory tiling with register blocking. A block computes a BM x BN
tile of out. It walks K in steps of BK: its threads copy a BM x BK tile of op(a) and a BK x BN tile
of op(b) into shared memory (each element read from global memory once per block, not once per
thread), wait (syncthreads), and each thread multiplies them into a TM x TN patch of sums kept in
registers. Each output is summed by one thread in fixed k order: deterministic, no atomics.

The tile loop and its helpers are device functions built for one tile shape (make_tile, cached),
so the linear ops' own kernels (k_attn_qkv_fwd_v1, k_mlp_fwd_v1, ...) reuse it and differ only in
what they do with the sums. A "block" of these launchers is a tile shape (BM, BN, BK, TM, TN):
(BM/TM) * (BN/TN) threads; Numba compiles one kernel per shape, the first time it is asked for.
"""
import functools
from types import SimpleNamespace

from numba import cuda, float32

from .common import cdiv, blocks

# (BM, BN, BK, TM, TN): the tile shapes the launchers are checked and timed at; the first is the
# engine's. On a GPU 64 x 64 tiles of 256 threads (8 KiB of shared memory); in the simulator,
# which pays per thread, 16 x 16 tiles of 16 threads.
TILES = dict(gpu=((64, 64, 16, 4, 4), (32, 64, 16, 4, 4), (128, 64, 8, 8, 4)),
             sim=((16, 16, 8, 4, 4), (8, 16, 4, 4, 4)))


# ---------------------------------------------------------------------------------------------
# v1: one thread per output element (for lessons)

@cuda.jit
def k_matmul_v1(out, a, b, trans_a, trans_b, accumulate):
    """out[i, j] (+)= sum_k op(a)[i, k] * op(b)[k, j]; thread (i, j) from a 2-D grid."""
    j, i = cuda.grid(2)
    M, N = out.shape
    if i >= M or j >= N:
        return
    K = a.shape[0] if trans_a else a.shape[1]
    acc = float32(0.0)
    for k in range(K):
        av = a[k, i] if trans_a else a[i, k]
        bv = b[j, k] if trans_b else b[k, j]
        acc += av * bv
    if accumulate:
        out[i, j] += acc
    else:
        out[i, j] = acc


@blocks(gpu=(16, 8), sim=(8, 4))
def matmul_v1(out, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """Launch: block x block threads, one per output element."""
    M, N = out.shape
    grid = (cdiv(N, block), cdiv(M, block))
    k_matmul_v1[grid, (block, block), stream](out, a, b, trans_a, trans_b, accumulate)


# ---------------------------------------------------------------------------------------------
# v2: shared-memory tiles, TM x TN outputs per thread

def make_tile_mma(trans_a, trans_b, BM, BN, BK, TM, TN):
    """Build the device function that adds this thread's TM x TN share of the block's tile of
    op(a) @ op(b) into `acc` (a local TM x TN array). The block's tile is rows
    blockIdx.y*BM.., columns blockIdx.x*BN.. The transposes and tile sizes are compile-time
    constants (Numba freezes closure variables), so the branches on them vanish from the compiled
    code and the small loops unroll. Kernels call it and then write acc out their own way."""
    TX = BN // TN                         # threads along a row of the tile
    THREADS = (BM // TM) * TX             # threads per block

    @cuda.jit(device=True)
    def tile_mma(acc, a, b):
        sa = cuda.shared.array((BK, BM), float32)     # op(a) tile, stored k-major: sa[k, m]
        sb = cuda.shared.array((BK, BN), float32)     # op(b) tile: sb[k, n]
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        tid = cuda.threadIdx.x
        tx, ty = tid % TX, tid // TX
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        M = a.shape[1] if trans_a else a.shape[0]
        K = a.shape[0] if trans_a else a.shape[1]
        N = b.shape[0] if trans_b else b.shape[1]
        for k0 in range(0, K, BK):
            # copy the tiles; consecutive threads read consecutive addresses of the stored array
            for e in range(tid, BM * BK, THREADS):
                if trans_a:                           # a stored [K, M]
                    kk, mm = e // BM, e % BM
                else:                                 # a stored [M, K]
                    mm, kk = e // BK, e % BK
                r, c = row0 + mm, k0 + kk
                if r < M and c < K:
                    sa[kk, mm] = a[c, r] if trans_a else a[r, c]
                else:
                    sa[kk, mm] = 0.0
            for e in range(tid, BN * BK, THREADS):
                if trans_b:                           # b stored [N, K]
                    nn, kk = e // BK, e % BK
                else:                                 # b stored [K, N]
                    kk, nn = e // BN, e % BN
                r, c = k0 + kk, col0 + nn
                if r < K and c < N:
                    sb[kk, nn] = b[c, r] if trans_b else b[r, c]
                else:
                    sb[kk, nn] = 0.0
            cuda.syncthreads()
            # acc[i, j] += sum_k op(a)[row i, k] * op(b)[k, col j] over this K step
            for kk in range(BK):
                for i in range(TM):
                    ra[i] = sa[kk, ty + i * (BM // TM)]
                for j in range(TN):
                    rb[j] = sb[kk, tx + j * TX]
                for i in range(TM):
                    for j in range(TN):
                        acc[i, j] += ra[i] * rb[j]
            cuda.syncthreads()

    return tile_mma


@functools.cache
def make_tile(tile):
    """Everything a tiled kernel needs for one tile shape (BM, BN, BK, TM, TN):
        mma_nn, mma_nt, mma_tn   acc += this thread's share of a @ b, a @ b^T, a^T @ b
        row(i), col(j)           the element of out that acc[i, j] belongs to
        zero(acc), store(out, acc, accumulate)
        TM, TN, THREADS, grid(M, N, z)"""
    BM, BN, BK, TM, TN = tile
    assert BM % TM == 0 and BN % TN == 0, f"tile {tile}: TM must divide BM and TN divide BN"
    TX = BN // TN

    @cuda.jit(device=True)
    def row(i):
        """Row of out that acc[i, :] of this thread belongs to (rows ty, ty + BM/TM, ...)."""
        return cuda.blockIdx.y * BM + cuda.threadIdx.x // TX + i * (BM // TM)

    @cuda.jit(device=True)
    def col(j):
        """Column of out that acc[:, j] belongs to (consecutive threads: consecutive columns)."""
        return cuda.blockIdx.x * BN + cuda.threadIdx.x % TX + j * TX

    @cuda.jit(device=True)
    def zero(acc):
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0

    @cuda.jit(device=True)
    def store(out, acc, accumulate):
        """out (+)= acc for this thread's outputs that fall inside out."""
        for i in range(TM):
            r = row(i)
            for j in range(TN):
                c = col(j)
                if r < out.shape[0] and c < out.shape[1]:
                    if accumulate:
                        out[r, c] += acc[i, j]
                    else:
                        out[r, c] = acc[i, j]

    return SimpleNamespace(
        mma_nn=make_tile_mma(False, False, *tile), mma_nt=make_tile_mma(False, True, *tile),
        mma_tn=make_tile_mma(True, False, *tile), mma_tt=make_tile_mma(True, True, *tile),
        row=row, col=col, zero=zero, store=store, TM=TM, TN=TN, THREADS=(BM // TM) * TX,
        grid=lambda M, N, z=1: (cdiv(N, BN), cdiv(M, BM), z))


@functools.cache
def _k_matmul_v2(tile, trans_a, trans_b):
    t = make_tile(tile)
    mma = {(False, False): t.mma_nn, (False, True): t.mma_nt,
           (True, False): t.mma_tn, (True, True): t.mma_tt}[(trans_a, trans_b)]
    zero, store, TM, TN = t.zero, t.store, t.TM, t.TN

    @cuda.jit
    def k_matmul_v2(out, a, b, accumulate):
        """out (+)= op(a) @ op(b), one BM x BN tile per block."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        mma(acc, a, b)
        store(out, acc, accumulate)

    return k_matmul_v2


@blocks(**TILES)
def matmul_v2(out, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """Launch: one block of (BM/TM)*(BN/TN) threads per BM x BN tile of out; block = the tile."""
    M, N = out.shape
    t = make_tile(block)
    _k_matmul_v2(block, bool(trans_a), bool(trans_b))[t.grid(M, N), t.THREADS, stream](out, a, b, accumulate)


k_matmul_v2 = _k_matmul_v2(matmul_v2.blocks[0], False, False)   # the default tile's kernel

VERSIONS = {"matmul": {1: matmul_v1, 2: matmul_v2}}
matmul = matmul_v2        # what the engine uses
