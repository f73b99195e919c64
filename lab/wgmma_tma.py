"""The lab's side of matmul v18's kernel (andrea_numba/kernels/wgmma_tma.py): the flag-built kernel
that the engine's k_matmul_bf16_wgmma was written out from, with the fused epilogues (mlp v20) and
the split-K fixups (matmul v19, v23) that only lab rungs run, their counters and their launcher.

    make_tma_kernel(BM, BN, stages, trans_a, trans_b, epilogue=None, fixup=0)
        epilogue None, fixup 0     matmul v18: the engine's k_matmul_bf16_wgmma, flag for flag (its
                                   bits: tests/test_matmul_v18.py, lab/bench/v18_bits.py --against flag-built)
        epilogue "gelu" | "dgelu"  mlp v20's products (point 5)
        fixup 1, 2                 matmul v19, v23: the split-K slices added in the kernel (point 6)
    tma_product(out, work, a, b, ..., epilogue=None, aux=None, fixup=0)
        the launch of any of them (matmul_bf16_wgmma's launch with the flags passed on)

Points 1-4 (roles, the ring, persistent blocks, the plain epilogue) are the engine file's.

History. matmul v17 (the engine's matmul_bf16_wgmma_cp_async, kernels/wgmma_mn.py) computes a
128 x 128 tile with 256 threads that do everything in turn: each stage they all issue cp.async copies
(address, swizzle and edge tests per 16-byte chunk), wait for them, meet at a block-wide barrier,
issue the wgmmas, and at the end of the tile store it before the block's next stage can start. On
the H200 that reached 180-340 TFLOP/s where cuBLAS reaches 400-600 on the same shapes. v18 is built
the way Hopper's fast GEMMs are (CUTLASS's "warp-specialized" kernels): a TMA producer warp, an
mbarrier ring, persistent blocks; v17's bits in every form and tile (lab/bench/v18_bits.py on the
H200, 2026-12-03). Written out in the engine without the options below as k_matmul_bf16_wgmma.

5. Fused epilogues (the lab's mlp v20; the engine's linear ops do not use them). "gelu": out = d
   (h_pre, fp32) and aux = bf16(gelu(d)) (h, uint16), the GELU's forward pass done from the
   registers; "dgelu": aux = bf16(d gelu'(out)) with out = h_pre read, so dh = dout @ W_2^T is never
   written in fp32. Only without split-K (a partial sum is no place for the GELU). The kernel takes
   aux always (the plain epilogue ignores it).

6. The split-K fixup (the lab's matmul v19 and v23; v18 runs fixup 0). v18 leaves the S partial
   tiles of a split product in work and a second kernel (matmul's k_splitk_sum) adds them: one more
   launch and a pass over S M N values from memory after the product has ended. v19 adds them in
   the product's own tail, in the same order: each consumer warp, after storing its cells of
   partial z, counts itself on an integer counter of its (tile, warp) (counts[t * 4C + warp]:
   threadfence, then one lane's atomic add; integers, so nothing about the sums depends on who
   arrives when); the warp that brings the count to S is the last of the S slices of those cells,
   and it sums them, z = 0, 1, ..., S - 1 in order, into out (+)= sum, exactly k_splitk_sum's
   expression: v18's bits. The partials it reads were written a moment before, mostly still in L2.
   It then sets the counter back to 0 for the next launch. Each cell's 32-byte sector belongs to
   one warp (a quad of lanes holds a row's 8 columns), so no SM reads another warp's cells before
   they are final (no stale L1 lines). On the H200 (2026-12-03) this gave v18's bits and was 7x
   slower on the split products: sum_slices' loads, one scalar a slice a cell, each waits for the
   one before; they need to be batched.
   matmul v23 (fixup = 2) sums the same way with its loads batched (sum_slices_batched): for PAIRS
   pairs of neighbouring cells at a time it loads up to SMAX slices of each into registers (every
   load in flight at once; constant indices once the loops unroll, so the arrays are registers,
   though ptxas spills 44 bytes at 128 x 256), then adds them in slice order; past SMAX slices the
   next SMAX continue the same running sums. The same additions in the same order as v19 and
   k_splitk_sum: v18's bits. Not yet timed on a GPU.
"""
import functools
import threading

import numpy as np
from numba import cuda, float32, int64

