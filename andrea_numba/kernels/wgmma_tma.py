"""k_matmul_bf16_wgmma: the product kernel of matmul_bf16_wgmma (the bf16-hopper recipe's products).

    out (+)= op(a16) @ op(b16)       a16, b16: bf16 copies (uint16 bit patterns) as stored, fp32 sums

Built the way Hopper's fast GEMMs are (CUTLASS's "warp-specialized" kernels), from the shared
layouts, descriptors and accumulators of matmul_bf16_wgmma_cp_async (kernels/wgmma_mn.py): a
producer warp copies each stage with TMA (kernels/tma.py), consumer warpgroups multiply it with
wgmma (kernels/wgmma.py), mbarriers pass the stages between them, and persistent blocks walk the
output tiles. The lab's rungs built on the same kernel with more flags (fused GELU epilogues, split-K
sums in the kernel) are in lab/wgmma_tma.py.

1. Roles. A block is C = BM / 64 consumer warpgroups plus one producer warp:

       threads 0 .. 128 C - 1       C consumer warpgroups: warpgroup wg owns rows 64 wg .. 64 wg + 63
                                    of the BM x BN tile, all BN columns (one m64nBNk16 wgmma a k16)
       thread 128 C                 the producer: issues every copy, nothing else
       threads 128 C + 1 .. + 31    the rest of the producer's warp: idle

   The producer copies with TMA: one instruction moves a whole box (a K-major tile of BM or BN rows
   of 64 k, or one 64-wide column block of an MN-major tile) into shared memory already swizzled,
   zeros past the matrix's edges. So no consumer thread spends an instruction on a copy.

2. The ring. STAGES stages of (BM + BN) x BK bf16 (BK = 64: 128-byte rows, wgmma_mn.py's layouts
   exactly: K-major rows or MN-major column blocks), in dynamic shared memory from a 1024-byte
   boundary (the swizzle's atom), A's tile first, then B's:

       stage st at word at0 + st STAGE_WORDS:   A [BM x 64]  (warpgroup wg's rows at + wg WG_WORDS)
                                                 B [BN x 64]  (at + A_WORDS)

   and two mbarriers a stage (tma.py, point 3): full[st] = bars[st] completes when the producer has
   announced the stage's bytes and they have landed; empty[st] = bars[STAGES + st] completes when
   all 4 C consumer warps have let go of it (lane 0 of each arrives; in the simulator, whose threads
   of a warp do not run in step, every consumer thread arrives for itself). Tile 128 x 256 with 4
   stages: 4 x 48 KiB = 192 KiB of the H200's 227.

       producer, use g of the ring (st = g % STAGES, parity (g // STAGES) & 1):
           wait empty[st] on parity ^ 1          (the consumers are done with the stage's last use)
           expect_tx full[st], stage bytes       (one arrival + the bytes to come)
           TMA A box(es), TMA B box(es) -> stage st, counted on full[st]
       consumer warpgroup, use g:
           wait full[st] on parity               (the stage's bytes are in shared memory)
           wgmma.fence; BK/16 wgmma; commit; wgmma.wait_group 1
           one lane a warp: arrive empty[(g - 1) % STAGES]   (use g - 1's wgmmas are complete)

   As in wgmma_mn.py's ring, one group of wgmmas stays in flight: a consumer lets go of a stage one
   use late. No block-wide barrier in the loop: the producer runs up to STAGES uses ahead of the
   slower warpgroup, each warpgroup runs as soon as its bytes are in.

3. Persistent blocks. The grid is one block per multiprocessor the kernel fits on (the occupancy
   API's count, units_grid), and block b computes work units b, b + grid, b + 2 grid, ... A unit is
   one output tile of one slice of K (split-K: unit u is tile t = u % tiles of slice u // tiles),
   and the tiles run along the shorter side first: with fewer tile rows than columns tile t is row
   t % tiles_m, column t // tiles_m (the blocks running at once share B's tiles, and A, the smaller,
   stays in L2: the 120M logits, 64 x 197 tiles, read the 77 MB of wte once instead of once a tile
   row), else row t // tiles_n, column t % tiles_n. Producer and consumers walk the same units, so
   the ring's use count g runs on across a block's tiles: while the consumers store tile i the
   producer already fills the ring with tile i + 1.

4. The epilogue. Each consumer thread stores its accumulators straight from registers (store_tile).
   The fragment layout of an m64nBNk16 wgmma (wgmma_tile.py): thread 32 w + 4 g + t of warpgroup wg
   (warp w, lane 4 g + t) holds BN / 2 accumulators

       d[4 j + 2 h + c] = row 64 wg + 16 w + g + 8 h, column 8 j + 2 t + c of the tile
                          (j = 0 .. BN/8 - 1, h = 0, 1, c = 0, 1)

   so the pair c = 0, 1 is two neighbours of a row, stored as one 64-bit access. Without split-K:
   out (+)= d. With it: the slice's partial tile part[z] = d, and matmul's k_splitk_sum adds the
   slices in order afterwards (no atomics).

Same sums as matmul_bf16_wgmma_cp_async (inputs rounded to bf16 ties to even, exact products,
wgmma's fp32 sums in the same k16 order within a stage, stages in order): its bits, at BN = 256 too
(lab/bench/v18_bits.py).

In the simulator the producer and the consumers are real threads of a real block: the mbarriers'
twins make them wait on each other (tma.py), the boxes are copied by NumPy, the wgmmas run
wgmma.py's twin. What the simulator cannot show is the speed, nor that the hardware's TMA and
mbarriers do what the PTX ISA says (lab/bench/gemm.py and the harness ask the H200).
"""
import functools

