"""bf16 tiles read by ldmatrix: the product tile of matmul_bf16 (family "bf16").

matmul_bf16 multiplies bf16 copies of its operands (each rounded once, ties to even: bf16_copies)
the way fast half-precision GEMMs do (cuBLAS, CUTLASS): shared memory holds bf16, 2 bytes a value,
in swizzled tiles that ldmatrix reads straight into the registers of the mma.sync fragments.
Inputs rounded to bf16, products exact, sums in fp32; the same bits at every run.

One stage (BK = 32 values of k) on its way, for each operand:

    bf16 copy    --cp.async-->      a stage of the ring in shared memory: 16-byte chunks (8 bf16),
                                    no register holds them, issued STAGES - 1 steps ahead (the
                                    ring: the comment above STAGES), each at its swizzled place
    barrier (one a step)
    shared bf16  --ldmatrix.x4-->   a warp's fragments: one instruction gives a 16 x 16 A fragment
                                    (a0..a3) or the B fragments (b0, b1) of two 16 x 8 tiles
                 --mma.sync m16n8k16--> fp32 sums of each 16 x 8 piece of the warp's tile

1. Shared tiles keep the orientation the operand has in global memory, so the copy is straight
   (stored rows to tile rows, consecutive threads along a row):
       a [M, K]   -> k-inner tile: BM rows (m) of BK = 32 bf16 (16 words, 64 bytes)
       a^T [K, M] -> k-outer tile: BK rows (k) of BM bf16 (BM / 2 words)
       b^T [N, K] -> k-inner tile: BN rows (n) of 32 bf16
       b [K, N]   -> k-outer tile: BK rows (k) of BN bf16
   ldmatrix reads 8 x 8 blocks whose rows are 16 contiguous bytes. A k-inner tile's 8 x 8 block
   has rows m (or n) and columns k, as the fragment wants them: plain ldmatrix. A k-outer tile's
   block has rows k and columns m (n): ldmatrix.trans hands each lane the same pairs (ptx.py).

2. Which lane points at which row (lane = 4 g + t, matrix i = lane >> 3, row lane & 7):
       A, 16 x 16 fragment at rows m0.., k0 = 16 ks:  matrix i -> a_i, rows m0 + 8 (i & 1) + 0..7,
                                                      k0 + 8 (i >> 1) + 0..7
       B, two 16 x 8 fragments at n0.., k0:           matrix i -> b_(i & 1) of tile n0 + 8 (i >> 1),
                                                      k0 + 8 (i & 1) + 0..7
   so for A lane bit 3 picks the +8 rows of m and lane bit 4 the +8 of k; for B bit 4 picks the
   +8 of n and bit 3 the +8 of k. In a k-inner tile a lane's row is m (n) = base + its 8-offset +
   (lane & 7) at the 16-byte chunk k / 8; in a k-outer tile it is k = k0 + its 8-offset + (lane & 7)
   at the chunk (base + its 8-offset) / 8.

3. The swizzle (bank arithmetic). Shared memory has 32 banks of 4 bytes: 128 bytes, eight 16-byte
   chunks, a line. A tile row of W words holds C = W / 4 chunks, and chunk q of row r is stored at
   chunk q ^ s(r) of that row with
       s(r) = (r >> log2(8 / X)) & (X - 1),    X = min(C, 8)
   k-outer tiles on the GPU have C = 8 or 16 (BM or BN = 64, 128): s(r) = r & 7. k-inner tiles have
   C = 4 (64-byte rows, two to a line): s(r) = (r >> 1) & 3.
   - ldmatrix reads a matrix's 8 rows of 16 bytes as one 128-byte request: free of conflicts when
     the 8 chunks land in 8 different chunk positions of the line (r W / 4 + q ^ s(r)) mod 8. For 8
     consecutive rows r = 8p .. 8p + 7 at one logical chunk q: C >= 8: (q ^ (r & 7)) mod 8 takes
     all 8 values. C = 4: r's parity picks the half line (4 (r & 1)) and q ^ ((r >> 1) & 3) the
     chunk within it: (r & 1, (r >> 1) & 3) runs through all 8 pairs. No conflict. (Without the
     swizzle a k-outer tile of 128 or 256-byte rows puts all 8 rows in one chunk position:
     8-way conflicts; a k-inner one, two-way.)
   - The copies: a 16-byte chunk is exactly the unit of the swizzle (logical chunk q of tile row r
     at chunk q ^ s(r)), and 8 consecutive lanes, one 128-byte request, write 8 different chunk
     positions of a line (_async_copier): no conflict.
   In the simulator's small tiles C can be 2 (16-wide tiles); the same formula serves.

4. The stage. A warp owns WM x WN of the block's tile (the warp layout of warp_tile.py, and the
   same outputs per lane: acc[2 mi + h, 2 ni + c] is row wm0 + 16 mi + 8 h + g, column
   wn0 + 8 ni + 2 t + c). It loads the stage's NI = WN / 8 B fragments of both k-steps (one
   ldmatrix.x4 for two fragments), then for each of the MI = WM / 16 rows of fragments the A
   fragment of both k-steps (one ldmatrix.x4 each) and, for each 16 x 8 piece, one mma.sync over
   k-step 0 from zero, one over k-step 1 chained on it, and one fp32 add of the stage's sum into
   acc (a chain of two inside the tensor core, not of all K: warp_tile.py measured a long chain
   drifting). Default tile 128 x 128 with 8 warps of 64 x 32: a warp issues 12 ldmatrix.x4 and
   32 mma.sync a stage (lab/bench/ptxcheck.py --v13 counts them in the PTX).

In the simulator (no ldmatrix, no mma.sync: warp instructions) the stage is a NumPy twin that
runs the GPU's instructions for the whole warp from the same shared words: every lane's ldmatrix
address from the same index functions (ptx.ldmatrix_warp), the fragments into ptx.mma_bf16_warp,
this lane's four results added into acc. It checks the copies, the swizzle, the lane addresses,
the fragment layouts and the edges; what it cannot check is that the GPU's ldmatrix and mma.sync
do what the PTX ISA says (the harness on a GPU does).
"""
import functools

