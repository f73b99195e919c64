"""Matrix products: the workhorse under attn_qkv, attn_out, mlp and the tied output projection.

    out[M, N] = op(a) @ op(b)        or, with accumulate, out += op(a) @ op(b)
    op(a) = a [M, K], or a^T when trans_a (a stored [K, M]);  op(b) = b [K, N], or b^T (b stored [N, K])

The three shapes a linear layer y = x @ W needs:
    forward         y  = x @ W               matmul(y, x, W)
    grad of input   dx = dy @ W^T            matmul(dx, dy, W, trans_b=True)
    grad of weight  dW += x^T @ dy           matmul(dW, x, dy, trans_a=True, accumulate=True)

v1, k_matmul_v1: one thread per output element, a plain loop over K. Every thread reads a whole
row of a and a whole column of b from global memory: easy to read, slow.

v2, make_matmul_v2(...): shared-memory tiling with register blocking. A block computes a BM x BN
tile of out. It walks K in steps of BK: its threads copy a BM x BK tile of op(a) and a BK x BN tile
of op(b) into shared memory (each element read from global memory once per block, not once per
thread), wait (syncthreads), and each thread multiplies them into a TM x TN patch of sums kept in
registers. Each output is summed by one thread in fixed k order: deterministic, no atomics.
"""
from numba import cuda, float32

from .common import SIMULATOR, cdiv


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


def matmul_v1(out, a, b, trans_a=False, trans_b=False, accumulate=False, stream=0):
    M, N = out.shape
    threads = (8, 8) if SIMULATOR else (16, 16)
    blocks = (cdiv(N, threads[0]), cdiv(M, threads[1]))
    k_matmul_v1[blocks, threads, stream](out, a, b, trans_a, trans_b, accumulate)


# ---------------------------------------------------------------------------------------------
# v2: shared-memory tiles, TM x TN outputs per thread

# (BM, BN, BK, TM, TN): a block computes BM x BN outputs with (BM/TM) * (BN/TN) threads
TILES_GPU = (64, 64, 16, 4, 4)        # 256 threads, 8 KiB of shared memory
TILES_SIM = (16, 16, 8, 4, 4)         # 16 threads: the simulator pays per thread


def make_matmul_v2(trans_a: bool, trans_b: bool, BM: int, BN: int, BK: int, TM: int, TN: int):
    """Build the tiled kernel for one choice of transposes and tile sizes. They are compile-time
    constants of the kernel (Numba freezes closure variables), so the branches on them vanish."""
    TX = BN // TN                     # threads along a row of the tile
    NT = (BM // TM) * TX              # threads per block

    @cuda.jit
    def k_matmul_v2(out, a, b, accumulate):
        sa = cuda.shared.array((BK, BM), float32)     # op(a) tile, stored k-major: sa[k, m]
        sb = cuda.shared.array((BK, BN), float32)     # op(b) tile: sb[k, n]
        acc = cuda.local.array((TM, TN), float32)     # this thread's outputs, in registers
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        M, N = out.shape
        K = a.shape[0] if trans_a else a.shape[1]
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0
        for k0 in range(0, K, BK):
            # copy the tiles; consecutive threads read consecutive addresses of the stored array
            for e in range(tid, BM * BK, NT):
                if trans_a:                           # a stored [K, M]
                    kk, mm = e // BM, e % BM
                else:                                 # a stored [M, K]
                    mm, kk = e // BK, e % BK
                r, c = row0 + mm, k0 + kk
                if r < M and c < K:
                    sa[kk, mm] = a[c, r] if trans_a else a[r, c]
                else:
                    sa[kk, mm] = 0.0
            for e in range(tid, BN * BK, NT):
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
            # thread (ty, tx) owns rows ty + i*(BM/TM) and columns tx + j*TX of the tile
            for kk in range(BK):
                for i in range(TM):
                    ra[i] = sa[kk, ty + i * (BM // TM)]
                for j in range(TN):
                    rb[j] = sb[kk, tx + j * TX]
                for i in range(TM):
                    for j in range(TN):
                        acc[i, j] += ra[i] * rb[j]
            cuda.syncthreads()
        for i in range(TM):
            r = row0 + ty + i * (BM // TM)
            for j in range(TN):
                c = col0 + tx + j * TX
                if r < M and c < N:
                    if accumulate:
                        out[r, c] += acc[i, j]
                    else:
                        out[r, c] = acc[i, j]

    return k_matmul_v2


_V2 = {}                  # (trans_a, trans_b) -> compiled kernel


def matmul_v2(out, a, b, trans_a=False, trans_b=False, accumulate=False, stream=0):
    BM, BN, BK, TM, TN = TILES_SIM if SIMULATOR else TILES_GPU
    key = (bool(trans_a), bool(trans_b))
    if key not in _V2:
        _V2[key] = make_matmul_v2(*key, BM, BN, BK, TM, TN)
    M, N = out.shape
    blocks = (cdiv(N, BN), cdiv(M, BM))
    _V2[key][blocks, (BM // TM) * (BN // TN), stream](out, a, b, accumulate)


VERSIONS = {1: matmul_v1, 2: matmul_v2}
matmul = matmul_v2        # what the engine uses
