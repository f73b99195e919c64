"""The lab's rungs of andrea_numba/kernels/matmul.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), the tile families they run (registered
in the engine's matmul.TILE_FAMILIES, each named by the rung that runs it) and the VERSIONS table
of the ladder:

    v1, v2        the lessons' pair (the engine's matmul_naive, matmul)
    v3, v4        warp tiles: SIMT multiply-adds, then 3xTF32 on tensor cores (lab/warp_tile.py)
    v5, v6, v7    lab/split_tile.py's k-major tiles: TF32 parts made once; split as read; the small
                  parts truncated by the tensor core
    v8            the engine's matmul_tf32x3: v7 on swizzled tiles (the fp32 recipe's)
    v9            SIMT multiply-adds at the SGEMM recipe (lab/simt_tile.py)
    v10           bf16 inputs rounded as read, on v8's tiles
    v11           the engine's matmul_fp16: v10 in fp16 (the fp16 recipe's)
    v12           bf16 shared tiles rounded once, read by ldmatrix (lab/half_tile.py)
    v13           the engine's matmul_bf16: v12's tiles fed by cp.async from bf16 copies (bf16-ampere)
    v14           wgmma on K-major bf16 copies (lab/wgmma_tile.py)
    v15           v14 with a wgmma group in flight and a deeper ring (lab/wgmma_ring.py)
    v16           v15 where no activation needs a transposed copy, v13 for the weight gradients
    v17           the engine's matmul_bf16_wgmma_cp_async: wgmma on the copies as stored
    v18           the engine's matmul_bf16_wgmma: TMA, a producer warp, persistent blocks (bf16-hopper)
    v19, v23      v18 with the split-K slices added in its own kernel (v23: their loads batched;
                  lab/wgmma_tma.py, the flag-built kernel and its launcher tma_product)
    v20-v22, v24  the library beside the ladder: cuBLASLt in fp32, bf16, fp16, and FP8
"""
import contextlib
import sys

from numba import cuda

from andrea_numba.kernels.common import ELEMENTWISE_THREADS, cdiv
from andrea_numba.kernels.matmul import *  # noqa: F401,F403  (the engine's rungs and helpers)
from andrea_numba.kernels.matmul import _matmul_warp, _split_product, _wgmma_matmul  # noqa: F401
from lab.cublaslt import matmul_versions as library_versions
from lab.fp8_products import matmul_versions as fp8_versions
from lab.half_tile import make_half_tile
from lab.operands import round_copies
from lab.simt_tile import make_simt_tile
from lab.split_wgmma_overlap import make_overlap_tile, overlap_resolve
from lab.warp_tile import make_v3_tile, make_v4_tile, make_v5_tile, make_v6_tile, make_v7_tile, make_v10_tile
from lab.wgmma_ring import make_ring_tile, ring_resolve
from lab.wgmma_tile import make_wgmma_tile, wgmma_resolve
from lab.wgmma_tma import COUNTS, tma_product

# The lab's tile families, named by the rung that runs them (the engine's: matmul.TILE_FAMILIES)
TILE_FAMILIES.update(
    v3=TileFamily(make_v3_tile, 3, "SIMT warp tiles"),
    v4=TileFamily(make_v4_tile, 4, "3xTF32 tensor-core warp tiles"),
    v5=TileFamily(make_v5_tile, 5, "split tiles (lab/split_tile.py): TF32 parts made once, 128-bit fragment reads"),
    v6=TileFamily(make_v6_tile, 6, "k-major tiles of raw values, split as the fragments are read"),
    v7=TileFamily(make_v7_tile, 7, "v6's tiles, the small parts' low bits left for the tensor core to drop"),
    v9=TileFamily(make_simt_tile, 9, "SIMT tiles of 4 x 4 blocks a thread on k-major shared tiles read 128 bits at a time"),
    v10=TileFamily(make_v10_tile, 10, "bf16 tensor cores (inputs rounded as read) on swizzled k-major tiles"),
    v12=TileFamily(make_half_tile, 12, "bf16 tensor cores on bf16 shared tiles (rounded once) read by ldmatrix"),
    v14=TileFamily(make_wgmma_tile, 14, "bf16 wgmma (Hopper warpgroup products) on K-major bf16 copies, a cp.async ring"),
    v15=TileFamily(make_ring_tile, 15, "bf16 wgmma with a group in flight, a deeper cp.async ring in dynamic shared memory"),
    v26=TileFamily(make_overlap_tile, 26, "v25's 3xTF32 planes on wgmma, a stage's wgmmas in flight across the stage boundary"),
)


