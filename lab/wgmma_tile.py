"""bf16 products on Hopper's warpgroup instruction: the product tile of matmul v14 (family "v14"), the
first wgmma rung (andrea_numba/kernels/wgmma_tile.py holds the pieces the engine's wgmma tiles share:
the warpgroup, the copier, the accumulators' layout, its point 3 below).

matmul v13 (half_tile.py) feeds mma.sync: every warp loads its A and B fragments from shared
memory into registers with ldmatrix (12 ldmatrix.x4 a warp and stage at 128 x 128) and issues 32
mma.sync m16n8k16, each a 16 x 8 piece. v14 keeps v13's bf16 copies, its cp.async ring and its
swizzled shared tiles, and hands the stage to wgmma.mma_async (kernels/wgmma.py): four warps (a
"warpgroup", 128 threads) issue ONE instruction for a 64 x 128 x 16 product, reading A and B
straight from shared memory through two descriptors. No ldmatrix, no fragment registers: only the
accumulators live in registers, 64 fp32 a thread.

1. The tiling. A block of 2 warpgroups (256 threads) computes a BM = 128 x BN = 128 tile of out:

       warpgroup wg (threads 128 wg .. 128 wg + 127) owns rows 64 wg .. 64 wg + 63, all 128 columns
       per 16 values of k: one wgmma m64n128k16 per warpgroup (A: its 64 rows, B: all 128 columns)
       BK = 32 a stage: two wgmma a warpgroup and stage, at k = 0 and k = 16 of the stage

   Both operands are K-major, the "a @ b^T" form: a16 [M, K] (a row of A holds its k values in
   order) and b16 [N, K] (b^T: a row n of B^T holds column n of B). wgmma's "transpose" bits could
   read MN-major tiles too, but with another swizzle than v13's; v14 instead makes the copies
   K-major: matmul_v14 rounds an operand stored the other way ([K, M] or [K, N]) into a transposed
   bf16 copy (lab/operands.py's k_round_bf16_t_v1), so the product kernel has a single form.

2. The shared stage (one of STAGES = 3 in a ring, the whole ring one shared array aligned to 1024):

       bytes 0 ..            A tile: BM rows of BK = 32 bf16 = 64 bytes (8 KiB at BM = 128)
       bytes 64 BM ..        B tile: BN rows of 64 bytes (n of B^T), 8 KiB at BN = 128
       stage s at s (BM + BN) 64 bytes: 16 KiB, so 3 stages are 48 KiB, Numba's static limit

   Every tile starts on a 1024-byte boundary (BM, BN multiples of 16 rows). Within a tile, row r's
   16-byte chunk q (k = 8q .. 8q + 7) is stored at chunk q ^ ((r >> 1) & 3) of the row: v13's
   k-inner swizzle (half_tile.py, point 3), which is bit for bit wgmma's 64-byte swizzle (mode 2):

       address = lin ^ (((lin >> 7) & 3) << 4)      lin = 64 r + 16 q + (byte in chunk), the plain place

   (bits 4-5, the chunk, XORed with bits 7-8, the row pair within an 8-row, 512-byte "atom"). The
   hardware applies this XOR to the addresses it computes, on the absolute shared address: the
   tile must start on a 512-byte boundary for the pattern to line up (base offset 0).
   The descriptors (wgmma.py: start, LBO, SBO, swizzle):

       A of warpgroup wg, k16 step ks:  start = A tile + 64 wg * 64 + 32 ks,  SBO = 512, LBO = 16, mode 2
       B, k16 step ks:                  start = B tile + 32 ks,               SBO = 512, LBO = 16, mode 2

   SBO = 512: the next 8 rows (the next atom); LBO is unused for a swizzled K-major operand whose
   k16 step lies inside one row (16 bytes by CUTLASS's convention); ks moves the start by 32 bytes
   (16 bf16) inside the 64-byte row, unswizzled: the hardware XORs what it computes from it.
   lab/bench/wgmma_probe.py confirmed exactly these (mode 2, SBO 512, LBO 16, K = 16 and 64) on the H200.

3. The accumulators (wgmma.py's docstring). Thread 32 w + 4 g + t of warpgroup wg (w = 0..3 its
   warp within the group, g = lane >> 2, t = lane & 3) holds d[4 j + 2 h + c] = out tile element

       row 64 wg + 16 w + g + 8 h,   column 8 j + 2 t + c        (j = 0 .. BN/8 - 1, h, c = 0, 1)

   which is the mma.sync C layout once per 8 columns for a warp of 16 rows: warp_tile.fragment_tile's
   layout with WM = 16, WN = BN (warp 4 wg + w owns rows 16 (4 wg + w) ..). So v14 reuses that
   epilogue unchanged, and matmul's _k_matmul_warp, split-K and all: acc[h, 2 j + c] = d[4 j + 2 h + c].
   The tuple lives in registers through the K loop (64 fp32 at BN = 128) and is added to acc once.

4. One step of the K loop (every thread of the block runs each line; STAGES - 1 steps of copies in
   flight, as v13's ring):

       cp.async.wait_group STAGES-2    this thread's copies of step s landed (in shared memory)
       fence.proxy.async.shared::cta   fence_proxy_async(): make them visible to the async proxy,
                                       which is what wgmma reads shared memory with (the zero
                                       fills are ordinary st.shared, generic-proxy writes that need
                                       this fence; cp.async's writes are taken to need it too, as
                                       the PTX ISA does not say otherwise for wgmma: one cheap
                                       instruction a step)
       bar.sync                        every thread's fenced copies; every warpgroup done with step
                                       s-1 (its wgmma_wait0 came before this barrier), so the stage
                                       (s-1) % STAGES may be refilled
       issue copies of step s + STAGES - 1 into that stage, commit (an empty group near the end)
       wgmma.fence                     the accumulators' registers are ready for the async unit
       wgmma.mma_async x 2             d += A[:, k 0..15] B[k 0..15, :], then k 16..31
       wgmma.commit_group
       wgmma.wait_group 0              both done: d may be read, the stage may be overwritten

   The accumulators start at zero (wgmma_acc_zeros, pinned before the first fence by wgmma_keep)
   and every wgmma adds (scale_d = 1). This first version waits for its own wgmmas every step: the
   tensor cores idle while the step's barrier and copy issue run. The next version keeps one group
   in flight (wgmma_wait1 after issuing step s + 1's wgmmas, releasing stage s only then: the ring
   needs one more stage of slack) so that the barrier, the copies and the next wgmmas overlap.

Edges: v13's copier. Chunks past M, N or K are zero-filled with plain stores (the same fence and
barrier order them with the copies); copies whose rows are not whole 16-byte chunks (K % 8 != 0,
or a start off a 16-byte boundary) take v13's guarded path of 2-byte loads and plain stores.

In the simulator the wgmma instruction cannot run (a warpgroup instruction, and the simulator
runs threads one by one): each thread runs wgmma.py's NumPy twin, wgmma_warpgroup, on the shared
array as it stands (its bytes are the shared addresses the descriptors count from: smem_desc's
twin gives the byte offset within the array), with the same descriptors, for the whole
warpgroup, and keeps its own fragment. It checks the copies, the swizzle, the descriptors, the
fragment layout and the edges; what it cannot check is the asynchrony (the fence, the waits).
"""
import functools

