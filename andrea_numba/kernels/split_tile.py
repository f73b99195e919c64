"""k-major tiles: the product tiles of matmul_tf32x3 (3xTF32) and matmul_fp16 (fp16 inputs, fp32 sums).

A block computes a BM x BN tile of out = op(a) @ op(b) with the warps, fragment layout (row(i),
col(j)) and split-K of warp_tile.py, in the K loop of tile_loop.make_pipeline (two shared stages;
the next step's global loads in flight during the current step's products). This file supplies
what the loop is built from: how a stage of each operand reaches shared memory (the copiers) and
how one stage is multiplied (tf32x3_stage, fp16_stage).

1. k along the rows. Both shared tiles hold k as the fast index, sa[m, k] (BM rows) and
   sb[n, k] (BN rows, n a column of out): BK = 16 values of k a stage, rows of 64 bytes, the raw
   fp32 values. An operand stored with k along its rows (a [M, K], b^T: b stored [N, K]) is copied
   straight; one stored with k down its columns (a^T: a stored [K, M], b [K, N]) is transposed on
   its way in (4. below).

2. A renaming of k that puts a thread's fragment values side by side. An mma sums its values of k
   in whatever order we name them, as long as A and B use the same names. Within a stage, the
   lane with t = lane & 3 takes the run k = 4t .. 4t + 3 of each of its rows and names it (ptx.py
   has the fragment layouts, lane = 4 g + t):

       3xTF32, m16n8k8 (A columns t and t + 4, B rows t and t + 4), two k-steps:
           k-step 0:   fragment k t <- k = 4t        fragment k t + 4 <- k = 4t + 1
           k-step 1:   fragment k t <- k = 4t + 2    fragment k t + 4 <- k = 4t + 3
       fp16, m16n8k16 (A registers a0, a1 and B's b0 hold k 2t, 2t + 1; a2, a3 and b1 k 2t + 8, 2t + 9):
           k = 4t, 4t + 1      -> fragment k 2t, 2t + 1
           k = 4t + 2, 4t + 3  -> fragment k 2t + 8, 2t + 9

   The four lanes t = 0..3 of a row cover the stage's 16 values of k once either way, and a
   thread's run of a row is 4 contiguous floats: one 128-bit shared read (ld.shared.v4) gives it
   both k-steps (3xTF32) or the whole stage (fp16) of one fragment row of A, or of B.

3. The swizzle. Tile row r lives in shared row
       phys(r) = r ^ ((r >> 2) & 1)        (rows 4..7 of every 8 swap in pairs: 4<->5, 6<->7)
   Shared memory has 32 banks of 4 bytes; a 128-bit access is served 8 lanes at a time, free of
   conflicts when their 16-byte groups (row * 4 + k / 4) mod 8 differ: a 64-byte row is half of
   the banks, so the row's parity picks the half and k / 4 the group in it. phys keeps each pair
   {2q, 2q + 1} (swapping some), and gives rows 4q + i and 4q + 4 + i opposite parities:
   - fragment reads: lanes 8p .. 8p + 7 read rows g = 2p, 2p + 1 at k / 4 = t = 0..3: both
     parities, four groups each: 8 groups. A warp's fragment rows are wm0 + 16 mi + 8 h + g with
     wm0 a multiple of 16, so their shared row is wm0 + 16 mi + 8 h + phys(g): one XOR a thread.
   - straight copies (128-bit stores): 8 consecutive lanes write rows 2q, 2q + 1 at four k / 4.
   - transposed 4 x 4 blocks (128-bit stores): the 8 lanes write rows 8q + i and 8q + 4 + i at four
     k / 4: one parity without the swizzle (two lanes to a group), both with it.
   - transposed columns (scalar stores, 4 bytes: 32 lanes at once, bank (row * 16 + k) mod 32):
     lanes 0..15 write k = 0..15 of row 8q + i, lanes 16..31 the same k of row 8q + 4 + i: two to
     a bank without the swizzle, one with it.

4. The copies (one float at a time where the operand is not 16-byte aligned, warp_tile.aligned,
   and in the simulator; 128-bit loads otherwise). Each thread holds E = R * 16 / THREADS values of
   an operand's R x 16 stage in registers between its global loads and its shared stores:
       straight      chunk j of thread b is e = b + j * THREADS: tile row e // 4, k = 4 (e % 4) ..
                     + 3: one 128-bit load, one 128-bit store.
       transposed, E = 16 (R = THREADS: A of the 128 x 64 tile, A and B of 128 x 128 at 4 warps):
                     thread b takes the 4 x 4 block k = 4 (b % 4) .. + 3, tile rows 4 (b // 4) .. + 3:
                     four 128-bit loads, one from each stored row, and then each tile row's 4
                     values of k, side by side in registers, go out as one 128-bit store.
       transposed, E = 8 (the other tiles' operands): chunk j of thread b is e = b + j * THREADS:
                     k = e % 16, tile rows 4 (e // 16) .. + 3 (consecutive threads take
                     consecutive k): one 128-bit load, four scalar stores down a column of the tile.

5. The stage. A thread reads its fragment rows' runs (2 MI rows of A, NI rows of B, 128 bits
   each) and multiplies each of the warp's MI x NI fragments of 16 x 8:
       tf32x3_stage: each value split as it is read, x = big + small (split_tf32x3), and six
           mma.sync m16n8k8 chained from zero, small*big, big*small, big*big for each k-step
           (small*small, about 2^-22 of the product, left out: 3xTF32 is as accurate as an fp32
           product), their sum added to acc in fp32 once a stage: a chain over all of K inside the
           tensor core drifts (warp_tile.py), a chain of six does not measurably.
       fp16_stage: each pair of values rounded to fp16 and packed as it is read (cvt.rn.f16x2.f32),
           one mma.sync m16n8k16 from zero (exact products, fp32 sums), added to acc.

Shared memory: 2 stages x (BM + BN) rows x 16 floats x 4 bytes = 128 (BM + BN) bytes: 24 KiB for
128 x 64, 32 KiB for 128 x 128, 16 KiB for 64 x 64. Registers for the copies: E of A plus E of B.

In the simulator a stage is a NumPy twin: each thread's TM x TN outputs from the same shared tiles
with the same split or rounding, summed in fp32 (mma.sync needs 32 real lanes: ptx.py).
"""
import numpy as np
from numba import cuda, float32, int32