import numpy as np
from numba import cuda, float32, int32

from .common import SIMULATOR, address, nonneg
from .operands import COPIES                        # the 16-bit copies' scratch (k_round_bf16)
from .ptx import CP_ASYNC_WAIT, cp_async16, cp_async_commit, ldmatrix_x4, ldmatrix_x4_trans, mma_bf16, store2
from .tile_loop import WARP, add_fragment, make_load
from .warp_tile import fragment_tile

if SIMULATOR:
    from .ptx import ldmatrix_warp, mma_bf16_warp     # the warp instructions' NumPy twins

BK_HALF = 32           # values of k a stage: two k-steps of 16; a k-inner row is 64 bytes of bf16


def _dev(f):
    """f as an inlined device function on a GPU; in the simulator the plain function, which also
    takes NumPy arrays of lanes (the stage's twin computes every lane's address at once)."""
    return f if SIMULATOR else cuda.jit(device=True, inline="always")(f)


def _word(W):
    """word(r, q): the word index of logical 16-byte chunk q of tile row r, rows of W words, with
    the swizzle of point 3 of the docstring: q is stored at q ^ s(r), s(r) = (r >> shift) & (X - 1)."""
    C = W // 4                                        # 16-byte chunks a row
    X = min(C, 8)
    assert C >= 1 and (C % 8 == 0 or 8 % C == 0), f"rows of {W} words"
    shift = {1: 3, 2: 2, 4: 1, 8: 0}[X]

    def word(r, q):
        return r * W + ((q ^ ((r >> shift) & (X - 1))) << 2)
    return _dev(word)