from numba import cuda, float32, int64

from .common import SIMULATOR, cdiv
from .tma import (mbar_arrive, mbar_expect_tx, mbar_fence_init, mbar_init, mbar_try_wait, tma_load_2d,
                  fence_tensormap)
from .wgmma import (shared_address, smem_desc, wgmma_acc_zeros, wgmma_commit, wgmma_fence, wgmma_keep, wgmma_wait0,
                    wgmma_wait1)
from .tile_loop import WARP
from .wgmma_mn import ALIGN, DYNAMIC_LIMIT, MN_BLOCK, _product, operand_layout
from .wgmma_tile import WARPGROUP

if not SIMULATOR:                           # the code generators of the intrinsics below
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.cuda.extending import intrinsic

BK = 64                 # values of k a stage: one 128-byte row (the 128-byte swizzle) a row of m or n


def tile_bytes(BM, BN, stages):
    """Dynamic shared memory of a launch: the ring plus 1 KiB to start it on a 1024-byte boundary."""
    return stages * (BM + BN) * 2 * BK + ALIGN


if SIMULATOR:
    def _fragment_cells(NREG, r0, c0, shape):
        """Twin of _fragment_pairs, a value at a time: (r, row, col) of each accumulator d[r] =
        d[4 j + 2 h + c] (row r0 + 8 h, column c0 + 8 j + c, point 4) that falls inside shape."""
        for r in range(NREG):
            row, col = r0 + 8 * ((r >> 1) & 1), c0 + 8 * (r >> 2) + (r & 1)
            if row < shape[0] and col < shape[1]:
                yield r, row, col

    def _store_tile(NREG):
        def store_tile(out, d, r0, c0, accumulate):
            """Twin: out[r0 + 8 h, c0 + 8 j + c] (+)= d[4 j + 2 h + c] where inside out."""
            for r, row, col in _fragment_cells(NREG, r0, c0, out.shape):
                out[row, col] = (out[row, col] + d[r]) if accumulate else d[r]
        return store_tile