from .common import SIMULATOR
from .ptx import f16x2, load4, mma_f16, mma_tf32, sim_round_fp16, store4, tf32_round
from .tile_loop import WARP, add_fragment, make_pipeline

BK_SPLIT = 16          # values of k a stage: a 4-float run of each row per lane (2. above)


@cuda.jit(device=True)
def split_tf32x3(x):
    """x = big + small: big = tf32(x) (round to nearest, ties away), small = x - big as it is. The
    tensor core reads a TF32 operand from its top 19 bits, so it truncates small to 10 mantissa bits:
    |x - big - tf32_trunc(small)| < 2^-21 |x|, three instructions (add, and, sub)."""
    big = tf32_round(x)
    return big, x - big


@cuda.jit(device=True)
def phys(r):
    """The shared row of tile row r: r ^ ((r >> 2) & 1) (3. above)."""
    return r ^ ((r >> 2) & 1)


def chunk_fetcher(chunk, CH, vec):
    """fetch(regs, g, r0, c0, rlim, clim): this thread's CH chunks of 4 floats of the stored matrix g,
    chunk j at (r0, c0) + chunk(threadIdx.x, j), into regs[4 j .. 4 j + 3] (zero outside rows < rlim,
    columns < clim); vec: one 128-bit load a chunk (the caller checked the alignment). Shared by the
    lab's 16-bit ldmatrix tiles."""
    @cuda.jit(device=True)
    def fetch(regs, g, r0, c0, rlim, clim):
        for j in range(CH):
            dr, dc = chunk(cuda.threadIdx.x, j)
            r, c = r0 + dr, c0 + dc
            if vec:
                if r < rlim and c < clim:     # clim is a multiple of 4: a chunk is all in or all out
                    regs[4 * j], regs[4 * j + 1], regs[4 * j + 2], regs[4 * j + 3] = load4(g, r * g.shape[1] + c)
                else:
                    for i in range(4):
                        regs[4 * j + i] = float32(0.0)
            else:
                for i in range(4):
                    regs[4 * j + i] = g[r, c + i] if r < rlim and c + i < clim else float32(0.0)
    return fetch


