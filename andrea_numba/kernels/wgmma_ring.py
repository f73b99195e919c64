"""wgmma kept in flight over a deeper ring: the product tile of matmul v15 (family "v15").

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

from .half_tile import async_resolve
# The ring's sizes and its tile (points 2 and 3) are shared with v17 and v18: they live with the
# pipeline that v15 and v17 both run (wgmma_mn.make_mn_pipeline), and are named here too.
from .wgmma_mn import (ALIGN, DYNAMIC_LIMIT, LAYOUT, LBO, STATIC_LIMIT, dynamic_bytes,  # noqa: F401
                       make_mn_pipeline, ring_bytes, ring_tile)


def make_ring_pipeline(BM, BN, BK, THREADS, stages, vec):
    """tile_mma(acc, a16, b16, kb, ke): acc += this thread's share of a16 @ b16^T over k in [kb, ke)
    (a16 [M, K], b16 [N, K]: K-major bf16 copies), through a ring of `stages` shared stages filled by
    cp.async, with one group of wgmmas in flight (points 1-3 of the docstring). The code is matmul
    v17's pipeline (wgmma_mn.make_mn_pipeline), which reads each operand K-major or MN-major: here
    both K-major, the a @ b^T form, with the transpose immediates 0 (the same PTX as v15's own loop
    had, but for symbol names)."""
    return make_mn_pipeline(BM, BN, BK, THREADS, stages, vec, False, True)


def ring_resolve(block, a16, b16):
    """The full tile of a v15 launch: ("v15", BM, BN, BK, WM, WN, vec, STAGES); vec when both
    K-major copies' rows are whole 16-byte chunks (half_tile.async_resolve's rule); STAGES 4 unless
    the block names it."""
    return ("v15", *block[:5], async_resolve(block, a16, b16)[6], block[5] if len(block) > 5 else 4)


@functools.cache
def make_ring_tile(tile):
    """Everything a kernel needs for one v15 tile (make_wgmma_tile's names, only the a @ b^T product
    mma[(False, True)]), plus SHARED: the dynamic shared memory bytes its launch passes (0: a static
    ring). tile = ("v15", BM, BN, BK, 64, BN, vec, STAGES), BK = 32 or 64."""
    assert tile[0] == "v15", tile
    assert tile[2] % 8 == 0 and 8 <= tile[2] <= 256, f"tile {tile}: wgmma's N is 8 .. 256, a multiple of 8"
    return ring_tile(tile, 15, lambda BM, BN, BK, THREADS, stages, vec:
                     {(False, True): make_ring_pipeline(BM, BN, BK, THREADS, stages, vec)})