from andrea_numba.kernels import matmul as MM
from andrea_numba.kernels.common import SIMULATOR, cdiv
from andrea_numba.kernels.half_tile import bf16_copies
from andrea_numba.kernels.tile_loop import WARP
from andrea_numba.kernels.tma import (TMAPS, fence_tensormap, map_fits, mbar_arrive, mbar_expect_tx, mbar_fence_init,
                                      mbar_init, mbar_try_wait, tma_load_2d)
from andrea_numba.kernels.wgmma import (shared_address, smem_desc, wgmma_acc_zeros, wgmma_commit, wgmma_fence,
                                        wgmma_keep, wgmma_wait0, wgmma_wait1)
from andrea_numba.kernels.wgmma_mn import ALIGN, DYNAMIC_LIMIT, MN_BLOCK, _product, operand_layout
from andrea_numba.kernels.wgmma_tile import WARPGROUP
from andrea_numba.kernels.wgmma_tma import BK, _store_tile, tile_bytes, units_grid

if SIMULATOR:
    from andrea_numba.kernels.ptx import warp_gather       # a warp's meeting point in the simulator (shfl's twin)
    from andrea_numba.kernels.wgmma_tma import _fragment_cells
else:                                       # the code generators of the intrinsics below
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.cuda.extending import intrinsic
    from andrea_numba.kernels.wgmma_tma import _fragment_pairs, _pairs_ok, _vector2

FULL = 0xFFFFFFFF                # every lane of a warp (syncwarp, shfl)


if SIMULATOR:
    _COUNT_LOCK = threading.Lock()

    def warp_last(counts, slot, S, w, lane):
        """Twin of warp_last: the warp's 32 lanes meet (syncwarp), lane 0 counts (an atomic add, here
        under a lock) and resets at S, every lane gets its count (shfl)."""
        warp_gather(0, w, lane)
        seen = 0
        if lane == 0:
            with _COUNT_LOCK:
                seen = int(counts[slot])
                counts[slot] = 0 if seen == S - 1 else seen + 1
        return int(warp_gather(seen, w, lane)[0]) == S - 1

    def _store_fused(NREG, kind, pair):
        def store_fused(out, aux, d, r0, c0):
            """Twin of the fused epilogues (point 5), one value at a time: "gelu": out = d and
            aux = the low half of pair(d, 0); "dgelu": aux = the low half of pair(d, 0, out, 0)."""
            for r, row, col in _fragment_cells(NREG, r0, c0, out.shape):
                if kind == "gelu":
                    out[row, col] = d[r]
                    word = pair(d[r], np.float32(0))
                else:
                    word = pair(d[r], np.float32(0), out[row, col], np.float32(0))
                aux[row, col] = np.uint16(np.int32(word).view(np.uint32) & np.uint32(0xFFFF))
        return store_fused