else:
    def _pairs_ok(builder, intp, ncols, aligned):
        """i1: the pairs of a row may go as whole 64-bit (32-bit) accesses: ncols even and every
        (pointer, mask) of `aligned` on its boundary (pointer & mask == 0)."""
        zero = ir.Constant(intp, 0)
        ok = builder.icmp_unsigned("==", builder.and_(ncols, ir.Constant(intp, 1)), zero)
        for ptr, mask in aligned:
            ok = builder.and_(ok, builder.icmp_unsigned("==", builder.and_(builder.ptrtoint(ptr, intp),
                                                                          ir.Constant(intp, mask)), zero))
        return ok

    def _fragment_pairs(context, builder, d, nreg, row0, col0, shape):
        """The accumulator pairs of an m64nNk16 wgmma, straight-line (point 4: d[4 j + 2 h + c] is
        row r0 + 8 h, column c0 + 8 j + c; c0 is even): for each pair c = 0, 1 of a row, (row, col,
        col + 1, the row inside shape, both columns inside, d of c = 0, d of c = 1)."""
        one = ir.Constant(context.get_value_type(types.intp), 1)
        for r in range(0, nreg, 2):
            row = builder.add(row0, context.get_constant(types.intp, 8 * ((r >> 1) & 1)))
            col = builder.add(col0, context.get_constant(types.intp, 8 * (r >> 2)))
            col1 = builder.add(col, one)
            in_row = builder.icmp_signed("<", row, shape[0])
            both = builder.and_(in_row, builder.icmp_signed("<", col1, shape[1]))
            yield row, col, col1, in_row, both, builder.extract_value(d, r), builder.extract_value(d, r + 1)

    def _vector2(x0, x1, builder):
        """<2 x float> of x0, x1."""
        v2 = ir.VectorType(ir.FloatType(), 2)
        v = builder.insert_element(ir.Constant(v2, ir.Undefined), x0, ir.Constant(ir.IntType(32), 0))
        return builder.insert_element(v, x1, ir.Constant(ir.IntType(32), 1))

    @intrinsic
    def _store_d(typingctx, out, d, r0, c0, accumulate):
        """out[r0 + 8 h, c0 + 8 j + c] (+)= d[4 j + 2 h + c] for every accumulator of an m64nNk16
        wgmma that falls inside out (a C-contiguous float32 [M, N] array): straight-line code with
        constant register numbers (a loop over d[r] would compile to a switch per register). c0 is
        even, so the pair c = 0, 1 is two neighbours of a row: where N is even and out starts on an
        8-byte boundary each pair goes as one 64-bit access (a warp then writes 8 whole 32-byte
        sectors an instruction, not 8 halves), else (and at a last odd column) one value at a time.
        PTX: setp + @p ld/st.global.v2.f32 (or .f32) and add.f32, per pair of registers"""
        ok = (isinstance(out, types.Array) and out.ndim == 2 and out.dtype == types.float32 and out.layout == "C"
              and isinstance(d, types.UniTuple) and d.dtype == types.float32 and d.count % 4 == 0
              and isinstance(r0, types.Integer) and isinstance(c0, types.Integer))
        if not ok:
            return None

        def codegen(context, builder, sig, args):
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            shape = cgutils.unpack_tuple(builder, arr.shape, 2)
            strides = cgutils.unpack_tuple(builder, arr.strides, 2)
            row0 = context.cast(builder, args[2], sig.args[2], types.intp)
            col0 = context.cast(builder, args[3], sig.args[3], types.intp)
            acc = context.cast(builder, args[4], sig.args[4], types.boolean)
            pairs_ok = _pairs_ok(builder, context.get_value_type(types.intp), shape[1], [(arr.data, 7)])

            def put(ptr, v, align=None):             # *ptr (+)= v
                with builder.if_else(acc) as (add, put_):
                    with add:
                        builder.store(builder.fadd(builder.load(ptr, align=align), v), ptr, align=align)
                    with put_:
                        builder.store(v, ptr, align=align)

            def at(row, col):
                return cgutils.get_item_pointer2(context, builder, arr.data, shape, strides, "C", [row, col])

            for row, col, col1, in_row, both, x0, x1 in _fragment_pairs(context, builder, args[1], sig.args[1].count,
                                                                         row0, col0, shape):
                with builder.if_else(builder.and_(both, pairs_ok), likely=True) as (pair, single):
                    with pair:
                        put(builder.bitcast(at(row, col), ir.VectorType(ir.FloatType(), 2).as_pointer()),
                            _vector2(x0, x1, builder), align=8)
                    with single:
                        for cc, x in ((col, x0), (col1, x1)):
                            with builder.if_then(builder.and_(in_row, builder.icmp_signed("<", cc, shape[1]))):
                                put(at(row, cc), x)
            return context.get_dummy_value()
        return types.void(out, d, r0, c0, accumulate), codegen

    def _store_tile(NREG):
        """store_tile(out, d, r0, c0, accumulate) for BN / 2 = NREG accumulators: _store_d (it reads
        NREG from d's type)."""
        return _store_d


