"""3xTF32 on wgmma: the product tile of matmul_tf32x3_wgmma (family "tf32x3_wgmma"), fp32-accurate
products on Hopper's warpgroup instruction.

matmul_tf32x3 (split_tile.py) splits each fp32 value x into big = tf32(x) and small = x - big and
sums small*big + big*small + big*big on mma.sync. This tile does the same three products with
wgmma.mma_async ... .tf32 (wgmma.py, "TF32"), which multiplies TF32 at about twice mma.sync's rate
on a Hopper multiprocessor. Two things differ from the bf16 wgmma tiles (wgmma_mn.py):

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

The copies (E = R * 32 / THREADS values a thread an operand, LOADS = E / 4 loads of 4 values):

    straight (k along the stored rows): load i of thread b takes f = i THREADS + b: row f // 8,
        k = 4 (f % 8) .. + 3: one 128-bit load, one 128-bit store into each plane. Eight
        consecutive threads fill one 128-byte row: no bank conflict.
    transposed (k down the stored columns): load i of lane l of warp w takes unit u = i WARPS + w:
        k = 16 (u & 1) + (l >> 1), rows 4 q .. 4 q + 3 with q = 2 (u >> 1) + (l & 1): one 128-bit
        load of 4 consecutive rows at one k (two lanes share a 32-byte sector), four scalar stores
        into each plane. A store instruction's 32 lanes write bank 4 ((k >> 2) ^ (r & 7)) + (k & 3):
        (k >> 2) & 3 and k & 3 take all 16 values over the lanes, and r & 7 = 4 (l & 1) + j flips
        bit 2 of the chunk between the lane pairs: 32 banks, no conflict.

3. The ring and the K loop: STAGES = 3 stages of four planes (A big, A small, B big, B small) in
   dynamic shared memory, 192 KiB at 128 x 128 (+ 1 KiB to start on a 1024-byte boundary: one
   block a multiprocessor), one group of wgmmas in flight. Registers carry one stage between its
   loads and its stores. Step s (every thread runs each line):

       fence.proxy.async; bar.sync      stage s % 3 is written and visible to wgmma; every thread
                                        has passed its wait of step s - 1, so the wgmmas of step
                                        s - 2 are complete in every warpgroup
       wgmma.fence; 4 k8 steps x 3 wgmmas (small*big, big*small, big*big) on stage s % 3; commit
       split and store the registers (step s + 1) into stage (s + 1) % 3 = (s - 2) % 3: free
       load step s + 2 into the registers (in flight during the next barrier and wgmmas)
       wgmma.wait_group 1               step s - 1's wgmmas are done (step s's may still run)

   so a stage's products run while the threads split and store the next one.

4. The sums. All three products of a step accumulate into the same fp32 registers, in k order,
   small*big and big*small before big*big (the small products are not added after a large one that
   could swamp them within a step); small*small (about 2^-22 of a product) is left out. small reaches
   the tensor core truncated to its top 19 bits: an error below 2^-21 |x| a value, as matmul_tf32x3.
   The accumulators, wgmma's fragment layout, are added to matmul's acc once (wgmma_tile.py, point 2),
   whose epilogue and split-K (no atomics) are the other tiles'.

Edges: past M, N, K (or a split-K slice) the loads give zeros. Operands whose rows are not whole
16-byte chunks on 16-byte boundaries (warp_tile.aligned) are loaded one value at a time, and so is
everything in the simulator, which runs wgmma.py's twin (wgmma_warpgroup_tf32: the same descriptors,
each value truncated to TF32) once per warpgroup and instruction.
"""
import functools

from numba import cuda, float32

from .common import SIMULATOR
from .ptx import load4_row, store4, tf32_round
from .warp_tile import aligned, fragment_tile
from .wgmma import (SWIZZLE_128B, fence_proxy_async, shared_address, smem_desc, wgmma_acc_zeros, wgmma_commit,
                    wgmma_fence, wgmma_keep, wgmma_tf32, wgmma_wait0, wgmma_wait1)
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
STAGES = 3               # one wgmma group in flight: the stage being stored is two steps old (point 3)


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
    return load, store


