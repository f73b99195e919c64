"""Matrix products: the workhorse under attn_qkv, attn_out, mlp and the tied output projection.

    out[M, N] = op(a) @ op(b)        or, with accumulate, out += op(a) @ op(b)
    op(a) = a [M, K], or a^T when trans_a (a stored [K, M]);  op(b) = b [K, N], or b^T (b stored [N, K])

The three shapes a linear layer y = x @ W needs:
    forward         y  = x @ W               matmul(y, x, W)
    grad of input   dx = dy @ W^T            matmul(dx, dy, W, trans_b=True)
    grad of weight  dW += x^T @ dy           matmul(dW, x, dy, trans_a=True, accumulate=True)

The lessons' pair:
    matmul_naive (k_matmul_naive): one thread per output element, a plain loop over K. Every thread
        reads a whole row of a and a whole column of b from global memory: easy to read, slow.
    matmul (k_matmul): shared-memory tiling with register blocking. A block computes a BM x BN
        tile of out. It walks K in steps of BK: its threads copy a BM x BK tile of op(a) and a BK x BN
        tile of op(b) into shared memory (each element read from global memory once per block, not
        once per thread), wait (syncthreads), and each thread multiplies them into a TM x TN patch of
        sums kept in registers. Each output is summed by one thread in fixed k order: deterministic.

The products the recipes' linear ops run (andrea_numba/recipes.py), each on a family of warp tiles
(warps own pieces of the block's tile in the tensor-core fragment layout, kernels/warp_tile.py),
with split-K for the products with few output tiles (below):
    matmul_tf32x3               fp32-accurate: three TF32 products a fragment on tensor cores (3xTF32),
                                swizzled k-major shared tiles (split_tile.py)            recipe fp32
    matmul_fp16                 the same tiles, inputs rounded to fp16, fp32 sums      recipe fp16
    matmul_bf16                 bf16 copies of the operands (rounded once) copied by cp.async into a
                                ring of shared stages, ldmatrix, mma.sync (half_tile.py)  bf16-ampere
    matmul_bf16_wgmma           Hopper: the copies as stored, moved by TMA from a producer warp,
                                wgmma, persistent blocks (wgmma_tma.py)                   bf16-hopper
    matmul_bf16_wgmma_cp_async  the same layouts and sums on a cp.async ring (wgmma_mn.py), where a
                                tensor map cannot read an operand
Every other rung of the ladder is the lab's (lab/matmul.py, with its VERSIONS table).

The tile loop and its helpers are device functions built for one tile (make_tile, cached), so the
linear ops' own kernels (k_attn_qkv_fwd, k_mlp_fwd, ...) reuse them and differ only in what
they do with the sums. A tile is matmul's shape (BM, BN, BK, TM, TN), or a tile family's name with
its shape, (family, BM, BN, BK, WM, WN, vec[, STAGES]): TILE_FAMILIES holds the engine's families
(each product launcher names its own: launcher.family) and the lab adds its own. A "block" of these
launchers is a tile shape; Numba compiles one kernel per shape, the first time it is asked for.
"""
import functools
from types import SimpleNamespace
from typing import Callable, NamedTuple

import numba
import numpy as np
from numba import cuda, float32

from .common import blocks, cdiv, ELEMENTWISE_THREADS, rung, SIMULATOR
from .half_tile import async_resolve, bf16_copies, make_async_tile
from .tma import TMAPS, map_fits
from .warp_tile import make_epilogue, make_fp16_tile, make_tf32x3_tile, resolve
from .split_wgmma import make_split_tile, split_resolve
from .wgmma_mn import make_mn_tile, mn_resolve
from .wgmma_tma import tile_bytes, tma_kernel, units_grid

# (BM, BN, BK, TM, TN): the tile shapes the launchers are checked and timed at; the first is the
# engine's. On a GPU 64 x 64 tiles of 256 threads (8 KiB of shared memory); in the simulator,
# which pays per thread, 16 x 16 tiles of 16 threads.
TILES = dict(gpu=((64, 64, 16, 4, 4), (32, 64, 16, 4, 4), (128, 64, 8, 8, 4)),
             sim=((16, 16, 8, 4, 4), (8, 16, 4, 4, 4)))



# ---------------------------------------------------------------------------------------------
# one thread per output element (for lessons)

@cuda.jit
def k_matmul_naive(out, a, b, trans_a, trans_b, accumulate):
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


