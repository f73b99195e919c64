"""The lab's flash attention rungs v3 to v12: one kernel text, built from flags (make_kernels).

The engine runs v8's forward and v10's backward (the fp32 recipe) and v12 (the fp16 recipe),
written out with every flag resolved in andrea_numba/kernels/attn_flash_tf32x3.py; the flag-built
copies of those here (_factory_fwd_v8, _factory_bwd_v10, _factory_fwd_v12, _factory_bwd_v12) are
what the engine's kernels are checked against, bit for bit (tests/test_attn_flash_tf32x3.py).
lab/attn_flash.py holds the ladder's VERSIONS table.

Flash attention v3 and v4: v2 (lab/attn_flash_mma.py) with its loads hidden behind its arithmetic.
The math, the saved tensors (y and lse), the dropout masks, the three kernels, the warps of 16
rows and the 3xTF32 tensor-core products are v2's (read attn_flash.py, then lab/attn_flash_mma.py).
v2 reaches 3 to 8 TFLOP/s on an H200, and its code shows where the time goes: every K and V tile
comes from global memory one float at a time, only after the previous tile's products are done,
so the whole latency of a load is paid twice per key tile; the forward waits at five barriers
per key tile; every key tile splits the same q values into TF32 big + small parts again; and
its blocks are 64 threads. v3 changes four things; v4 a fifth.

1. Prefetch into registers. The inner tiles (K and V in the forward and the dq kernel, Q and dY
   in the dk/dv kernel) are copied by warp_tile._copier in two halves: `fetch` loads this
   thread's share of a tile from global memory into registers, `put` writes those registers to
   shared memory. A kernel fetches tile j + 1 at the top of iteration j, multiplies tile j (which
   is already in shared memory) while those loads are in flight, and only then puts tile j + 1:

       fetch tile 0; put; barrier
       for each tile j:   fetch tile j + 1 (registers)       <- global loads start
                          products and softmax on tile j     <- ... and arrive meanwhile
                          barrier (every warp is done with tile j); put tile j + 1; barrier

   The K and V tiles of the same keys travel together (two shared buffers, sk and sv), so an
   iteration waits at two barriers, not five (forward) or three (backward). When every row of
   the [B, T, C] arrays starts on a 16-byte boundary (hs and C multiples of 4, base pointers
   16-byte aligned: aligned_rows) a thread moves 4 floats with one 128-bit load (ptx.load4) and
   one 128-bit store; otherwise, and always in the simulator, one float at a time.

2. The block's own tile is split once. The rows a block owns (q in the forward; q and dy in the
   dq kernel; k and v in the dk/dv kernel) are the A operand of every s-like product, for every
   inner tile. v3 reads them from global memory once, splits each value into its TF32 big and
   small parts once, and keeps both in shared memory as two planes, stored in *fragment order*:

       own[plane, w, ks, 4 lane + i]    plane 0 big, 1 small; warp w; k step ks (channels 8 ks ..)
       i = 0: A[g, t]   1: A[g + 8, t]   2: A[g, t + 4]   3: A[g + 8, t + 4]    (lane = 4 g + t)

   which is exactly the a0..a3 of mma.sync's A fragment (ptx.py). A thread's four values of a k
   step sit side by side: one 128-bit shared load per plane, no bank conflicts (the warp reads
   512 consecutive bytes), no padding, and no rounding in the loop (step_own below). Only the B
   operand (the inner tile, shared by the block's warps) is split per step, as in v2.

3. Warp-local syncs. The forward's row maxima and sums (red) and the p f / ds tiles (sp, sds,
   spf) are written and read only by the warp that owns their rows, so they need __syncwarp(),
   not a block barrier (warp_sync below). The simulator has no warps: there warp_sync is a
   block barrier, which every thread reaches at the same place.

4. Blocks. A block is (WARPS, BKV) as in v2: 16 WARPS own rows, inner tiles of BKV rows. The
   planes cost twice the own tile, so what fits 48 KiB of static shared memory at hs = 64 is
   (shared_bytes):
       forward   (4, 16)  47,616 bytes   64 query rows share each K and V tile
                 (2, 32)  38,912 bytes
                 (2, 16)  28,160 bytes
       backward  (2, 16)  46,720 bytes   (the dk/dv kernel; dq needs 44,032)
                 (1, 16)  27,776 bytes
                 (2,  8)  40,256 bytes
   Four warps do not fit the backward at hs = 64: its two own tiles' planes alone are 64 KiB.
   One warp with BKV = 32 fits (38,656 bytes), but each of its threads carries 128 floats of the
   next Q and dY tiles: more than the registers hold, so ptxas spills them to local memory. The
   blocks above compile for sm_90 with 126 to 255 registers a thread and no spills.

5. v4: one plane, split as read. The two planes of point 2 cost twice an own tile of shared
   memory: 32 KiB of q planes for the forward's 64 rows at hs = 64, so its key tiles stay 16 keys
   long (two barriers and a softmax pass per 16 keys). Matmul v6 showed (kernels/matmul.py) that
   on this GPU shared memory, not arithmetic, is what runs out, and that splitting each value
   right after a 128-bit read beat reading two split planes (v6 against v5). v4 keeps an own tile's values in one
   plane in the same fragment order (one load4 a k step instead of two) and splits them there
   (step_own, PLANES = 1): the forward fits (4, 32), 64 query rows against 32-key tiles (44,032
   bytes), the backward (2, 32) (43,264 bytes). The kernels are v3's text; make_kernels(...,
   PLANES) builds either, named _v3 or _v4.

A thread holds, of a 16-row tile product, rows g and g + 8 and the columns 2t, 2t + 1 of every
8-column fragment: acc[hh, j] is row 8 hh + g, column 8 (j // 2) + 2 t + j % 2 (v2's layout).
Every output element is summed by one thread, tile after tile in a fixed order: deterministic,
no atomics. In the simulator the tensor-core steps are NumPy twins that compute each thread's
outputs from the same shared tiles (the own tile from its planes, as big + small).

The same kernel text serves the later versions, whose launchers follow v3's and v4's below: v5 to
v10 (each a comment of its own), and v11, v12 with 16-bit products (kernels/attn_flash_lowp.py's
pieces). aligned_rows and warp_sync are the engine's (kernels/attn_flash_tf32x3.py).
"""
import math

import numpy as np
from numba import cuda, float32, int32

