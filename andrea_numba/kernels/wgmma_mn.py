"""wgmma on operands as they are stored: the product tile of matmul_bf16_wgmma_cp_async (family
"bf16_wgmma_cp_async"), whose layouts, descriptors and stage sizes matmul_bf16_wgmma (wgmma_tma.py)
copies its stages into with TMA.

Each operand is rounded to a bf16 copy as it is stored (the plain k_round_bf16 copy; an operand
that is bf16 already, uint16, is used where it is: half_tile.bf16_copies). wgmma reads A and B from
shared memory either K-major or, through the two immediates of its instruction, imm-trans-a and
imm-trans-b, M- and N-major (kernels/wgmma.py, "MN-major layouts"). So each stage tile is filled in
its operand's own orientation and wgmma is told which is which: no operand is copied transposed,
not even both operands of a weight gradient (dW += x^T @ dy: x [tokens, d] and dy [tokens, out],
K = tokens, both stored with k down their columns). The warpgroups, the accumulators and the
epilogue are wgmma_tile.py's, split-K is matmul's.

1. Which operand is read which way. out = op(a) @ op(b); matmul's trans flags say how a and b are
   stored, wgmma's immediates how its A and B lie in shared memory:

       matmul            a stored        A in shared memory   b stored      B in shared memory
       a @ b             [M, K]          K-major (trans 0)    [K, N]        N-major (trans 1)
       a @ b^T           [M, K]          K-major              [N, K]        K-major (trans 0)
       a^T @ b  (dW)     [K, M]          M-major (trans 1)    [K, N]        N-major
       a^T @ b^T         [K, M]          M-major              [N, K]        K-major

   so imm-trans-a = trans_a and imm-trans-b = not trans_b: a row of a stored tile (contiguous in
   global memory) is always a row of the shared tile. a @ b^T reads both K-major.

2. The K-major tile (wgmma.kmajor_offset): R rows (m or n) of BK values of k, 2 BK bytes a
   row, the 16-byte chunk q of row r at chunk q ^ (r & 7) (BK = 64: 128-byte rows, mode 1, SBO 1024;
   BK = 32: 64-byte rows, mode 2, SBO 512; LBO unused, 16). The k16 step ks starts 32 ks bytes
   into the rows.

3. The MN-major tile (wgmma.mnmajor_offset with W = 128): the R values of m (n) are cut into
   R / 64 column blocks of 64; block j holds m = 64 j .. 64 j + 63 for all BK values of k, one
   128-byte row per k (the 64 values of m in order), the 16-byte chunk q (m 8q .. 8q + 7 of the
   block) of row k stored at chunk q ^ (k & 7): the 128-byte swizzle, mode 1.

       byte of element (m, k) = (m // 64) 128 BK + swizzle(128 k + 2 (m % 64))

   An atom is 8 rows (k .. k + 7) x 64 values of m, 1024 bytes. The descriptor (mode 1):

       LBO = 128 BK   the next 64 values of m (n): the next column block (8192 bytes at BK = 64)
       SBO = 1024     the next 8 values of k: the next atom down the block

   (for a swizzled MN-major operand the "leading" offset runs along M/N and the "stride" offset
   along K: the other way round from K-major, wgmma.py says why). A k16 step is two atoms, so
   step ks starts 16 ks rows = 2048 ks bytes down: on a 1024-byte boundary, no start inside a row.
   Warpgroup wg's 64 rows of A are column block wg: its descriptor starts at A tile + wg 128 BK,
   which is the same byte offset as its 64 K-major rows (64 x 2 BK): the two layouts use the same
   bytes a tile, so a stage's size does not depend on the operands' orientation. B's descriptor
   spans all BN / 64 blocks (LBO apart). Each block is a BK x 64 tile of the stored copy with
   128-byte rows, and matmul_bf16's cp.async copier (half_tile._async_copier, rows of 8 chunks,
   chunk q of row r at q ^ (r & 7)) fills exactly this layout: the MN-major copier is that copier
   once per column block (_mn_copier). A warp's 32 lanes copy 4 stored rows of 128 bytes each
   (whole 128-byte segments of global memory), and 8 lanes write the 8 chunk positions of one
   128-byte line of shared memory: no bank conflict.

   The tile's widths: BM and BN multiples of 64 (the swizzle's 64 values a row; a narrower MN-major
   operand would need the 64- or 32-byte swizzle, which these tiles do not use).

4. The ring. One wgmma group stays in flight: after issuing step s's wgmmas a warpgroup waits
   only for step s - 1's (wgmma.wait_group 1), so step s's products run while the threads go on to
   the barrier, the copies and the wgmmas of step s + 1. The price: a stage is busy for one more step
   (step s's stage is read until the wait of step s + 1), so the copies run STAGES - 2 steps
   ahead instead of STAGES - 1, and the ring needs STAGES >= 3 (4 preferred).

   The ring lives in dynamic shared memory. Static shared arrays stop at 48 KiB; dynamic shared
   memory goes to 227 KiB on Hopper once the kernel asks for it (matmul.allow_shared: the driver's
   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, set once per compiled kernel). So the stages
   take BK = 64 (rows of 128 bytes: wgmma's 128-byte swizzle, four k16 steps a stage):

       tile (BM x BN, BK, STAGES)   a stage                 the ring             + alignment
       128 x 128, 64, 4             (128 + 128) 128 B = 32 KiB    128 KiB         + 1 KiB
       128 x 256, 64, 3             (128 + 256) 128 B = 48 KiB    144 KiB         + 1 KiB  (spills: not declared)
       128 x 128, 32, 3 (static)    (128 + 128)  64 B = 16 KiB     48 KiB         (a static ring)

   The dynamic array is only promised 16-byte alignment, and the 128-byte swizzle is computed on
   the absolute shared address (the pattern repeats every 1024 bytes): the ring starts at the first
   1024-byte boundary inside the array (pad = (-address) mod 1024 bytes, so 1 KiB is allocated
   extra). Every tile in it is a whole number of 1024-byte atoms (BM, BN multiples of 8 rows).

   The layout at BK = 64 (wgmma.py's docstring, mode 1). Row r of a tile is 128 bytes (k 0..63);
   its 16-byte chunk q (k 8q .. 8q + 7) is stored at chunk q ^ (r & 7): the copier with rows of 8
   chunks (half_tile._word(32)), which is wgmma.kmajor_offset(r, k, R, swizzle=1). Descriptors of
   two K-major operands:

       A of warpgroup wg, k16 step ks:  start = A tile + 64 wg * 128 + 32 ks,  SBO = 1024, LBO = 16, mode 1
       B, k16 step ks:                  start = B tile + 32 ks,                SBO = 1024, LBO = 16, mode 1

   (ks = 0..3: the start moves 32 bytes along the unswizzled row; the hardware XORs the addresses it
   computes.) At BK = 32: 64-byte rows, mode 2, SBO = 512, ks = 0, 1.

5. One step of the K loop (every thread runs each line; P = STAGES - 2 steps of copies ahead):

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

6. Edges. Past M, N, K (and past the end of a split-K slice) the copier writes zeros; a stored
   row that is not whole 16-byte chunks (its length not a multiple of 8, or its start off a 16-byte
   boundary) takes the copier's guarded path of 2-byte loads. For an MN-major operand the stored
   row runs along M (N), so M % 8 != 0 (not K % 8) sends it there.

The simulator runs wgmma.py's twin, wgmma_warpgroup, on the shared array's bytes with the same
descriptors and the transpose bits (it reads an MN-major operand through mnmajor_read_addresses),
and does every copy at once: it checks the copier, the swizzle, the descriptors, the transpose
bits and the ring's stage arithmetic against each other, not the asynchrony (the waits and fences
are no-ops there; its dynamic shared array starts at address 0, so pad = 0). What it cannot check
is that the hardware reads MN-major tiles as the PTX ISA says, which lab/bench/wgmma_probe.py's
mn_* variants ask the H200.
"""
import functools