@rung(1)
@blocks(gpu=(16, 8), sim=(8, 4))
def matmul_naive(out, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """Launch: block x block threads, one per output element."""
    M, N = out.shape
    grid = (cdiv(N, block), cdiv(M, block))
    k_matmul_naive[grid, (block, block), stream](out, a, b, trans_a, trans_b, accumulate)



# ---------------------------------------------------------------------------------------------
# shared-memory tiles, TM x TN outputs per thread

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
def _make_tile_v2(tile):
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

    zero, store = make_epilogue(row, col, TM, TN)     # acc = 0, and out (+)= acc where inside out

    return SimpleNamespace(
        mma_nn=make_tile_mma(False, False, *tile), mma_nt=make_tile_mma(False, True, *tile),
        mma_tn=make_tile_mma(True, False, *tile), mma_tt=make_tile_mma(True, True, *tile),
        row=row, col=col, zero=zero, store=store, TM=TM, TN=TN, THREADS=(BM // TM) * TX,
        grid=lambda M, N, z=1: (cdiv(N, BN), cdiv(M, BM), z))


class TileFamily(NamedTuple):
    """A family of product tiles. make(tile) builds the tile functions of one tile (family, BM, BN, BK,
    WM, WN, vec[, STAGES]); rung: the matmul rung whose product kernel runs it; what: a line for the
    kernel's docstring. The product kernel on a family's tiles is named k_matmul_<family>."""
    make: Callable
    rung: int
    what: str



# The tile families, by name: the engine's, which its product launchers run (each launcher's
# .family) and the linear ops' fused kernels are built on. The lab (lab/matmul.py) adds its own,
# named by the rung that runs them ("v3", "v4", ...).
TILE_FAMILIES = {
    "tf32x3": TileFamily(make_tf32x3_tile, 8, "3xTF32 tensor cores on swizzled k-major tiles (the small parts' low "
                                              "bits left for the tensor core to drop, transposed operands stored 128 bits at a time)"),
    "fp16": TileFamily(make_fp16_tile, 11, "fp16 tensor cores (inputs rounded as read) on swizzled k-major tiles"),
    "bf16": TileFamily(make_async_tile, 13, "bf16 tensor cores on bf16 copies, copied to a ring of shared stages by cp.async"),
    "tf32x3_wgmma": TileFamily(make_split_tile, 25, "3xTF32 on Hopper's wgmma: big and small planes of each operand, "
                                                    "split and stored K-major by the threads"),
    "bf16_wgmma_cp_async": TileFamily(make_mn_tile, 17, "bf16 wgmma on the bf16 copies as stored: MN-major stages read "
                                                        "through the transpose bits"),
}


@functools.cache
def make_tile(tile):
    """The tile functions of matmul's shared tiles (tile = (BM, BN, BK, TM, TN)) or of a tile of a
    family (tile = (family, BM, BN, BK, WM, WN, vec[, STAGES]): TILE_FAMILIES[family].make). The linear
    ops' kernels are written against these names and run on any."""
    if len(tile) == 5:
        return _make_tile_v2(tile)
    return TILE_FAMILIES[tile[0]].make(tile)


@functools.cache
def _k_matmul_v2(tile, trans_a, trans_b):
    t = make_tile(tile)
    mma = {(False, False): t.mma_nn, (False, True): t.mma_nt,
           (True, False): t.mma_tn, (True, True): t.mma_tt}[(trans_a, trans_b)]
    zero, store, TM, TN = t.zero, t.store, t.TM, t.TN

    @cuda.jit
    def k_matmul(out, a, b, accumulate):
        """out (+)= op(a) @ op(b), one BM x BN tile per block."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        mma(acc, a, b)
        store(out, acc, accumulate)

    return k_matmul


@rung(2)
@blocks(**TILES)
def matmul(out, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """Launch: one block of (BM/TM)*(BN/TN) threads per BM x BN tile of out; block = the tile."""
    M, N = out.shape
    t = make_tile(block)
    _k_matmul_v2(block, bool(trans_a), bool(trans_b))[t.grid(M, N), t.THREADS, stream](out, a, b, accumulate)


k_matmul = _k_matmul_v2(matmul.blocks[0], False, False)   # the default tile's kernel


# ---------------------------------------------------------------------------------------------
# Products on a tile family (warp tiles, kernels/warp_tile.py): 128-bit copies, shared stages, split-K.
#
# Split-K: a product with few output tiles and a long K (a weight gradient, K = B*T rows) would
# leave most of the GPU idle: dW_O at 12M is 3 x 3 tiles of 128 x 128 for 132 multiprocessors.
# With a work buffer, the launcher cuts K into S slices of ksplit (a multiple of BK). Block z of
# the grid's third dimension sums its slice into work[z] (a partial tile, no atomics), then
# k_splitk_sum adds the slices in the fixed order z = 0, 1, .., S-1:
#     out (+)= work[0] + work[1] + ... + work[S-1]
#
# How many slices: a GPU runs a launch in waves. With R blocks resident at once (the occupancy of
# the kernel: R = 2 blocks of 128 x 64 on each of the H200's 132 multiprocessors, 264; the CUDA
# occupancy API says so, see resident_blocks), a launch of n blocks of equal work takes
# ceil(n / R) waves, and a wave lasts as long as one block's K loop. The 120M's dW_1 is 6 x 48 = 288
# tiles: one full wave and one of 24 blocks, the GPU 55% busy. Cutting K into S slices makes S
# times the blocks, each S times shorter, so splitk picks the S of least
#     waves(S) x stages per slice  +  the cost of the slices' partial tiles
# (each slice's M x N partial is written, then read by the sum: about one wave-stage per half a
# million partial values, plus the second launch). dW_1 at 120M: S = 1 costs 2 x 512 = 1024
# wave-stages, S = 4 (1152 blocks, 5 waves x 128) 640 + 21, S = 8 (9 waves x 64) 576 + 38.
# S depends only on the shapes, the work buffer's size and the kernel's occupancy on this GPU:
# the same launch every time, so the same sums in the same order: deterministic.

RESIDENT_BLOCKS = 4          # the simulator's stand-in for the GPU's resident blocks (resident_blocks)
SPLIT_LAUNCH = 2             # the sum's launch and its pass, in wave-stages ...
SPLIT_VALUES = 1 << 19       # ... plus one for every half million partial values written and read


def splitk_work(C: int, N: int = 0) -> int:
    """Floats of the split-K work buffer for a model of width C at N = B*T rows (the engine's, and
    the op cases'): room for 8 slices of the largest weight gradient, W_1's C x 4C (32 of a C x C
    one), and for 2 slices of an N x C activation (the MLP's C-wide products)."""
    return max(32 * C * C, 2 * N * C)


def splitk(M, N, K, z, block, work, resident=RESIDENT_BLOCKS):
    """(S, ksplit): slices of K for a launch of z products of M x N, by the least cost in
    wave-stages (the comment above) with `resident` blocks running at once; S = 1 without a work
    buffer. Each slice is at least 2 BK long; S * z * M * N fits in work."""
    if work is None:
        return 1, K
    return _splitk(M, N, K, z, *block[:3], work.shape[0], resident)


@functools.cache                 # a pure function of its numbers: worked out once per shape
def _splitk(M, N, K, z, BM, BN, BK, work_size, resident):
    tiles = cdiv(M, BM) * cdiv(N, BN) * z
    best = None
    for S in range(1, max(1, min(K // (2 * BK), work_size // (z * M * N))) + 1):
        ksplit = cdiv(cdiv(K, S), BK) * BK
        S = cdiv(K, ksplit)                   # rounding ksplit up to whole stages may need fewer
        cost = cdiv(tiles * S, resident) * (ksplit // BK)
        if S > 1:
            cost += SPLIT_LAUNCH + S * z * M * N / SPLIT_VALUES
        if best is None or cost < best[0]:
            best = (cost, S, ksplit)
    return best[1], best[2]


# k_splitk_sum: one thread an element of out, over flat views (out [M*N], work [S, M*N]): a
# thread's index is the element, so no row and column are worked out (the lab's k_splitk_sum_v1, on
# [M, N] views, spent the integer pipe on that division: lab/matmul.py).
@cuda.jit
def k_splitk_sum(out, work, accumulate):
    """out[i] (+)= sum_z work[z, i], z = 0, 1, ... in order; out [M*N] and work [S, M*N] flat."""
    i = cuda.grid(1)
    if i >= out.shape[0]:
        return
    s = work[0, i]
    for z in range(1, work.shape[0]):
        s += work[z, i]
    if accumulate:
        out[i] += s
    else:
        out[i] = s



def splitk_sum(out, work, accumulate, stream):
    """Launch k_splitk_sum over out [M, N] (work [S, M, N]): out (+)= work[0] + ... + work[S-1]."""
    M, N = out.shape
    k_splitk_sum[cdiv(M * N, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, stream](
        out.reshape(M * N), work.reshape(work.shape[0], M * N), accumulate)



@functools.cache
def _k_matmul_warp(tile, trans_a, trans_b):
    t = make_tile(tile)
    mma, zero, store, TM, TN = t.mma[(trans_a, trans_b)], t.zero, t.store, t.TM, t.TN

    @cuda.jit(device=True)
    def product(out, work, a, b, accumulate, ksplit):
        """out (+)= op(a) @ op(b) (a grid of one layer), or work[z] = the product over K slice z."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        K = a.shape[0] if trans_a else a.shape[1]
        z = cuda.blockIdx.z
        mma(acc, a, b, z * ksplit, min(K, (z + 1) * ksplit))
        if cuda.gridDim.z == 1:
            store(out, acc, accumulate)
        else:
            store(work[z], acc, False)         # slice z's partial tile

    def k_matmul(out, work, a, b, accumulate, ksplit):
        product(out, work, a, b, accumulate, ksplit)

    family = TILE_FAMILIES[tile[0]]
    k_matmul.__doc__ = (f"One BM x BN tile of out (+)= op(a) @ op(b) per block on {family.what}; with split-K, "
                        f"block z writes its slice's partial tile to work[z].")
    # named by its family: k_matmul_tf32x3, k_matmul_fp16, k_matmul_bf16, ... (the lab's: k_matmul_v3, ...)
    k_matmul.__name__ = k_matmul.__qualname__ = f"k_matmul_{tile[0]}"
    return cuda.jit(k_matmul)



@functools.cache
def _resident(tile, trans_a, trans_b, sig):
    kernel = _k_matmul_warp(tile, trans_a, trans_b).compile(sig)
    return kernel.max_cooperative_grid_blocks(make_tile(tile).THREADS)


def resident_blocks(tile, trans_a, trans_b, args) -> int:
    """Blocks of this product kernel the GPU runs at once: blocks per multiprocessor (set by
    its registers and shared memory, from the CUDA occupancy API) x multiprocessors, for the
    kernel compiled for these arguments. The simulator's stand-in: RESIDENT_BLOCKS."""
    if SIMULATOR:
        return RESIDENT_BLOCKS
    return _resident(tile, trans_a, trans_b, tuple(numba.typeof(x) for x in args))



def _split_product(family, out, work, a, b, trans_a, trans_b, accumulate, block, stream):
    """A product on a tile of `family` at the declared block (warp_tile.resolve), split over K into
    work where splitk says so: returns part, out itself viewed [1, M, N] or the S > 1 partial
    products [S, M, N], which the caller adds into out."""
    M, N = out.shape
    K = a.shape[0] if trans_a else a.shape[1]
    tile = resolve(family, block, a, b)
    t = make_tile(tile)
    trans_a, trans_b = bool(trans_a), bool(trans_b)
    resident = 0 if work is None else resident_blocks(tile, trans_a, trans_b,
                                                      (out, out.reshape(1, M, N), a, b, accumulate, K))
    S, ksplit = splitk(M, N, K, 1, block, work, resident)
    part = work[:S * M * N].reshape(S, M, N) if S > 1 else out.reshape(1, M, N)
    _k_matmul_warp(tile, trans_a, trans_b)[t.grid(M, N, S), t.THREADS, stream](
        out, part, a, b, accumulate, ksplit)
    return part


def _matmul_warp(family, out, work, a, b, trans_a, trans_b, accumulate, block, stream):
    """A product on a tile of `family`, its split-K slices (if any) added by k_splitk_sum."""
    part = _split_product(family, out, work, a, b, trans_a, trans_b, accumulate, block, stream)
    if part.shape[0] > 1:
        splitk_sum(out, part, accumulate, stream)



# ---------------------------------------------------------------------------------------------
# matmul_tf32x3: 3xTF32 on swizzled k-major tiles (split_tile.py, "v8's shared tiles").
#
# 3xTF32: each value x is split into big = tf32(x) (10 mantissa bits) and small = x - big, and a
# fragment's product is small*big + big*small + big*big on tensor cores, in that order (the small
# products first, so they are not lost against the large one); small*small, about 2^-22 of the
# product, is left out: as accurate as an fp32 product. small goes to the tensor core as x - big,
# which it reads from its top 19 bits (truncation): small keeps its 10 bits rounded toward zero, an
# error below 2^-21 |x| (three instructions a split instead of five to round it first).
#
# The tiles (split_tile.py): both operands k-major in shared memory, BK = 16 values of k a stage
# (two mma k-steps), a permutation of k that puts a thread's fragment values side by side (one
# 128-bit shared read gives it two k-steps of a row), one plane of raw values split as each thread
# reads its fragments, and one fp32 add into acc a stage. An operand stored with k down its columns
# (a^T in the weight gradients) reaches shared memory in 4 x 4 blocks, each tile row's 4 values of k
# in one 128-bit store; a row swizzle makes these stores, the scalar stores of b in x @ W and the
# fragment reads free of bank conflicts.
#
# (BM, BN, BK, WM, WN): 128 x 64 of 4 warps of 64 x 32 (the engine's), 128 x 128 of 8, 64 x 64 of
# 4 warps of 32 x 32, 128 x 128 of 4 warps of 64 x 64. Shared memory: 24 KiB for 128 x 64, 32 KiB
# for 128 x 128 (two stages of (BM + BN) rows of 16 floats). In the simulator one warp of 32 x 32 and two warps of 16 x 64.
KMAJOR_TILES = dict(gpu=((128, 64, 16, 64, 32), (128, 128, 16, 64, 32), (64, 64, 16, 32, 32), (128, 128, 16, 64, 64)),
                    sim=((32, 32, 16, 32, 32), (32, 64, 16, 16, 64)))



@rung(8)
@blocks(**KMAJOR_TILES)
def matmul_tf32x3(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """fp32-accurate products on tensor cores: 3xTF32 on swizzled k-major tiles (the comment above);
    block = (BM, BN, 16, WM, WN): (BM/WM) x (BN/WN) warps; work: float32 [n], the split-K buffer (or
    None: no split)."""
    _matmul_warp("tf32x3", out, work, a, b, trans_a, trans_b, accumulate, block, stream)



# matmul_fp16: the same tiles in fp16 (cvt.rn.f16x2.f32, mma.sync ... .f16.f16, one m16n8k16 a
# fragment a stage): 11 significant bits where bf16 keeps 8, but 5 exponent bits: an input past
# 65504 becomes inf, one below 6.1e-5 loses bits, which is why training in fp16 needs loss scaling
# (lesson 10).
@rung(11)
@blocks(**KMAJOR_TILES)
def matmul_fp16(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """fp16 tensor-core products (inputs rounded to fp16, fp32 sums) on matmul_tf32x3's swizzled tiles."""
    _matmul_warp("fp16", out, work, a, b, trans_a, trans_b, accumulate, block, stream)



matmul_fp16.precision = "fp16"
matmul_tf32x3.family, matmul_fp16.family = "tf32x3", "fp16"     # their tiles (the linear ops' kernels run on them)


# ---------------------------------------------------------------------------------------------
# matmul_bf16: bf16 products from bf16 copies by cp.async (kernels/half_tile.py). Each operand is
# first rounded once to a bf16 copy (operands.round_into, ties to even) in a scratch of its own; the
# product kernel copies 16-byte chunks of the copies global -> shared with cp.async (no staging
# registers) into a ring of 3 shared stages (4 for the smaller tiles), one barrier a step, then
# ldmatrix reads the swizzled bf16 tiles into mma.sync fragments (m16n8k16, fp32 sums). Inputs
# rounded to bf16, exact products, fp32 sums. Tiles (BM, BN, 32, WM, WN[, STAGES]): 128 x 128 of 8
# warps, 3 stages (48 KiB, the static limit), 128 x 64 and 64 x 64 of 4 warps with 4 stages (48
# and 32 KiB); in the simulator one warp of 32 x 32 (3 stages) and two warps of 32 x 16 with 4
# stages (a 64-row tile: the swizzle of 128-byte rows, and wait_group 2).
ASYNC_TILES = dict(gpu=((128, 128, 32, 64, 32), (128, 64, 32, 64, 32, 4), (64, 64, 32, 32, 32, 4)),
                   sim=((32, 32, 32, 32, 32), (64, 16, 32, 32, 16, 4)))



@rung(13)
@blocks(**ASYNC_TILES)
def matmul_bf16(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """bf16 tensor-core products from bf16 copies of the operands (rounded once, ties to even) copied
    to shared memory by cp.async through a ring of stages; block = (BM, BN, 32, WM, WN[, STAGES]);
    work: the split-K buffer (or None). The copies live in operands.COPIES, a scratch that grows to
    the largest product seen (half_tile.bf16_copies): an allocation at the first product of a new
    largest size, so not for a graph capture without COPIES.reserve first, and one scratch for the
    process (launches on two streams at once would share it)."""
    M, N = out.shape
    K = a.shape[0] if trans_a else a.shape[1]
    trans_a, trans_b = bool(trans_a), bool(trans_b)
    a16, b16 = bf16_copies(a, b, stream)
    tile = async_resolve(block, a16, b16)
    t = make_tile(tile)
    resident = 0 if work is None else resident_blocks(tile, trans_a, trans_b,
                                                      (out, out.reshape(1, M, N), a16, b16, accumulate, K))
    S, ksplit = splitk(M, N, K, 1, block, work, resident)       # slices of K, no atomics
    part = work[:S * M * N].reshape(S, M, N) if S > 1 else out.reshape(1, M, N)
    _k_matmul_warp(tile, trans_a, trans_b)[t.grid(M, N, S), t.THREADS, stream](
        out, part, a16, b16, accumulate, ksplit)
    if S > 1:
        splitk_sum(out, part, accumulate, stream)



matmul_bf16.precision = "bf16"
matmul_bf16.family = "bf16"
# The linear ops chain whole products of it (the kernels that run three products in one launch,
# attn_qkv's and attn_out's on make_tile with the fp32 operands, have no form on its tiles, whose
# functions take the bf16 copies that only its launcher makes): bf16-ampere's ops, on its tiles.
ASYNC_OP_TILES = ASYNC_TILES


# ---------------------------------------------------------------------------------------------
# matmul_bf16_wgmma_cp_async: wgmma on the operands as they are stored (kernels/wgmma_mn.py). Each
# operand is rounded to a bf16 copy as it is stored (half_tile.bf16_copies; a uint16 operand is used
# where it is); a stage tile holds an operand stored with k along its rows K-major and one with k
# down its columns MN-major (128-byte swizzle, column blocks of 64 values of m or n), and wgmma reads
# the latter through its transpose bits (imm-trans-a = trans_a, imm-trans-b = not trans_b): no
# transposed copy of any operand. A ring of cp.async stages in dynamic shared memory, one wgmma
# group in flight, split-K as the others (no atomics). matmul_bf16_wgmma runs the products whose
# operands a tensor map cannot read here, at the default tile: the same sums, its bits.
#
# Tiles (BM, BN, BK, 64, BN[, STAGES]), BM and BN multiples of 64: 128 x 128 x 64 with 3 stages
# (97 KiB with the 1 KiB to align: two blocks a multiprocessor) and with 4 (129 KiB: one), the
# static 128 x 128 x 32 with 3 (48 KiB), one warpgroup of 64 x 128 x 64 with 4. Not declared:
# 128 x 256 x 64 with 3 stages (144 KiB) compiles, but its 128 accumulators a thread hit ptxas's
# 255 registers and spill. In the simulator one warpgroup of 64 x 128 x 64 with 4 stages (dynamic;
# an N-major B of two column blocks, so its descriptor's LBO is used) and of 64 x 64 x 32 with 3
# (static).
MN_TILES = dict(gpu=((128, 128, 64, 64, 128, 3), (128, 128, 64, 64, 128, 4), (128, 128, 32, 64, 128, 3),
                     (64, 128, 64, 64, 128, 4)),
                sim=((64, 128, 64, 64, 128, 4), (64, 64, 32, 64, 64, 3)))
_SHARED_ALLOWED = set()



def allow_shared(kernel, args, nbytes):
    """Let the kernel (a dispatcher), compiled for these arguments, take nbytes of dynamic shared
    memory: past 48 KiB the driver refuses the launch until the function's attribute
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES says so. Once per compiled kernel, size and
    device; nothing in the simulator or at 48 KiB or less. Returns the compiled kernel (or None)."""
    if SIMULATOR or nbytes <= 48 * 1024:
        return None
    from numba.cuda.cudadrv.driver import binding, driver    # optional: it needs cuda-python (a GPU's)
    compiled = kernel.compile(tuple(numba.typeof(x) for x in args))
    cufunc = compiled._codelibrary.get_cufunc()
    key = (id(compiled), cufunc.device.id, nbytes)
    if key not in _SHARED_ALLOWED:
        driver.cuKernelSetAttribute(binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    nbytes, cufunc.handle, cufunc.device.id)
        _SHARED_ALLOWED.add(key)
    return compiled



def _wgmma_matmul(resolve, out, work, a16, b16, trans_a, trans_b, accumulate, block, stream):
    """out (+)= op(a16) @ op(b16) on wgmma tiles, from bf16 copies: the full tile resolve() makes of
    them, the kernel allowed the tile's dynamic shared memory (t.SHARED, allow_shared; a static ring
    has none), slices of K as matmul_bf16's (no atomics)."""
    M, N = out.shape
    K = a16.shape[0] if trans_a else a16.shape[1]
    tile = resolve(block, a16, b16)
    t = make_tile(tile)
    shared = getattr(t, "SHARED", 0)
    kernel = _k_matmul_warp(tile, trans_a, trans_b)
    args = (out, out.reshape(1, M, N), a16, b16, accumulate, K)  # the kernel's argument types
    compiled = allow_shared(kernel, args, shared)
    if work is None:
        resident = 0
    elif compiled is None:
        resident = resident_blocks(tile, trans_a, trans_b, args)
    else:                                                       # the occupancy with its shared memory
        resident = compiled.max_cooperative_grid_blocks(t.THREADS, shared)
    S, ksplit = splitk(M, N, K, 1, block, work, resident)
    part = work[:S * M * N].reshape(S, M, N) if S > 1 else out.reshape(1, M, N)
    kernel[t.grid(M, N, S), t.THREADS, stream, shared](out, part, a16, b16, accumulate, ksplit)
    if S > 1:
        splitk_sum(out, part, accumulate, stream)


@rung(17)
@blocks(**MN_TILES)
def matmul_bf16_wgmma_cp_async(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """bf16 products on wgmma (sm_90a) from bf16 copies of the operands as they are stored (rounded
    once, ties to even; none transposed), an operand with k down its columns read M- or N-major
    through wgmma's transpose bits; a ring of cp.async stages in dynamic shared memory, one wgmma
    group in flight; block = (BM, BN, BK, 64, BN[, STAGES]), BK = 64 (dynamic ring) or 32 (static),
    BM and BN multiples of 64; work: the split-K buffer (or None). The copies live in
    operands.COPIES, as matmul_bf16's (its caveats: one scratch, grown at a new largest size)."""
    a16, b16 = bf16_copies(a, b, stream)             # [M, K] or [K, M], [K, N] or [N, K]
    _wgmma_matmul(mn_resolve, out, work, a16, b16, bool(trans_a), bool(trans_b), accumulate, block, stream)


matmul_bf16_wgmma_cp_async.precision = "bf16"
matmul_bf16_wgmma_cp_async.family = "bf16_wgmma_cp_async"


# ---------------------------------------------------------------------------------------------
# matmul_bf16_wgmma: matmul_bf16_wgmma_cp_async's shared layouts, descriptors and sums, built as
# Hopper's fast GEMMs are (kernels/wgmma_tma.py): a producer warp whose one thread copies each stage
# with TMA (a whole swizzled box an instruction, zeros past the edges, kernels/tma.py), consumer
# warpgroups that wait for a stage's bytes on an mbarrier and let go of it on another, no
# block-wide barrier in the loop, and persistent blocks (one a multiprocessor) that walk the tiles,
# so one tile's stores overlap the next tile's copies. Tiles (BM, BN, 64, STAGES): 128 x 256 with 4
# stages (192 KiB: 128 accumulators a consumer thread, 288 threads), 128 x 128 with 4 (with 6
# stages it was slower on all twelve products timed on the H200, and so was 128 x 128 with 3 stages
# and two blocks a multiprocessor, 96 registers a thread: neither offered);
# in the simulator one consumer warpgroup of 64 x 128 with 3 stages and 64 x 64 with 2. Operands
# that a tensor map cannot describe (rows not whole 16-byte chunks, or a start off a 16-byte
# boundary) go to matmul_bf16_wgmma_cp_async at its default tile.

TMA_TILES = dict(gpu=((128, 256, 64, 4), (128, 128, 64, 4)),
                 sim=((64, 128, 64, 3), (64, 64, 64, 2)))

# block "auto": the tile is picked per product (pick_tile): the linear ops run this way, since one
# tile does not suit every shape (a 768-wide product makes 192 tiles of 128 x 256 on 132
# multiprocessors: two waves, the second half empty; 384 of 128 x 128 fill three nearly full)
TMA_AUTO = "auto"

# the work a multiprocessor does on a tile (BM, BN, STAGES) in the time of a 128 x 256 tile's, per
# unit of area (wgmma m64n256 reads its shared operands a third less per product than m64n128):
# 0.80-0.92 for 128 x 128 with 4 stages on the H200's products (twelve shapes, docs/precision.md);
# the simulator's tiles: no preference. (128 x 128 with 3 stages, two blocks a multiprocessor, was
# slower than one block of 4 stages on all thirteen products timed.)
TMA_SPEED = {(128, 256, 4): 1.0, (128, 128, 4): 0.85, (64, 128, 3): 1.0, (64, 64, 2): 1.0}



def pick_tile(M, N, K, work, resident):
    """The tile (of TMA_TILES) with the least estimated time for an M x N x K product on
    `resident` multiprocessors (one block each): waves of persistent units (split-K included, as
    splitk weighs it) x stages a unit x the tile's area over its speed (TMA_SPEED). Ties go to the
    first listed."""
    best = None
    for tile in TMA_TILES["sim" if SIMULATOR else "gpu"]:
        BM, BN, BK, stages = tile
        S, ksplit = splitk(M, N, K, 1, tile, work, resident)
        waves = cdiv(cdiv(M, BM) * cdiv(N, BN) * S, resident)
        cost = waves * cdiv(ksplit, BK) * BM * BN / TMA_SPEED[(BM, BN, stages)] + (S > 1) * S * M * N / 8
        if best is None or cost < best[0]:
            best = (cost, tile)
    return best[1]



@rung(18)
@blocks(gpu=(TMA_AUTO,) + TMA_TILES["gpu"], sim=(TMA_AUTO,) + TMA_TILES["sim"])
def matmul_bf16_wgmma(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """bf16 products on wgmma (sm_90a) from bf16 copies of the operands as stored, copied to shared
    memory by TMA from a producer warp, over a ring of mbarrier-guarded stages, by persistent blocks; block = (BM, BN, 64, STAGES), or "auto" (pick_tile's for the shape); work: the
    split-K buffer (or None). The copies live in operands.COPIES, the tensor maps in tma.TMAPS
    (written at an operand's first product)."""
    _tma_matmul(out, work, a, b, trans_a, trans_b, accumulate, block, stream)



def _tma_matmul(out, work, a, b, trans_a, trans_b, accumulate, block, stream):
    """matmul_bf16_wgmma's launch: bf16 copies of the operands (used where they are uint16), their
    tensor maps, the tile (pick_tile's where block is "auto"), split-K on the occupancy of the
    kernel with its shared memory, k_matmul_bf16_wgmma (wgmma_tma.py) on one persistent block a
    resident slot, and k_splitk_sum where K was split. Operands a tensor map cannot read go to
    matmul_bf16_wgmma_cp_async."""
    M, N = out.shape
    K = a.shape[0] if trans_a else a.shape[1]
    a16, b16 = bf16_copies(a, b, stream)
    if not (map_fits(a16) and map_fits(b16)):             # the cp.async ring on the copies (used where they are)
        matmul_bf16_wgmma_cp_async(out, work, a16, b16, trans_a, trans_b, accumulate, stream=stream)
        return
    if block == TMA_AUTO:
        block = pick_tile(M, N, K, work, sm_count())
    BM, BN, BK, stages = block
    trans_a, trans_b = bool(trans_a), bool(trans_b)
    kernel, threads = tma_kernel(BM, BN, stages, trans_a, trans_b)
    shared = tile_bytes(BM, BN, stages)
    tmap_a = TMAPS.address(a16, BK if trans_a else BM, stream)     # M-major: boxes of BK rows of k
    tmap_b = TMAPS.address(b16, BN if trans_b else BK, stream)     # K-major: boxes of BN rows of n
    args = (out, out.reshape(1, M, N), a16, b16, tmap_a, tmap_b, accumulate, K)
    compiled = allow_shared(kernel, args, shared)
    resident = RESIDENT_BLOCKS if compiled is None else compiled.max_cooperative_grid_blocks(threads, shared)
    S, ksplit = splitk(M, N, K, 1, block, work, resident)
    part = work[:S * M * N].reshape(S, M, N) if S > 1 else out.reshape(1, M, N)
    kernel[units_grid(M, N, S, BM, BN, resident), threads, stream, shared](
        out, part, a16, b16, tmap_a, tmap_b, accumulate, ksplit)
    if S > 1:
        splitk_sum(out, part, accumulate, stream)



# ---------------------------------------------------------------------------------------------
# matmul_tf32x3_wgmma: matmul_tf32x3's 3xTF32 sums on Hopper's wgmma (kernels/split_wgmma.py).
# wgmma reads TF32 only K-major and only from shared memory, so the threads load each stage
# through registers, split every value into big and small and store both into K-major planes
# (transposing an operand stored with k down its columns), and three wgmmas a k8 step multiply
# small*big, big*small and big*big into fresh registers, added to the sums once a stage. Two
# stages in dynamic shared memory, the next one split and stored while the tensor cores multiply
# this one, split-K as the others (no atomics). Tiles (BM, BN, 32, 64, BN): 128 x 128 (129 KiB,
# 64 accumulators a thread and 64 for the stage's sums) and 128 x 64 (97 KiB); in the simulator
# one warpgroup of 64 x 32 and of 64 x 64.
SPLIT_WGMMA_TILES = dict(gpu=((128, 128, 32, 64, 128), (128, 64, 32, 64, 64)),
                         sim=((64, 32, 32, 64, 32), (64, 64, 32, 64, 64)))


@rung(25)
@blocks(**SPLIT_WGMMA_TILES)
def matmul_tf32x3_wgmma(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """fp32-accurate products on Hopper's wgmma (sm_90a): 3xTF32 as matmul_tf32x3, each operand split
    into big and small planes stored K-major in a ring of shared stages by the threads; block = (BM,
    BN, 32, 64, BN); work: the split-K buffer (or None)."""
    _wgmma_matmul(split_resolve, out, work, a, b, bool(trans_a), bool(trans_b), accumulate, block, stream)


matmul_tf32x3_wgmma.family = "tf32x3_wgmma"


# the linear ops on matmul_bf16_wgmma (the bf16-hopper recipe's): a tile per product ("auto", what
# the engine runs), and every product at one fixed tile besides, so the harness checks two
TMA_OP_TILES = dict(gpu=(TMA_AUTO, TMA_TILES["gpu"][1]), sim=(TMA_AUTO, TMA_TILES["sim"][1]))



def sm_count() -> int:
    """The GPU's multiprocessors (matmul_bf16_wgmma's tiles all run one block on each), RESIDENT_BLOCKS in the simulator."""
    return RESIDENT_BLOCKS if SIMULATOR else cuda.get_current_device().MULTIPROCESSOR_COUNT



matmul_bf16_wgmma.precision = "bf16"


# matmul v20-v22 and v24 are not rungs of the ladder but the library beside it: the same products
# through cuBLASLt in fp32, bf16 and fp16 (kernels/cublaslt.py), and its FP8 E4M3 products with each
# operand quantized per tensor by our kernels first (kernels/fp8_products.py). Both modules sit above
# the ops they wrap, so they are not imported here: the lab's VERSIONS table adds them where they can
# run (a GPU with nvmath-python; FP8: Ada or Hopper), so that the harness checks the library as it
# checks our kernels and lab/bench/gemm.py times it.