from andrea_numba.kernels.attn import NEG_INF, _check
from andrea_numba.kernels.attn_flash_lowp import HALF_VERSION, kstep_nn16, kstep_own16, own_tile16
from andrea_numba.kernels.attn_flash_rowdot import k_attn_flash_bwd_rowdot
from andrea_numba.kernels.attn_flash_tf32x3 import SHARED_LIMIT, aligned_rows, warp_sync
from andrea_numba.kernels.common import SIMULATOR, BlockDoesNotFit, as_is, blocks, cdiv, jit_as, nonneg
from andrea_numba.kernels.dropout import dropout_factor, key_value, mask_args
from andrea_numba.kernels.ptx import load4, mma_tf32, tf32_round
from andrea_numba.kernels.warp_tile import WARP, _copier, _kstep, col_swizzle

# (WARPS, BKV). GPU: the table in the module docstring, the first is the default. Simulator: one
# and two warps, inner tiles of 8 and 16 rows (two fragments per product: more than one n step).
FLASH_V3_FWD_BLOCKS = dict(gpu=((4, 16), (2, 32), (2, 16)), sim=((1, 8), (2, 16)))
FLASH_V3_BWD_BLOCKS = dict(gpu=((2, 16), (1, 16), (2, 8)), sim=((1, 8), (2, 16)))


def shared_bytes(hs: int, warps: int, bkv: int, forward_only: bool = False, planes: int = 2,
                 swizzle: bool = False, half: bool = False) -> int:
    """Bytes of shared memory of the forward (forward_only) or of the larger backward kernel, with
    own tiles of `planes` planes (2: v3, 1: v4); swizzle: v6's unpadded inner tiles; half: v11's
    and v12's own tiles of packed 16-bit pairs, channels padded to 16 (attn_flash_lowp.py)."""
    HS8, BQ = cdiv(hs, 16 if half else 8) * (16 if half else 8), 16 * warps
    P, PK = inner_pitch(HS8, swizzle), bkv + 4
    own = BQ * HS8 // 2 if half else planes * BQ * HS8   # an own tile's planes (half: one of 32-bit pairs)
    fwd = own + 2 * bkv * P + BQ * PK + BQ * 4           # q planes, K and V tiles, p f, red
    dq = 2 * own + 2 * bkv * P + BQ * PK                 # q, dy planes, K and V tiles, ds
    dkdv = 2 * own + 2 * bkv * P + 2 * BQ * PK + 2 * bkv  # k, v planes, Q and dY tiles, P f, ds, lse, D
    return 4 * (fwd if forward_only else max(dq, dkdv))


def swizzled(HS8: int, swizzle: bool) -> bool:
    """v6 swizzles an inner tile's columns when its rows are a multiple of 32 floats (hs = 32, 64,
    ...); at other head sizes it keeps v3's padded rows."""
    return swizzle and HS8 % 32 == 0


def inner_pitch(HS8: int, swizzle: bool = False) -> int:
    """Floats a row of an inner tile (K, V, Q, dY) takes in shared memory: HS8 + 4 (v3: the pad
    that makes the [key, channel] reads conflict-free), or HS8 with v6's swizzle."""
    return HS8 if swizzled(HS8, swizzle) else HS8 + 4