import numpy as np
from numba import cuda, float32

from andrea_numba.kernels.common import SIMULATOR
from andrea_numba.kernels.half_tile import BK_HALF, async_resolve
from andrea_numba.kernels.ptx import CP_ASYNC_WAIT, cp_async_commit
from andrea_numba.kernels.warp_tile import fragment_tile
from andrea_numba.kernels.wgmma import (SWIZZLE_64B, fence_proxy_async, smem_desc, wgmma_acc_zeros, wgmma_bf16,
                                        wgmma_commit, wgmma_fence, wgmma_keep, wgmma_wait0, wgmma_warpgroup)
from andrea_numba.kernels.wgmma_tile import *  # noqa: F401,F403  (the engine's pieces of a wgmma tile)
from andrea_numba.kernels.wgmma_tile import WARPGROUP, _copier, _fragment_add

ROW_BYTES = 64         # a tile row: BK = 32 bf16, one 64-byte swizzle row
LBO, SBO = 16, 512     # the descriptors' byte offsets (point 2): LBO unused, SBO = 8 rows of 64 bytes
STAGES = 3             # the ring (a block's sixth number overrides it)


if SIMULATOR:
    def _product(N):
        def product(d, ring, desc_a, desc_b):
            """Twin of d = wgmma_bf16(d, desc_a, desc_b, 1): the warpgroup's product from the shared
            array's bytes, this thread's row of registers added to d in fp32."""
            regs = wgmma_warpgroup(ring, desc_a, desc_b, N)[cuda.threadIdx.x % WARPGROUP]
            return tuple(np.float32(x + y) for x, y in zip(d, regs))
        return product
else:
    def _product(N):
        @cuda.jit(device=True, inline="always")
        def product(d, ring, desc_a, desc_b):
            """d += A @ B of one k16 step (scale_d = 1), issued for the warpgroup; read d only after
            the commit and the wait."""
            return wgmma_bf16(d, desc_a, desc_b, 1)
        return product


