"""wgmma kept in flight over a deeper ring: the product tile of matmul v15 (family "v15"), on the
ring that the engine's matmul_bf16_wgmma_cp_async runs (andrea_numba/kernels/wgmma_mn.py, points 4
and 5 there) with both operands K-major: K-major copies (wgmma_copies, lab/matmul.py), the
a @ b^T form, the transpose immediates 0.

v14 (lab/wgmma_tile.py) issues a stage's wgmmas and then waits for them (wgmma.wait_group 0) before
the next step's barrier: the tensor cores idle while every thread waits, meets the others at the
barrier and issues the next copies. v15 changes two things and keeps the rest (v13's bf16 copies
and cp.async copier, v14's descriptors, accumulator layout, epilogue and simulator twin):

1. One wgmma group stays in flight. After issuing step s's wgmmas a warpgroup waits only for
   step s - 1's (wgmma.wait_group 1), so step s's products run while the threads go on to the
   barrier, the copies and the wgmmas of step s + 1; the copies run STAGES - 2 steps ahead.

2. A deeper ring in dynamic shared memory (past Numba's static 48 KiB, the kernel allowed it once:
   matmul.allow_shared), with BK = 64 stages of 128-byte rows (wgmma's 128-byte swizzle, four k16
   steps a stage).

Same math as v14 (the same sums in the same order within a stage's k16 steps: v14's bits where BK
divides the same way). On the H200 (docs/kernels.md) 128 x 128 x 64 with 3 stages ran the 120M
logits in 2.72 ms against 3.04 with 4 and 3.66 with v14's static ring, and was the fastest on 11 of
the 13 products timed (4% and 11% behind 4 stages on the other two: the 120M dx = dh @ W_1^T and the
12M dW_O). But v15 reads both operands K-major, so an operand stored with k down its columns (both
of a weight gradient's) is first rounded into a transposed copy: v16 sent the weight gradients to
v13 instead, and v17 (the engine's matmul_bf16_wgmma_cp_async) reads them as stored.
"""
import functools

from andrea_numba.kernels.half_tile import async_resolve
# The ring's sizes and its tile live with the pipeline that v15 and the engine's
# matmul_bf16_wgmma_cp_async both run (wgmma_mn.make_mn_pipeline), and are named here too.
from andrea_numba.kernels.wgmma_mn import (ALIGN, DYNAMIC_LIMIT, LAYOUT, LBO, STATIC_LIMIT, dynamic_bytes,  # noqa: F401
                                           make_mn_pipeline, ring_bytes, ring_tile)


def make_ring_pipeline(BM, BN, BK, THREADS, stages, vec):
    """tile_mma(acc, a16, b16, kb, ke): acc += this thread's share of a16 @ b16^T over k in [kb, ke)
    (a16 [M, K], b16 [N, K]: K-major bf16 copies), through a ring of `stages` shared stages filled by
    cp.async, with one group of wgmmas in flight. The code is the engine's pipeline
    (wgmma_mn.make_mn_pipeline), which reads each operand K-major or MN-major: here both K-major, the
    a @ b^T form, with the transpose immediates 0 (the same PTX as v15's own loop had, but for
    symbol names)."""
    return make_mn_pipeline(BM, BN, BK, THREADS, stages, vec, False, True)


def ring_resolve(block, a16, b16):
    """The full tile of a v15 launch: ("v15", BM, BN, BK, WM, WN, vec, STAGES); vec when both
    K-major copies' rows are whole 16-byte chunks (half_tile.async_resolve's rule); STAGES 4 unless
    the block names it."""
    return ("v15", *block[:5], async_resolve(block, a16, b16)[6], block[5] if len(block) > 5 else 4)


@functools.cache
def make_ring_tile(tile):
    """Everything a kernel needs for one v15 tile (lab.wgmma_tile.make_wgmma_tile's names, only the
    a @ b^T product mma[(False, True)]), plus SHARED: the dynamic shared memory bytes its launch
    passes (0: a static ring). tile = ("v15", BM, BN, BK, 64, BN, vec, STAGES), BK = 32 or 64."""
    assert tile[0] == "v15", tile
    assert tile[2] % 8 == 0 and 8 <= tile[2] <= 256, f"tile {tile}: wgmma's N is 8 .. 256, a multiple of 8"
    return ring_tile(tile, 15, lambda BM, BN, BK, THREADS, stages, vec:
                     {(False, True): make_ring_pipeline(BM, BN, BK, THREADS, stages, vec)})