def _own_tile(HS, NK, PLANES):
    """load_own(f, x, r0, c0, T, w, g, t): this lane's A fragments of the 16 rows r0 + 16 w ..
    of x [T, C] (channels c0 .. c0 + HS - 1, zero past T and past HS) into f in fragment order
    (module docstring, point 2): split into big and small parts, the planes f[0] and f[1]
    (PLANES = 2, v3), or as they are, f[0] (PLANES = 1, v4: split as read). One float at a time,
    straight from global memory: it runs once per block, before the first tile."""
    @cuda.jit(device=True)
    def load_own(f, x, r0, c0, T, w, g, t):
        lane = 4 * g + t
        for ks in range(NK):
            for i in range(4):                            # a0 A[g, t], a1 A[g+8, t], a2 A[g, t+4], a3 A[g+8, t+4]
                r = r0 + 16 * w + g + 8 * (i % 2)
                d = 8 * ks + t + 4 * (i // 2)
                val = x[r, c0 + d] if r < T and d < HS else float32(0.0)
                if PLANES == 1:
                    f[0, w, ks, 4 * lane + i] = val
                else:
                    big = tf32_round(val)
                    f[0, w, ks, 4 * lane + i] = big       # x = big + small (small: the next 11 bits)
                    f[1, w, ks, 4 * lane + i] = tf32_round(val - big)
    return load_own


def _kstep_own(WARPS, NK, NI, PLANES, TRUNC=False, SWZ=False):
    """step(acc, f, sb, ks, w, g, t): acc (2, 2 NI) += this thread's share of
    own[16 rows of warp w, 8 ks .. 8 ks + 7] @ tile^T, the own tile from f in fragment order (its
    split planes, PLANES = 2, or its values split here, PLANES = 1), the tile stored [n, k] in
    shared memory (rows of K, V, Q or dY read as [key or query, channel]):
    warp_tile._kstep(False, True, 1, NI, True) with the A fragments read 128 bits at a time.
    TRUNC (v5): the small parts made in the loop go to the tensor core as x - big (matmul v7's split).
    SWZ (v6): the tile's column k of row n is at k ^ col_swizzle(n)."""
    PLANE = WARPS * NK * 4 * WARP                         # floats of one plane

    if SIMULATOR:
        # The twin (mma.sync needs 32 real lanes): rows g and g + 8 of the warp's A slice are the
        # values big + small of lanes 4 g .. 4 g + 3 (slots 0 and 2 make row g, slots 1 and 3 row
        # g + 8); this thread's 2 x 2 NI outputs are one NumPy product from the same shared tiles.
        COL = np.array([(j // 2) * 8 + j % 2 for j in range(2 * NI)])        # col(j) - 2t

        def step(acc, f, sb, ks, w, g, t):
            if PLANES == 2:
                own = f[0, w, ks] + f[1, w, ks]
            else:                                           # the same split as the GPU's, here
                x = f[0, w, ks]
                big = tf32_round(x)
                own = big + tf32_round(x - big)
            a = own.reshape(WARP, 4)[4 * g:4 * g + 4]      # lanes 4g .. 4g+3, slots
            rows = np.stack([np.concatenate([a[:, 0], a[:, 2]]), np.concatenate([a[:, 1], a[:, 3]])])   # 2 x 8
            n = (COL + 2 * t)[:, None]                      # the tile's rows: this thread's columns
            k = np.arange(8 * ks, 8 * ks + 8)[None, :]
            if SWZ:
                k = k ^ (((n & 3) << 3) | (((n >> 2) & 1) << 2))
            acc += rows @ sb[n, k].T
        return step

    @cuda.jit(device=True)
    def step(acc, f, sb, ks, w, g, t):
        i = (w * NK + ks) * 4 * WARP + 4 * (4 * g + t)
        if PLANES == 2:
            ab0, ab1, ab2, ab3 = load4(f, i)              # big parts of a0 .. a3: one 128-bit load
            as0, as1, as2, as3 = load4(f, i + PLANE)      # small parts
        else:
            a0, a1, a2, a3 = load4(f, i)                  # a0 .. a3: one 128-bit load, then split
            ab0, ab1, ab2, ab3 = tf32_round(a0), tf32_round(a1), tf32_round(a2), tf32_round(a3)
            as0, as1, as2, as3 = a0 - ab0, a1 - ab1, a2 - ab2, a3 - ab3
            if not TRUNC:
                as0, as1, as2, as3 = tf32_round(as0), tf32_round(as1), tf32_round(as2), tf32_round(as3)
        kk = 8 * ks
        zero = float32(0.0)
        sw = col_swizzle(g) if SWZ else 0                 # rows ni * 8 + g all swizzle as row g
        for ni in range(NI):                              # b0 B[t, g] = tile[n, kk + t], b1 B[t+4, g]
            n = ni * 8 + g
            x0, x1 = sb[n, (kk + t) ^ sw], sb[n, (kk + t + 4) ^ sw]
            bb0, bb1 = tf32_round(x0), tf32_round(x1)
            bs0, bs1 = x0 - bb0, x1 - bb1
            if not TRUNC:
                bs0, bs1 = tf32_round(bs0), tf32_round(bs1)
            c0, c1, c2, c3 = mma_tf32(as0, as1, as2, as3, bb0, bb1, zero, zero, zero, zero)   # small * big
            c0, c1, c2, c3 = mma_tf32(ab0, ab1, ab2, ab3, bs0, bs1, c0, c1, c2, c3)           # + big * small
            c0, c1, c2, c3 = mma_tf32(ab0, ab1, ab2, ab3, bb0, bb1, c0, c1, c2, c3)           # + big * big
            acc[0, 2 * ni] += c0                          # acc += the 8-deep product in fp32 (warp_tile.py)
            acc[0, 2 * ni + 1] += c1
            acc[1, 2 * ni] += c2
            acc[1, 2 * ni + 1] += c3
    return step


def make_kernels(HS: int, WARPS: int, BKV: int, VEC: bool, PLANES: int = 2, TRUNC: bool = False, SWZ: bool = False,
                 NONNEG: bool = False, HEAVY: bool = False, ROWDOT: int = 0, HALF=None):
    """The three kernels for head size HS, block (WARPS, BKV) and 128-bit copies VEC (the caller
    checked the alignment: aligned_rows); the own tiles as two split planes (PLANES = 2, v3) or
    one plane of values split as read (PLANES = 1, v4); TRUNC: v3 with the small parts of the
    inner tiles' values truncated by the tensor core (v5); SWZ: v5 with swizzled inner tiles (v6);
    NONNEG: v5 with its thread and block indices through common.nonneg (v7); HEAVY: v7 on the grid
    (B*H, tiles), the longest tiles of every head first (v8); ROWDOT = 1: v8 with D = dy . y worked
    out by the dq kernel for its rows (v9); 2: v9 with those rows read 128 bits at a time when VEC (v10).
    HALF = "bf16" or "fp16" (with v8's forward, v10's backward): every product one mma.sync
    m16n8k16 of inputs rounded to that format, the forward's softmax in base 2 (v11, v12:
    attn_flash_lowp.py)."""
    KS = 16 if HALF else 8        # the mma's k step: 8 (TF32), 16 (bf16, fp16)
    HS8 = cdiv(HS, KS) * KS       # head size rounded up to the mma's k step (tiles zero-padded)
    BQ = 16 * WARPS               # rows of the block's own tile: 16 per warp
    NT = WARP * WARPS
    version = HALF_VERSION[HALF] if HALF else 10 if ROWDOT == 2 else 9 if ROWDOT else 8 if HEAVY else 7 if NONNEG else 6 if SWZ else 5 if TRUNC else 3 if PLANES == 2 else 4
    ix = nonneg if NONNEG else as_is   # v7: indices the compiler knows are >= 0 (common.nonneg)
    SWZ = swizzled(HS8, SWZ)      # (at a head size of rows not a multiple of 32 floats, v6 is v5)
    P = inner_pitch(HS8, SWZ)     # pitch of the inner tiles: conflict-free fragment reads
    PK = BKV + 4                  # pitch of the p f and ds tiles
    NK = HS8 // KS                # k steps over the head's channels
    NQ, NH = BKV // 8, HS8 // 8   # 8-column fragments of a BKV-wide and of an HS8-wide product
    SQ, SH = 2 * NQ, 2 * NH       # a thread's columns of such a product (two per fragment)
    LPT = cdiv(BKV, NT)           # lse and D values per thread of a query tile (dk/dv kernel)
    FR = 4 * WARP                 # floats of a warp's A fragments per k step (plane layout)
    assert BKV % 8 == 0 and (BKV * HS8) % NT == 0, f"block ({WARPS}, {BKV}) does not tile head size {HS}"
    E = BKV * HS8 // NT           # floats of an inner tile per thread
    fetch, put, _ = _copier(BKV, HS8, P, NT, VEC and E % 4 == 0, SWZ, NONNEG)
    load_own = own_tile16(HS, NK, HALF) if HALF else _own_tile(HS, NK, PLANES)
    # acc (2, 2 NQ) += own[16 rows, KS] @ tile^T, the own tile from its planes (q k^T, dy v^T, ...)
    step_own = kstep_own16(NK, NQ, HALF) if HALF else _kstep_own(WARPS, NK, NQ, PLANES, TRUNC, SWZ)
    # acc (2, 2 NH) += A[16 rows, KS] @ B with B stored [k, n] (p f @ V, ds @ K, (P f)^T @ dY, ds^T @ Q)
    step_nn = kstep_nn16(NH, BKV, HALF) if HALF else _kstep(False, False, 1, NH, True, TRUNC, SWZ)
    OWN, OWN_T = ((1, WARPS, NK, FR), int32) if HALF else ((PLANES, WARPS, NK, FR), float32)   # own tiles' shape, type
    LOG2 = HALF is not None       # v11, v12: the forward's softmax in base 2, an integer maximum (attn_flash_lowp.py)

    if HEAVY:       # v8: grid (B*H, tiles); a block's tile is blockIdx.y (see the note above v8)
        @cuda.jit(device=True, inline="always")
        def grid_tile():
            """(this block's tile, the number of tiles), (b*H + h)."""
            return cuda.blockIdx.y, cuda.gridDim.y, cuda.blockIdx.x
    else:           # v3 .. v7: grid (tiles, B*H)
        @cuda.jit(device=True, inline="always")
        def grid_tile():
            """(this block's tile, the number of tiles), (b*H + h)."""
            return cuda.blockIdx.x, cuda.gridDim.x, cuda.blockIdx.y

    @cuda.jit(device=True)
    def zero(acc):
        for i in range(acc.shape[0]):
            for j in range(acc.shape[1]):
                acc[i, j] = 0.0

    @cuda.jit(device=True)
    def col(j, tq):
        """Column (within a fragment row of 8 j-pairs) of acc[:, j] for lane t = tq."""
        return (j // 2) * 8 + 2 * tq + j % 2

    def k_attn_flash_fwd(y, lse, q, k, v, scale, dropout_key, threshold, dscale):
        """Block (query tile of BQ rows, b*H + h); warp w owns rows 16 w .. 16 w + 15. Online
        softmax over the key tiles as k_attn_flash_fwd_v2, with the q planes split once and the
        next K and V tiles loading during the current tile's products (module docstring)."""
        key = key_value(dropout_key)
        fq = cuda.shared.array(OWN, OWN_T, alignment=16)   # q's planes: big, small (v3), values (v4), bf16 pairs (v11)
        sk = cuda.shared.array((BKV, P), float32, alignment=16)     # the K tile of the current keys
        sv = cuda.shared.array((BKV, P), float32, alignment=16)     # the V tile of the same keys
        sp = cuda.shared.array((BQ, PK), float32)                   # p f of the tile (rows of each warp)
        red = cuda.shared.array((BQ, 4), float32)                   # a row's 4 lanes' partial max (or sum)
        rk = cuda.local.array(E, float32)                  # the next K tile, on its way in
        rv = cuda.local.array(E, float32)                  # the next V tile
        s = cuda.local.array((2, SQ), float32)             # s of rows g, g + 8 (this thread's columns)
        o = cuda.local.array((2, SH), float32)             # yacc of rows g, g + 8
        m = cuda.local.array(2, float32)                   # running maximum of the two rows
        lsum = cuda.local.array(2, float32)                # this lane's part of their running sums
        T = q.shape[1]
        H = lse.shape[1]
        tile, n_tiles_grid, bh = grid_tile()
        b, h = ix(ix(bh) // H), ix(ix(bh) % H)
        c0 = h * HS
        t0 = ix(n_tiles_grid - 1 - tile) * BQ  # the longest rows first
        w, lane = ix(cuda.threadIdx.x) // WARP, ix(cuda.threadIdx.x) % WARP
        wm0 = 16 * w
        g, tq = lane >> 2, lane & 3
        kb, vb = k[b], v[b]                                # [T, C] rows of this batch element
        zero(o)
        for hh in range(2):
            m[hh] = NEG_INF
            lsum[hh] = 0.0
        load_own(fq, q[b], t0, c0, T, w, g, tq)            # split once, used for every key tile
        n_tiles = (min(T, t0 + BQ) + BKV - 1) // BKV       # keys 0 .. min(T, t0 + BQ) - 1
        fetch(rk, kb, 0, c0, T, c0 + HS)
        fetch(rv, vb, 0, c0, T, c0 + HS)
        put(sk, rk)
        put(sv, rv)
        cuda.syncthreads()                                 # the q planes and the first tiles are in place
        for j in range(n_tiles):
            u0 = j * BKV
            more = j + 1 < n_tiles                         # the same in every thread of the block
            if more:                                       # the next keys' K and V: loads in flight
                fetch(rk, kb, u0 + BKV, c0, T, c0 + HS)    # during the products below
                fetch(rv, vb, u0 + BKV, c0, T, c0 + HS)
            zero(s)
            for ks in range(NK):                           # s = q k^T over the head's channels
                step_own(s, fq, sk, ix(ks), w, g, tq)
            for hh in range(2):
                t = t0 + wm0 + 8 * hh + g
                mt = NEG_INF
                for jj in range(SQ):
                    if u0 + col(jj, tq) <= t:              # causal: keys u <= t
                        s[hh, jj] *= scale
                        mt = max(mt, s[hh, jj])
                red[wm0 + 8 * hh + g, tq] = mt
            warp_sync()                                    # red's rows belong to this warp
            for hh in range(2):
                rr = wm0 + 8 * hh + g
                t = t0 + rr
                m_new = max(max(m[hh], max(red[rr, 0], red[rr, 1])), max(red[rr, 2], red[rr, 3]))
                if LOG2:                                   # v11, v12: s in base 2, m an integer
                    m_new = float32(math.ceil(m_new))
                    alpha = math.exp2(m[hh] - m_new)       # a power of two; 0 at the first tile
                else:
                    alpha = math.exp(m[hh] - m_new)        # 0 at the first tile (m = -inf)
                lsum[hh] *= alpha
                for jj in range(SH):
                    o[hh, jj] *= alpha
                for jj in range(SQ):
                    c = col(jj, tq)
                    p = float32(0.0)
                    if u0 + c <= t:
                        p = math.exp2(s[hh, jj] - m_new) if LOG2 else math.exp(s[hh, jj] - m_new)
                        lsum[hh] += p                      # the softmax's sum: before dropout
                        p *= dropout_factor(key, ((b * H + h) * T + t) * T + u0 + c, threshold, dscale)
                    sp[rr, c] = p
                m[hh] = m_new
            warp_sync()                                    # so are sp's
            for kk in range(0, BKV, KS):                   # yacc += (p f) @ v
                step_nn(o, sp, sv, ix(kk), wm0, 0, g, tq)
            if more:
                cuda.syncthreads()                         # every warp is done with sk and sv
                put(sk, rk)
                put(sv, rv)
                cuda.syncthreads()                         # the next tiles are in place
        for hh in range(2):
            red[wm0 + 8 * hh + g, tq] = lsum[hh]
        warp_sync()
        for hh in range(2):
            rr = wm0 + 8 * hh + g
            t = t0 + rr
            lt = ((red[rr, 0] + red[rr, 1]) + red[rr, 2]) + red[rr, 3]     # l: the lanes' parts in order
            if t < T:
                for jj in range(SH):
                    d = col(jj, tq)
                    if d < HS:
                        y[b, t, c0 + d] = o[hh, jj] / lt
                if tq == 0:
                    if LOG2:                               # lse = ln 2 (m + log2 l), in natural units
                        lse[b, h, t] = (m[hh] + math.log2(lt)) * float32(0.6931471805599453)
                    else:
                        lse[b, h, t] = m[hh] + math.log(lt)

    def k_attn_flash_bwd_dq(dq, d_rowdot, dy, q, k, v, y, lse, scale, dropout_key, threshold, dscale):
        """Block (query tile of BQ rows, b*H + h); per key tile u0 <= the tile's last query:
            s = q k^T, datt' = dy v^T (q and dy from their planes), ds = P (f datt' - D) into
            the warp's rows of a shared tile, dq += ds k; at the end dq *= scale. As
            k_attn_flash_bwd_dq_v2, the next K and V tiles loading during the products. v3 to v8
            read D from d_rowdot (k_attn_flash_bwd_rowdot, launched before); v9 works it out
            here for the tile's rows and writes it to d_rowdot for the dk/dv kernel."""
        key = key_value(dropout_key)
        fq = cuda.shared.array(OWN, OWN_T, alignment=16)   # q's planes: big, small (v3), values (v4), bf16 pairs (v11)
        fdy = cuda.shared.array(OWN, OWN_T, alignment=16)  # dy's planes
        sk = cuda.shared.array((BKV, P), float32, alignment=16)
        sv = cuda.shared.array((BKV, P), float32, alignment=16)
        sds = cuda.shared.array((BQ, PK), float32)
        rk = cuda.local.array(E, float32)
        rv = cuda.local.array(E, float32)
        s = cuda.local.array((2, SQ), float32)
        da = cuda.local.array((2, SQ), float32)
        acc = cuda.local.array((2, SH), float32)
        lse_t = cuda.local.array(2, float32)
        d_t = cuda.local.array(2, float32)
        T = q.shape[1]
        H = lse.shape[1]
        tile, n_tiles_grid, bh = grid_tile()
        b, h = ix(ix(bh) // H), ix(ix(bh) % H)
        c0 = h * HS
        t0 = ix(n_tiles_grid - 1 - tile) * BQ
        w, lane = ix(cuda.threadIdx.x) // WARP, ix(cuda.threadIdx.x) % WARP
        wm0 = 16 * w
        g, tq = lane >> 2, lane & 3
        kb, vb = k[b], v[b]
        zero(acc)
        for hh in range(2):
            t = t0 + wm0 + 8 * hh + g
            lse_t[hh] = lse[b, h, t] if t < T else float32(0.0)
            if not ROWDOT:
                d_t[hh] = d_rowdot[b, h, t] if t < T else float32(0.0)
        if ROWDOT:      # v9: D[t] = sum_d dy[t, d] y[t, d], a thread a row, in channel order (rowdot_v1's sum)
            sd = cuda.shared.array(BQ, float32)
            for r in range(ix(cuda.threadIdx.x), BQ, NT):
                t = t0 + r
                dd = float32(0.0)
                if t < T:
                    if ROWDOT == 2 and VEC:                # v10: 4 channels a load, the same sum in the same order
                        base = (b * T + t) * dy.shape[2] + c0
                        for d in range(0, HS, 4):
                            g0, g1, g2, g3 = load4(dy, base + d)
                            y0, y1, y2, y3 = load4(y, base + d)
                            dd += g0 * y0
                            dd += g1 * y1
                            dd += g2 * y2
                            dd += g3 * y3
                    else:
                        for d in range(HS):
                            dd += dy[b, t, c0 + d] * y[b, t, c0 + d]
                    d_rowdot[b, h, t] = dd                 # for the dk/dv kernel, launched next
                sd[r] = dd
        load_own(fq, q[b], t0, c0, T, w, g, tq)
        load_own(fdy, dy[b], t0, c0, T, w, g, tq)
        n_tiles = (min(T, t0 + BQ) + BKV - 1) // BKV
        fetch(rk, kb, 0, c0, T, c0 + HS)
        fetch(rv, vb, 0, c0, T, c0 + HS)
        put(sk, rk)
        put(sv, rv)
        cuda.syncthreads()
        if ROWDOT:                                         # (sd written before the barrier)
            for hh in range(2):
                d_t[hh] = sd[wm0 + 8 * hh + g]
        for j in range(n_tiles):
            u0 = j * BKV
            more = j + 1 < n_tiles
            if more:
                fetch(rk, kb, u0 + BKV, c0, T, c0 + HS)
                fetch(rv, vb, u0 + BKV, c0, T, c0 + HS)
            zero(s)
            zero(da)
            for ks in range(NK):
                step_own(s, fq, sk, ix(ks), w, g, tq)         # q k^T
                step_own(da, fdy, sv, ix(ks), w, g, tq)       # dy v^T
            for hh in range(2):
                rr = wm0 + 8 * hh + g
                t = t0 + rr
                for jj in range(SQ):
                    c = col(jj, tq)
                    u = u0 + c
                    gr = float32(0.0)
                    if u <= t and t < T:
                        p = math.exp(s[hh, jj] * scale - lse_t[hh])
                        f = dropout_factor(key, ((b * H + h) * T + t) * T + u, threshold, dscale)
                        gr = p * (da[hh, jj] * f - d_t[hh])
                    sds[rr, c] = gr
            warp_sync()                                    # sds's rows belong to this warp
            for kk in range(0, BKV, KS):                   # dq += ds @ k (the K tile as [u, d] rows)
                step_nn(acc, sds, sk, ix(kk), wm0, 0, g, tq)
            if more:
                cuda.syncthreads()                         # every warp is done with sk and sv
                put(sk, rk)
                put(sv, rv)
                cuda.syncthreads()
        for hh in range(2):
            t = t0 + wm0 + 8 * hh + g
            if t < T:
                for jj in range(SH):
                    d = col(jj, tq)
                    if d < HS:
                        dq[b, t, c0 + d] = acc[hh, jj] * scale

    @cuda.jit(device=True)
    def fetch_rows(regs, a, b, h, t0, T):
        """This thread's share of a[b, h, t0 .. t0 + BKV - 1] (lse or D) into registers (0 past T)."""
        for i in range(LPT):
            jj = ix(cuda.threadIdx.x) + i * NT
            regs[i] = a[b, h, t0 + jj] if jj < BKV and t0 + jj < T else float32(0.0)

    @cuda.jit(device=True)
    def put_rows(s, regs):
        for i in range(LPT):
            jj = ix(cuda.threadIdx.x) + i * NT
            if jj < BKV:
                s[jj] = regs[i]

    def k_attn_flash_bwd_dkdv(dk, dv, dy, q, k, v, lse, d_rowdot, scale, dropout_key, threshold, dscale):
        """Block (key tile of BQ keys u, b*H + h); per query tile of BKV queries t >= u0:
            s^T = k q^T, datt'^T = v dy^T (k and v from their planes), P^T = exp(scale s^T - lse),
            dv += (P f)^T dy and dk += ds^T q; at the end dk *= scale. As k_attn_flash_bwd_dkdv_v2,
            the next Q, dY tiles and their lse, D loading during the products."""
        key = key_value(dropout_key)
        fk = cuda.shared.array(OWN, OWN_T, alignment=16)   # k's planes: big, small (v3), values (v4), bf16 pairs (v11)
        fv = cuda.shared.array(OWN, OWN_T, alignment=16)   # v's planes
        sq = cuda.shared.array((BKV, P), float32, alignment=16)    # the Q tile of the current queries
        sdy = cuda.shared.array((BKV, P), float32, alignment=16)   # the dY tile of the same queries
        spf = cuda.shared.array((BQ, PK), float32)                 # (P f)^T: spf[key, query]
        sds = cuda.shared.array((BQ, PK), float32)                 # ds^T: sds[key, query]
        slse = cuda.shared.array(BKV, float32)
        sd = cuda.shared.array(BKV, float32)
        rq = cuda.local.array(E, float32)                  # the next Q tile, on its way in
        rdy = cuda.local.array(E, float32)                 # the next dY tile
        rl = cuda.local.array(LPT, float32)                # the next lse values
        rd = cuda.local.array(LPT, float32)                # the next D values
        st = cuda.local.array((2, SQ), float32)
        dat = cuda.local.array((2, SQ), float32)
        vacc = cuda.local.array((2, SH), float32)
        kacc = cuda.local.array((2, SH), float32)
        T = q.shape[1]
        H = lse.shape[1]
        tile, n_tiles_grid, bh = grid_tile()
        b, h = ix(ix(bh) // H), ix(ix(bh) % H)
        c0 = h * HS
        u0 = ix(tile) * BQ                          # the longest columns (small u) first
        w, lane = ix(cuda.threadIdx.x) // WARP, ix(cuda.threadIdx.x) % WARP
        wm0 = 16 * w
        g, tq = lane >> 2, lane & 3
        qb, dyb = q[b], dy[b]
        zero(vacc)
        zero(kacc)
        load_own(fk, k[b], u0, c0, T, w, g, tq)
        load_own(fv, v[b], u0, c0, T, w, g, tq)
        n_tiles = (T - u0 + BKV - 1) // BKV                # queries u0 .. T - 1 (one block per key tile: u0 < T)
        fetch(rq, qb, u0, c0, T, c0 + HS)
        fetch(rdy, dyb, u0, c0, T, c0 + HS)
        fetch_rows(rl, lse, b, h, u0, T)
        fetch_rows(rd, d_rowdot, b, h, u0, T)
        put(sq, rq)
        put(sdy, rdy)
        put_rows(slse, rl)
        put_rows(sd, rd)
        cuda.syncthreads()
        for j in range(n_tiles):
            t0 = u0 + j * BKV
            more = j + 1 < n_tiles
            if more:
                fetch(rq, qb, t0 + BKV, c0, T, c0 + HS)
                fetch(rdy, dyb, t0 + BKV, c0, T, c0 + HS)
                fetch_rows(rl, lse, b, h, t0 + BKV, T)
                fetch_rows(rd, d_rowdot, b, h, t0 + BKV, T)
            zero(st)
            zero(dat)
            for ks in range(NK):
                step_own(st, fk, sq, ix(ks), w, g, tq)        # k q^T
                step_own(dat, fv, sdy, ix(ks), w, g, tq)      # v dy^T
            for hh in range(2):
                rr = wm0 + 8 * hh + g
                u = u0 + rr
                for jj in range(SQ):
                    c = col(jj, tq)
                    tt = t0 + c
                    pf = float32(0.0)
                    gr = float32(0.0)
                    if tt < T and u <= tt:
                        p = math.exp(st[hh, jj] * scale - slse[c])
                        f = dropout_factor(key, ((b * H + h) * T + tt) * T + u, threshold, dscale)
                        pf = p * f
                        gr = p * (dat[hh, jj] * f - sd[c])
                    spf[rr, c] = pf
                    sds[rr, c] = gr
            warp_sync()                                    # spf's and sds's rows belong to this warp
            for kk in range(0, BKV, KS):
                step_nn(vacc, spf, sdy, ix(kk), wm0, 0, g, tq)  # dv += (P f)^T @ dy
                step_nn(kacc, sds, sq, ix(kk), wm0, 0, g, tq)   # dk += ds^T @ q
            if more:
                cuda.syncthreads()                         # every warp is done with sq, sdy, slse, sd
                put(sq, rq)
                put(sdy, rdy)
                put_rows(slse, rl)
                put_rows(sd, rd)
                cuda.syncthreads()
        for hh in range(2):
            u = u0 + wm0 + 8 * hh + g
            if u < T:
                for jj in range(SH):
                    d = col(jj, tq)
                    if d < HS:
                        dv[b, u, c0 + d] = vacc[hh, jj]
                        dk[b, u, c0 + d] = kacc[hh, jj] * scale

    return tuple(jit_as(f, version) for f in (k_attn_flash_fwd, k_attn_flash_bwd_dq, k_attn_flash_bwd_dkdv))


_KERNELS = {}       # (hs, WARPS, BKV, vec, planes, trunc, swizzle, nonneg, heavy, rowdot) -> the three kernels of v3 .. v10


def kernels(hs, block, vec, forward_only=False, planes=2, trunc=False, swizzle=False, nonneg=False, heavy=False,
            rowdot=0, half=None):
    """The kernels of head size hs and block (WARPS, BKV), after checking that they fit; planes:
    2 for v3's, 1 for v4's; trunc (with 2 planes): v5's; swizzle (with trunc): v6's; nonneg
    (with trunc): v7's; heavy (with nonneg): v8's; rowdot = 1 (with heavy): v9's, 2: v10's; half =
    "bf16" (with v8's or v10's flags): v11's, "fp16": v12's."""
    warps, bkv = block
    ks = 16 if half else 8
    v = {"bf16": 11, "fp16": 12}[half] if half else 10 if rowdot == 2 else 9 if rowdot else 8 if heavy else 7 if nonneg else 6 if swizzle else 5 if trunc else 3 if planes == 2 else 4
    need = shared_bytes(hs, warps, bkv, forward_only=forward_only, planes=planes, swizzle=swizzle, half=bool(half))
    if need > SHARED_LIMIT:
        raise BlockDoesNotFit(f"flash attention v{v}: head size {hs} needs {need} bytes of shared memory with "
                         f"block {block}, more than {SHARED_LIMIT}")
    if bkv % 8 or (bkv * cdiv(hs, ks) * ks) % (WARP * warps):
        raise BlockDoesNotFit(f"flash attention v{v}: block {block} does not split a {bkv}-row tile of head size {hs} "
                         f"over {WARP * warps} threads (BKV a multiple of 8)")
    key = (hs, warps, bkv, vec, planes, trunc, swizzle, nonneg, heavy, rowdot) + ((half,) if half else ())
    if key not in _KERNELS:
        _KERNELS[key] = make_kernels(hs, warps, bkv, vec, planes, trunc, swizzle, nonneg, heavy, rowdot, half)   # numba compiles each on its first launch
    return _KERNELS[key]


def _grid(T, warps, BH, heavy):
    """(query or key tiles, B*H), or (B*H, tiles) for v8."""
    return (BH, cdiv(T, 16 * warps)) if heavy else (cdiv(T, 16 * warps), BH)


def _fwd(planes, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, trunc=False, swizzle=False,
         nonneg=False, heavy=False, half=None):
    B, T, C, hs = _check(q, n_head)
    warps = block[0]
    fwd = kernels(hs, block, aligned_rows(hs, k, v), forward_only=True, planes=planes, trunc=trunc, swizzle=swizzle,
                  nonneg=nonneg, heavy=heavy, half=half)[0]
    scale = 1.0 / math.sqrt(hs) * (1.0 / math.log(2.0) if half else 1.0)   # v11, v12: scores in base 2
    fwd[_grid(T, warps, B * n_head, heavy), WARP * warps, stream](
        y, lse, q, k, v, np.float32(scale), *mask_args(dropout_p, dropout_key))


def _bwd(planes, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream,
         trunc=False, swizzle=False, nonneg=False, heavy=False, rowdot=0, half=None):
    B, T, C, hs = _check(q, n_head)
    warps = block[0]
    vec = aligned_rows(hs, q, k, v, dy, *((y,) if rowdot == 2 else ()))     # (v10 reads y 128 bits at a time too)
    _, dq_kernel, dkdv_kernel = kernels(hs, block, vec, planes=planes, trunc=trunc,
                                        swizzle=swizzle, nonneg=nonneg, heavy=heavy, rowdot=rowdot, half=half)
    scale = np.float32(1.0 / math.sqrt(hs))
    drop = mask_args(dropout_p, dropout_key)
    NT = WARP * warps
    if not rowdot:                         # v9's dq kernel works out D itself
        k_attn_flash_bwd_rowdot[cdiv(B * n_head * T, NT), NT, stream](d_rowdot, dy, y)
    grid = _grid(T, warps, B * n_head, heavy)
    dq_kernel[grid, NT, stream](dq, d_rowdot, dy, q, k, v, y, lse, scale, *drop)
    dkdv_kernel[grid, NT, stream](dk, dv, dy, q, k, v, lse, d_rowdot, scale, *drop)


# v4 (one plane of own values, module docstring point 5): what now fits 48 KiB at hs = 64
FLASH_V4_FWD_BLOCKS = dict(gpu=((4, 32), (4, 16), (2, 32)), sim=((1, 8), (2, 16)))
FLASH_V4_BWD_BLOCKS = dict(gpu=((2, 32), (4, 8), (2, 16)), sim=((1, 8), (2, 16)))


@blocks(**FLASH_V3_FWD_BLOCKS)
def attn_flash_fwd_v3(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """y [B, T, C] and lse [B, H, T]. Grid (T / (16 WARPS) query tiles, B*H), 32 WARPS threads;
    block = (WARPS, BKV)."""
    _fwd(2, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream)


@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v3(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """d_rowdot [B, H, T] receives D = dy . y (v1's k_attn_flash_bwd_rowdot), then the dq and
    the dk/dv kernels on grid (T / (16 WARPS) tiles, B*H), 32 WARPS threads; block = (WARPS, BKV)."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream)


@blocks(**FLASH_V4_FWD_BLOCKS)
def attn_flash_fwd_v4(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """As v3 with the own tile's values in one plane, split as read: twice the key tile fits."""
    _fwd(1, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream)


@blocks(**FLASH_V4_BWD_BLOCKS)
def attn_flash_bwd_v4(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v3 with the own tiles' values in one plane each, split as read."""
    _bwd(1, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream)


# v5: v3 with matmul v7's split in the loop (kernels/matmul.py): each inner-tile value (and each
# ds or p f value) is split into big = tf32(x) and x - big, which the tensor core truncates to
# TF32, three instructions instead of five. The own tiles' planes are split once per block, as in
# v3. The products' inner steps issue about 7.5 instructions a mma.sync (p f @ V at hs = 64: 20
# splits of A and B values at five instructions, 24 mma); v5 removes 2 of every 5 split ones.
@blocks(**FLASH_V3_FWD_BLOCKS)
def attn_flash_fwd_v5(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """As v3 with the small parts truncated by the tensor core."""
    _fwd(2, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, trunc=True)


@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v5(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v3 with the small parts truncated by the tensor core."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream, trunc=True)


# v6: v5 with swizzled inner tiles. The K, V, Q and dY tiles are read two ways: as the B operand of
# an s-like product, row n = key (or query) at columns k = channel (step_own: 8 lanes g on 8 rows,
# 4 lanes t on 4 columns), and as the B operand of p f @ V, ds @ K, (P f)^T @ dY and ds^T @ Q,
# row k = key at columns n = channel (step_nn: 4 lanes t on 4 rows, 8 lanes g on 8 columns).
# v3's pitch HS8 + 4 (4 banks further a row) makes the first conflict-free and the second two to a
# bank (Nsight Compute on the H200: shared loads 1.9-way). No pitch serves both. v6 keeps rows of
# HS8 floats (a multiple of 32: every row starts at bank 0) and stores column c of row r at
# c ^ col_swizzle(r) = c ^ (8 (r & 3) + 4 ((r >> 2) & 1)):
#   step_own, rows g = 0..7 at columns kk + t:   (kk + t) ^ (8 (g & 3) + 4 (g >> 2))  32 banks
#   step_nn,  rows kk + t at columns 8 ni + g:   (8 ni + g) ^ 8 t                       32 banks
#             rows kk + t + 4:                   (8 ni + g) ^ (8 t + 4)                 32 banks
#   the copy, 16 lanes along a row in 4-float chunks: chunk ^ (a multiple of 4)    conflict-free
# The XOR changes bits 2..4 of a column only, so a column stays in its row and a 4-float chunk
# stays whole (128-bit copies as before). The same values meet the same arithmetic: v6 gives v5's
# bits. At a head size whose rows are not a multiple of 32 floats v6 keeps v3's pad (it is v5).
@blocks(**FLASH_V3_FWD_BLOCKS)
def attn_flash_fwd_v6(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """As v5 with swizzled inner tiles."""
    _fwd(2, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, trunc=True, swizzle=True)


@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v6(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v5 with swizzled inner tiles."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream,
         trunc=True, swizzle=True)


# v7: v5 with its indices through common.nonneg. Numba types cuda.threadIdx.x and cuda.blockIdx as
# signed integers and keeps Python's meaning for a signed index (a[-1] is the last element; // and
# % round toward minus infinity), so every shared-memory read of v5's inner steps, sb[n, kk + t]
# with n and t from the lane, compiled to a test "if index < 0: index += size" for each of its
# two indices, and lane // 4, lane % 4 to fix-ups for negative lanes. v7 reads every thread and
# block index, and the loop counters it indexes with, through nonneg (int64(uint32(i)): the same
# number, now known to be >= 0), and the compiler drops those tests: in the dk/dv kernel (PTX for
# sm_90, hs = 64, block (2, 16)) the loop over the channels' k steps went from 192 to 171
# instructions for its 12 mma.sync, the loop over a tile's queries from 513 to 429 for 48 (the
# forward: 169 to 128 and 287 to 220). On the H200 that was 0-4% of the time (docs/kernels.md).
# Nothing else changes: the same elements meet the same arithmetic in the same order, so v7 gives
# v5's bits.
@blocks(**FLASH_V3_FWD_BLOCKS)
def attn_flash_fwd_v7(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """As v5 with indices the compiler knows are >= 0."""
    _fwd(2, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, trunc=True, nonneg=True)


@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v7(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v5 with indices the compiler knows are >= 0."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream,
         trunc=True, nonneg=True)


# v8: v7 on the grid (B*H, tiles) instead of (tiles, B*H). A causal tile's work grows with its
# length: query tile i of the forward and the dq kernel visits i + 1 key tiles, key tile j of the
# dk/dv kernel visits n - j query tiles. Each kernel numbers its tiles so that block 0 is the
# longest, but the GPU hands out blocks in the order x, then y (in practice; CUDA promises no
# order, and the results do not depend on one): on (tiles, B*H) it sends every
# head's tiles from the longest to the shortest, head after head, so the last head's longest
# tiles start last, while the rest of the GPU runs out of work (Nsight Compute, v3's dk/dv kernel
# at 12M: the multiprocessors busy 82% of its time). On (B*H, tiles) the longest tiles of every
# head go first and the short ones fill in at the end (longest first: the classic rule for
# scheduling jobs of unequal length on parallel machines). Each block computes what it computed
# before: v8 gives v5's bits.
@blocks(**FLASH_V3_FWD_BLOCKS)
def _factory_fwd_v8(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """As v7 on the grid (B*H, query tiles): the longest tiles first. (The engine's
    attn_flash_fwd_tf32x3 written out; this flag-built copy is its bit-for-bit check.)"""
    _fwd(2, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, trunc=True, nonneg=True, heavy=True)


@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v8(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v7 on the grid (B*H, tiles): the longest tiles first."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream,
         trunc=True, nonneg=True, heavy=True)


# v9: v8 without the launch of k_attn_flash_bwd_rowdot. D[t] = sum_d dy[t, d] y[t, d] (the
# softmax backward's row sum, module docstring of attn_flash.py) is needed by the dq kernel for its
# query rows and by the dk/dv kernel for every query, and the dq kernel runs first. So v9's dq
# kernel works out D for its own tile's rows, one thread a row summing in channel order as the
# rowdot kernel does (the same sum: v8's bits), keeps them in shared memory for its own use and
# writes them to d_rowdot for the dk/dv kernel. The rowdot kernel read dy and y with a thread a row:
# 0.031 ms a call at 12M (14 a step), about 0.8 TB/s.
@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v9(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v8 with D = dy . y worked out in the dq kernel (no rowdot launch)."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream,
         trunc=True, nonneg=True, heavy=True, rowdot=1)


# v10: v9 with the dq kernel's rows of dy and y read 128 bits at a time. In v9 a thread summed its
# row with 2 x 64 scalar loads, each waiting for the add before it (the loop is not unrolled): the
# dq kernel took 0.242 ms a call against v8's 0.211 (Nsight Compute, the 12M training step on the
# H200), about what the rowdot launch it replaces had cost (0.031). v10 loads 4 channels of dy and
# of y a step (ptx.load4, when every row starts on a 16-byte boundary: aligned_rows, now with y)
# and adds them in channel order as before: v9's sum, v9's bits.
@blocks(**FLASH_V3_BWD_BLOCKS)
def _factory_bwd_v10(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                     block, stream=0):
    """As v9 with dy and y read 128 bits at a time for D. (The engine's attn_flash_bwd_tf32x3
    written out; this flag-built copy is its bit-for-bit check.)"""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream,
         trunc=True, nonneg=True, heavy=True, rowdot=2)


# v11 (bf16 products) and v12 (fp16 products): v8's forward and v10's backward with every product on
# mma.sync m16n8k16, its inputs rounded to a 16-bit format (the pieces: attn_flash_lowp.py, whose
# docstring tells how). Blocks (WARPS, BKV): v8's and v10's on the GPU (this module's table; the
# packed own tiles take less shared memory than v8's planes); in the simulator (1, 8) (a half k16
# step, two key tiles at the harness's T = 13) and (1, 16) (whole k16 steps), one warp each, which
# costs the simulator 2 s less a harness run than v8's (2, 16); tests/test_attn_flash_lowp.py runs
# (2, 16).
FLASH_LOWP_FWD_BLOCKS = dict(gpu=((4, 16), (2, 32), (2, 16)), sim=((1, 8), (1, 16)))
FLASH_LOWP_BWD_BLOCKS = dict(gpu=((2, 16), (1, 16), (2, 8)), sim=((1, 8), (1, 16)))


def _launchers(fmt):
    @blocks(**FLASH_LOWP_FWD_BLOCKS)
    def fwd(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
        _fwd(2, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, trunc=True, nonneg=True,
             heavy=True, half=fmt)

    @blocks(**FLASH_LOWP_BWD_BLOCKS)
    def bwd(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
        _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream,
             trunc=True, nonneg=True, heavy=True, rowdot=2, half=fmt)
    return fwd, bwd


def _named(launch, name, doc, precision):
    launch.__name__ = launch.__qualname__ = name
    launch.__doc__ = doc
    launch.precision = precision      # the harness checks it against the twin under products_in(precision)
    return launch


_f, _b = _launchers("bf16")
attn_flash_fwd_v11 = _named(_f, "attn_flash_fwd_v11", """As v8 with bf16 products (mma.sync m16n8k16, inputs
    rounded as fragments are formed) and the online softmax in base 2 with an integer maximum.""", "bf16")
attn_flash_bwd_v11 = _named(_b, "attn_flash_bwd_v11", """As v10 with bf16 products (mma.sync m16n8k16,
    inputs rounded as fragments are formed).""", "bf16")


_f, _b = _launchers("fp16")      # the engine's attn_flash_fwd_fp16 / _bwd_fp16, flag-built: their check
_factory_fwd_v12 = _named(_f, "_factory_fwd_v12", """As v11 with fp16 products (cvt.rn.f16x2.f32,
    mma.sync ... .f16.f16): 11 significant bits where bf16 keeps 8, nothing above 65504.""", "fp16")
_factory_bwd_v12 = _named(_b, "_factory_bwd_v12", """As v11's backward with fp16 products.""", "fp16")