def _transposed(R, THREADS, vec):
    """(load, store) of an operand stored with k down its columns (g [K, R..]): point 2, transposed."""
    WARPS = THREADS // 32
    LOADS = R * BK // (4 * THREADS)
    assert LOADS >= 1 and LOADS * WARPS * 32 * 4 == R * BK, f"{R} rows do not share out over {THREADS} threads"

    @cuda.jit(device=True)
    def load(regs, g, r0, k0, rlim, klim):
        lane, warp = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
        for i in range(LOADS):
            u = i * WARPS + warp
            k = k0 + 16 * (u & 1) + (lane >> 1)
            r = r0 + 4 * (2 * (u >> 1) + (lane & 1))
            if vec and k < klim and r + 3 < rlim:
                regs[4 * i], regs[4 * i + 1], regs[4 * i + 2], regs[4 * i + 3] = load4_row(g, k, r)
            else:
                for j in range(4):
                    regs[4 * i + j] = g[k, r + j] if k < klim and r + j < rlim else float32(0)

    @cuda.jit(device=True)
    def store(ring, big, small, regs):
        lane, warp = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
        for i in range(LOADS):
            u = i * WARPS + warp
            k = 16 * (u & 1) + (lane >> 1)
            for j in range(4):
                word = plane_word(4 * (2 * (u >> 1) + (lane & 1)) + j, k)
                b, s = split(regs[4 * i + j])
                ring[big + word] = b
                ring[small + word] = s
    return load, store


if SIMULATOR:
    def _product(N):
        @cuda.jit(device=True)      # a (fake) device function: the twin reads cuda.threadIdx
        def product(d, ring, desc_a, desc_b):
            """Twin of d = wgmma_tf32(d, desc_a, desc_b, 1): the warpgroup's product from the shared
            array's bytes (worked out once for the group), this thread's registers added to d in fp32."""
            t = cuda.threadIdx.x
            regs = warpgroup_once(lambda: wgmma_warpgroup_tf32(ring, desc_a, desc_b, N), t // WARPGROUP,
                                  t % WARPGROUP)[t % WARPGROUP]
            return tuple(float32(x + y) for x, y in zip(d, regs))
        return product
else:
    def _product(N):
        @cuda.jit(device=True, inline="always")
        def product(d, ring, desc_a, desc_b):
            """d += A @ B of one k8 step, both K-major TF32; read d only after the commit and a wait."""
            return wgmma_tf32(d, desc_a, desc_b, 1)
        return product


