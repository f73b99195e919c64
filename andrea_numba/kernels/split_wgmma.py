"""3xTF32 on wgmma: the product tile of matmul_tf32x3_wgmma (family "tf32x3_wgmma"), fp32-accurate
products on Hopper's warpgroup instruction.

matmul_tf32x3 (split_tile.py) splits each fp32 value x into big = tf32(x) and small = x - big and
sums small*big + big*small + big*big on mma.sync. This tile does the same three products with
Hopper's wgmma.mma_async ... .tf32 (wgmma.py, "TF32"): on an H100 the same products 1.05-1.44x
faster than matmul_tf32x3 (docs/speed.md). Two things differ from the bf16 wgmma tiles (wgmma_mn.py):

1. Both operands K-major. wgmma has no transpose bit for TF32, so every shared tile holds its rows
   (m of A, n of B) with k along them, whatever the operand's orientation in global memory. And
   wgmma reads its operands from shared memory, not from registers we fill, so big and small must
   both be there: each operand's stage is two planes, big and small, of R rows x BK = 32 values.

       matmul            a stored        its rows      b stored      its rows
       a @ b             [M, K]          m: straight   [K, N]        k: transposed
       a @ b^T           [M, K]          straight      [N, K]        n: straight
       a^T @ b  (dW)     [K, M]          transposed    [K, N]        transposed

2. The threads copy through registers: each thread loads its share of the next stage from global
   memory (128-bit loads where the operand allows), splits each value (big = tf32_round(x), two
   integer instructions; small = x - big, exact), and stores big and small into the two planes,
   transposing on the way where the operand is stored with k down its columns.

The plane (one per operand and part): R rows of 128 bytes (32 fp32 values of k), 8-row atoms of
1024 bytes, the 16-byte chunk q (k 4q .. 4q + 3) of row r at chunk q ^ (r & 7): wgmma's 128-byte
swizzle (mode 1, SBO = 1024 bytes to the next 8 rows, LBO unused). The k8 step ks of a plane starts
32 ks bytes into its rows; warpgroup wg's 64 rows of A start 64 wg rows down. Word (4 bytes) of
element (r, k) in a plane:

    r * 32 + 4 * ((k >> 2) ^ (r & 7)) + (k & 3)

The copies, 128-bit loads and stores (E values a thread an operand):

    straight (k along the stored rows): load i of thread b takes f = i THREADS + b: row f // 8,
        k = 4 (f % 8) .. + 3: one load, one store into each plane (E = R * 32 / THREADS). Eight
        consecutive threads fill one 128-byte row: no bank conflict.
    transposed (k down the stored columns), in 4 x 4 blocks: block b (b = thread, + THREADS ...)
        covers k = 4 (b % 8) .. + 3 and rows 4 (b // 8) .. + 3: four loads, one from each stored row
        k (4 consecutive rows r), then each row's 4 values of k, side by side in registers, go out as
        one store into each plane (E = 16). Eight consecutive threads write the 8 chunks of one row:
        no bank conflict.

3. The ring and the K loop: STAGES = 2 stages of four planes (A big, A small, B big, B small) in
   dynamic shared memory, 128 KiB at 128 x 128 (+ 1 KiB to start on a 1024-byte boundary), 96 KiB
   at 128 x 64. Registers carry one stage between its loads and its stores. Step s (every thread
   runs each line):

       fence.proxy.async; bar.sync      stage s % 2 is written and visible to wgmma; every thread
                                        has passed its wait of step s - 1
       wgmma.fence; 4 k8 steps x 3 wgmmas (small*big, big*small, big*big) on stage s % 2; commit
       split and store the registers (step s + 1) into stage (s + 1) % 2: step s - 1's, done
       load step s + 2 into the registers
       wgmma.wait_group 0; acc += the stage's sums

   so a stage's products run while the threads split and store the next one and load the one after.

4. The sums. Each stage's twelve wgmmas sum into fresh registers (the first with scale-d 0), in k
   order, small*big and big*small before big*big; small*small (about 2^-22 of a product) is left
   out, and small reaches the tensor core truncated to its top 19 bits (an error below 2^-21 |x|, as
   matmul_tf32x3). The stage's sums are then added to acc with ordinary fp32 adds (round to nearest),
   as matmul_tf32x3 adds each stage. Why fresh registers a stage: the tensor core's own additions
   keep fewer bits than an fp32 add, and sums chained over the whole of K were off by up to 3.4e-5
   of the largest output at K = 4096 on an H100, where fp32 products stay below 1e-6
   (lab/bench/gemm.py's err column).
   The accumulators, wgmma's fragment layout, are acc's as wgmma_tile.py (point 2) maps them, whose
   epilogue and split-K (no atomics) are the other tiles'.

Edges: past M, N, K (or a split-K slice) the loads give zeros. Operands whose rows are not whole
16-byte chunks on 16-byte boundaries (warp_tile.aligned) are loaded one value at a time, and so is
everything in the simulator, which runs wgmma.py's twin (wgmma_warpgroup_tf32: the same descriptors,
each value truncated to TF32) once per warpgroup and instruction.
"""
import functools
from types import SimpleNamespace