def _straight_copier(R, THREADS, vec):
    """fetch(regs, g, r0, c0, rlim, clim), put(s, regs), E for an operand stored with k along its
    rows: stored rows r0.. are tile rows, stored columns c0.. are k (4. above, "straight"); s is one
    shared stage (R, 16), tile row r at shared row phys(r)."""
    BK = BK_SPLIT
    E = R * BK // THREADS                 # values per thread
    CH = E // 4                           # 4-float chunks per thread
    assert CH * 4 * THREADS == R * BK, f"a {R} x {BK} tile does not split into 4-float chunks over {THREADS} threads"

    @cuda.jit(device=True)
    def chunk(b, j):
        """(tile row, k) of thread b's chunk j: 4 consecutive k of one row."""
        e = b + j * THREADS
        return e // (BK // 4), (e % (BK // 4)) * 4

    @cuda.jit(device=True)
    def put(s, regs):
        for j in range(CH):
            dr, dc = chunk(cuda.threadIdx.x, j)
            x0, x1, x2, x3 = regs[4 * j], regs[4 * j + 1], regs[4 * j + 2], regs[4 * j + 3]
            r = phys(dr)
            if vec:                       # tile row dr, k = dc .. dc + 3: one 128-bit store
                store4(s, r * BK + dc, x0, x1, x2, x3)
            else:
                s[r, dc], s[r, dc + 1], s[r, dc + 2], s[r, dc + 3] = x0, x1, x2, x3

    return chunk_fetcher(chunk, CH, vec), put, E