def _frag_index(k_inner, W, mn_bit, k_bit):
    """index(base, ks, lane): the word this lane hands to ldmatrix for the 16 x 16 block at rows
    (m or n) base.., k = 16 ks.. of a tile with rows of W words (point 2 of the docstring).
    mn_bit and k_bit: the lane bits that pick the +8 of m (n) and of k (A: 3, 4; B: 4, 3)."""
    word = _word(W)

    def index(base, ks, lane):
        mn = base + 8 * ((lane >> mn_bit) & 1)
        k = 16 * ks + 8 * ((lane >> k_bit) & 1)
        if k_inner:                                   # rows m (n), chunk k / 8
            return word(mn + (lane & 7), k >> 3)
        return word(k + (lane & 7), mn >> 3)          # rows k, chunk m / 8 (n / 8)
    return _dev(index)


def _stage(trans_a, trans_b, BM, BN, MI, NI):
    """stage(acc, sa, sb, wm0, wn0, g, t): acc += this thread's share of one stage's product, from
    the bf16 words of the shared tiles sa and sb (one stage each)."""
    a_index = _frag_index(not trans_a, BM // 2 if trans_a else BK_HALF // 2, 3, 4)
    b_index = _frag_index(trans_b, BK_HALF // 2 if trans_b else BN // 2, 4, 3)
    NJ = NI // 2                                      # ldmatrix.x4 of B: two 16 x 8 fragments

    if SIMULATOR:
        lanes = np.arange(WARP)
        MBASE, NBASE = 16 * np.arange(MI)[:, None], 16 * np.arange(NJ)[:, None]

        def stage(acc, sa, sb, wm0, wn0, g, t):
            wa, wb = sa.reshape(-1).view(np.int32), sb.reshape(-1).view(np.int32)
            c = 0
            for ks in range(2):
                fa = ldmatrix_warp(wa, a_index(wm0 + MBASE, ks, lanes), trans=trans_a)      # [MI, 32, 4]
                fb = ldmatrix_warp(wb, b_index(wn0 + NBASE, ks, lanes), trans=not trans_b)  # [NJ, 32, 4]
                fb = fb.reshape(NJ, WARP, 2, 2).transpose(0, 2, 1, 3).reshape(NI, WARP, 2)  # [NI, 32, 2]
                c = c + mma_bf16_warp(fa[:, None], fb[None, :])                           # [MI, NI, 32, 4]
            mine = c[:, :, 4 * g + t].reshape(MI, NI, 2, 2).transpose(0, 2, 1, 3)           # [mi, h, ni, c]
            acc += mine.reshape(2 * MI, 2 * NI)
        return stage

    ld_a = ldmatrix_x4_trans if trans_a else ldmatrix_x4
    ld_b = ldmatrix_x4 if trans_b else ldmatrix_x4_trans

    @cuda.jit(device=True)
    def stage(acc, sa, sb, wm0, wn0, g, t):
        fb = cuda.local.array((2, NI, 2), int32)     # [k-step, ni, b0 b1]: bf16x2 words, the whole stage
        fa = cuda.local.array((2, 4), int32)         # [k-step, a0..a3] of one mi at a time (fewer registers)
        lane = 4 * g + t
        for ks in range(2):
            for nj in range(NJ):
                fb[ks, 2 * nj, 0], fb[ks, 2 * nj, 1], fb[ks, 2 * nj + 1, 0], fb[ks, 2 * nj + 1, 1] = ld_b(
                    sb, b_index(wn0 + 16 * nj, ks, lane))
        zero = float32(0.0)
        for mi in range(MI):
            for ks in range(2):
                fa[ks, 0], fa[ks, 1], fa[ks, 2], fa[ks, 3] = ld_a(sa, a_index(wm0 + 16 * mi, ks, lane))
            for ni in range(NI):
                # a0 A[g, 2t..], a1 A[g+8, 2t..], a2 A[g, 2t+8..], a3 A[g+8, 2t+8..]; b0 B[2t.., g], b1 B[2t+8.., g]
                c0, c1, c2, c3 = mma_bf16(fa[0, 0], fa[0, 1], fa[0, 2], fa[0, 3], fb[0, ni, 0], fb[0, ni, 1],
                                          zero, zero, zero, zero)                  # k-step 0, from zero
                c0, c1, c2, c3 = mma_bf16(fa[1, 0], fa[1, 1], fa[1, 2], fa[1, 3], fb[1, ni, 0], fb[1, ni, 1],
                                          c0, c1, c2, c3)                          # + k-step 1
                add_fragment(acc, mi, ni, c0, c1, c2, c3)
    return stage


# =============================================================================================
# matmul_bf16's ring: the bf16 copies, fed to the shared stages by cp.async
#
#   1. k_round_bf16 (operands.round_into) rounds each operand once into a bf16 copy in a
#      scratch buffer (ties to even, cvt.rn.bf16x2's bits): rows packed, the copy keeps the
#      operand's orientation, a [M, K] -> a16 [M, K], a^T [K, M] -> a16 [K, M].
#   2. The product kernel copies 16-byte chunks (8 bf16) of the copies straight from global to
#      shared memory with cp.async: no register holds them, no instruction of the thread waits
#      for them until the stage is needed. A chunk lands at its swizzled place (logical chunk q of
#      tile row r at chunk q ^ s(r), point 3 of the module docstring), where the stage (ldmatrix,
#      mma.sync) reads it.
#
# The ring of STAGES shared stages (make_async_pipeline below), K step s in stage s % STAGES:
#
#     prologue: issue the copies of steps 0 .. STAGES-2, one commit group each
#     step s:   wait_group STAGES-2       this thread's copies of step s have landed (of the groups
#                                         committed, only the newest STAGES-2 may still be pending)
#               barrier                   every thread's copies of step s are visible, and every warp
#                                         has finished step s-1, whose stage is (s+STAGES-1) % STAGES
#               issue step s+STAGES-1 into that stage, commit (an empty group near the end, so that
#                                         the count of groups stays one a step)
#               stage(s): ldmatrix + mma.sync from stage s % STAGES
#
# One barrier a step, and STAGES-1 steps of copies in flight while the tensor cores work. Why 3 by
# default: the copies of a stage take about as long as a global-memory round trip (~600-800 ns on
# the H200 under load), one stage of 128 x 128 products about 1/3-1/2 of that for a block sharing
# its multiprocessor with another: two stages in flight cover the latency where one does not, and
# 3 stages of a 128 x 128 tile fill the 48 KiB that a Numba kernel's static shared memory may take
# (3 x (128 + 128) x 32 x 2 bytes). Smaller tiles take 4 (block's sixth number). 128 x 256 would need 72 KiB: dynamic shared memory past
# 48 KiB needs a launch attribute that Numba does not set, so it is not offered.
#
# Edges. A chunk is 8 consecutive stored columns of one stored row.
#   - Copies whose stored column counts are multiples of 8 ("vec", both operands; the scratch
#     puts each copy on a 256-byte boundary): every chunk is 16-byte aligned, and a chunk is
#     either wholly inside the operand or wholly outside (its first column and the limit are
#     multiples of 8; the K limit of a split-K slice is a multiple of BK): inside, one cp.async;
#     outside (past M, N or K), two plain 8-byte stores of zeros at its place, ordered with the
#     copies by the same wait and barrier.
#   - Otherwise (K, or M, N of a transposed operand, not a multiple of 8: the rows of a packed
#     copy then start at addresses that are not 16-byte aligned, and cp.async .cg takes only
#     aligned 16 bytes) the same chunks are copied by 8 guarded 2-byte loads and two 8-byte
#     stores, synchronously: correct, slower. Padding the copy's rows to a multiple of 8 would
#     keep cp.async, but round_into writes packed rows (a padded copy needs another rounding
#     kernel): left for a later version.
# =============================================================================================

STAGES = 3             # shared stages of the ring (a block's sixth number overrides it)


# The bf16 copies live in operands.COPIES, the scratch the library route's copies use too. Not the
# launcher's `work` argument: work is the split-K buffer, may be None (no split), is sized for
# partial tiles (splitk_work), not for two operands, and is used by the same launch for the slices'
# partial sums; carving both out of it would tie the copies' room to the split.
def bf16_copies(a, b, stream=0):
    """(a16, b16): a and b rounded to bf16 (uint16 bit patterns, ties to even) in COPIES, each with
    its operand's shape, rows packed; a16 at element 0, b16 on the next 256-byte boundary. An
    operand that is bf16 already (uint16: an activation the model saved rounded, gpu_model.SAVED16)
    is used where it is: rounding it again would give the same bits."""
    a16, b16 = COPIES.round(a, b, "bf16", stream)
    return a16.reshape(a.shape), b16.reshape(b.shape)


def async_resolve(block, a16, b16):
    """The full tile of a matmul_bf16 launch: ("bf16", BM, BN, BK, WM, WN, vec, STAGES); vec when both
    copies' rows are whole 16-byte chunks: rows of a multiple of 8 values, starting on a 16-byte
    boundary (bf16_copies' slots do; a saved activation does where its layer's offset allows)."""
    vec = all(x.shape[1] % 8 == 0 and address(x) % 16 == 0 for x in (a16, b16))
    stages = block[5] if len(block) > 5 else STAGES
    return ("bf16", *block[:5], vec, stages)


def _async_copier(R, Cc, THREADS, vec):
    """copy(s, g, r0, c0, rlim, clim): start copying the R x Cc tile of the stored bf16 copy g (uint16
    [rows, cols]) at (r0, c0) into the shared stage s (R rows of Cc / 2 words, swizzled), zeros
    outside rows < rlim, columns < clim. Chunk e = thread + j THREADS of the tile (8 bf16, 16 bytes)
    is stored row e // (Cc / 8), columns 8 (e % (Cc / 8)) ..: consecutive threads along a row, so a
    warp reads 512 consecutive bytes of two to eight rows, and 8 consecutive lanes (one 128-byte
    shared-memory request) write 8 different chunk positions of the line (point 3: conflict-free)."""
    CPR = Cc // 8                                     # chunks a stored row
    CH = R * CPR // THREADS                           # chunks a thread
    assert CPR >= 1 and CH * THREADS == R * CPR, f"a {R} x {Cc} bf16 tile does not split into 16-byte chunks over {THREADS} threads"
    word = _word(Cc // 2)

    @cuda.jit(device=True)
    def copy(s, g, r0, c0, rlim, clim):
        for j in range(CH):
            e = nonneg(cuda.threadIdx.x) + j * THREADS
            dr, q = e // CPR, e % CPR
            r, c = r0 + dr, c0 + 8 * q
            w = word(dr, q)                           # the chunk's first word in the stage
            if vec:
                if r < rlim and c < clim:             # clim a multiple of 8: the chunk is all in
                    cp_async16(s, w, g, r * g.shape[1] + c)
                else:                                 # past the edge: zeros (plain stores)
                    store2(s, w, 0, 0)
                    store2(s, w + 2, 0, 0)
            else:
                ws = cuda.local.array(4, int32)       # 4 words of bf16 pairs, the lower column low
                for i in range(4):
                    lo = int(g[r, c + 2 * i]) if r < rlim and c + 2 * i < clim else 0
                    hi = int(g[r, c + 2 * i + 1]) if r < rlim and c + 2 * i + 1 < clim else 0
                    ws[i] = lo | (((hi ^ 0x8000) - 0x8000) << 16)   # hi sign-extended: an int32's bits
                store2(s, w, ws[0], ws[1])
                store2(s, w + 2, ws[2], ws[3])
    return copy


def make_async_pipeline(trans_a, trans_b, BM, BN, WM, WN, stages, copy_a, copy_b, stage):
    """tile_mma(acc, a16, b16, kb, ke): acc += this thread's share of op(a) @ op(b) over k in [kb, ke)
    from the bf16 copies, through a ring of `stages` shared stages filled by cp.async (the ring is
    described above). copy_a, copy_b: _async_copier's of each operand; stage: _stage's."""
    BK = BK_HALF
    SA, SB = (stages, BM * BK // 2), (stages, BN * BK // 2)      # words: bf16 pairs
    WARPS_N = BN // WN
    load = make_load(trans_a, trans_b, copy_a, copy_b)           # tile_loop's: which stored rows and columns
    wait = CP_ASYNC_WAIT[stages - 2]                             # step s's group landed
    wait_all = CP_ASYNC_WAIT[0]

    @cuda.jit(device=True)
    def tile_mma(acc, a, b, kb, ke):
        sa = cuda.shared.array(SA, float32, alignment=16)        # 16-byte chunks for cp.async, ldmatrix
        sb = cuda.shared.array(SB, float32, alignment=16)
        tid = cuda.threadIdx.x
        warp, lane = tid // WARP, tid % WARP
        g, t = lane >> 2, lane & 3
        wm0, wn0 = (warp // WARPS_N) * WM, (warp % WARPS_N) * WN
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        M = a.shape[1] if trans_a else a.shape[0]
        N = b.shape[0] if trans_b else b.shape[1]
        n_steps = (ke - kb + BK - 1) // BK
        for p in range(stages - 1):                              # prologue: steps 0 .. stages-2 in flight
            if p < n_steps:
                load(sa[p], sb[p], a, b, kb + p * BK, ke, row0, col0, M, N)
            cp_async_commit()
        for s in range(n_steps):
            wait()                                               # my copies of step s are in
            cuda.syncthreads()                                   # everyone's; stage (s-1) % stages is free
            nxt = s + stages - 1
            if nxt < n_steps:
                st = nxt % stages
                load(sa[st], sb[st], a, b, kb + nxt * BK, ke, row0, col0, M, N)
            cp_async_commit()                                    # one group a step, empty or not
            cur = s % stages
            stage(acc, sa[cur], sb[cur], wm0, wn0, g, t)
        wait_all()                                               # only empty groups remain: no-op in effect
        cuda.syncthreads()                                       # the stages may be refilled by a next call
    return tile_mma


@functools.cache
def make_async_tile(tile):
    """Everything a kernel needs for one matmul_bf16 tile, the names of matmul.make_tile (mma, mma_nn
    .. mma_tt, row, col, zero, store, TM, TN, THREADS, BK, grid); its mma functions take the bf16
    copies (uint16 arrays, bf16_copies), not the fp32 operands.
    tile = ("bf16", BM, BN, BK, WM, WN, vec, STAGES): BK = 32; vec: cp.async chunks (async_resolve)."""
    family, BM, BN, BK, WM, WN, vec, stages = tile
    assert family == "bf16", family
    assert BK == BK_HALF, f"bf16 ldmatrix tiles take BK = {BK_HALF}, got {BK}"
    assert BM % WM == 0 and BN % WN == 0 and WM % 16 == 0 and WN % 16 == 0, f"tile {tile}"
    assert stages - 2 in CP_ASYNC_WAIT, f"{stages} stages: wait_group {stages - 2} has no intrinsic (ptx.py)"
    MI, NI = WM // 16, WN // 8
    THREADS = WARP * (BM // WM) * (BN // WN)
    ranged = {}
    for ta in (False, True):
        for tb in (False, True):
            copy_a = _async_copier(*((BK, BM) if ta else (BM, BK)), THREADS, vec)
            copy_b = _async_copier(*((BN, BK) if tb else (BK, BN)), THREADS, vec)
            ranged[(ta, tb)] = make_async_pipeline(ta, tb, BM, BN, WM, WN, stages, copy_a, copy_b,
                                                   _stage(ta, tb, BM, BN, MI, NI))
    return fragment_tile(ranged, BM, BN, BK, WM, WN, THREADS)