# The split-K sum of the rungs before v8 (v3-v7): k_splitk_sum_v1, one thread an element of the
# [M, N] views. It finds its element's row and column with an integer division and remainder
# (64-bit), which kept the H200's integer pipe 75% busy while memory, the real work, ran at 41%
# (Nsight Compute, 120M dW_1's sum); v8 on sum with the engine's k_splitk_sum over flat views, a
# thread's index the element. The same additions in the same order: the same bits.
@cuda.jit
def k_splitk_sum_v1(out, work, accumulate):
    """out[r, c] (+)= sum_z work[z, r, c], z = 0, 1, ... in order (one thread per element)."""
    i = cuda.grid(1)
    M, N = out.shape
    if i >= M * N:
        return
    r, c = i // N, i % N
    s = work[0, r, c]
    for z in range(1, work.shape[0]):
        s += work[z, r, c]
    if accumulate:
        out[r, c] += s
    else:
        out[r, c] = s


def splitk_sum_v1(out, work, accumulate, stream):
    """Launch k_splitk_sum_v1 over out [M, N] (work [S, M, N])."""
    M, N = out.shape
    k_splitk_sum_v1[cdiv(M * N, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, stream](out, work, accumulate)


def _matmul_warp_v1(family, out, work, a, b, trans_a, trans_b, accumulate, block, stream):
    """matmul._matmul_warp with the split-K slices added by k_splitk_sum_v1 (v3-v7)."""
    part = _split_product(family, out, work, a, b, trans_a, trans_b, accumulate, block, stream)
    if part.shape[0] > 1:
        splitk_sum_v1(out, part, accumulate, stream)


# v3 and v4: warp tiles (lab/warp_tile.py), 128-bit copies, two shared stages, split-K (matmul.py).
# v3 multiplies with SIMT multiply-adds, v4 on tensor cores (3xTF32, fp32-accurate).
#
# (BM, BN, BK, WM, WN): 4 warps of 64 x 32 outputs (128 x 64 per block), 4 warps of 32 x 32
# (64 x 64), 8 warps of 64 x 32 (128 x 128), and 64 x 64 with BK = 32 (half the barriers); in the
# simulator, which pays per thread, one warp of 32 x 32 or two warps of 16 x 64 (few threads, many
# outputs each). The first: on the H200 (lab/bench/gemm.py --blocks, 2026-12-01) v4 was
# fastest with it for 8 of the 11 products timed, 5-17% ahead of 64 x 64 (the 120M logits: 14.8
# against 17.3 ms), and at most 11% behind the best for the other three.
WARP_TILES = dict(gpu=((128, 64, 16, 64, 32), (64, 64, 16, 32, 32), (128, 128, 16, 64, 32),
                       (64, 64, 32, 32, 32)),
                  sim=((32, 32, 8, 32, 32), (32, 64, 8, 16, 64)))


@blocks(**WARP_TILES)
def matmul_v3(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """SIMT warp tiles. work: float32 [n] split-K buffer (or None: no split). block = (BM, BN, BK,
    WM, WN): (BM/WM)*(BN/WN) warps per BM x BN tile of out."""
    _matmul_warp_v1("v3", out, work, a, b, trans_a, trans_b, accumulate, block, stream)


@blocks(**WARP_TILES)
def matmul_v4(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """3xTF32 tensor-core warp tiles (a NumPy twin of the step in the simulator); otherwise as matmul_v3."""
    _matmul_warp_v1("v4", out, work, a, b, trans_a, trans_b, accumulate, block, stream)


# v5: split tiles (lab/split_tile.py), BK = 16. Each value of a tile is split into its TF32
# parts once, as it enters shared memory (two planes), the tiles keep k along their rows, and a
# permutation of k gives each thread its fragment values side by side (128-bit shared reads).
# Shared memory: 32 KiB for 64 x 64, 48 KiB (the static limit) for 128 x 64 and 64 x 128.
SPLIT_TILES = dict(gpu=((128, 64, 16, 64, 32), (64, 64, 16, 32, 32), (128, 64, 16, 32, 32), (64, 128, 16, 32, 32)),
                   sim=((32, 32, 16, 32, 32), (32, 64, 16, 16, 64)))


@blocks(**SPLIT_TILES)
def matmul_v5(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """3xTF32 on split tiles (BK = 16); otherwise as matmul_v4."""
    _matmul_warp_v1("v5", out, work, a, b, trans_a, trans_b, accumulate, block, stream)


# v6: v5's k-major tiles and k permutation with one shared plane of raw values, split into TF32
# parts as each thread reads its fragments (lab/split_tile.py, presplit=False). v5 halved the
# arithmetic around the mma but doubled the shared-memory traffic, and shared memory was the
# limit (lab/bench/gemm_ablate.py on the H200: with no mma at all v5's kernel still took 66% of its
# time); v6 halves that traffic. Its tiles are the engine's KMAJOR_TILES (matmul.py): 24 KiB of
# shared memory for 128 x 64, 32 KiB for 128 x 128.
@blocks(**KMAJOR_TILES)
def matmul_v6(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """3xTF32 on k-major tiles split as read (BK = 16); otherwise as matmul_v4."""
    _matmul_warp_v1("v6", out, work, a, b, trans_a, trans_b, accumulate, block, stream)


# v7: v6 with a split of three instructions a value instead of five. v6 splits x into
# big = tf32(x) (add half a TF32 unit, clear the low 13 bits) and small = tf32(x - big) (the same
# two again). An mma.sync reads a TF32 operand from its top 19 bits only: measured on the H200
# (lab/bench/gemm_ablate.py --splits, 2026-12-01), handing it x - big with the half unit added gives
# v6's bits exactly. v7 hands it x - big as it is, and the tensor core truncates it: small then
# keeps its 10 bits rounded toward zero instead of to nearest, an error below 2^-21 |x| where v6's
# is below 2^-22 |x|, of either sign, next to the 2^-22 of the small * small product that 3xTF32
# leaves out. Measured against float64 on the same run: 3.5e-7 (v6 3.9e-7) at 8192 x 3072 x 768,
# 6.5e-7 (6.8e-7) at 8192 x 768 x 3072, 8.0e-7 (8.1e-7) at 4096^3. The inner loop loses 96 of its
# ~550 instructions a warp and stage (the kernel issues instructions at about half the rate it
# could, with 2 warps a scheduler: Nsight Compute), and ran 2-9% faster than v6.
@blocks(**KMAJOR_TILES)
def matmul_v7(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """v6 with the small parts truncated by the tensor core (three instructions a split)."""
    _matmul_warp_v1("v7", out, work, a, b, trans_a, trans_b, accumulate, block, stream)


# v8: v7 on swizzled k-major tiles (lab/split_tile.py, "v8's shared tiles"; written out in
# kernels/split_tile.py). An operand stored with k down its columns (a^T in the weight gradients)
# reaches shared memory in 4 x 4 blocks, each tile row's 4 values of k in one 128-bit store, where
# v6 and v7 wrote 4 scalars two to a bank; a row swizzle makes these stores, v6's scalar stores
# (kept for B of x @ W) and the fragment reads free of bank conflicts. The same values in the same
# sums as v7: v8 gives v7's bits. (matmul.matmul_tf32x3, the engine's fp32 recipe's products.)


# v9: SIMT multiply-adds again, at the recipe of fast SGEMMs (lab/simt_tile.py): k-major
# shared tiles, a thread's outputs in 4 x 4 blocks whose operands come in 128-bit shared loads,
# 4 loads for 64 multiply-adds where v3 made 16 scalar ones. For a SIMT model (lab recipe "simt2"):
# no tensor cores, every product an fp32 multiply-add. BK = 8: 8 KiB of shared memory for
# 128 x 128 (two stages); 64 sums a thread at 8 warps of 64 x 32.
SIMT2_TILES = dict(gpu=((128, 128, 8, 64, 32), (128, 64, 8, 64, 32), (64, 64, 8, 32, 32), (128, 128, 16, 64, 32)),
                   sim=((32, 16, 8, 32, 16), (32, 32, 8, 32, 16)))


@blocks(**SIMT2_TILES)
def matmul_v9(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """SIMT products on k-major tiles with 128-bit shared reads; block = (BM, BN, BK, WM, WN)
    (lab/simt_tile.py); work: the split-K buffer (or None)."""
    _matmul_warp("v9", out, work, a, b, trans_a, trans_b, accumulate, block, stream)


# v10: bf16 products on v8's tiles (lab/split_tile.py, "bf16"): the operands stay fp32 in memory and in
# shared memory; each thread rounds its fragment values to bf16 as it reads them (cvt.rn.bf16x2.f32,
# two values an instruction) and one mma.sync m16n8k16 takes a fragment's whole stage of 16 values
# of k, where v8 issued six m16n8k8 (three TF32 products, two k-steps). Not an fp32 product: each
# input keeps 8 significant bits (reference/precision.py), every product of two bf16 is exact and
# the sums are fp32. The harness checks it against the twin on bf16-rounded inputs at the fp32
# tolerance, and against the fp32 twin within the bound that rounding allows.
@blocks(**KMAJOR_TILES)
def matmul_v10(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """bf16 tensor-core products (inputs rounded to bf16, fp32 sums) on v8's swizzled tiles."""
    _matmul_warp("v10", out, work, a, b, trans_a, trans_b, accumulate, block, stream)


matmul_v10.precision = "bf16"     # the harness compares it with the twin on bf16-rounded inputs


# v11: v10 in fp16, the engine's matmul_fp16 (matmul.py).


# the tile family each launches (the linear ops' fused kernels run on it: attn_qkv._fwd_warp, ...)
matmul_v3.family, matmul_v4.family, matmul_v5.family, matmul_v6.family, matmul_v7.family = "v3", "v4", "v5", "v6", "v7"
matmul_v9.family, matmul_v10.family = "v9", "v10"


# v12: bf16 products the way fast half-precision GEMMs do them (lab/half_tile.py). The operands
# stay fp32 in global memory; each block loads its next stage (BK = 32) into registers before the
# current stage's products, rounds it to bf16 (cvt.rn.bf16x2.f32, ties to even) and stores the
# bf16 pairs to the other of two swizzled shared stages, so shared memory holds 2 bytes a value
# and each value is rounded once per block (v10: 4 bytes, rounded by every warp that reads it);
# ldmatrix.x4 (.trans for an operand stored with k down its columns) reads the mma.sync fragments
# 16 x 16 at a time. Same math as v10 (inputs rounded to bf16, exact products, fp32 sums), other
# order of the sums: other bits than v10. Tiles: 8 warps of 64 x 32 (128 x 128, the default), 4
# warps of 64 x 32 (128 x 64) and of 32 x 32 (64 x 64); 32 KiB, 24 KiB, 16 KiB of shared memory.
# In the simulator one warp of 32 x 32 and two warps of 32 x 16 (a 64-row tile: the GPU's swizzle
# of 128-byte rows).
HALF_TILES = dict(gpu=((128, 128, 32, 64, 32), (128, 64, 32, 64, 32), (64, 64, 32, 32, 32)),
                  sim=((32, 32, 32, 32, 32), (64, 16, 32, 32, 16)))


@blocks(**HALF_TILES)
def matmul_v12(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """bf16 tensor-core products (inputs rounded to bf16 once, on their way into shared memory;
    fp32 sums) with ldmatrix fragment reads; block = (BM, BN, 32, WM, WN); work: the split-K buffer."""
    _matmul_warp("v12", out, work, a, b, trans_a, trans_b, accumulate, block, stream)


matmul_v12.precision = "bf16"
matmul_v12.family = "v12"
# the linear ops on v12's tiles (attn_qkv, attn_out v11, mlp v15): in the simulator two tiles of one
# warp (matmul v12's rows check the two-warp tile and its swizzle of 128-byte rows)
HALF_OP_TILES = dict(gpu=HALF_TILES["gpu"], sim=(HALF_TILES["sim"][0], (32, 16, 32, 32, 16)))


# v13: v12's tiles fed by cp.async (kernels/half_tile.py, "matmul v13"). Each operand is first
# rounded once to a bf16 copy (operands.round_into, ties to even: v12's rounding) in a scratch of
# half_tile's; the product kernel copies 16-byte chunks of the copies global -> shared with
# cp.async (no staging registers, half the bytes of v12's fp32 loads) into a ring of 3 shared
# stages (4 for the smaller tiles), one barrier a step, then v12's swizzle, ldmatrix and mma.sync.
# Same math as v12 (inputs rounded to bf16, exact products, fp32 sums, the same stage and order of
# sums within a block: v12's bits where the split of K is the same). Tiles (BM, BN, 32, WM, WN[,
# STAGES]): 128 x 128 of 8 warps, 3 stages (48 KiB, the static limit), 128 x 64 and 64 x 64 of
# 4 warps with 4 stages (48 and 32 KiB); in the simulator one warp of 32 x 32 (3 stages) and two
# warps of 32 x 16 with 4 stages (a 64-row tile: the swizzle of 128-byte rows, and wait_group 2).
# (matmul.matmul_bf16, the bf16-ampere recipe's products.)


# v14: bf16 products on Hopper's warpgroup instruction wgmma.mma_async (lab/wgmma_tile.py). v13's
# bf16 copies, cp.async ring and swizzled shared tiles, but the stage is two wgmma m64n128k16 a
# warpgroup (two warpgroups, 256 threads, a 128 x 128 tile), reading A and B straight from shared
# memory through descriptors (the 64-byte swizzle of v13's k-inner tiles is wgmma's mode 2): no
# ldmatrix, no fragment registers. wgmma reads the tiles K-major, so both copies are made K-major,
# the a @ b^T form: a16 [M, K], b16 [N, K]; an operand stored with k down its columns (b of x @ W,
# a^T of a weight gradient) is rounded into a transposed copy (lab/operands.py's k_round_bf16_t_v1, a 32 x 32
# tile transpose through shared memory). Same math as v13 (inputs rounded to bf16 ties to even,
# exact products, fp32 sums), another order of the sums inside the tensor core: other bits than
# v13, the same at every run. Tiles (BM, BN, 32, 64, BN[, STAGES]): 128 x 128 of 2 warpgroups with
# 3 stages (48 KiB) and 64 x 128 of one with 4 (48 KiB); in the simulator one warpgroup of 64 x 16
# (3 stages) and of 64 x 8 (4 stages: wait_group 2).
WGMMA_TILES = dict(gpu=((128, 128, 32, 64, 128), (64, 128, 32, 64, 128, 4)),
                   sim=((64, 16, 32, 64, 16), (64, 8, 32, 64, 8, 4)))


@blocks(**WGMMA_TILES)
def matmul_v14(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """bf16 products on wgmma (sm_90a) from K-major bf16 copies of the operands (rounded once, ties
    to even; transposed where stored the other way) copied to shared memory by cp.async through a
    ring of stages; block = (BM, BN, 32, 64, BN[, STAGES]); work: the split-K buffer (or None). The
    copies live in operands.COPIES, as v13's (its caveats: one scratch, grown at a new largest size)."""
    a16, b16 = wgmma_copies(a, b, bool(trans_a), bool(trans_b), stream)        # K-major: a16 [M, K], b16 [N, K]
    _wgmma_matmul(wgmma_resolve, out, work, a16, b16, False, True, accumulate, block, stream)


matmul_v14.precision = "bf16"
matmul_v14.family = "v14"


def wgmma_copies(a, b, trans_a, trans_b, stream=0):
    """(a16 [M, K], b16 [N, K]): the K-major bf16 copies of op(a) and op(b)^T in operands.COPIES.
    a stored [M, K] (not trans_a) and b stored [N, K] (trans_b) are K-major already: rounded as they
    are (a uint16 one used where it is); a^T stored [K, M] and b stored [K, N] are rounded into
    transposed copies (lab/operands.py's k_round_bf16_t_v1; a uint16 one has its bits transposed)."""
    a16, b16 = round_copies(a, b, stream, transpose=(trans_a, not trans_b))
    M, K = (a.shape[1], a.shape[0]) if trans_a else a.shape
    N = b.shape[0] if trans_b else b.shape[1]
    return a16.reshape(M, K), b16.reshape(N, K)


# v15: v14 with one wgmma group kept in flight and a deeper ring (lab/wgmma_ring.py). A warpgroup
# waits for step s - 1's wgmmas (wait_group 1) instead of step s's, so the tensor cores keep working
# through the barrier and the next copies; a stage stays busy one step longer, so the copies run
# STAGES - 2 steps ahead. The ring lives in dynamic shared memory (past Numba's static 48 KiB: the
# kernel is allowed it once, allow_shared), with BK = 64 stages of 128-byte rows (wgmma's 128-byte
# swizzle, four k16 steps a stage). Same math as v14 (the same sums in the same order within a
# stage's k16 steps: v14's bits where BK divides the same way). Tiles (BM, BN, BK, 64, BN[, STAGES]):
# 128 x 128 x 64 with 4 stages (128 KiB + 1 KiB to align; ptxas: 112 registers, no spills) and v14's
# static 128 x 128 x 32 with 3 (48 KiB; 92 registers); in the simulator one warpgroup of 64 x 16 x 64
# with 4 stages (dynamic) and of 64 x 8 x 32 with 3 (static). Not declared: 128 x 256 x 64 with 3
# stages (144 KiB) compiles, but its 128 accumulators a thread hit ptxas's 255 registers and spill
# (84 bytes stored, 156 loaded, a 608-byte stack frame with the epilogue's acc array). The 4-stage
# ring leaves room for one block a multiprocessor (129 KiB of 227); 3 stages (97 KiB) for two, and
# that is v15's first tile: on the H200 (docs/kernels.md) 128 x 128 x 64 with 3
# stages ran the 120M logits in 2.72 ms against 3.04 with 4 and 3.66 with v14's static ring, and was
# the fastest on 11 of the 13 products timed (4% and 11% behind 4 stages on the other two: the 120M
# dx = dh @ W_1^T and the 12M dW_O). Also declared: 64 x 128 x 64 of
# one warpgroup with 4 stages (two blocks a multiprocessor too; slower on every 120M product).
RING_TILES = dict(gpu=MN_TILES["gpu"], sim=((64, 16, 64, 64, 16, 4), (64, 8, 32, 64, 8, 3)))


@blocks(**RING_TILES)
def matmul_v15(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """bf16 products on wgmma (sm_90a) with one wgmma group in flight, from K-major bf16 copies (v14's)
    through a ring of cp.async stages in dynamic shared memory; block = (BM, BN, BK, 64, BN[, STAGES]),
    BK = 64 (dynamic ring) or 32 (static, v14's); work: the split-K buffer (or None). The copies live
    in operands.COPIES, as v13's and v14's."""
    a16, b16 = wgmma_copies(a, b, bool(trans_a), bool(trans_b), stream)        # K-major: a16 [M, K], b16 [N, K]
    _wgmma_matmul(ring_resolve, out, work, a16, b16, False, True, accumulate, block, stream)


matmul_v15.precision = "bf16"
matmul_v15.family = "v15"


# v16: v15 where it needs no transposed copy of an activation, v13 where it would. v15 reads both
# operands K-major, so a weight gradient (dW += x^T @ dy: x and dy stored with M and N along their
# rows, K = the tokens down their columns) would first be copied transposed, activation-sized; v13
# reads an operand of either orientation from a copy made as it is stored. So (out = op(a) @ op(b)):
#     op(a) = a (trans_a False): v15. A forward x @ W, a dx = dy @ W^T, the logits x @ wte^T, dlogits @ wte
#         (b: a weight; where stored [K, N] its transposed copy is weight-sized)
#     op(a) = a^T (trans_a True): v13, at its default tile. The weight gradients, dwte += dlogits^T @ x
# The bits are v15's or v13's, product by product; the same at every run. block: v15's (RING_TILES).
@blocks(**RING_TILES)
def matmul_v16(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """bf16 products: matmul v15 (wgmma) where op(a) = a, matmul v13 (mma.sync) where op(a) = a^T (a
    weight gradient, whose operands v15 would copy transposed); block is v15's."""
    if trans_a:
        matmul_bf16(out, work, a, b, trans_a, trans_b, accumulate, stream=stream)
    else:
        matmul_v15(out, work, a, b, trans_a, trans_b, accumulate, block=block, stream=stream)


matmul_v16.precision = "bf16"


# v17, the engine's matmul_bf16_wgmma_cp_async (matmul.py): wgmma on the operands as they are
# stored (kernels/wgmma_mn.py). v14 and v15 hand wgmma K-major copies only, so an operand
# stored with k down its columns (both of a weight gradient's, dW += x^T @ dy) is rounded into a
# transposed copy first (k_round_bf16_t_v1), which made them slower than v13 on the weight
# gradients (98 against 145 TFLOP/s on the H200). v17 rounds each operand as it is stored
# (half_tile.bf16_copies: k_round_bf16; a uint16 operand is used where it is), fills an
# MN-major stage tile for an operand with k down its columns (128-byte swizzle, column blocks of
# 64 values of m or n, one 128-byte row per k: v13's copier once per block), and has wgmma read it
# through its transpose bits (imm-trans-a = trans_a, imm-trans-b = not trans_b). The rest is v15's:
# ring, wait-1 order, tiles, accumulators, split-K (no atomics). Only the shared-memory layout
# differs, so the same sums in the same order: v15's bits, for every transpose. Tiles: v15's on
# the GPU (the MN-major tiles use the same bytes); in the simulator one warpgroup of 64 x 128 x 64
# with 4 stages (dynamic; an N-major B of two column blocks, so its descriptor's LBO is used) and
# of 64 x 64 x 32 with 3 (static): an MN-major tile needs BM and BN multiples of 64. Its kernel is
# _k_matmul_warp's on make_mn_tile (tile family "bf16_wgmma_cp_async"), launched by v14's and v15's
# _wgmma_matmul on the copies as stored. v18 runs on it the products whose operands a tensor map
# cannot read.


# v18, the engine's matmul_bf16_wgmma (matmul.py, kernels/wgmma_tma.py): v17's shared layouts,
# descriptors and sums, copied by TMA from a producer warp, persistent blocks.


def tma_fits(a, b) -> bool:
    """Whether matmul v18 (matmul_bf16_wgmma) runs a product of a and b itself: each a 2-D array with
    rows of a multiple of 8 values (a float32 operand is copied into an aligned slot of COPIES with its
    rows packed), a uint16 one (read where it is) also a tensor map's alignment (tma.map_fits); else
    v18 hands the product to v17 (matmul_bf16_wgmma_cp_async)."""
    return all(x.ndim == 2 and x.shape[1] % 8 == 0 and (x.dtype != "uint16" or map_fits(x)) for x in (a, b))


# v19: v18 whose kernel adds its split-K slices itself (lab/wgmma_tma.py, point 6): the last warp of the S
# slices of a tile's cells sums them in k_splitk_sum's order, so v18's bits without the second
# launch and its pass over memory (the sums took 0.93 ms of the 120M bf16 step). Measured on the
# H200: v18's bits in whole 120M and 12M steps, but the split products took 173 us against
# 23: the summing warp's scalar loads, one slice after another, wait on L2 S x 128 times a thread.
# A rung that lost (docs/precision.md); batching those loads is its next step.
@blocks(gpu=(TMA_AUTO,) + TMA_TILES["gpu"], sim=(TMA_AUTO,) + TMA_TILES["sim"])
def matmul_v19(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """matmul v18 with the split-K slices added in the product's own kernel (lab/wgmma_tma.py's SplitKCounts)."""
    tma_product(out, work, a, b, trans_a, trans_b, accumulate, block, stream, fixup=1)


matmul_v19.precision = "bf16"


# the modules whose linear ops name matmul_bf16_wgmma at each product: the engine's and their lab twins
TMA_OPS = tuple(f"{wing}.{op}" for wing in ("andrea_numba.kernels", "lab") for op in ("attn_qkv", "attn_out", "mlp", "loss"))


@contextlib.contextmanager
def tma_matmul(version: int):
    """Benchmarks only: inside, the linear ops whose products run on matmul v18 (matmul_bf16_wgmma:
    the bf16-hopper recipe's, the lab's recipes bf16t and bf16s) run matmul `version` (18, 19, 23)
    instead, for a rung of the split-K fixup timed and checked inside the whole model without a
    recipe of its own: the name matmul_bf16_wgmma, which those ops look up at each product, points at
    it in their modules (TMA_OPS, those imported); after, at v18 again. The fixups' counters are
    reserved on the way in (a model built inside may capture its step as a CUDA graph)."""
    assert version in (18, 19, 23), f"matmul v{version} is not a TMA version (18, 19, 23)"
    engine, launch = VERSIONS["matmul"][18], VERSIONS["matmul"][version]
    if version != 18:
        COUNTS.reserve()
    users = [m for name, m in sys.modules.items() if name in TMA_OPS and getattr(m, "matmul_bf16_wgmma", None) is engine]
    for m in users:
        m.matmul_bf16_wgmma = launch
    try:
        yield
    finally:
        for m in users:
            m.matmul_bf16_wgmma = engine


# v23 (20-22 are the library route's numbers, cublaslt.py): v19 with the in-kernel sums' loads batched
# (lab/wgmma_tma.py, point 6: sum_slices_batched, up to 8 slices of 2 accumulator pairs in flight before
# the adds, in the same order): v18's bits. Its time on a GPU is not measured yet; the simulator
# checks its bits (tests/test_matmul_v19.py), and lab/bench/gpu_profile.sh times it beside v18 and v19.
@blocks(gpu=(TMA_AUTO,) + TMA_TILES["gpu"], sim=(TMA_AUTO,) + TMA_TILES["sim"])
def matmul_v23(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """matmul v19 with the split-K slices' loads batched before their adds."""
    tma_product(out, work, a, b, trans_a, trans_b, accumulate, block, stream, fixup=2)


matmul_v23.precision = "bf16"


# v26: v25 (the engine's matmul_tf32x3_wgmma) with one stage's wgmmas kept in flight while the
# threads add the stage before's sums, meet, and split and store the next stage (lab/split_wgmma_overlap.py):
# v25's bits, two sets of stage sums a thread.
@blocks(**SPLIT_WGMMA_TILES)
def matmul_v26(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """matmul v25 with a stage's wgmmas in flight across the stage boundary; block = (BM, BN, 32, 64, BN)."""
    _wgmma_matmul(overlap_resolve, out, work, a, b, bool(trans_a), bool(trans_b), accumulate, block, stream)


matmul_v26.family = "v26"


VERSIONS = {"matmul": {1: matmul_naive, 2: matmul, 3: matmul_v3, 4: matmul_v4, 5: matmul_v5, 6: matmul_v6,
                       7: matmul_v7, 8: matmul_tf32x3, 9: matmul_v9, 10: matmul_v10, 11: matmul_fp16,
                       12: matmul_v12, 13: matmul_bf16, 14: matmul_v14, 15: matmul_v15, 16: matmul_v16,
                       17: matmul_bf16_wgmma_cp_async, 18: matmul_bf16_wgmma, 19: matmul_v19, 23: matmul_v23,
                       25: matmul_tf32x3_wgmma, 26: matmul_v26}}


# matmul v20-v22 (cuBLASLt in fp32, bf16, fp16) and v24 (FP8) beside the ladder, where they can run
# (a GPU with nvmath-python; FP8: Ada or Hopper): the harness checks them and lab/bench/gemm.py times
# them as it does our kernels.
VERSIONS["matmul"].update(library_versions())
VERSIONS["matmul"].update(fp8_versions())
