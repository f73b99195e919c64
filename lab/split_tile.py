"""The lab's k-major tiles (andrea_numba/kernels/split_tile.py holds the engine's, written out): the
flag factory tile_mma_split that builds the product tiles of matmul v5, v6, v7 and v10 and the
variants lab/bench/gemm_ablate.py measures, with the history of each option. The engine's
matmul_tf32x3 (v8) and matmul_fp16 (v11) run the written-out tiles; at their values
(presplit=False, swizzle=True, and split_mode="trunc" or half="fp16") the factory gives their bits
(tests/test_split_tile.py).

matmul v4 (lab/warp_tile.py) computes the right thing but spends its time around the tensor cores:
every value a warp reads from shared memory is read one float at a time and split into its TF32
parts big + small there and then (five instructions), and a value of the A tile is read and
split again by each of the BN/WN warps that share it; after every 8-deep step each fragment's
product is added to acc with four fp32 adds. v5 keeps v4's warps, fragment layout, output
layout (row(i), col(j)) and split-K, and moves that work out of the inner loop:

1. Split once. The copy into shared memory splits each value x into big = tf32(x) and
   small = tf32(x - big) and stores them in two planes: s[0] holds the big parts, s[1] the small
   ones. The inner loop reads ready TF32 parts.

2. k along the rows. Both shared tiles are stored with k as the fast index, sa[plane, m, k] and
   sb[plane, n, k], BK = 16 values of k per stage, pitch 16 (64 bytes). An operand stored with k
   along its rows in global memory (a [M, K], b^T: b stored [N, K]) is copied straight, four
   floats at a time; one stored with k down its columns (a^T: a stored [K, M], b [K, N]) is
   copied transposed: each thread fetches 4 consecutive columns of one stored row and writes
   them down a column of the tile (consecutive threads take consecutive k, so a warp's scalar
   stores fall in different banks, at most two to a bank).

3. A permutation of k that puts a thread's fragment values side by side (the engine's module
   docstring, 2.): one 128-bit shared read (ld.shared.v4) gives a thread two k-steps of one row
   of A (or of B), where v4 needed four scalar reads and four splits. Bank check: a 128-bit read
   is served 8 lanes at a time; lanes 8p .. 8p + 7 read rows g = 2p, 2p + 1 at columns 4t, so
   their 16-byte groups are (4 g + t) mod 8 with pitch 16: eight different groups, no conflict.

4. One fp32 add per stage. A fragment's three products (small*big, big*small, big*big) of both
   k-steps are chained inside the tensor core, six mma.sync from zero, and the result is added
   to acc once per stage (v4: after every k-step). A chain over all of K drifts (warp_tile.py);
   a chain of six does not measurably.

Shared memory: 2 stages x 2 planes x (BM + BN) x 16 floats: 32 KiB for a 64 x 64 tile, 48 KiB
(the static limit) for 128 x 64 (split_bytes).

v6 (presplit=False) keeps 2, 3 and 4 and undoes 1: shared memory holds one plane of the raw
values, and each thread splits its fragment values right after its 128-bit read. Measured on the
H200 (lab/bench/gemm_ablate.py, 2026-12-01), v5 was no faster than v4: with its mma instructions
removed, v5's kernel still took two thirds of its time, so the limit was the data movement
(two planes written and read per stage, with 8 of 64 warps per SM), not the arithmetic that v5
moved out. v6 moves half the bytes through shared memory for some more arithmetic, and ran the
120M MLP product (8192 x 3072 x 768) at 49 TFLOP/s against v5's 39 and cuBLAS SGEMM's 47.
One plane: 2 stages x (BM + BN) x 16 floats, 24 KiB for 128 x 64.

v7 (split_mode="trunc") hands the tensor core x - big as it is (lab/matmul.py, v7's comment).

v8 (swizzle=True) and v10, v11 (half=): the comments above _split_copier and HALF.

In the simulator the stage's products are a NumPy twin: each thread's TM x TN outputs of
(big + small parts) from the same shared tiles (warp_tile.py says why: mma.sync needs 32 real
lanes).
"""
import numpy as np
from numba import cuda, float32, int32

