"""wgmma kept in flight over a deeper ring: the product tile of matmul v15 (kind "bf16h").

v14 (wgmma_tile.py) issues a stage's wgmmas and then waits for them (wgmma.wait_group 0) before
the next step's barrier: the tensor cores idle while every thread waits, meets the others at the
barrier and issues the next copies. v15 changes two things and keeps the rest (v13's bf16 copies
and cp.async copier, v14's descriptors, accumulator layout, epilogue and simulator twin):

1. One wgmma group stays in flight. After issuing step s's wgmmas a warpgroup waits only for
   step s - 1's (wgmma.wait_group 1), so step s's products run while the threads go on to the
   barrier, the copies and the wgmmas of step s + 1. The price: a stage is busy for one more step
   (step s's stage is read until the wait of step s + 1), so the copies run STAGES - 2 steps
   ahead instead of STAGES - 1, and the ring needs STAGES >= 3 (4 preferred).

2. A deeper ring in dynamic shared memory. Static shared arrays stop at 48 KiB; dynamic shared
   memory goes to 227 KiB on Hopper once the kernel asks for it (matmul.allow_shared: the driver's
   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, set once per compiled kernel). So the stages
   take BK = 64 (rows of 128 bytes: wgmma's 128-byte swizzle, four k16 steps a stage):

       tile (BM x BN, BK, STAGES)   a stage                 the ring             + alignment
       128 x 128, 64, 4             (128 + 128) 128 B = 32 KiB    128 KiB         + 1 KiB
       128 x 256, 64, 3             (128 + 256) 128 B = 48 KiB    144 KiB         + 1 KiB  (spills: not declared)
       128 x 128, 32, 3 (static)    (128 + 128)  64 B = 16 KiB     48 KiB         (v14's ring)

   The dynamic array is only promised 16-byte alignment, and the 128-byte swizzle is computed on
   the absolute shared address (the pattern repeats every 1024 bytes): the ring starts at the first
   1024-byte boundary inside the array (pad = (-address) mod 1024 bytes, so 1 KiB is allocated
   extra). Every tile in it is a whole number of 1024-byte atoms (BM, BN multiples of 8 rows).

The layout at BK = 64 (wgmma.py's docstring, mode 1). Row r of a tile is 128 bytes (k 0..63);
its 16-byte chunk q (k 8q .. 8q + 7) is stored at chunk q ^ (r & 7): v13's copier with rows of 8
chunks (half_tile._word(32)), which is wgmma.kmajor_offset(r, k, R, swizzle=1). Descriptors:

       A of warpgroup wg, k16 step ks:  start = A tile + 64 wg * 128 + 32 ks,  SBO = 1024, LBO = 16, mode 1
       B, k16 step ks:                  start = B tile + 32 ks,                SBO = 1024, LBO = 16, mode 1

(ks = 0..3: the start moves 32 bytes along the unswizzled row; the hardware XORs the addresses it
computes.) At BK = 32 the tiles are v14's: 64-byte rows, mode 2, SBO = 512, ks = 0, 1.

3. One step of the K loop (every thread runs each line; P = STAGES - 2 steps of copies ahead):

       cp.async.wait_group P - 1       my copies of step s are in shared memory (P - 1 newer groups
                                       may still be in flight: steps s + 1 .. s + P - 1)
       fence.proxy.async.shared::cta   ... and visible to wgmma's async proxy
       bar.sync                        (a) everyone's copies of step s are in and fenced;
                                       (b) every thread has passed its wgmma.wait_group 1 of step
                                           s - 1, so in every warpgroup the wgmmas of step s - 2
                                           are complete: stage (s - 2) % STAGES is read by no one
       copies of step s + P into stage (s + P) % STAGES = (s - 2) % STAGES, commit (maybe empty)
       wgmma.fence; wgmma x BK/16 on stage s % STAGES; wgmma.commit_group
       wgmma.wait_group 1              step s - 1's wgmmas are done (step s's may still run)

   Which stage is in use at the barrier of step s: s % STAGES (being waited for), (s - 1) %
   STAGES (step s - 1's wgmmas may still be reading it), (s + 1) .. (s + P - 1) % STAGES (copies
   in flight). That is P + 1 = STAGES - 1 stages, so exactly one, (s - 2) % STAGES, is free, and
   barrier (b) is what proves it: without the barrier a fast warpgroup could overwrite a stage
   that a slow warpgroup's wgmmas were still reading. After the loop: wgmma.wait_group 0, then the
   accumulators are read.

   The accumulators d are passed from one wgmma to the next in registers through the loop; only
   the wgmmas touch them until the final wait (wgmma_keep pins them: before the first fence, after
   every wait).

The simulator runs v14's twin (wgmma.wgmma_warpgroup on the shared array's bytes) and does every
copy at once: it checks the layout, the descriptors, the ring's stage arithmetic and the edges,
not the asynchrony (the waits and fences are no-ops there). Its dynamic shared array starts at
address 0, so pad = 0 there.
"""
import functools