def make_wgmma_pipeline(BM, BN, THREADS, stages, vec):
    """tile_mma(acc, a16, b16, kb, ke): acc += this thread's share of a16 @ b16^T over k in [kb, ke)
    (a16 [M, K], b16 [N, K]: K-major bf16 copies), through a ring of `stages` shared stages filled by
    cp.async and multiplied by wgmma (points 2 and 4 of the docstring)."""
    BK = BK_HALF
    A_WORDS, B_WORDS = BM * BK // 2, BN * BK // 2              # 32-bit words (bf16 pairs) of each tile
    STAGE_WORDS = A_WORDS + B_WORDS
    RING_WORDS = stages * STAGE_WORDS                           # a constant: Numba sizes shared arrays at compile time
    WG_WORDS = 64 * ROW_BYTES // 4                              # a warpgroup's 64 rows of A
    STEP_WORDS = 32 // 4                                        # the second k16 step: 32 bytes along a row
    copy_a, copy_b = _copier(BM, THREADS, vec), _copier(BN, THREADS, vec)
    product = _product(BN)
    fragment_add = _fragment_add(BN // 2)
    wait = CP_ASYNC_WAIT[stages - 2]                            # step s's group landed
    wait_all = CP_ASYNC_WAIT[0]

    @cuda.jit(device=True)
    def load(ring, st, a, b, k0, ke, row0, col0, M, N):
        """Start the copies of the stage at k0 into ring stage st: A rows row0.., B^T rows col0.."""
        base = st * STAGE_WORDS
        copy_a(ring[base:base + A_WORDS], a, row0, k0, M, ke)
        copy_b(ring[base + A_WORDS:base + STAGE_WORDS], b, col0, k0, N, ke)

    @cuda.jit(device=True)
    def tile_mma(acc, a, b, kb, ke):
        # one array for the ring: stage st's A tile at word st * STAGE_WORDS, its B tile after it,
        # every tile on a 1024-byte boundary (the 64-byte swizzle needs 512)
        ring = cuda.shared.array(RING_WORDS, float32, alignment=1024)
        wg = cuda.threadIdx.x // WARPGROUP
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        M, N = a.shape[0], b.shape[0]
        n_steps = (ke - kb + BK - 1) // BK
        for p in range(stages - 1):                             # prologue: steps 0 .. stages-2 in flight
            if p < n_steps:
                load(ring, p, a, b, kb + p * BK, ke, row0, col0, M, N)
            cp_async_commit()
        d = wgmma_keep(wgmma_acc_zeros(BN))                     # the zeros set before the first fence
        for s in range(n_steps):
            wait()                                              # my copies of step s are in ...
            fence_proxy_async()                                 # ... and visible to wgmma's proxy
            cuda.syncthreads()                                  # everyone's; stage (s-1) % stages is free
            nxt = s + stages - 1
            if nxt < n_steps:
                load(ring, nxt % stages, a, b, kb + nxt * BK, ke, row0, col0, M, N)
            cp_async_commit()                                   # one group a step, empty or not
            at_a = (s % stages) * STAGE_WORDS + wg * WG_WORDS   # this warpgroup's 64 rows of A
            at_b = (s % stages) * STAGE_WORDS + A_WORDS         # all BN rows of B^T
            wgmma_fence()
            d = product(d, ring, smem_desc(ring, at_a, LBO, SBO, SWIZZLE_64B),
                        smem_desc(ring, at_b, LBO, SBO, SWIZZLE_64B))                 # k 0..15
            d = product(d, ring, smem_desc(ring, at_a + STEP_WORDS, LBO, SBO, SWIZZLE_64B),
                        smem_desc(ring, at_b + STEP_WORDS, LBO, SBO, SWIZZLE_64B))    # k 16..31
            wgmma_commit()
            wgmma_wait0()                                       # synchronous: both done (point 4)
            d = wgmma_keep(d)                                   # no read of d moves above the wait
        fragment_add(acc, d)
        wait_all()                                              # only empty groups remain
        cuda.syncthreads()                                      # the ring may be refilled by a next call
    return tile_mma


@functools.cache
def make_wgmma_tile(tile):
    """Everything a kernel needs for one v14 tile, the names of make_async_tile, with only the
    a @ b^T product (mma[(False, True)], mma_nt): its arguments are K-major bf16 copies, a16 [M, K]
    and b16 [N, K]. tile = ("v14", BM, BN, BK, WM, WN, vec, STAGES): WM = 64 (a warpgroup's
    rows), WN = BN (one wgmma m64nBNk16 a warpgroup and k16 step), BK = 32."""
    family, BM, BN, BK, WM, WN, vec, stages = tile
    assert family == "v14", family
    assert BK == BK_HALF, f"wgmma tiles take BK = {BK_HALF}, got {BK}"
    assert WM == 64 and WN == BN and BM % 64 == 0, f"tile {tile}: warpgroups of 64 rows x all BN columns"
    assert BN % 8 == 0 and 8 <= BN <= 256, f"tile {tile}: wgmma's N is 8 .. 256, a multiple of 8"
    assert stages - 2 in CP_ASYNC_WAIT, f"{stages} stages: wait_group {stages - 2} has no intrinsic (ptx.py)"
    assert stages * (BM + BN) * ROW_BYTES <= 48 * 1024, f"tile {tile}: more than 48 KiB of static shared memory"
    THREADS = WARPGROUP * (BM // 64)
    ranged = {(False, True): make_wgmma_pipeline(BM, BN, THREADS, stages, vec)}
    # the accumulator layout is fragment_tile's with warps of 16 rows x BN columns (point 3)
    return fragment_tile(ranged, BM, BN, BK, 16, BN, THREADS)


def wgmma_resolve(block, a16, b16):
    """The full tile of a v14 launch: ("v14", BM, BN, BK, WM, WN, vec, STAGES); vec when both
    K-major copies' rows are whole 16-byte chunks (half_tile.async_resolve's rule)."""
    return ("v14", *async_resolve(block, a16, b16)[1:])