else:
    @cuda.jit(device=True, inline="always")
    def warp_last(counts, slot, S, w, lane):
        """Point 6: whether this warp is the last of the S slices to store its cells of the tile.
        Every lane's partial cells visible GPU-wide (threadfence) before any lane counts (syncwarp);
        lane 0 adds 1 to counts[slot] (an integer atomic: the old value back) and, the last, sets it
        back to 0; the old value goes to every lane (shfl); the last fences again before it reads.
        PTX: membar.gl; bar.warp.sync; atom.global.add.u32; shfl.sync.idx.b32"""
        cuda.threadfence()
        cuda.syncwarp(FULL)
        seen = 0
        if lane == 0:
            seen = cuda.atomic.add(counts, slot, 1)
            if seen == S - 1:
                counts[slot] = 0
        last = cuda.shfl_sync(FULL, seen, 0) == S - 1
        if last:
            cuda.threadfence()
        return last

    @functools.cache
    def _store_fused(NREG, kind, pair):
        """The fused epilogue (point 5) as an intrinsic store_fused(out, aux, d, r0, c0): for every
        accumulator pair (c = 0, 1 of a row, as _store_d's) inside out, "gelu": out = d (fp32) and
        aux = pair(d0, d1) (an int32 of two bf16: aux is uint16 [M, N]); "dgelu": aux = pair(d0, d1,
        z0, z1) with z = out (read: h_pre). pair is a Python function compiled into the code here
        (context.compile_internal). Where the pair is not whole (N odd, the last column) or the
        rows are not 4-byte aligned, value by value with pair(x, 0[, z, 0])'s low half."""
        f32, i32 = types.float32, types.int32
        pair_sig = i32(f32, f32) if kind == "gelu" else i32(f32, f32, f32, f32)

        def typer(typingctx, out, aux, d, r0, c0):
            ok = (isinstance(out, types.Array) and out.ndim == 2 and out.dtype == types.float32 and out.layout == "C"
                  and isinstance(aux, types.Array) and aux.ndim == 2 and aux.dtype == types.uint16 and aux.layout == "C"
                  and isinstance(d, types.UniTuple) and d.dtype == types.float32 and d.count == NREG)
            if not ok:
                return None

            def codegen(context, builder, sig, args):
                o = context.make_array(sig.args[0])(context, builder, args[0])
                a = context.make_array(sig.args[1])(context, builder, args[1])
                oshape, ostrides = cgutils.unpack_tuple(builder, o.shape, 2), cgutils.unpack_tuple(builder, o.strides, 2)
                ashape, astrides = cgutils.unpack_tuple(builder, a.shape, 2), cgutils.unpack_tuple(builder, a.strides, 2)
                row0 = context.cast(builder, args[3], sig.args[3], types.intp)
                col0 = context.cast(builder, args[4], sig.args[4], types.intp)
                pairs_ok = _pairs_ok(builder, context.get_value_type(types.intp), oshape[1], [(o.data, 7), (a.data, 3)])
                fzero, I32 = ir.Constant(ir.FloatType(), 0.0), ir.IntType(32)

                def word(xs, zs):
                    return context.compile_internal(builder, pair, pair_sig, list(xs) + list(zs) if zs else list(xs))

                def at(row, col):                    # (out's element, aux's element)
                    return (cgutils.get_item_pointer2(context, builder, o.data, oshape, ostrides, "C", [row, col]),
                            cgutils.get_item_pointer2(context, builder, a.data, ashape, astrides, "C", [row, col]))

                for row, col, col1, in_row, both, x0, x1 in _fragment_pairs(context, builder, args[2], NREG,
                                                                             row0, col0, oshape):
                    with builder.if_else(builder.and_(both, pairs_ok), likely=True) as (whole, single):
                        with whole:
                            op, ap = at(row, col)
                            vp = builder.bitcast(op, ir.VectorType(ir.FloatType(), 2).as_pointer())
                            if kind == "gelu":
                                builder.store(_vector2(x0, x1, builder), vp, align=8)
                                w = word((x0, x1), None)
                            else:
                                z = builder.load(vp, align=8)
                                w = word((x0, x1), (builder.extract_element(z, ir.Constant(I32, 0)),
                                                    builder.extract_element(z, ir.Constant(I32, 1))))
                            builder.store(w, builder.bitcast(ap, I32.as_pointer()), align=4)
                        with single:
                            for cc, x in ((col, x0), (col1, x1)):
                                with builder.if_then(builder.and_(in_row, builder.icmp_signed("<", cc, oshape[1]))):
                                    op, ap = at(row, cc)
                                    if kind == "gelu":
                                        builder.store(x, op)
                                        w = word((x, fzero), None)
                                    else:
                                        w = word((x, fzero), (builder.load(op), fzero))
                                    builder.store(builder.trunc(w, ir.IntType(16)), ap)
                return context.get_dummy_value()
            return types.void(out, aux, d, r0, c0), codegen
        typer.__name__ = f"store_{kind}"
        return intrinsic(typer)