def make_pipeline(BM, BN, THREADS, vec, trans_a, trans_b):
    """tile_mma(acc, a, b, kb, ke): acc += this thread's share of op(a) @ op(b) over k in [kb, ke),
    the fp32 operands as stored (a [M, K], or [K, M] when trans_a; b [K, N], or [N, K] when trans_b),
    in 3xTF32 through the ring of point 3."""
    A_T, B_T = bool(trans_a), not trans_b                       # stored with k down the columns
    load_a, store_a = (_transposed if A_T else _straight)(BM, THREADS, vec)
    load_b, store_b = (_transposed if B_T else _straight)(BN, THREADS, vec)
    EA, EB = BM * BK // THREADS, BN * BK // THREADS
    PLANE_A, PLANE_B = BM * ROW_WORDS, BN * ROW_WORDS
    STAGE = stage_words(BM, BN)
    WG_WORDS = 64 * ROW_WORDS                                   # a warpgroup's 64 rows of A
    product = _product(BN)
    fragment_add = _fragment_add(BN // 2)

    @cuda.jit(device=True)
    def ring_array():
        """The dynamic shared array and the word where the ring starts: its first 1024-byte
        boundary (the launch gave STAGES * STAGE * 4 + 1024 bytes)."""
        ring = cuda.shared.array(0, float32)
        pad = (ALIGN - (shared_address(ring, 0) & (ALIGN - 1))) & (ALIGN - 1)
        return ring, pad // 4

    @cuda.jit(device=True)
    def put(ring, base, ra, rb):
        """Split and store the registers into the stage at word base: A big, A small, B big, B small."""
        store_a(ring, base, base + PLANE_A, ra)
        store_b(ring, base + 2 * PLANE_A, base + 2 * PLANE_A + PLANE_B, rb)

    @cuda.jit(device=True)
    def tile_mma(acc, a, b, kb, ke):
        ring, at0 = ring_array()                                # stage st at word at0 + st * STAGE
        wg = cuda.threadIdx.x // WARPGROUP
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        M = a.shape[1] if A_T else a.shape[0]
        N = b.shape[1] if B_T else b.shape[0]
        ra = cuda.local.array(EA, float32)                      # one stage of this thread's values
        rb = cuda.local.array(EB, float32)
        n_steps = (ke - kb + BK - 1) // BK
        load_a(ra, a, row0, kb, M, ke)
        load_b(rb, b, col0, kb, N, ke)
        put(ring, at0, ra, rb)                                  # step 0 into stage 0
        if n_steps > 1:
            load_a(ra, a, row0, kb + BK, M, ke)                 # step 1 into the registers
            load_b(rb, b, col0, kb + BK, N, ke)
        d = wgmma_keep(wgmma_acc_zeros(BN))                     # the zeros set before the first fence
        for s in range(n_steps):
            fence_proxy_async()                                 # my stores of stage s visible to wgmma ...
            cuda.syncthreads()                                  # ... and everyone's; step s - 2's wgmmas done
            base = at0 + (s % STAGES) * STAGE
            at_a = base + wg * WG_WORDS                         # this warpgroup's 64 rows of A (big plane)
            at_b = base + 2 * PLANE_A                           # B's big plane
            wgmma_fence()
            for ks in range(KSTEPS):                            # k 8 ks .. 8 ks + 7 of the stage
                a_big = smem_desc(ring, at_a + ks * STEP_WORDS, LBO, SBO, SWIZZLE_128B)
                a_small = smem_desc(ring, at_a + PLANE_A + ks * STEP_WORDS, LBO, SBO, SWIZZLE_128B)
                b_big = smem_desc(ring, at_b + ks * STEP_WORDS, LBO, SBO, SWIZZLE_128B)
                b_small = smem_desc(ring, at_b + PLANE_B + ks * STEP_WORDS, LBO, SBO, SWIZZLE_128B)
                d = product(d, ring, a_small, b_big)
                d = product(d, ring, a_big, b_small)
                d = product(d, ring, a_big, b_big)
            wgmma_commit()
            if s + 1 < n_steps:                                 # stage (s + 1) % 3 was read by step s - 2
                put(ring, at0 + ((s + 1) % STAGES) * STAGE, ra, rb)
            if s + 2 < n_steps:
                load_a(ra, a, row0, kb + (s + 2) * BK, M, ke)
                load_b(rb, b, col0, kb + (s + 2) * BK, N, ke)
            wgmma_wait1()                                       # step s - 1's group done; s's may run
            d = wgmma_keep(d)
        wgmma_wait0()                                           # the last group done: d may be read
        d = wgmma_keep(d)
        fragment_add(acc, d)
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
    fp32 operands as stored. tile = ("tf32x3_wgmma", BM, BN, 32, 64, BN, vec, 3): warpgroups of 64
    rows x all BN columns, BN a multiple of 8 up to 256."""
    family, BM, BN, bk, WM, WN, vec, stages = tile
    assert family == "tf32x3_wgmma" and bk == BK and stages == STAGES, tile
    assert WM == 64 and WN == BN and BM % 64 == 0 and BN % 8 == 0 and BN <= 256, \
        f"tile {tile}: warpgroups of 64 rows x all BN columns"
    shared = shared_bytes(BM, BN)
    assert shared <= DYNAMIC_LIMIT, f"tile {tile}: {shared} bytes of dynamic shared memory"
    THREADS = WARPGROUP * (BM // 64)
    ranged = {(ta, tb): make_pipeline(BM, BN, THREADS, vec, ta, tb) for ta in (False, True) for tb in (False, True)}
    t = fragment_tile(ranged, BM, BN, BK, 16, BN, THREADS)
    t.SHARED = shared
    return t