from numba import cuda, float32

from .common import SIMULATOR
from .half_tile import BK_HALF, async_resolve
from .ptx import CP_ASYNC_WAIT, cp_async_commit
from .warp_tile import fragment_tile
from .wgmma import (SWIZZLE_64B, SWIZZLE_128B, fence_proxy_async, shared_address, smem_desc, wgmma_acc_zeros,
                    wgmma_commit, wgmma_fence, wgmma_keep, wgmma_wait0, wgmma_wait1)
from .wgmma_tile import WARPGROUP, _copier, _fragment_add, _product

STATIC_LIMIT = 48 * 1024          # bytes of static shared memory a kernel may declare
DYNAMIC_LIMIT = 227 * 1024        # bytes of dynamic shared memory a Hopper block may ask for
ALIGN = 1024                      # the 128-byte swizzle's atom: 8 rows of 128 bytes
LBO = 16                          # unused by swizzled K-major operands (CUTLASS's 1, i.e. 16 bytes)
# BK -> (row bytes, swizzle mode, SBO = 8 rows)
LAYOUT = {32: (64, SWIZZLE_64B, 512), 64: (128, SWIZZLE_128B, 1024)}


def ring_bytes(BM, BN, BK, stages):
    """Bytes of the ring: stages x (A tile + B tile), rows of 2 BK bytes."""
    return stages * (BM + BN) * 2 * BK


def dynamic_bytes(BM, BN, BK, stages):
    """The dynamic shared memory a launch of this tile asks for: 0 for BK = 32 (a static ring, v14's),
    else the ring + 1 KiB to start it on a 1024-byte boundary."""
    return 0 if BK == BK_HALF else ring_bytes(BM, BN, BK, stages) + ALIGN


