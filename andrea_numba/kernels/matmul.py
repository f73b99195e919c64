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
The tile loop is a device function (tile_mma_nn / _nt / _tn), so the linear ops' own kernels
(k_attn_qkv_fwd, k_mlp_fwd, ...) reuse it and differ only in what they do with the sums.
"""
import os

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

# A block computes BM x BN outputs with (BM/TM) * (BN/TN) threads, walking K in steps of BK.
TILES_GPU = (64, 64, 16, 4, 4)        # 256 threads, 8 KiB of shared memory
TILES_SIM = (16, 16, 8, 4, 4)         # 16 threads: the simulator pays per thread
# bench/ tries other tile shapes with ANDREA_MATMUL_TILES="BM,BN,BK,TM,TN" (read once, at import)
_env_tiles = os.environ.get("ANDREA_MATMUL_TILES")
if _env_tiles and not SIMULATOR:
    TILES_GPU = tuple(int(v) for v in _env_tiles.split(","))
BM, BN, BK, TM, TN = TILES_SIM if SIMULATOR else TILES_GPU
TX = BN // TN                         # threads along a row of the tile
THREADS = (BM // TM) * TX             # threads per block


def make_tile_mma(trans_a: bool, trans_b: bool):
    """Build the device function that adds this thread's TM x TN share of the block's tile of
    op(a) @ op(b) into `acc` (a local TM x TN array). The block's tile is rows
    blockIdx.y*BM.., columns blockIdx.x*BN.. The transposes are compile-time constants (Numba
    freezes closure variables), so the branches on them vanish from the compiled code. Kernels
    call it and then write acc out their own way (plain, accumulated, through GELU, ...)."""

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


tile_mma_nn = make_tile_mma(False, False)     # a @ b
tile_mma_nt = make_tile_mma(False, True)      # a @ b^T
tile_mma_tn = make_tile_mma(True, False)      # a^T @ b
tile_mma_tt = make_tile_mma(True, True)       # a^T @ b^T
TILE_MMA = {(False, False): tile_mma_nn, (False, True): tile_mma_nt,
            (True, False): tile_mma_tn, (True, True): tile_mma_tt}


@cuda.jit(device=True)
def tile_row(i):
    """Row of out that acc[i, :] of this thread belongs to (rows ty, ty + BM/TM, ...)."""
    return cuda.blockIdx.y * BM + cuda.threadIdx.x // TX + i * (BM // TM)


@cuda.jit(device=True)
def tile_col(j):
    """Column of out that acc[:, j] of this thread belongs to (consecutive threads: consecutive columns)."""
    return cuda.blockIdx.x * BN + cuda.threadIdx.x % TX + j * TX


@cuda.jit(device=True)
def tile_zero(acc):
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = 0.0


@cuda.jit(device=True)
def tile_store(out, acc, accumulate):
    """out (+)= acc for this thread's outputs that fall inside out."""
    for i in range(TM):
        r = tile_row(i)
        for j in range(TN):
            c = tile_col(j)
            if r < out.shape[0] and c < out.shape[1]:
                if accumulate:
                    out[r, c] += acc[i, j]
                else:
                    out[r, c] = acc[i, j]


def tile_grid(M, N, z=1):
    """Grid covering an M x N output with BM x BN tiles (z copies along blockIdx.z)."""
    return (cdiv(N, BN), cdiv(M, BM), z)


def make_matmul_v2(trans_a: bool, trans_b: bool):
    tile_mma = TILE_MMA[(trans_a, trans_b)]

    @cuda.jit
    def k_matmul_v2(out, a, b, accumulate):
        """out (+)= op(a) @ op(b), one BM x BN tile per block."""
        acc = cuda.local.array((TM, TN), float32)
        tile_zero(acc)
        tile_mma(acc, a, b)
        tile_store(out, acc, accumulate)

    return k_matmul_v2


_V2 = {key: make_matmul_v2(*key) for key in TILE_MMA}


def matmul_v2(out, a, b, trans_a=False, trans_b=False, accumulate=False, stream=0):
    M, N = out.shape
    _V2[(bool(trans_a), bool(trans_b))][tile_grid(M, N), THREADS, stream](out, a, b, accumulate)


VERSIONS = {1: matmul_v1, 2: matmul_v2}
matmul = matmul_v2        # what the engine uses