import numpy as np
from numba import cuda, float32

from .common import SIMULATOR
from .half_tile import BK_HALF, async_resolve
from .ptx import CP_ASYNC_WAIT, cp_async_commit
from .warp_tile import fragment_tile
from .wgmma import (SWIZZLE_64B, SWIZZLE_128B, fence_proxy_async, mnmajor_lbo_sbo, mnmajor_step_offset,
                    shared_address, smem_desc, wgmma_acc_zeros, wgmma_bf16_trans, wgmma_commit, wgmma_fence,
                    wgmma_keep, wgmma_wait0, wgmma_wait1, wgmma_warpgroup)
from .wgmma_tile import WARPGROUP, _copier, _fragment_add

MN_BLOCK = 64              # values of m (n) in one 128-byte row of an MN-major tile: a column block
MN_SWIZZLE = SWIZZLE_128B  # the MN-major tiles' swizzle (point 3)

# The ring (point 4), which matmul_bf16_wgmma sizes its stages by too: its limits, its K-major
# layouts, its bytes and the tile's checks (ring_tile).
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
    """The dynamic shared memory a launch of this tile asks for: 0 for BK = 32 (a static ring),
    else the ring + 1 KiB to start it on a 1024-byte boundary."""
    return 0 if BK == BK_HALF else ring_bytes(BM, BN, BK, stages) + ALIGN