def make_ring_pipeline(BM, BN, BK, THREADS, stages, vec):
    """tile_mma(acc, a16, b16, kb, ke): acc += this thread's share of a16 @ b16^T over k in [kb, ke)
    (a16 [M, K], b16 [N, K]: K-major bf16 copies), through a ring of `stages` shared stages filled by
    cp.async, with one group of wgmmas in flight (points 1-3 of the docstring)."""
    ROW, SWZ, SBO = LAYOUT[BK]
    A_WORDS, B_WORDS = BM * ROW // 4, BN * ROW // 4             # 32-bit words of each tile
    STAGE_WORDS = A_WORDS + B_WORDS
    RING_WORDS = stages * STAGE_WORDS
    WG_WORDS = 64 * ROW // 4                                    # a warpgroup's 64 rows of A
    STEP_WORDS = 32 // 4                                        # a k16 step: 32 bytes along a row
    KSTEPS = BK // 16
    AHEAD = stages - 2                                          # steps of copies ahead (P)
    dynamic = dynamic_bytes(BM, BN, BK, stages) > 0
    copy_a, copy_b = _copier(BM, THREADS, vec, BK), _copier(BN, THREADS, vec, BK)
    product = _product(BN)
    if SIMULATOR:                       # the twin reads cuda.threadIdx in wgmma_tile's module: run it
        product = cuda.jit(device=True)(product)    # as a (fake) device function, which sets that up
    fragment_add = _fragment_add(BN // 2)
    wait = CP_ASYNC_WAIT[AHEAD - 1]                             # step s's group landed
    wait_all = CP_ASYNC_WAIT[0]

    if dynamic:
        @cuda.jit(device=True)
        def ring_array():
            """The dynamic shared array and the word where the ring starts: its first 1024-byte
            boundary (the launch gave RING_WORDS * 4 + 1024 bytes)."""
            ring = cuda.shared.array(0, float32)
            pad = (ALIGN - (shared_address(ring, 0) & (ALIGN - 1))) & (ALIGN - 1)
            return ring, pad // 4
    else:
        @cuda.jit(device=True)
        def ring_array():
            """v14's static ring, aligned by its declaration."""
            return cuda.shared.array(RING_WORDS, float32, alignment=ALIGN), 0

    @cuda.jit(device=True)
    def load(ring, base, a, b, k0, ke, row0, col0, M, N):
        """Start the copies of the stage at k0 into the stage at word `base`: A rows row0.., B^T rows col0.."""
        copy_a(ring[base:base + A_WORDS], a, row0, k0, M, ke)
        copy_b(ring[base + A_WORDS:base + STAGE_WORDS], b, col0, k0, N, ke)

    @cuda.jit(device=True)
    def tile_mma(acc, a, b, kb, ke):
        ring, at0 = ring_array()                                # stage st at word at0 + st * STAGE_WORDS
        wg = cuda.threadIdx.x // WARPGROUP
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        M, N = a.shape[0], b.shape[0]
        n_steps = (ke - kb + BK - 1) // BK
        for p in range(AHEAD):                                  # prologue: steps 0 .. P-1 in flight
            if p < n_steps:
                load(ring, at0 + p * STAGE_WORDS, a, b, kb + p * BK, ke, row0, col0, M, N)
            cp_async_commit()
        d = wgmma_keep(wgmma_acc_zeros(BN))                     # the zeros set before the first fence
        for s in range(n_steps):
            wait()                                              # my copies of step s are in ...
            fence_proxy_async()                                 # ... and visible to wgmma's proxy
            cuda.syncthreads()                                  # everyone's; and every warpgroup's
            #                                                     wgmmas of step s - 2 are complete
            #                                                     (each thread passed wait1 of s - 1)
            nxt = s + AHEAD                                     # refill stage (s - 2) % stages
            if nxt < n_steps:
                load(ring, at0 + (nxt % stages) * STAGE_WORDS, a, b, kb + nxt * BK, ke, row0, col0, M, N)
            cp_async_commit()                                   # one group a step, empty or not
            at_a = at0 + (s % stages) * STAGE_WORDS + wg * WG_WORDS   # this warpgroup's 64 rows of A
            at_b = at0 + (s % stages) * STAGE_WORDS + A_WORDS         # all BN rows of B^T
            wgmma_fence()
            for ks in range(KSTEPS):                            # k 16 ks .. 16 ks + 15 of the stage
                d = product(d, ring, smem_desc(ring, at_a + ks * STEP_WORDS, LBO, SBO, SWZ),
                            smem_desc(ring, at_b + ks * STEP_WORDS, LBO, SBO, SWZ))
            wgmma_commit()
            wgmma_wait1()                                       # step s - 1's group done; s's may run
            d = wgmma_keep(d)
        wgmma_wait0()                                           # the last group done: d may be read
        d = wgmma_keep(d)
        fragment_add(acc, d)
        wait_all()                                              # only empty groups remain
        cuda.syncthreads()                                      # the ring may be refilled by a next call
    return tile_mma


def ring_resolve(block, a16, b16):
    """The full tile of a v15 launch: ("bf16h", BM, BN, BK, WM, WN, vec, STAGES); vec when both
    K-major copies' rows are whole 16-byte chunks (half_tile.async_resolve's rule); STAGES 4 unless
    the block names it."""
    return ("bf16h", *block[:5], async_resolve(block, a16, b16)[6], block[5] if len(block) > 5 else 4)


@functools.cache
def make_ring_tile(tile):
    """Everything a kernel needs for one v15 tile (make_wgmma_tile's names, only the a @ b^T product
    mma[(False, True)]), plus SHARED: the dynamic shared memory bytes its launch passes (0: a static
    ring). tile = ("bf16h", BM, BN, BK, 64, BN, vec, STAGES), BK = 32 or 64."""
    kind, BM, BN, BK, WM, WN, vec, stages = tile
    assert kind == "bf16h", kind
    assert BK in LAYOUT, f"v15 tiles take BK = 32 or 64, got {BK}"
    assert WM == 64 and WN == BN and BM % 64 == 0, f"tile {tile}: warpgroups of 64 rows x all BN columns"
    assert BN % 8 == 0 and 8 <= BN <= 256, f"tile {tile}: wgmma's N is 8 .. 256, a multiple of 8"
    assert stages >= 3 and stages - 3 in CP_ASYNC_WAIT, f"{stages} stages: one wgmma group in flight needs 3 .. 5"
    shared = dynamic_bytes(BM, BN, BK, stages)
    if shared:
        assert shared <= DYNAMIC_LIMIT, f"tile {tile}: {shared} bytes of dynamic shared memory"
    else:
        assert ring_bytes(BM, BN, BK, stages) <= STATIC_LIMIT, f"tile {tile}: more than 48 KiB of static shared memory"
    THREADS = WARPGROUP * (BM // 64)
    ranged = {(False, True): make_ring_pipeline(BM, BN, BK, THREADS, stages, vec)}
    t = fragment_tile(ranged, BM, BN, BK, 16, BN, THREADS)       # v14's accumulator layout and epilogue
    t.SHARED = shared
    return t