from andrea_numba.kernels.common import SIMULATOR
from andrea_numba.kernels.ptx import bf16x2, f16x2, load4, mma_bf16, mma_f16, mma_tf32, store4, tf32_half_up, tf32_round
from andrea_numba.kernels.split_tile import BK_SPLIT, chunk_fetcher, phys
from andrea_numba.kernels.tile_loop import WARP, add_fragment, make_pipeline
from reference.precision import round_bf16, round_fp16


def split_bytes(BM: int, BN: int) -> int:
    """Shared memory of a split tile: 2 stages x 2 planes x (BM + BN) rows x 16 floats."""
    return 4 * 2 * 2 * (BM + BN) * BK_SPLIT


@cuda.jit(device=True)
def split(x):
    """x = big + small (+ about 2^-22 x): big = tf32(x), small = tf32(x - big)."""
    big = tf32_round(x)
    return big, tf32_round(x - big)


@cuda.jit(device=True)
def split_half(x):
    """split(x) as the tensor core sees it, in four instructions instead of five: small's low 13
    bits are left for the mma to drop (tf32_half_up). big must be whole: x - big needs it."""
    big = tf32_round(x)
    return big, tf32_half_up(x - big)


@cuda.jit(device=True)
def split_trunc(x):
    """small = x - big as it is, which the tensor core truncates to TF32 (round toward zero, not to
    nearest): three instructions, a little less accurate (v7; the engine's split_tf32x3)."""
    big = tf32_round(x)
    return big, x - big


SPLITS = {"round": split, "half": split_half, "trunc": split_trunc}


# v8's shared tiles (swizzle=True): the k-major tile of v6, with two changes.
#
# 1. A transposed operand of 16 values a thread comes in as 4 x 4 blocks. v6 copies an operand
#    stored with k down its columns (a^T in the weight gradients, W in x @ W) 4 tile rows at one
#    k per thread, written down a column of the tile: 4 scalar shared stores for 4 values, two to
#    a bank (Nsight Compute on the 120M dW_1: shared memory 83% busy, half its store wavefronts
#    conflicts). When the tile has as many rows as the block has threads (A of the 128 x 64
#    tile: 16 values a thread), v8 gives each thread a block of 4 consecutive k by 4 consecutive
#    tile rows, thread b at k = 4 (b % 4) .. + 3 and rows 4 (b // 4) .. + 3: four 128-bit global
#    loads, one from each stored row, and then each tile row's 4 values of k, side by side in
#    registers now, go out as one 128-bit store. Operands of 8 values a thread (B of the 128 x 64
#    tile) keep v6's copy: 4 x 2 blocks halved the global loads' width and made x @ W 20%
#    slower on the H200.
#
# 2. A swizzle that makes every access conflict-free: tile row r lives in shared row
#        phys(r) = r ^ ((r >> 2) & 1)      (rows 4..7 of every 8 swap in pairs: 4<->5, 6<->7)
#    (the engine's split_tile.phys; its module docstring, 3., has the bank arithmetic). v6's
#    scalar stores (16 lanes down one row, 16 down the row 4 further on) were two to a bank and
#    are conflict-free with it too.

@cuda.jit(device=True)
def same(r):
    """Tile row r's shared row without a swizzle (v5, v6, v7)."""
    return r