def _mn_copier(R, BK, THREADS, vec):
    """copy(s, g, r0, k0, rlim, klim): start copying the R x BK piece of op(g) at m (n) r0.., k0.. of an
    MN-major bf16 copy g (uint16 [K, rows]: k down the stored rows) into the stage tile s (point 3:
    R / 64 column blocks of BK rows of 128 bytes), zeros past m (n) >= rlim or k >= klim. Block j is
    the K-major copier (wgmma_tile._copier, a BK-row x 64-column tile of g) at stored rows k0.., columns
    r0 + 64 j ..; the same argument order as the K-major copier, so the pipeline loads either."""
    BLOCK_WORDS = BK * 128 // 4                       # one column block: BK rows of 128 bytes
    block = _copier(BK, THREADS, vec, MN_BLOCK)       # rows k, 64 columns (m or n) of g

    @cuda.jit(device=True)
    def copy(s, g, r0, k0, rlim, klim):
        for j in range(R // MN_BLOCK):
            block(s[j * BLOCK_WORDS:(j + 1) * BLOCK_WORDS], g, k0, r0 + j * MN_BLOCK, klim, rlim)
    return copy


def operand_layout(mn_major, BK):
    """(step bytes, LBO, SBO, swizzle) of one operand's stage tile: where its k16 step ks starts
    (start + ks * step) and its descriptor's offsets and mode (points 2 and 3)."""
    if mn_major:
        return (mnmajor_step_offset(1, MN_SWIZZLE), *mnmajor_lbo_sbo(BK, MN_SWIZZLE), MN_SWIZZLE)
    row, swizzle, sbo = LAYOUT[BK]
    return 32, LBO, sbo, swizzle


def _operand_copier(mn_major, R, BK, THREADS, vec):
    """The copier of one operand's R x BK stage tile: copy(s, g, r0, k0, rlim, klim) either way."""
    return _mn_copier(R, BK, THREADS, vec) if mn_major else _copier(R, THREADS, vec, BK)


if SIMULATOR:
    def _product(N, TA, TB):
        @cuda.jit(device=True)      # a (fake) device function: the twin reads cuda.threadIdx
        def product(d, ring, desc_a, desc_b):
            """Twin of d = wgmma_bf16_trans(d, desc_a, desc_b, 1, TA, TB): the warpgroup's product
            from the shared array's bytes, this thread's row of registers added to d in fp32."""
            regs = wgmma_warpgroup(ring, desc_a, desc_b, N, trans_a=TA, trans_b=TB)[cuda.threadIdx.x % WARPGROUP]
            return tuple(np.float32(x + y) for x, y in zip(d, regs))
        return product
else:
    def _product(N, TA, TB):
        @cuda.jit(device=True, inline="always")
        def product(d, ring, desc_a, desc_b):
            """d += A @ B of one k16 step (scale_d = 1), A M-major when TA, B N-major when TB (the
            wgmma's immediates: constants of this function); read d only after the commit and wait."""
            return wgmma_bf16_trans(d, desc_a, desc_b, 1, TA, TB)
        return product


def make_mn_pipeline(BM, BN, BK, THREADS, stages, vec, trans_a, trans_b):
    """tile_mma(acc, a16, b16, kb, ke): acc += this thread's share of op(a16) @ op(b16) over k in
    [kb, ke), the bf16 copies as stored (a16 [M, K], or [K, M] when trans_a; b16 [K, N], or [N, K]
    when trans_b), through the ring (points 4 and 5): `stages` shared stages filled by cp.async,
    one group of wgmmas in flight. A is read M-major when trans_a, B N-major when not trans_b
    (point 1). (The lab's matmul v15 runs it with both K-major: lab/wgmma_ring.py.)"""
    A_MN, B_MN = bool(trans_a), not trans_b                     # wgmma's imm-trans-a, imm-trans-b
    A_STEP, A_LBO, A_SBO, A_SWZ = operand_layout(A_MN, BK)
    B_STEP, B_LBO, B_SBO, B_SWZ = operand_layout(B_MN, BK)
    A_STEP, B_STEP = A_STEP // 4, B_STEP // 4                   # in 32-bit words of the ring
    A_WORDS, B_WORDS = BM * BK // 2, BN * BK // 2               # words of each tile (2 BK bytes a row of m or n)
    STAGE_WORDS = A_WORDS + B_WORDS
    RING_WORDS = stages * STAGE_WORDS
    WG_WORDS = 64 * BK // 2                                     # a warpgroup's 64 m: 64 rows or one block
    KSTEPS = BK // 16
    AHEAD = stages - 2                                          # steps of copies ahead (P)
    dynamic = dynamic_bytes(BM, BN, BK, stages) > 0
    copy_a = _operand_copier(A_MN, BM, BK, THREADS, vec)
    copy_b = _operand_copier(B_MN, BN, BK, THREADS, vec)
    product = _product(BN, int(A_MN), int(B_MN))
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
            """A static ring (BK = 32), aligned by its declaration."""
            return cuda.shared.array(RING_WORDS, float32, alignment=ALIGN), 0

    @cuda.jit(device=True)
    def load(ring, base, a, b, k0, ke, row0, col0, M, N):
        """Start the copies of the stage at k0 into the stage at word `base`: A's m row0.., B's n col0.."""
        copy_a(ring[base:base + A_WORDS], a, row0, k0, M, ke)
        copy_b(ring[base + A_WORDS:base + STAGE_WORDS], b, col0, k0, N, ke)

    @cuda.jit(device=True)
    def tile_mma(acc, a, b, kb, ke):
        ring, at0 = ring_array()                                # stage st at word at0 + st * STAGE_WORDS
        wg = cuda.threadIdx.x // WARPGROUP
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        M = a.shape[1] if A_MN else a.shape[0]                  # a stored [K, M] or [M, K]
        N = b.shape[1] if B_MN else b.shape[0]                  # b stored [K, N] or [N, K]
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
            nxt = s + AHEAD                                     # refill stage (s - 2) % stages
            if nxt < n_steps:
                load(ring, at0 + (nxt % stages) * STAGE_WORDS, a, b, kb + nxt * BK, ke, row0, col0, M, N)
            cp_async_commit()                                   # one group a step, empty or not
            at_a = at0 + (s % stages) * STAGE_WORDS + wg * WG_WORDS   # this warpgroup's 64 m of A
            at_b = at0 + (s % stages) * STAGE_WORDS + A_WORDS         # all BN n of B
            wgmma_fence()
            for ks in range(KSTEPS):                            # k 16 ks .. 16 ks + 15 of the stage
                d = product(d, ring, smem_desc(ring, at_a + ks * A_STEP, A_LBO, A_SBO, A_SWZ),
                            smem_desc(ring, at_b + ks * B_STEP, B_LBO, B_SBO, B_SWZ))
            wgmma_commit()
            wgmma_wait1()                                       # step s - 1's group done; s's may run
            d = wgmma_keep(d)
        wgmma_wait0()                                           # the last group done: d may be read
        d = wgmma_keep(d)
        fragment_add(acc, d)
        wait_all()                                              # only empty groups remain
        cuda.syncthreads()                                      # the ring may be refilled by a next call
    return tile_mma


def ring_tile(tile, version, pipelines):
    """The tile of a ring of wgmma stages (tile = (family, BM, BN, BK, 64, BN, vec, STAGES); version:
    the matmul rung, for the messages) after the checks every such tile shares: BK = 32 or 64,
    warpgroups of 64 rows, 3 to 5 stages, the ring within its shared memory. pipelines(BM, BN, BK,
    THREADS, stages, vec) gives the {(trans_a, trans_b): tile_mma} products; the accumulators' layout
    and epilogue (wgmma_tile.py, point 2: warp_tile.fragment_tile) around them, and SHARED."""
    family, BM, BN, BK, WM, WN, vec, stages = tile
    assert BK in LAYOUT, f"v{version} tiles take BK = 32 or 64, got {BK}"
    assert WM == 64 and WN == BN and BM % 64 == 0, f"tile {tile}: warpgroups of 64 rows x all BN columns"
    assert stages >= 3 and stages - 3 in CP_ASYNC_WAIT, f"{stages} stages: one wgmma group in flight needs 3 .. 5"
    shared = dynamic_bytes(BM, BN, BK, stages)
    if shared:
        assert shared <= DYNAMIC_LIMIT, f"tile {tile}: {shared} bytes of dynamic shared memory"
    else:
        assert ring_bytes(BM, BN, BK, stages) <= STATIC_LIMIT, f"tile {tile}: more than 48 KiB of static shared memory"
    THREADS = WARPGROUP * (BM // 64)
    t = fragment_tile(pipelines(BM, BN, BK, THREADS, stages, vec), BM, BN, BK, 16, BN, THREADS)
    t.SHARED = shared
    return t


def mn_resolve(block, a16, b16):
    """The full tile of a matmul_bf16_wgmma_cp_async launch: ("bf16_wgmma_cp_async", BM, BN, BK, WM,
    WN, vec, STAGES); vec when both copies' stored rows are whole 16-byte chunks (half_tile.async_resolve's
    rule, on the rows as stored); STAGES 4 unless the block names it."""
    return ("bf16_wgmma_cp_async", *block[:5], async_resolve(block, a16, b16)[6], block[5] if len(block) > 5 else 4)


@functools.cache
def make_mn_tile(tile):
    """Everything a kernel needs for one matmul_bf16_wgmma_cp_async tile (matmul.make_tile's names,
    and SHARED: the dynamic shared memory bytes its launch passes, 0 for a static ring), with the four
    products mma[(trans_a, trans_b)] on the bf16 copies as stored (half_tile.bf16_copies).
    tile = ("bf16_wgmma_cp_async", BM, BN, BK, 64, BN, vec, STAGES), BK = 32 or 64, BM and BN multiples of 64."""
    assert tile[0] == "bf16_wgmma_cp_async", tile
    assert tile[2] % MN_BLOCK == 0 and tile[2] <= 256, f"tile {tile}: BN a multiple of 64 (an MN-major row), at most 256"
    return ring_tile(tile, 17, lambda BM, BN, BK, THREADS, stages, vec:
                     {(ta, tb): make_mn_pipeline(BM, BN, BK, THREADS, stages, vec, ta, tb)
                      for ta in (False, True) for tb in (False, True)})