from numba import cuda, float32

from .common import SIMULATOR
from .ptx import load4_row, store4, tf32_round
from .warp_tile import aligned, fragment_tile
from .wgmma import (SWIZZLE_128B, fence_proxy_async, shared_address, smem_desc, wgmma_acc_zeros, wgmma_commit,
                    wgmma_fence, wgmma_keep, wgmma_tf32, wgmma_wait0)
from .wgmma_mn import ALIGN, DYNAMIC_LIMIT
from .wgmma_tile import WARPGROUP, _fragment_add

if SIMULATOR:
    from .wgmma import warpgroup_once, wgmma_warpgroup_tf32

BK = 32                  # values of k a stage: one 128-byte row of fp32 (the 128-byte swizzle)
ROW_WORDS = 32           # 32-bit words of a plane's row
KSTEPS = BK // 8         # wgmma k8 steps a stage
SBO = 1024               # bytes to the next 8 rows (the next atom)
LBO = 16                 # unused by swizzled K-major operands
STEP_WORDS = 8           # a k8 step: 32 bytes along the rows
STAGES = 2               # the stage being stored was read by the step before, which is done (point 3)
WG_WORDS = 64 * ROW_WORDS    # a warpgroup's 64 rows of A in a plane


def stage_words(BM, BN):
    """32-bit words of one stage: four planes (A big, A small, B big, B small) of rows of 32 words."""
    return 2 * (BM + BN) * ROW_WORDS


def shared_bytes(BM, BN):
    """The dynamic shared memory of a launch: STAGES stages + 1 KiB to align the ring."""
    return STAGES * stage_words(BM, BN) * 4 + ALIGN


@cuda.jit(device=True, inline="always")
def plane_word(r, k):
    """The 32-bit word of element (r, k) within a plane: row r of 32 words, the 16-byte chunk k >> 2
    at chunk (k >> 2) ^ (r & 7) (the 128-byte swizzle)."""
    return r * ROW_WORDS + 4 * ((k >> 2) ^ (r & 7)) + (k & 3)


@cuda.jit(device=True, inline="always")
def split(x):
    """x = big + small: big = tf32(x) (round to nearest, ties away), small = x - big (exact)."""
    big = tf32_round(x)
    return big, x - big


