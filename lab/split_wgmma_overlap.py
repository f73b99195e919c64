"""3xTF32 on wgmma with a stage in flight: the product tile of matmul v26 (family "v26"), the
engine's matmul_tf32x3_wgmma (v25, andrea_numba/kernels/split_wgmma.py) with the tensor cores kept
busy across its stage boundaries.

v25 issues a stage's twelve wgmmas, splits and stores the next stage while they run, and then waits
for them (wgmma.wait_group 0) and adds their sums to acc before the next barrier: every stage, the
tensor cores drain while each thread waits, adds 64 sums and meets the others at the barrier, and
refill only when the next stage's wgmmas are issued. v26 keeps everything of v25 (the planes, their
swizzle, the copies, the 3xTF32 products and their order, each stage summed in fresh registers and
added to acc in fp32) but the order of a step, on a ring of three stages instead of two:

    v25, step s (2 stages)                      v26, step s (3 stages)
    fence.proxy.async; bar.sync                 fence.proxy.async; bar.sync    (stage s stored)
    12 wgmmas of stage s into e; commit         12 wgmmas of stage s % 3 into e[s % 2]; commit
    split + store step s + 1's registers        wgmma.wait_group 1: step s - 1's e is done
    load step s + 2 into the registers          acc += e[(s - 1) % 2]
    wgmma.wait_group 0                          split + store step s + 1's registers into the
    acc += e                                      stage step s - 2 read
                                                load step s + 2 into the registers

so step s's products run while the threads add step s - 1's sums, split and store the next stage
and issue the next loads, and the next step's wgmmas queue behind them. The stage stored at step s
is the one step s - 2 read: every warpgroup waited for step s - 2 (its wait_group 1 of step s - 1)
before the barrier of step s, so one barrier a step still guards the ring (with two stages the
stage stored would be step s - 1's, which the other warpgroup may still be reading: a second
barrier a step). The price: two sets of stage sums (e[0], e[1]: 2 x BN / 2 registers a thread
beside acc's BN / 2) and a third stage of shared memory (193 KiB at 128 x 128). The sums are v25's,
added to acc in the same order: v25's bits (tests/test_matmul_v26.py).

Measured on an H100 (docs/speed.md, "Where the time goes"): slower than v25. At 128 x 128 the
second set of sums takes a thread to 255 registers with spills (1.06-1.58x v25's time); at 128 x 64
(no spills) it is within 4% of v25 where A is stored K-major and slower on the weight gradients. The
tensor cores' idle time at v25's stage boundaries is not what holds v25 back.
"""
import functools

from numba import cuda, float32

from andrea_numba.kernels.split_wgmma import BK, aligned, build_tile, stage_parts, stage_words
from andrea_numba.kernels.wgmma import fence_proxy_async, wgmma_acc_zeros, wgmma_keep, wgmma_wait0, wgmma_wait1
from andrea_numba.kernels.wgmma_mn import ALIGN
from andrea_numba.kernels.wgmma_tile import WARPGROUP

STAGES = 3          # the stage being stored was read two steps before, which every warpgroup has waited for


def shared_bytes(BM, BN):
    """The dynamic shared memory of a launch: STAGES stages + 1 KiB to align the ring (193 KiB at 128 x 128)."""
    return STAGES * stage_words(BM, BN) * 4 + ALIGN


def make_overlap_pipeline(BM, BN, THREADS, vec, trans_a, trans_b):
    """tile_mma(acc, a, b, kb, ke): v25's pieces (split_wgmma.stage_parts: the copies, the split and
    store, a stage's 12 wgmmas) in this module's order, one stage's wgmmas in flight."""
    p = stage_parts(BM, BN, THREADS, vec, trans_a, trans_b)
    EA, EB, STAGE = p.EA, p.EB, p.STAGE
    extents, load, ring_array, put, stage_sums, fragment_add = (p.extents, p.load, p.ring_array, p.put,
                                                                p.stage_sums, p.fragment_add)

    @cuda.jit(device=True)
    def issue(e, ring, at0, wg, s):
        """Wait for stage s % 3 to be stored (every thread: so every warpgroup has also waited for step
        s - 2), then its 12 wgmmas into e, fresh, committed."""
        fence_proxy_async()
        cuda.syncthreads()
        return stage_sums(e, ring, at0 + (s % STAGES) * STAGE, wg)

    @cuda.jit(device=True)
    def refill(ring, at0, ra, rb, a, b, row0, col0, M, N, kb, ke, s, n_steps):
        """Step s + 1's registers split and stored into its stage, the one step s - 2 read (done in
        every warpgroup: each waited for it before the barrier of step s); step s + 2 loaded."""
        if s + 1 < n_steps:
            put(ring, at0 + ((s + 1) % STAGES) * STAGE, ra, rb)
        if s + 2 < n_steps:
            load(ra, rb, a, b, row0, col0, M, N, kb + (s + 2) * BK, ke)

    @cuda.jit(device=True)
    def tile_mma(acc, a, b, kb, ke):
        ring, at0 = ring_array()
        wg = cuda.threadIdx.x // WARPGROUP
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        M, N = extents(a, b)
        ra = cuda.local.array(EA, float32)
        rb = cuda.local.array(EB, float32)
        n_steps = (ke - kb + BK - 1) // BK
        if n_steps <= 0:                                        # (the same for the whole block)
            return
        load(ra, rb, a, b, row0, col0, M, N, kb, ke)
        put(ring, at0, ra, rb)                                  # step 0 into stage 0
        if n_steps > 1:
            load(ra, rb, a, b, row0, col0, M, N, kb + BK, ke)
        e0 = wgmma_keep(wgmma_acc_zeros(BN))                    # the even steps' sums
        e1 = wgmma_keep(wgmma_acc_zeros(BN))                    # the odd steps'
        e0 = issue(e0, ring, at0, wg, 0)
        refill(ring, at0, ra, rb, a, b, row0, col0, M, N, kb, ke, 0, n_steps)
        s = 1
        while s < n_steps:                                      # steps s (odd) and s + 1 (even)
            e1 = issue(e1, ring, at0, wg, s)
            wgmma_wait1()                                       # step s - 1's sums are in e0
            e0 = wgmma_keep(e0)
            fragment_add(acc, e0)
            refill(ring, at0, ra, rb, a, b, row0, col0, M, N, kb, ke, s, n_steps)
            if s + 1 < n_steps:
                e0 = issue(e0, ring, at0, wg, s + 1)
                wgmma_wait1()                                   # step s's sums are in e1
                e1 = wgmma_keep(e1)
                fragment_add(acc, e1)
                refill(ring, at0, ra, rb, a, b, row0, col0, M, N, kb, ke, s + 1, n_steps)
            s += 2
        wgmma_wait0()                                           # the last step's sums
        if n_steps % 2:
            e0 = wgmma_keep(e0)
            fragment_add(acc, e0)
        else:
            e1 = wgmma_keep(e1)
            fragment_add(acc, e1)
        cuda.syncthreads()                                      # the ring may be refilled by a next call
    return tile_mma


def overlap_resolve(block, a, b):
    """The full tile of a matmul v26 launch: ("v26", BM, BN, 32, 64, BN, vec, STAGES)."""
    return ("v26", *block[:5], aligned(a, b), STAGES)


@functools.cache
def make_overlap_tile(tile):
    """matmul v26's tile: split_wgmma.make_split_tile's names on make_overlap_pipeline."""
    return build_tile(tile, "v26", STAGES, shared_bytes, make_overlap_pipeline)