def _split_copier(R, THREADS, straight, vec, presplit=True, swizzle=False):
    """fetch(regs, g, r0, c0, rlim, clim): this thread's share of one operand's tile of the stored
    matrix g, from stored row r0 and column c0 (zero outside rows < rlim, columns < clim), into
    registers; put(s, regs): split them into the planes of the k-major shared tile s[plane, row, k]
    (R tile rows, BK_SPLIT values of k).
    straight: the stored rows are the tile's rows, the stored columns are k: a chunk is 4
      consecutive k of one row, written as one 128-bit store per plane.
    transposed: the stored rows are k, the stored columns are the tile's rows: a chunk is 4
      consecutive tile rows at one k, written as 4 scalar stores per plane; consecutive threads
      take consecutive k.
    vec: 128-bit global loads (the caller checked the alignment); otherwise one float at a time.
    presplit=False: one plane of the raw values (split when read: _stage).
    swizzle (v8, one plane): tile row r at shared row phys(r); a transposed operand of 16 values a
    thread in 4 x 4 blocks."""
    assert not (swizzle and presplit), "v8's swizzled tiles hold one plane of raw values"
    BK = BK_SPLIT
    row = phys if swizzle else same
    E = R * BK // THREADS                 # elements per thread
    CH = E // 4                           # 4-float chunks per thread
    assert CH * 4 * THREADS == R * BK, f"a {R} x {BK} tile does not split into 4-float chunks over {THREADS} threads"

    blocks4 = swizzle and not straight and E == 16     # v8: a 4 x 4 block per thread (the comment above)

    @cuda.jit(device=True)
    def chunk(b, j):
        """(stored row offset, stored column offset) of thread b's chunk j of the tile."""
        if blocks4:                       # stored rows 4 (b % 4) + j (k), columns 4 (b // 4) .. (tile rows)
            return 4 * (b % 4) + j, 4 * (b // 4)
        e = b + j * THREADS
        if straight:
            return e // (BK // 4), (e % (BK // 4)) * 4
        return e % BK, (e // BK) * 4

    fetch = chunk_fetcher(chunk, CH, vec)

    @cuda.jit(device=True)
    def put(s, regs):
        if blocks4:                       # tile rows dc + i, k = dr .. dr + 3 of the block: one 128-bit store each
            dr, dc = chunk(cuda.threadIdx.x, 0)
            for i in range(4):
                r = phys(dc + i)
                if vec:
                    store4(s, r * BK + dr, regs[i], regs[4 + i], regs[8 + i], regs[12 + i])
                else:
                    s[0, r, dr], s[0, r, dr + 1], s[0, r, dr + 2], s[0, r, dr + 3] = (
                        regs[i], regs[4 + i], regs[8 + i], regs[12 + i])
            return
        for j in range(CH):
            dr, dc = chunk(cuda.threadIdx.x, j)
            if not presplit:
                x0, x1, x2, x3 = regs[4 * j], regs[4 * j + 1], regs[4 * j + 2], regs[4 * j + 3]
                if straight and vec:
                    store4(s, row(dr) * BK + dc, x0, x1, x2, x3)
                elif straight:
                    r = row(dr)
                    s[0, r, dc], s[0, r, dc + 1], s[0, r, dc + 2], s[0, r, dc + 3] = x0, x1, x2, x3
                else:
                    s[0, row(dc), dr], s[0, row(dc + 1), dr], s[0, row(dc + 2), dr], s[0, row(dc + 3), dr] = (
                        x0, x1, x2, x3)
                continue
            b0, s0 = split(regs[4 * j])
            b1, s1 = split(regs[4 * j + 1])
            b2, s2 = split(regs[4 * j + 2])
            b3, s3 = split(regs[4 * j + 3])
            if straight and vec:              # tile row dr, k = dc .. dc + 3: one 16-byte store per plane
                store4(s, dr * BK + dc, b0, b1, b2, b3)
                store4(s, (R + dr) * BK + dc, s0, s1, s2, s3)
            elif straight:
                s[0, dr, dc], s[0, dr, dc + 1], s[0, dr, dc + 2], s[0, dr, dc + 3] = b0, b1, b2, b3
                s[1, dr, dc], s[1, dr, dc + 1], s[1, dr, dc + 2], s[1, dr, dc + 3] = s0, s1, s2, s3
            else:                             # k = dr, tile rows dc .. dc + 3
                s[0, dc, dr], s[0, dc + 1, dr], s[0, dc + 2, dr], s[0, dc + 3, dr] = b0, b1, b2, b3
                s[1, dc, dr], s[1, dc + 1, dr], s[1, dc + 2, dr], s[1, dc + 3, dr] = s0, s1, s2, s3
    return fetch, put, E


# bf16 (matmul v10): the same tiles, one mma a fragment a stage. mma.sync m16n8k16 takes 16 values
# of k at once, two bf16 to a register (ptx.py). A stage holds 16 values of k, and lane t's run of
# a row is k = 4t .. 4t + 3 (one 128-bit shared read, as for 3xTF32). An mma sums its 16 values of
# k in whatever order we name them, as long as A and B use the same names, so lane t names its run
#     k = 4t, 4t + 1   ->  fragment k 2t, 2t + 1        (registers a0, a1 of A and b0 of B)
#     k = 4t + 2, 4t + 3  ->  fragment k 2t + 8, 2t + 9   (registers a2, a3 of A and b1 of B)
# and the four lanes t = 0..3 cover the stage's 16 values of k once. Each pair is rounded to bf16
# and packed by one cvt.rn.bf16x2.f32 as it is read: the shared tiles keep the fp32 values. Where
# 3xTF32 needed six mma.sync a fragment a stage (three products, two k-steps), bf16 needs one.
# fp16 (matmul v11) is the same stage with cvt.rn.f16x2.f32 and the f16 mma.sync: 11 significant
# bits instead of 8, a range up to 65504 instead of fp32's.
HALF = {"bf16": (bf16x2, mma_bf16, round_bf16), "fp16": (f16x2, mma_f16, round_fp16)}


def _stage_16(BM, BN, MI, NI, swizzle, fmt="bf16"):
    """stage(acc, sa, sb, wm0, wn0, g, t): acc += this thread's share of the stage's product, the
    values of one plane of raw fp32 tiles rounded to `fmt` (bf16 or fp16) as they are read."""
    TM, TN = 2 * MI, 2 * NI
    BK = BK_SPLIT
    pack, mma16, rnd = HALF[fmt]

    if SIMULATOR:
        ROW = np.array([(i // 2) * 16 + (i % 2) * 8 for i in range(TM)])
        COL = np.array([(j // 2) * 8 + j % 2 for j in range(TN)])

        def stage(acc, sa, sb, wm0, wn0, g, t):
            rows, cols = ROW + (wm0 + g), COL + (wn0 + 2 * t)
            if swizzle:
                rows, cols = rows ^ ((rows >> 2) & 1), cols ^ ((cols >> 2) & 1)
            with np.errstate(over="ignore", invalid="ignore"):   # fp16: past 65504 is inf, as on the GPU
                acc += rnd(sa[0][rows]) @ rnd(sb[0][cols].T)     # exact products, fp32 sums
        return stage

    @cuda.jit(device=True)
    def stage(acc, sa, sb, wm0, wn0, g, t):
        ra = cuda.local.array((MI, 2, 2), int32)   # [mi, row g or g + 8, k pair 2t.. or 2t + 8..]: bf16x2
        rb = cuda.local.array((NI, 2), int32)      # [ni, k pair]
        gs = phys(g) if swizzle else g
        for mi in range(MI):
            for h in range(2):
                x0, x1, x2, x3 = load4(sa, (wm0 + 16 * mi + 8 * h + gs) * BK + 4 * t)
                ra[mi, h, 0] = pack(x0, x1)
                ra[mi, h, 1] = pack(x2, x3)
        for ni in range(NI):
            y0, y1, y2, y3 = load4(sb, (wn0 + 8 * ni + gs) * BK + 4 * t)
            rb[ni, 0] = pack(y0, y1)
            rb[ni, 1] = pack(y2, y3)
        zero = float32(0.0)
        for mi in range(MI):
            for ni in range(NI):
                # a0 A[g, 2t..], a1 A[g+8, 2t..], a2 A[g, 2t+8..], a3 A[g+8, 2t+8..]; b0 B[2t.., g], b1 B[2t+8.., g]
                c0, c1, c2, c3 = mma16(ra[mi, 0, 0], ra[mi, 1, 0], ra[mi, 0, 1], ra[mi, 1, 1],
                                       rb[ni, 0], rb[ni, 1], zero, zero, zero, zero)
                add_fragment(acc, mi, ni, c0, c1, c2, c3)
    return stage


def _stage(BM, BN, MI, NI, products=3, presplit=True, split_mode="round", swizzle=False):
    """stage(acc, sa, sb, wm0, wn0, g, t): acc += this thread's share of the stage's product
    op(a)[tile rows, 16 k] @ op(b)[16 k, tile columns], from the split planes sa (2, BM, 16) and
    sb (2, BN, 16). products: 3 (3xTF32); 1 and 0 are for measuring only (lab/bench/gemm_ablate.py):
    big*big alone (TF32 accuracy), or no mma at all (a multiply-add keeps the reads alive).
    presplit=False: sa and sb hold one plane of raw values, split here as they are read, by
    SPLITS[split_mode]. swizzle: tile row r is at shared row phys(r) (v8)."""
    TM, TN = 2 * MI, 2 * NI
    BK = BK_SPLIT
    split = SPLITS[split_mode]

    if SIMULATOR:
        ROW = np.array([(i // 2) * 16 + (i % 2) * 8 for i in range(TM)])      # row(i) - wm0 - g
        COL = np.array([(j // 2) * 8 + j % 2 for j in range(TN)])            # col(j) - wn0 - 2t

        def parts(x):
            big = tf32_round(x)
            if split_mode == "trunc":              # what the tensor core makes of x - big
                return big, ((x - big).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
            return big, tf32_round(x - big)

        def stage(acc, sa, sb, wm0, wn0, g, t):
            rows, cols = ROW + (wm0 + g), COL + (wn0 + 2 * t)
            if swizzle:                                   # the shared rows of A's rows and B's columns
                rows, cols = rows ^ ((rows >> 2) & 1), cols ^ ((cols >> 2) & 1)
            if presplit:
                ab, as_ = sa[0][rows], sa[1][rows]        # TM x 16: this thread's rows of op(a)
                bb, bs = sb[0][cols].T, sb[1][cols].T     # 16 x TN: its columns of op(b)
            else:
                ab, as_ = parts(sa[0][rows])
                bb, bs = parts(sb[0][cols].T)
            acc += (as_ @ bb + ab @ bs) + ab @ bb        # small*big + big*small + big*big
        return stage

    @cuda.jit(device=True)
    def stage(acc, sa, sb, wm0, wn0, g, t):
        ra = cuda.local.array((MI, 2, 2, 4), float32)   # [mi, row g or g + 8, plane, k run]
        rb = cuda.local.array((NI, 2, 4), float32)      # [ni, plane, k run]
        gs = phys(g) if swizzle else g                 # the shared row of fragment row g
        for mi in range(MI):
            for h in range(2):
                m = wm0 + 16 * mi + 8 * h + gs
                if presplit:
                    for p in range(2):
                        ra[mi, h, p, 0], ra[mi, h, p, 1], ra[mi, h, p, 2], ra[mi, h, p, 3] = load4(sa, (p * BM + m) * BK + 4 * t)
                else:
                    x0, x1, x2, x3 = load4(sa, m * BK + 4 * t)
                    ra[mi, h, 0, 0], ra[mi, h, 1, 0] = split(x0)
                    ra[mi, h, 0, 1], ra[mi, h, 1, 1] = split(x1)
                    ra[mi, h, 0, 2], ra[mi, h, 1, 2] = split(x2)
                    ra[mi, h, 0, 3], ra[mi, h, 1, 3] = split(x3)
        for ni in range(NI):
            n = wn0 + 8 * ni + gs
            if presplit:
                for p in range(2):
                    rb[ni, p, 0], rb[ni, p, 1], rb[ni, p, 2], rb[ni, p, 3] = load4(sb, (p * BN + n) * BK + 4 * t)
            else:
                x0, x1, x2, x3 = load4(sb, n * BK + 4 * t)
                rb[ni, 0, 0], rb[ni, 1, 0] = split(x0)
                rb[ni, 0, 1], rb[ni, 1, 1] = split(x1)
                rb[ni, 0, 2], rb[ni, 1, 2] = split(x2)
                rb[ni, 0, 3], rb[ni, 1, 3] = split(x3)
        zero = float32(0.0)
        for mi in range(MI):
            for ni in range(NI):
                c0, c1, c2, c3 = zero, zero, zero, zero
                for ks in range(2 if products else 0):
                    u, v = 2 * ks, 2 * ks + 1        # the run's values used as columns t and t + 4
                    # a0 A[g, t], a1 A[g+8, t], a2 A[g, t+4], a3 A[g+8, t+4];  b0 B[t, g], b1 B[t+4, g]
                    if products == 3:
                        c0, c1, c2, c3 = mma_tf32(ra[mi, 0, 1, u], ra[mi, 1, 1, u], ra[mi, 0, 1, v], ra[mi, 1, 1, v],
                                                  rb[ni, 0, u], rb[ni, 0, v], c0, c1, c2, c3)   # small * big
                        c0, c1, c2, c3 = mma_tf32(ra[mi, 0, 0, u], ra[mi, 1, 0, u], ra[mi, 0, 0, v], ra[mi, 1, 0, v],
                                                  rb[ni, 1, u], rb[ni, 1, v], c0, c1, c2, c3)   # + big * small
                    c0, c1, c2, c3 = mma_tf32(ra[mi, 0, 0, u], ra[mi, 1, 0, u], ra[mi, 0, 0, v], ra[mi, 1, 0, v],
                                              rb[ni, 0, u], rb[ni, 0, v], c0, c1, c2, c3)   # + big * big
                if products == 0:
                    for q in range(4):
                        c0 += ra[mi, 0, 0, q] * rb[ni, 0, q] + ra[mi, 1, 1, q] * rb[ni, 1, q]
                add_fragment(acc, mi, ni, c0, c1, c2, c3)
    return stage


def tile_mma_split(trans_a, trans_b, BM, BN, BK, WM, WN, vec, products=3, presplit=True, split_mode="round",
                   swizzle=False, half=None):
    """Build tile_mma(acc, a, b, kb, ke): acc += this thread's share of the block's tile of
    op(a)[:, kb:ke] @ op(b)[kb:ke, :], on split tiles (same warps and outputs as warp_tile's).
    products: see _stage (3 for every rung of the ladder). presplit=False: one shared plane of
    raw values, split as the fragments are read (half the shared memory and its traffic), by
    SPLITS[split_mode]: "round" (v6), "trunc" (v7: small truncated by the tensor core).
    swizzle (v8, presplit=False): swizzled shared rows, transposed operands in 4 x 4 blocks.
    half="bf16" (v10) or "fp16" (v11), presplit=False: the values rounded to that 16-bit format as
    they are read, one mma.sync m16n8k16 a fragment a stage (_stage_16)."""
    assert not (half and presplit), "16-bit tiles hold one plane of raw values"
    assert BK == BK_SPLIT, f"split tiles take BK = {BK_SPLIT}, got {BK}"
    WARPS_N = BN // WN
    THREADS = WARP * (BM // WM) * WARPS_N
    # a [M, K] is straight, a^T (stored [K, M]) transposed; b^T (stored [N, K]) straight, b [K, N] transposed
    fetch_a, put_a, EA = _split_copier(BM, THREADS, not trans_a, vec, presplit, swizzle)
    fetch_b, put_b, EB = _split_copier(BN, THREADS, trans_b, vec, presplit, swizzle)
    stage = (_stage_16(BM, BN, WM // 16, WN // 8, swizzle, half) if half else
             _stage(BM, BN, WM // 16, WN // 8, products, presplit, split_mode, swizzle))
    PL = 2 if presplit else 1                              # shared planes

    return make_pipeline(trans_a, trans_b, BM, BN, BK, WM, WN, (fetch_a, put_a, EA, (PL, BM, BK)),
                         (fetch_b, put_b, EB, (PL, BN, BK)), stage), THREADS