def _transposed_copier(R, THREADS, vec):
    """fetch(regs, g, r0, c0, rlim, clim), put(s, regs), E for an operand stored with k down its
    columns: stored rows r0.. are k, stored columns c0.. are tile rows (4. above: 4 x 4 blocks when
    a thread holds 16 values, otherwise 4 tile rows at one k); s is one shared stage (R, 16), tile
    row r at shared row phys(r)."""
    BK = BK_SPLIT
    E = R * BK // THREADS                 # values per thread
    CH = E // 4                           # 4-float chunks per thread
    assert CH * 4 * THREADS == R * BK, f"a {R} x {BK} tile does not split into 4-float chunks over {THREADS} threads"

    if E == 16:
        @cuda.jit(device=True)
        def chunk(b, j):
            """(k, first tile row) of thread b's chunk j: row j of its 4 x 4 block."""
            return 4 * (b % 4) + j, 4 * (b // 4)

        @cuda.jit(device=True)
        def put(s, regs):
            dr, dc = chunk(cuda.threadIdx.x, 0)
            for i in range(4):            # tile row dc + i, k = dr .. dr + 3: column i of the block
                r = phys(dc + i)
                if vec:
                    store4(s, r * BK + dr, regs[i], regs[4 + i], regs[8 + i], regs[12 + i])
                else:
                    s[r, dr], s[r, dr + 1], s[r, dr + 2], s[r, dr + 3] = regs[i], regs[4 + i], regs[8 + i], regs[12 + i]
    else:
        @cuda.jit(device=True)
        def chunk(b, j):
            """(k, first tile row) of thread b's chunk j: 4 consecutive tile rows at one k."""
            e = b + j * THREADS
            return e % BK, (e // BK) * 4

        @cuda.jit(device=True)
        def put(s, regs):
            for j in range(CH):
                dr, dc = chunk(cuda.threadIdx.x, j)
                x0, x1, x2, x3 = regs[4 * j], regs[4 * j + 1], regs[4 * j + 2], regs[4 * j + 3]
                s[phys(dc), dr], s[phys(dc + 1), dr], s[phys(dc + 2), dr], s[phys(dc + 3), dr] = x0, x1, x2, x3

    return chunk_fetcher(chunk, CH, vec), put, E


def _twin_rows(MI, NI):
    """For the simulator's stages: ROW[i] = row(i) - wm0 - g and COL[j] = col(j) - wn0 - 2 t of a
    thread's acc[i, j] (warp_tile.py's layout)."""
    ROW = np.array([(i // 2) * 16 + (i % 2) * 8 for i in range(2 * MI)])
    COL = np.array([(j // 2) * 8 + j % 2 for j in range(2 * NI)])
    return ROW, COL


def tf32x3_stage(MI, NI):
    """stage(acc, sa, sb, wm0, wn0, g, t): acc += this thread's share of the stage's product
    op(a)[tile rows, 16 k] @ op(b)[16 k, tile columns] in 3xTF32, from the shared stages sa (BM, 16)
    and sb (BN, 16) of raw values; MI x NI fragments of 16 x 8 a warp (5. above)."""
    BK = BK_SPLIT

    if SIMULATOR:
        ROW, COL = _twin_rows(MI, NI)

        def parts(x):                                     # split_tf32x3, small as the tensor core reads it
            big = tf32_round(x)
            return big, ((x - big).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)

        def stage(acc, sa, sb, wm0, wn0, g, t):
            rows, cols = ROW + (wm0 + g), COL + (wn0 + 2 * t)
            rows, cols = rows ^ ((rows >> 2) & 1), cols ^ ((cols >> 2) & 1)   # phys: their shared rows
            ab, as_ = parts(sa[rows])                     # TM x 16: this thread's rows of op(a)
            bb, bs = parts(sb[cols].T)                    # 16 x TN: its columns of op(b)
            acc += (as_ @ bb + ab @ bs) + ab @ bb         # small*big + big*small + big*big
        return stage

    @cuda.jit(device=True)
    def stage(acc, sa, sb, wm0, wn0, g, t):
        ra = cuda.local.array((MI, 2, 2, 4), float32)   # [mi, row g or g + 8, big or small, k run]
        rb = cuda.local.array((NI, 2, 4), float32)      # [ni, big or small, k run]
        gs = phys(g)                                   # the shared row of fragment row g
        for mi in range(MI):
            for h in range(2):
                x0, x1, x2, x3 = load4(sa, (wm0 + 16 * mi + 8 * h + gs) * BK + 4 * t)
                ra[mi, h, 0, 0], ra[mi, h, 1, 0] = split_tf32x3(x0)
                ra[mi, h, 0, 1], ra[mi, h, 1, 1] = split_tf32x3(x1)
                ra[mi, h, 0, 2], ra[mi, h, 1, 2] = split_tf32x3(x2)
                ra[mi, h, 0, 3], ra[mi, h, 1, 3] = split_tf32x3(x3)
        for ni in range(NI):
            x0, x1, x2, x3 = load4(sb, (wn0 + 8 * ni + gs) * BK + 4 * t)
            rb[ni, 0, 0], rb[ni, 1, 0] = split_tf32x3(x0)
            rb[ni, 0, 1], rb[ni, 1, 1] = split_tf32x3(x1)
            rb[ni, 0, 2], rb[ni, 1, 2] = split_tf32x3(x2)
            rb[ni, 0, 3], rb[ni, 1, 3] = split_tf32x3(x3)
        zero = float32(0.0)
        for mi in range(MI):
            for ni in range(NI):
                c0, c1, c2, c3 = zero, zero, zero, zero
                for ks in range(2):
                    u, v = 2 * ks, 2 * ks + 1        # the run's values named k t and t + 4 of k-step ks
                    # a0 A[g, t], a1 A[g+8, t], a2 A[g, t+4], a3 A[g+8, t+4];  b0 B[t, g], b1 B[t+4, g]
                    c0, c1, c2, c3 = mma_tf32(ra[mi, 0, 1, u], ra[mi, 1, 1, u], ra[mi, 0, 1, v], ra[mi, 1, 1, v],
                                              rb[ni, 0, u], rb[ni, 0, v], c0, c1, c2, c3)   # small * big
                    c0, c1, c2, c3 = mma_tf32(ra[mi, 0, 0, u], ra[mi, 1, 0, u], ra[mi, 0, 0, v], ra[mi, 1, 0, v],
                                              rb[ni, 1, u], rb[ni, 1, v], c0, c1, c2, c3)   # + big * small
                    c0, c1, c2, c3 = mma_tf32(ra[mi, 0, 0, u], ra[mi, 1, 0, u], ra[mi, 0, 0, v], ra[mi, 1, 0, v],
                                              rb[ni, 0, u], rb[ni, 0, v], c0, c1, c2, c3)   # + big * big
                # c0 C[g, 2t], c1 C[g, 2t+1], c2 C[g+8, 2t], c3 C[g+8, 2t+1]: one fp32 add each a stage
                add_fragment(acc, mi, ni, c0, c1, c2, c3)
    return stage


def fp16_stage(MI, NI):
    """stage(acc, sa, sb, wm0, wn0, g, t): acc += this thread's share of the stage's product, the
    values of the shared stages sa (BM, 16) and sb (BN, 16) rounded to fp16 as they are read (ties
    to even; past 65504: inf), exact products, fp32 sums; MI x NI fragments of 16 x 8 a warp."""
    BK = BK_SPLIT

    if SIMULATOR:
        ROW, COL = _twin_rows(MI, NI)

        def stage(acc, sa, sb, wm0, wn0, g, t):
            rows, cols = ROW + (wm0 + g), COL + (wn0 + 2 * t)
            rows, cols = rows ^ ((rows >> 2) & 1), cols ^ ((cols >> 2) & 1)   # phys: their shared rows
            with np.errstate(over="ignore", invalid="ignore"):   # past 65504 is inf, as on the GPU
                acc += sim_round_fp16(sa[rows]) @ sim_round_fp16(sb[cols].T)     # exact products, fp32 sums
        return stage

    @cuda.jit(device=True)
    def stage(acc, sa, sb, wm0, wn0, g, t):
        ra = cuda.local.array((MI, 2, 2), int32)   # [mi, row g or g + 8, k pair 2t.. or 2t + 8..]: f16x2
        rb = cuda.local.array((NI, 2), int32)      # [ni, k pair]
        gs = phys(g)                               # the shared row of fragment row g
        for mi in range(MI):
            for h in range(2):
                x0, x1, x2, x3 = load4(sa, (wm0 + 16 * mi + 8 * h + gs) * BK + 4 * t)
                ra[mi, h, 0] = f16x2(x0, x1)
                ra[mi, h, 1] = f16x2(x2, x3)
        for ni in range(NI):
            y0, y1, y2, y3 = load4(sb, (wn0 + 8 * ni + gs) * BK + 4 * t)
            rb[ni, 0] = f16x2(y0, y1)
            rb[ni, 1] = f16x2(y2, y3)
        zero = float32(0.0)
        for mi in range(MI):
            for ni in range(NI):
                # a0 A[g, 2t..], a1 A[g+8, 2t..], a2 A[g, 2t+8..], a3 A[g+8, 2t+8..]; b0 B[2t.., g], b1 B[2t+8.., g]
                c0, c1, c2, c3 = mma_f16(ra[mi, 0, 0], ra[mi, 1, 0], ra[mi, 0, 1], ra[mi, 1, 1],
                                         rb[ni, 0], rb[ni, 1], zero, zero, zero, zero)
                add_fragment(acc, mi, ni, c0, c1, c2, c3)
    return stage


def _kmajor_tile_mma(trans_a, trans_b, BM, BN, BK, WM, WN, vec, stage):
    """tile_mma(acc, a, b, kb, ke), THREADS: the K loop (tile_loop.make_pipeline) on k-major tiles,
    each stage multiplied by stage(MI, NI)."""
    assert BK == BK_SPLIT, f"k-major tiles take BK = {BK_SPLIT}, got {BK}"
    THREADS = WARP * (BM // WM) * (BN // WN)
    # a [M, K] is straight, a^T (stored [K, M]) transposed; b^T (stored [N, K]) straight, b [K, N] transposed
    fetch_a, put_a, EA = (_transposed_copier if trans_a else _straight_copier)(BM, THREADS, vec)
    fetch_b, put_b, EB = (_straight_copier if trans_b else _transposed_copier)(BN, THREADS, vec)
    return make_pipeline(trans_a, trans_b, BM, BN, BK, WM, WN, (fetch_a, put_a, EA, (BM, BK)),
                         (fetch_b, put_b, EB, (BN, BK)), stage(WM // 16, WN // 8)), THREADS


def tf32x3_tile_mma(trans_a, trans_b, BM, BN, BK, WM, WN, vec):
    """tile_mma(acc, a, b, kb, ke), THREADS: acc += this thread's share of the block's tile of
    op(a)[:, kb:ke] @ op(b)[kb:ke, :] in 3xTF32 (matmul_tf32x3's tile). (BM, BN, BK, WM, WN): the
    tile (BK = 16); vec: 128-bit global loads (the caller checked the alignment)."""
    return _kmajor_tile_mma(trans_a, trans_b, BM, BN, BK, WM, WN, vec, tf32x3_stage)


def fp16_tile_mma(trans_a, trans_b, BM, BN, BK, WM, WN, vec):
    """tf32x3_tile_mma with fp16 products: the values rounded to fp16 as read (matmul_fp16's tile)."""
    return _kmajor_tile_mma(trans_a, trans_b, BM, BN, BK, WM, WN, vec, fp16_stage)