def make_tma_kernel(BM, BN, stages, trans_a, trans_b, epilogue=None, fixup=0):
    """The v18 kernel for out (+)= op(a16) @ op(b16) (a16 [M, K] or [K, M] when trans_a, b16 [K, N]
    or [N, K] when trans_b: bf16 copies as stored), BM x BN tiles, `stages` in the ring:
    k(out, part, a16, b16, tmap_a, tmap_b, accumulate, ksplit), tmap_*: the tensor maps' addresses
    (tma.TMAPS: boxes of BM or BN rows for a K-major operand, BK rows for an MN-major one); part
    [S, M, N]: S = 1 (out itself, viewed [1, M, N]) or the split-K slices; counts: int32, a counter
    for each (tile, consumer warp) of a split product, all 0 (fixup 1 or 2: v19 or v23 adds the
    slices itself, point 6; 0: v18 leaves them to k_splitk_sum and never reads counts)."""
    C = BM // 64                                             # consumer warpgroups
    # who lets go of a stage: one lane a consumer warp on a GPU (after wgmma.wait_group, a
    # .sync.aligned instruction, all 32 lanes have passed the stage's wait); in the simulator, where
    # a warp's threads do not run in step, every consumer thread for itself
    RELEASERS = C * WARPGROUP if SIMULATOR else 4 * C
    WARPS_C = 4 * C                                          # consumer warps (a counter each, point 6)
    NREG = BN // 2                                           # accumulators a consumer thread
    LANE_MASK = 0 if SIMULATOR else WARP - 1                # lane & LANE_MASK == 0: this thread arrives
    PRODUCER = C * WARPGROUP                                 # the thread that issues the copies
    THREADS = PRODUCER + WARP
    A_MN, B_MN = bool(trans_a), not trans_b                  # wgmma's imm-trans-a, imm-trans-b (wgmma_mn.py, point 1)
    A_STEP, A_LBO, A_SBO, A_SWZ = operand_layout(A_MN, BK)
    B_STEP, B_LBO, B_SBO, B_SWZ = operand_layout(B_MN, BK)
    A_STEP, B_STEP = A_STEP // 4, B_STEP // 4                # in 32-bit words of the ring
    A_WORDS, B_WORDS = BM * BK // 2, BN * BK // 2
    STAGE_WORDS = A_WORDS + B_WORDS
    STAGE_BYTES = 4 * STAGE_WORDS
    WG_WORDS = 64 * BK // 2                                  # a warpgroup's 64 rows (or column block) of A
    BLOCK_WORDS = BK * 128 // 4                              # one 64-wide column block of an MN-major tile
    KSTEPS = BK // 16
    BARRIERS = 2 * stages                                    # full[0 .. stages - 1], empty[...]
    A_ROWS, B_ROWS = (BK if A_MN else BM), (BK if B_MN else BN)   # each box's rows (its tensor map's)
    A_BOXES, B_BOXES = (BM // MN_BLOCK if A_MN else 1), (BN // MN_BLOCK if B_MN else 1)
    product = _product(BN, int(A_MN), int(B_MN))
    store_tile = _store_tile(NREG)
    if epilogue is None:                                     # out (+)= d: every product
        def _plain(out, aux, d, r0, c0, accumulate):
            store_tile(out, d, r0, c0, accumulate)
        store = _plain if SIMULATOR else cuda.jit(device=True, inline="always")(_plain)
    else:                                                    # ("gelu" | "dgelu", pair): point 5
        fused = _store_fused(BN // 2, *epilogue)

        def _fused(out, aux, d, r0, c0, accumulate):
            fused(out, aux, d, r0, c0)
        store = _fused if SIMULATOR else cuda.jit(device=True, inline="always")(_fused)
    assert BM % 64 == 0 and BN % 64 == 0 and BN <= 256 and BM <= 256, (BM, BN)
    assert stages >= 2 and tile_bytes(BM, BN, stages) <= DYNAMIC_LIMIT, (BM, BN, stages)

    @cuda.jit(device=True)
    def load(ring, at, g, tmap, r0, k0, bars, st, MN, ROWS, BOXES):
        """Start the copy of one operand's stage tile (rows r0.. of m or n, k0.. of k) at word at:
        one K-major box (ROWS = BM or BN rows of 64 k), or BOXES MN-major column blocks (64 m or n
        wide, ROWS = BK rows of k) BLOCK_WORDS apart."""
        for j in range(BOXES):
            if MN:
                tma_load_2d(ring, at + j * BLOCK_WORDS, g, tmap, r0 + MN_BLOCK * j, k0, ROWS, bars, st)
            else:
                tma_load_2d(ring, at, g, tmap, k0, r0, ROWS, bars, st)

    @cuda.jit(device=True)
    def unit_range(u, tiles, tiles_m, tiles_n, ksplit, K):
        """(row0, col0, kb, ke, z) of work unit u (point 3): tiles in the order that keeps the
        operand with more tiles in L2, the tile index along the shorter side running fastest."""
        z, t = u // tiles, u % tiles
        kb = z * ksplit
        if tiles_m <= tiles_n:                               # down a column of tiles: B's tile is reused
            tm, tn = t % tiles_m, t // tiles_m
        else:                                                # along a row of tiles: A's tile is reused
            tm, tn = t // tiles_n, t % tiles_n
        return tm * BM, tn * BN, kb, min(K, kb + ksplit), z

    @cuda.jit(device=True)
    def produce(ring, at0, bars, a, b, tmap_a, tmap_b, units, tiles, tiles_m, tiles_n, ksplit, K):
        fence_tensormap(tmap_a)                              # the maps were written from the host
        fence_tensormap(tmap_b)
        g = 0
        for u in range(cuda.blockIdx.x, units, cuda.gridDim.x):
            row0, col0, kb, ke, z = unit_range(u, tiles, tiles_m, tiles_n, ksplit, K)
            for k0 in range(kb, ke, BK):
                st = g % stages
                while not mbar_try_wait(bars, stages + st, ((g // stages) & 1) ^ 1):
                    pass                                     # empty[st]: its last use is done
                mbar_expect_tx(bars, st, STAGE_BYTES)        # full[st]: my arrival, the bytes to come
                base = at0 + st * STAGE_WORDS
                load(ring, base, a, tmap_a, row0, k0, bars, st, A_MN, A_ROWS, A_BOXES)
                load(ring, base + A_WORDS, b, tmap_b, col0, k0, bars, st, B_MN, B_ROWS, B_BOXES)
                g += 1

    @cuda.jit(device=True, inline="always")
    def cell(r0, c0, r):
        """(row, column) of accumulator d[r] = d[4 j + 2 h + c]: row r0 + 8 h, column c0 + 8 j + c (point 4)."""
        return r0 + 8 * ((r >> 1) & 1), c0 + 8 * (r >> 2) + (r & 1)

    @cuda.jit(device=True, inline="always")
    def put(out, row, col, v, accumulate):
        """out[row, col] (+)= v."""
        if accumulate:
            out[row, col] += v
        else:
            out[row, col] = v

    @cuda.jit(device=True)
    def sum_slices(out, part, r0, c0, accumulate):
        """Point 6: out (+)= part[0] + part[1] + ... + part[S - 1] at this thread's cells (its
        accumulators' rows and columns, point 4), in k_splitk_sum's order."""
        M, N = out.shape
        for r in range(NREG):
            row, col = cell(r0, c0, r)
            if row < M and col < N:
                v = part[0, row, col]
                for z in range(1, part.shape[0]):
                    v += part[z, row, col]
                put(out, row, col, v, accumulate)

    SMAX, PAIRS = 8, 2                                       # v23: slices and accumulator pairs a batch
    XSHAPE, PQ = (SMAX, 2 * PAIRS), 2 * PAIRS                # (constants for cuda.local.array)

    @cuda.jit(device=True)
    def sum_slices_batched(out, part, r0, c0, accumulate):
        """Point 6, v23: sum_slices' sums (the same order) with the loads of PAIRS accumulator pairs
        x up to SMAX slices issued before any add. x[z, 2 p + c]: slice z0 + z, pair p, column c."""
        M, N = out.shape
        S = part.shape[0]
        x = cuda.local.array(XSHAPE, float32)
        v = cuda.local.array(PQ, float32)
        for r in range(0, NREG, 2 * PAIRS):              # accumulators r .. r + 2 PAIRS - 1
            for z0 in range(0, S, SMAX):
                for z in range(SMAX):                    # the loads: independent, all in flight
                    for q in range(2 * PAIRS):
                        row, col = cell(r0, c0, r + q)
                        if z0 + z < S and row < M and col < N:
                            x[z, q] = part[z0 + z, row, col]
                for q in range(2 * PAIRS):               # the adds, in slice order
                    if z0 == 0:
                        v[q] = x[0, q]
                    else:
                        v[q] += x[0, q]
                    for z in range(1, SMAX):
                        if z0 + z < S:
                            v[q] += x[z, q]
            for q in range(2 * PAIRS):
                row, col = cell(r0, c0, r + q)
                if row < M and col < N:
                    put(out, row, col, v[q], accumulate)

    @cuda.jit(device=True)
    def consume(ring, at0, bars, out, part, aux, accumulate, units, tiles, tiles_m, tiles_n, ksplit, K, counts):
        tid = cuda.threadIdx.x
        wg, warp, lane = tid // WARPGROUP, tid // WARP, tid % WARP
        g = 0
        for u in range(cuda.blockIdx.x, units, cuda.gridDim.x):
            row0, col0, kb, ke, z = unit_range(u, tiles, tiles_m, tiles_n, ksplit, K)
            n = (ke - kb + BK - 1) // BK
            d = wgmma_keep(wgmma_acc_zeros(BN))              # zeros set before the first fence
            for s in range(n):
                st = g % stages
                while not mbar_try_wait(bars, st, (g // stages) & 1):
                    pass                                     # full[st]: the bytes of use g are in
                at_a = at0 + st * STAGE_WORDS + wg * WG_WORDS
                at_b = at0 + st * STAGE_WORDS + A_WORDS
                wgmma_fence()
                for ks in range(KSTEPS):
                    d = product(d, ring, smem_desc(ring, at_a + ks * A_STEP, A_LBO, A_SBO, A_SWZ),
                                smem_desc(ring, at_b + ks * B_STEP, B_LBO, B_SBO, B_SWZ))
                wgmma_commit()
                wgmma_wait1()                                # use g - 1's wgmmas are complete
                d = wgmma_keep(d)
                if s > 0 and (lane & LANE_MASK) == 0:
                    mbar_arrive(bars, stages + (g - 1) % stages)
                g += 1
            wgmma_wait0()
            d = wgmma_keep(d)
            if n > 0 and (lane & LANE_MASK) == 0:
                mbar_arrive(bars, stages + (g - 1) % stages)
            r0, c0 = row0 + 16 * warp + (lane >> 2), col0 + 2 * (lane & 3)
            if part.shape[0] == 1:
                store(out, aux, d, r0, c0, accumulate)
            else:
                store_tile(part[z], d, r0, c0, False)
                if fixup and warp_last(counts, (u % tiles) * WARPS_C + warp, part.shape[0], warp, lane):
                    if fixup == 2:                                  # the last slice's warp: point 6
                        sum_slices_batched(out, part, r0, c0, accumulate)
                    else:
                        sum_slices(out, part, r0, c0, accumulate)

    def k_matmul(out, part, a, b, tmap_a, tmap_b, accumulate, ksplit, aux, counts):
        ring = cuda.shared.array(0, float32)
        at0 = ((ALIGN - (shared_address(ring, 0) & (ALIGN - 1))) & (ALIGN - 1)) // 4   # the ring's first word
        bars = cuda.shared.array(BARRIERS, int64, alignment=8)     # full[st] = bars[st], empty[st] = bars[stages + st]
        M, N = out.shape
        K = a.shape[0] if trans_a else a.shape[1]
        tiles_m, tiles_n = (M + BM - 1) // BM, (N + BN - 1) // BN
        tiles = tiles_m * tiles_n
        units = tiles * part.shape[0]
        tid = cuda.threadIdx.x
        if tid == 0:
            for st in range(stages):
                mbar_init(bars, st, 1)
                mbar_init(bars, stages + st, RELEASERS)
            mbar_fence_init()
        cuda.syncthreads()
        if tid == PRODUCER:
            produce(ring, at0, bars, a, b, tmap_a, tmap_b, units, tiles, tiles_m, tiles_n, ksplit, K)
        elif tid < PRODUCER:
            consume(ring, at0, bars, out, part, aux, accumulate, units, tiles, tiles_m, tiles_n, ksplit, K, counts)

    k_matmul.__doc__ = (f"Persistent {BM} x {BN} tiles of out (+)= op(a) @ op(b) on wgmma, {C} consumer warpgroups "
                        f"and a TMA producer warp over a ring of {stages} stages (kernels/wgmma_tma.py).")
    k_matmul.__name__ = k_matmul.__qualname__ = f"k_matmul_v{(18, 19, 23)[fixup]}"     # fixup 0, 1, 2: v18, v19, v23
    return k_matmul, THREADS



def fixup_counters(M, N, BM, BN) -> int:
    """The counters a split product's fixup uses (point 6): one a (tile, consumer warp)."""
    return cdiv(M, BM) * cdiv(N, BN) * 4 * (BM // 64)


@functools.cache
def tma_kernel(BM, BN, stages, trans_a, trans_b, epilogue=None, fixup=0):
    """(the compiled-on-demand kernel, threads a block) for one v18 tile, form and epilogue (fixup 1,
    2: v19's, v23's), cached."""
    k, threads = make_tma_kernel(BM, BN, stages, trans_a, trans_b, epilogue, fixup)
    if SIMULATOR:
        return cuda.jit(k), threads
    # .maxntid threads, .minnctapersm 1: ptxas keeps to the registers that let one block of
    # `threads` run (224 a thread at 288 threads: 128 accumulators at BN = 256 and room to spare)
    return cuda.jit(k, launch_bounds=(threads, 1)), threads


class SplitKCounts:
    """The split-K fixup's counters (point 6): an int32 for each (tile, consumer warp) of a split
    product, all 0 between launches (the last warp of each sets its counter back). One array for
    every launch (they run in stream order), reserved at the first tma_product and by
    lab.matmul.tma_matmul (before a model that runs v19 or v23 is built, so never inside a graph
    capture). Only the fixup rungs (matmul v19, v23) count on it; the other flag sets take it unread."""
    SIZE = 1 << 14                  # 16384: 2048 tiles of 8 consumer warps (a split product has few)

    def __init__(self):
        self.buf = None

    def reserve(self):
        if self.buf is None:
            self.buf = cuda.to_device(np.zeros(self.SIZE, np.int32))
        return self.buf


COUNTS = SplitKCounts()


def tma_product(out, work, a, b, trans_a, trans_b, accumulate, block, stream, epilogue=None, aux=None, fixup=0):
    """matmul_bf16_wgmma's launch (matmul._tma_matmul) on the flag-built kernel. fixup 1, 2: the kernel
    adds its split-K slices itself (point 6: matmul v19 and v23); a fused epilogue (point 5: ("gelu" |
    "dgelu", pair) and its aux array: mlp v20) takes no split-K, and operands a tensor map cannot read
    raise (the caller checks lab.matmul.tma_fits first). At epilogue None and fixup 0: matmul v18,
    the engine's launch on the flag-built kernel."""
    M, N = out.shape
    K = a.shape[0] if trans_a else a.shape[1]
    a16, b16 = bf16_copies(a, b, stream)
    if not (map_fits(a16) and map_fits(b16)):             # the cp.async ring on the copies (used where they are)
        assert epilogue is None, "a fused epilogue needs operands a tensor map can read"
        MM.matmul_bf16_wgmma_cp_async(out, work, a16, b16, trans_a, trans_b, accumulate, stream=stream)
        return
    if epilogue is not None:
        work = None                                     # no split-K: the GELU needs the whole sum
    if block == MM.TMA_AUTO:
        block = MM.pick_tile(M, N, K, work, MM.sm_count())
    BM, BN, BK, stages = block
    trans_a, trans_b = bool(trans_a), bool(trans_b)
    kernel, threads = tma_kernel(BM, BN, stages, trans_a, trans_b, epilogue, fixup)
    counts = COUNTS.reserve()
    shared = tile_bytes(BM, BN, stages)
    tmap_a = TMAPS.address(a16, BK if trans_a else BM, stream)     # M-major: boxes of BK rows of k
    tmap_b = TMAPS.address(b16, BN if trans_b else BK, stream)     # K-major: boxes of BN rows of n
    aux = out if aux is None else aux
    args = (out, out.reshape(1, M, N), a16, b16, tmap_a, tmap_b, accumulate, K, aux, counts)
    compiled = MM.allow_shared(kernel, args, shared)
    resident = MM.RESIDENT_BLOCKS if compiled is None else compiled.max_cooperative_grid_blocks(threads, shared)
    S, ksplit = MM.splitk(M, N, K, 1, block, work, resident)
    part = work[:S * M * N].reshape(S, M, N) if S > 1 else out.reshape(1, M, N)
    if fixup and S > 1:
        assert fixup_counters(M, N, BM, BN) <= counts.shape[0], "split-K fixup: more tiles than counters"
    kernel[units_grid(M, N, S, BM, BN, resident), threads, stream, shared](
        out, part, a16, b16, tmap_a, tmap_b, accumulate, ksplit, aux, counts)
    if S > 1 and not fixup:
        MM.splitk_sum(out, part, accumulate, stream)