def _straight(R, THREADS, vec):
    """(load, store) of an operand stored with k along its rows (g [R.., K]): point 2, straight.
    load(regs, g, r0, k0, rlim, klim) fills this thread's E values; store(ring, big, small, regs)
    splits them into the planes at words big and small."""
    LOADS = R * BK // (4 * THREADS)
    assert LOADS >= 1 and LOADS * 4 * THREADS == R * BK, f"{R} rows do not share out over {THREADS} threads"

    @cuda.jit(device=True)
    def load(regs, g, r0, k0, rlim, klim):
        for i in range(LOADS):
            f = i * THREADS + cuda.threadIdx.x
            r, k = r0 + f // 8, k0 + 4 * (f % 8)
            if vec and r < rlim and k + 3 < klim:
                regs[4 * i], regs[4 * i + 1], regs[4 * i + 2], regs[4 * i + 3] = load4_row(g, r, k)
            else:
                for j in range(4):
                    regs[4 * i + j] = g[r, k + j] if r < rlim and k + j < klim else float32(0)

    @cuda.jit(device=True)
    def store(ring, big, small, regs):
        for i in range(LOADS):
            f = i * THREADS + cuda.threadIdx.x
            word = plane_word(f // 8, 4 * (f % 8))
            b0, s0 = split(regs[4 * i])
            b1, s1 = split(regs[4 * i + 1])
            b2, s2 = split(regs[4 * i + 2])
            b3, s3 = split(regs[4 * i + 3])
            store4(ring, big + word, b0, b1, b2, b3)
            store4(ring, small + word, s0, s1, s2, s3)
    return load, store, 4 * LOADS


def _transposed(R, THREADS, vec):
    """(load, store) of an operand stored with k down its columns (g [K, R..]): point 2, transposed,
    in 4 x 4 blocks. Its E = 16 ROUNDS values a thread; a thread past the stage's blocks (a narrow
    tile) loads and stores nothing."""
    BLOCKS = R * BK // 16                     # 8 quads of k x R / 4 quads of rows
    ROUNDS = (BLOCKS + THREADS - 1) // THREADS
    assert R % 4 == 0, f"{R} rows are not whole quads"

    @cuda.jit(device=True)
    def load(regs, g, r0, k0, rlim, klim):
        for i in range(ROUNDS):
            blk = i * THREADS + cuda.threadIdx.x
            if blk < BLOCKS:
                k, r = k0 + 4 * (blk % 8), r0 + 4 * (blk // 8)
                for c in range(4):                              # stored row k + c: rows r .. r + 3
                    at = 16 * i + 4 * c
                    if vec and k + c < klim and r + 3 < rlim:
                        regs[at], regs[at + 1], regs[at + 2], regs[at + 3] = load4_row(g, k + c, r)
                    else:
                        for j in range(4):
                            regs[at + j] = g[k + c, r + j] if k + c < klim and r + j < rlim else float32(0)

    @cuda.jit(device=True)
    def store(ring, big, small, regs):
        for i in range(ROUNDS):
            blk = i * THREADS + cuda.threadIdx.x
            if blk < BLOCKS:
                for j in range(4):                              # row 4 (blk // 8) + j: its 4 values of k
                    word = plane_word(4 * (blk // 8) + j, 4 * (blk % 8))
                    b0, s0 = split(regs[16 * i + j])
                    b1, s1 = split(regs[16 * i + 4 + j])
                    b2, s2 = split(regs[16 * i + 8 + j])
                    b3, s3 = split(regs[16 * i + 12 + j])
                    store4(ring, big + word, b0, b1, b2, b3)
                    store4(ring, small + word, s0, s1, s2, s3)
    return load, store, 16 * ROUNDS


if SIMULATOR:
    def _product(N, scale_d):
        @cuda.jit(device=True)      # a (fake) device function: the twin reads cuda.threadIdx
        def product(e, ring, desc_a, desc_b):
            """Twin of e = wgmma_tf32(e, desc_a, desc_b, scale_d): the warpgroup's product from the
            shared array's bytes (worked out once for the group), this thread's registers added to e in
            fp32 (scale_d 1) or in its place (0)."""
            t = cuda.threadIdx.x
            regs = warpgroup_once(lambda: wgmma_warpgroup_tf32(ring, desc_a, desc_b, N), t // WARPGROUP,
                                  t % WARPGROUP)[t % WARPGROUP]
            if scale_d == 0:
                return tuple(float32(y) for y in regs)
            return tuple(float32(x + y) for x, y in zip(e, regs))
        return product
else:
    def _product(N, scale_d):
        @cuda.jit(device=True, inline="always")
        def product(e, ring, desc_a, desc_b):
            """e (+)= A @ B of one k8 step, both K-major TF32 (scale_d 0: e = A @ B); read e only after
            the commit and the wait."""
            return wgmma_tf32(e, desc_a, desc_b, scale_d)
        return product


def stage_parts(BM, BN, THREADS, vec, trans_a, trans_b):
    """The pieces of a pipeline over the ring, for the fp32 operands as stored (a [M, K], or [K, M]
    when trans_a; b [K, N], or [N, K] when trans_b): extents (M, N), load (a stage into this thread's
    registers, EA and EB of them), ring_array, put (a stage's split and store), stage_sums (a stage's
    12 wgmmas, point 4), fragment_add, and the stage's size in words (STAGE). make_pipeline (below)
    is v25's loop over them; lab/split_wgmma_overlap.py (v26) runs them in another order."""
    A_T, B_T = bool(trans_a), not trans_b                       # stored with k down the columns
    load_a, store_a, EA = (_transposed if A_T else _straight)(BM, THREADS, vec)
    load_b, store_b, EB = (_transposed if B_T else _straight)(BN, THREADS, vec)
    PLANE_A, PLANE_B = BM * ROW_WORDS, BN * ROW_WORDS
    fresh, product = _product(BN, 0), _product(BN, 1)

    @cuda.jit(device=True)
    def ring_array():
        """The dynamic shared array and the word where the ring starts: its first 1024-byte
        boundary (the launch gave the stages' bytes + 1024)."""
        ring = cuda.shared.array(0, float32)
        pad = (ALIGN - (shared_address(ring, 0) & (ALIGN - 1))) & (ALIGN - 1)
        return ring, pad // 4

    @cuda.jit(device=True)
    def extents(a, b):
        """(M, N) of the product, from the operands as stored."""
        return (a.shape[1] if A_T else a.shape[0]), (b.shape[1] if B_T else b.shape[0])

    @cuda.jit(device=True)
    def load(ra, rb, a, b, row0, col0, M, N, k0, ke):
        """This thread's share of the stage of k from k0 (nothing at or past ke) into the registers."""
        load_a(ra, a, row0, k0, M, ke)
        load_b(rb, b, col0, k0, N, ke)

    @cuda.jit(device=True)
    def put(ring, base, ra, rb):
        """Split and store the registers into the stage at word base: A big, A small, B big, B small."""
        store_a(ring, base, base + PLANE_A, ra)
        store_b(ring, base + 2 * PLANE_A, base + 2 * PLANE_A + PLANE_B, rb)

    @cuda.jit(device=True)
    def desc(ring, word):
        """The descriptor of the K-major operand whose k8 step starts at word `word` of the ring."""
        return smem_desc(ring, word, LBO, SBO, SWIZZLE_128B)

    @cuda.jit(device=True)
    def stage_sums(e, ring, stage, wg):
        """e = this warpgroup's 64 rows of the stage's products (its 64 rows of A from word stage,
        B's planes after A's), in fresh registers: wgmma.fence, 4 k8 steps x 3 wgmmas (small*big,
        big*small, big*big), commit. Read e only after a wait."""
        at_a = stage + wg * WG_WORDS                            # this warpgroup's 64 rows of A (big plane)
        at_b = stage + 2 * PLANE_A                              # B's big plane
        wgmma_fence()
        e = fresh(e, ring, desc(ring, at_a + PLANE_A), desc(ring, at_b))        # small*big, k 0..7: a new sum
        e = product(e, ring, desc(ring, at_a), desc(ring, at_b + PLANE_B))      # big*small
        e = product(e, ring, desc(ring, at_a), desc(ring, at_b))                # big*big
        for ks in range(1, KSTEPS):                             # k 8 ks .. 8 ks + 7 of the stage
            off = ks * STEP_WORDS
            e = product(e, ring, desc(ring, at_a + PLANE_A + off), desc(ring, at_b + off))
            e = product(e, ring, desc(ring, at_a + off), desc(ring, at_b + PLANE_B + off))
            e = product(e, ring, desc(ring, at_a + off), desc(ring, at_b + off))
        wgmma_commit()
        return e

    return SimpleNamespace(EA=EA, EB=EB, STAGE=stage_words(BM, BN), extents=extents, load=load,
                           ring_array=ring_array, put=put, stage_sums=stage_sums, fragment_add=_fragment_add(BN // 2))


def make_pipeline(BM, BN, THREADS, vec, trans_a, trans_b):
    """tile_mma(acc, a, b, kb, ke): acc += this thread's share of op(a) @ op(b) over k in [kb, ke),
    the fp32 operands as stored (a [M, K], or [K, M] when trans_a; b [K, N], or [N, K] when trans_b),
    in 3xTF32 through the ring of point 3, each stage's sums added to acc (point 4)."""
    p = stage_parts(BM, BN, THREADS, vec, trans_a, trans_b)
    EA, EB, STAGE = p.EA, p.EB, p.STAGE
    extents, load, ring_array, put, stage_sums, fragment_add = (p.extents, p.load, p.ring_array, p.put,
                                                                p.stage_sums, p.fragment_add)

    @cuda.jit(device=True)
    def tile_mma(acc, a, b, kb, ke):
        ring, at0 = ring_array()                                # stage st at word at0 + st * STAGE
        wg = cuda.threadIdx.x // WARPGROUP
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        M, N = extents(a, b)
        ra = cuda.local.array(EA, float32)                      # one stage of this thread's values
        rb = cuda.local.array(EB, float32)
        n_steps = (ke - kb + BK - 1) // BK
        load(ra, rb, a, b, row0, col0, M, N, kb, ke)
        put(ring, at0, ra, rb)                                  # step 0 into stage 0
        if n_steps > 1:
            load(ra, rb, a, b, row0, col0, M, N, kb + BK, ke)   # step 1 into the registers
        e = wgmma_keep(wgmma_acc_zeros(BN))                     # a stage's sums (set before the first fence)
        for s in range(n_steps):
            fence_proxy_async()                                 # my stores of stage s visible to wgmma ...
            cuda.syncthreads()                                  # ... and everyone's; step s - 1's wgmmas done
            e = stage_sums(e, ring, at0 + (s % STAGES) * STAGE, wg)
            if s + 1 < n_steps:                                 # the other stage, read by step s - 1
                put(ring, at0 + ((s + 1) % STAGES) * STAGE, ra, rb)
            if s + 2 < n_steps:
                load(ra, rb, a, b, row0, col0, M, N, kb + (s + 2) * BK, ke)
            wgmma_wait0()                                       # step s's sums are in e
            e = wgmma_keep(e)
            fragment_add(acc, e)                                # acc += e: fp32 adds, rounded to nearest
        cuda.syncthreads()                                      # the ring may be refilled by a next call
    return tile_mma


def split_resolve(block, a, b):
    """The full tile of a matmul_tf32x3_wgmma launch: ("tf32x3_wgmma", BM, BN, 32, 64, BN, vec,
    STAGES), vec when both operands allow 128-bit loads (warp_tile.aligned)."""
    return ("tf32x3_wgmma", *block[:5], aligned(a, b), STAGES)


@functools.cache
def make_split_tile(tile):
    """Everything a kernel needs for one matmul_tf32x3_wgmma tile (matmul.make_tile's names, and
    SHARED: its launch's dynamic shared memory), the four products mma[(trans_a, trans_b)] on the
    fp32 operands as stored. tile = ("tf32x3_wgmma", BM, BN, 32, 64, BN, vec, 2): warpgroups of 64
    rows x all BN columns, BN a multiple of 8 up to 256."""
    return build_tile(tile, "tf32x3_wgmma", STAGES, shared_bytes, make_pipeline)


def build_tile(tile, family, stages, shared_bytes, pipeline):
    """The tile functions of a tile of split planes on wgmma (make_split_tile's, and lab matmul
    v26's): the tile checked, shared_bytes(BM, BN) of dynamic shared memory, the four products from
    pipeline(BM, BN, THREADS, vec, trans_a, trans_b)."""
    name, BM, BN, bk, WM, WN, vec, n_stages = tile
    assert name == family and bk == BK and n_stages == stages, tile
    assert WM == 64 and WN == BN and BM % 64 == 0 and BN % 8 == 0 and BN <= 256, \
        f"tile {tile}: warpgroups of 64 rows x all BN columns"
    shared = shared_bytes(BM, BN)
    assert shared <= DYNAMIC_LIMIT, f"tile {tile}: {shared} bytes of dynamic shared memory"
    THREADS = WARPGROUP * (BM // 64)
    ranged = {(ta, tb): pipeline(BM, BN, THREADS, vec, ta, tb) for ta in (False, True) for tb in (False, True)}
    t = fragment_tile(ranged, BM, BN, BK, 16, BN, THREADS)
    t.SHARED = shared
    return t