@functools.cache
def tma_kernel(BM, BN, stages, trans_a, trans_b):
    """(k_matmul_bf16_wgmma for a BM x BN tile with `stages` in the ring and one form, threads a
    block), compiled on demand and cached. The kernel:

        k_matmul_bf16_wgmma(out, part, a16, b16, tmap_a, tmap_b, accumulate, ksplit)

    out (+)= op(a16) @ op(b16) (a16 [M, K] or [K, M] when trans_a, b16 [K, N] or [N, K] when
    trans_b: bf16 copies as stored); tmap_*: the tensor maps' addresses (tma.TMAPS: boxes of BM or BN
    rows for a K-major operand, BK rows for an MN-major one); part [S, M, N]: out itself viewed
    [1, M, N], or the S split-K slices' partial tiles (point 4), each ksplit values of k."""
    C = BM // 64                                             # consumer warpgroups (point 1)
    # who lets go of a stage: one lane a consumer warp on a GPU (after wgmma.wait_group, a
    # .sync.aligned instruction, all 32 lanes have passed the stage's wait); in the simulator, where
    # a warp's threads do not run in step, every consumer thread for itself
    RELEASERS = C * WARPGROUP if SIMULATOR else 4 * C
    NREG = BN // 2                                           # accumulators a consumer thread (point 4)
    LANE_MASK = 0 if SIMULATOR else WARP - 1                # lane & LANE_MASK == 0: this thread arrives
    PRODUCER = C * WARPGROUP                                 # the thread that issues the copies
    THREADS = PRODUCER + WARP
    A_MN, B_MN = bool(trans_a), not trans_b                  # wgmma's imm-trans-a, imm-trans-b (wgmma_mn.py, point 1)
    A_STEP, A_LBO, A_SBO, A_SWZ = operand_layout(A_MN, BK)   # a k16 step's offset and descriptor fields
    B_STEP, B_LBO, B_SBO, B_SWZ = operand_layout(B_MN, BK)
    A_STEP, B_STEP = A_STEP // 4, B_STEP // 4                # in 32-bit words of the ring
    A_WORDS, B_WORDS = BM * BK // 2, BN * BK // 2            # a stage's A and B tiles (point 2)
    STAGE_WORDS = A_WORDS + B_WORDS
    STAGE_BYTES = 4 * STAGE_WORDS                            # what full[st] waits for
    WG_WORDS = 64 * BK // 2                                  # a warpgroup's 64 rows (or column block) of A
    BLOCK_WORDS = BK * 128 // 4                              # one 64-wide column block of an MN-major tile
    KSTEPS = BK // 16                                        # wgmmas a stage
    BARRIERS = 2 * stages                                    # full[0 .. stages - 1], empty[...]
    A_ROWS, B_ROWS = (BK if A_MN else BM), (BK if B_MN else BN)   # each box's rows (its tensor map's)
    A_BOXES, B_BOXES = (BM // MN_BLOCK if A_MN else 1), (BN // MN_BLOCK if B_MN else 1)
    product = _product(BN, int(A_MN), int(B_MN))             # d += A_k16 B_k16: one m64nBNk16 wgmma
    store_tile = _store_tile(NREG)
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
        """The producer thread (point 2): every stage of every unit of this block, into the ring."""
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

    @cuda.jit(device=True)
    def consume(ring, at0, bars, out, part, accumulate, units, tiles, tiles_m, tiles_n, ksplit, K):
        """A consumer thread (points 2 and 4): for each unit, the wgmmas of every stage of its slice
        of K into d, then d stored to out or to the slice's partial tile."""
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
            r0, c0 = row0 + 16 * warp + (lane >> 2), col0 + 2 * (lane & 3)     # d[0]'s cell (point 4)
            if part.shape[0] == 1:
                store_tile(out, d, r0, c0, accumulate)
            else:
                store_tile(part[z], d, r0, c0, False)

    def k_matmul_bf16_wgmma(out, part, a, b, tmap_a, tmap_b, accumulate, ksplit):
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
            consume(ring, at0, bars, out, part, accumulate, units, tiles, tiles_m, tiles_n, ksplit, K)

    k_matmul_bf16_wgmma.__doc__ = (f"Persistent {BM} x {BN} tiles of out (+)= op(a) @ op(b) on wgmma, {C} consumer "
                                   f"warpgroups and a TMA producer warp over a ring of {stages} stages "
                                   f"(kernels/wgmma_tma.py).")
    if SIMULATOR:
        return cuda.jit(k_matmul_bf16_wgmma), THREADS
    # .maxntid THREADS, .minnctapersm 1: ptxas keeps to the registers that let one block of
    # THREADS run (224 a thread at 288 threads: 128 accumulators at BN = 256 and room to spare)
    return cuda.jit(k_matmul_bf16_wgmma, launch_bounds=(THREADS, 1)), THREADS


def units_grid(M, N, S, BM, BN, resident):
    """Blocks of a launch (point 3): one per resident slot, never more than its work units."""
    return max(1, min(cdiv(M, BM) * cdiv(N, BN) * S, resident))
