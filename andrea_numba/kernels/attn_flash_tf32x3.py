"""Flash attention on tensor cores: the engine's kernels of the fp32 recipe (3xTF32 products) and of
the fp16 recipe (fp16 products). One kernel text; the product format is its only switch.

The math is attn_flash.py's (read its docstring first; the NumPy twin is reference/attn.py). Per
(b, h), with scale = 1 / sqrt(hs), causal (u <= t) and the dropout factor f[t, u]:

    forward    s = scale q k^T    lse[t] = log sum_u exp(s[t, u])    y = (P f) v,  P = exp(s - lse)
    backward   D[t] = dy[t] . y[t]        ds = P (f (dy v^T) - D)
               dq = scale ds k            dk = scale ds^T q            dv = (P f)^T dy

Three kernels, each a block per (head, tile), the tile's rows owned by warps of 16 rows:

    k_attn_flash_fwd_*        query tile: online softmax over the key tiles u0 <= its last query;
                              writes y and lse
    k_attn_flash_bwd_dq_*     query tile: D of its rows (written to d_rowdot for the next kernel),
                              then s, P, ds per key tile; dq += ds k
    k_attn_flash_bwd_dkdv_*   key tile: per query tile t0 >= u0, s^T, P^T, ds^T;
                              dv += (P f)^T dy, dk += ds^T q

The dq and dk/dv kernels both recompute s and P (the price of saving no T x T matrix), so that
every output element is summed by one thread, tile after tile in a fixed order: no atomics, the
same bits on every run.

Tiling. A block is (WARPS, BKV): BQ = 16 WARPS rows of its own tile (warp w owns rows 16 w ..
16 w + 15: q in the forward; q and dy in the dq kernel; k and v in the dk/dv kernel) against inner
tiles of BKV rows (K and V in the forward and the dq kernel, Q and dY in the dk/dv kernel), which
every warp of the block reads. The head's hs channels are padded with zeros to HS8, a multiple of
the mma's k step KS (8 for TF32, 16 for fp16). Each product is one of two kinds:

    step_own   acc (16 rows x BKV) += own[16 rows, KS channels] @ inner^T     s = q k^T, dy v^T, ...
    step_nn    acc (16 rows x HS8) += sa[16 rows, KS keys] @ inner[KS keys, HS8]   (p f) v, ds k, ...

where sa is the warp's rows of a BKV-wide tile in shared memory (p f, ds, (P f)^T, ds^T), written
and read by that warp alone, so a __syncwarp() (warp_sync) orders it, not a block barrier.

Fragments. mma.sync's operands are spread over the 32 lanes of a warp, lane = 4 g + t (ptx.py):

    m16n8k8 (TF32)  A:  a0 A[g, t]     a1 A[g + 8, t]     a2 A[g, t + 4]     a3 A[g + 8, t + 4]
                    B:  b0 B[t, g]     b1 B[t + 4, g]
    C (both)        C:  c0 C[g, 2t]    c1 C[g, 2t + 1]    c2 C[g + 8, 2t]    c3 C[g + 8, 2t + 1]

(m16n8k16, fp16: two values of k to a register, attn_flash_lowp.py.) So a thread holds, of a
16-row product, rows g and g + 8 and columns 2t, 2t + 1 of every 8-column fragment:
acc[hh, j] is row 8 hh + g, column 8 (j // 2) + 2t + j % 2 (col below). The own tile is the A
operand of every step_own, for every inner tile: it is loaded once per block, converted once, and
kept in shared memory in *fragment order*,

    own[plane, w, ks, 4 lane + i] = a_i of warp w's A fragment for k step ks,

so a thread reads its four registers of a k step with one 128-bit load (no bank conflicts: the
warp reads 512 consecutive bytes). The inner tiles are kept as [row, channel] with a pitch of
HS8 + 4 floats: lanes (g, t) reading [g, kk + t] hit 32 different banks.

Product formats. 3xTF32 (the fp32 recipe): a value x is big = tf32(x) (10 mantissa bits) plus
small = x - big, and a b = a_small b_big + a_big b_small + a_big b_big to about fp32's accuracy
(the a_small b_small term is below its rounding): three mma.sync m16n8k8 an 8-deep fragment. The
own tile is split once, into two planes (big, and small rounded to TF32); the inner tile's values
and the warp's p f or ds values are split as they are read, small = x - big handed to the tensor
core as it is: the mma reads its top 19 bits, a truncation, an error below 2^-21 |x| next to the
2^-22 of the term left out, for two instructions a value fewer (matmul.py, the note on matmul_v7).
fp16 (the fp16 recipe): one mma.sync m16n8k16 a 16-deep fragment, every input rounded to fp16 as
it is read, the own tile packed two values to a word once; the forward's softmax runs in base 2
with an integer running maximum, so that p f rounds to the same fp16 numbers in every tiling
(attn_flash_lowp.py, point 3). The softmax, its statistics, D and every sum stay fp32 in both.

Prefetch. Each inner tile is copied in two halves (warp_tile._copier): fetch loads this thread's
share of the next tile from global memory into registers, put stores them into shared memory.
An iteration starts the next tile's loads before the current tile's products, so that they
arrive while the tensor cores work:

    fetch tile 0; put; barrier
    for each tile j:   fetch tile j + 1 (registers)       <- global loads start
                       products and softmax on tile j     <- ... and arrive meanwhile
                       barrier (every warp is done with tile j); put tile j + 1; barrier

The K and V (or Q and dY) tiles of the same rows travel together: two barriers a tile. Where
every row of the [B, T, C] arrays starts on a 16-byte boundary (aligned_rows) a thread moves 4
floats with one 128-bit load and store, and the dq kernel reads dy and y 4 channels a load for
D; otherwise, and always in the simulator, one float at a time.

Shared memory. Static shared memory is 48 KiB a block; at hs = 64 (shared_bytes):

                 block (WARPS, BKV)   3xTF32    fp16
    forward      (4, 16)              47,616    23,040    64 query rows share each K and V tile
                 (2, 32)              38,912    26,624
                 (2, 16)              28,160    15,872
    backward     (2, 16)              46,720    22,144    (the dk/dv kernel; dq needs less)
                 (1, 16)              27,776    15,488
                 (2,  8)              40,256    15,680

The first of each is the default; the fp16 build runs the same blocks. Four warps do not fit the
3xTF32 backward: its two own tiles' planes alone would be 64 KiB. One warp with BKV = 32 fits
(38,656 bytes) but then each thread carries 128 floats of the next Q and dY tiles, more than its
registers hold. The 3xTF32 blocks above compile for sm_90 with 126 to 255 registers a thread
and no spills.

Grid. (B*H, tiles): blockIdx.x is the head, blockIdx.y the tile, numbered so that tile 0 is the
longest (the forward's and the dq kernel's last query tile visits every key tile; the dk/dv
kernel's first key tile visits every query tile). A GPU hands out blocks x first (in practice;
CUDA promises no order, and the results do not depend on one), so every head's longest tiles
start first and the short ones fill in at the end: the classic rule for jobs of unequal length
on parallel machines. On (tiles, B*H) the last head's longest tiles would start last, while the
rest of the GPU runs out of work.

Indices. Numba types thread and block indices as signed integers with Python's meaning of a
negative index; common.nonneg tells the compiler they are not negative, which drops that code
from every shared-memory read (the same elements, the same bits).

In the simulator the tensor-core steps are NumPy twins that compute each thread's outputs from
the same shared tiles (ptx.py: mma.sync needs 32 real lanes), and warp_sync is a block barrier.
"""
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import cuda, float32, int32

from .attn import NEG_INF, _check
from .attn_flash_lowp import kstep_nn16, kstep_own16, own_tile16
from .common import SIMULATOR, BlockDoesNotFit, address, blocks, cdiv, nonneg, rung
from .dropout import dropout_factor, key_value, mask_args
from .ptx import load4, mma_tf32, tf32_round
from .warp_tile import WARP, _copier

SHARED_LIMIT = 48 * 1024                    # bytes of static shared memory per block

# (WARPS, BKV). GPU: the table in the module docstring, the first is the default. Simulator: one
# and two warps, inner tiles of 8 and 16 rows (two fragments per product: more than one n step).
# The fp16 build: one warp in the simulator, (1, 8) (half a k16 step, two key tiles at the
# harness's T = 13) and (1, 16) (whole k16 steps); tests/test_attn_flash_lowp.py runs (2, 16).
TF32X3_FWD_BLOCKS = dict(gpu=((4, 16), (2, 32), (2, 16)), sim=((1, 8), (2, 16)))
TF32X3_BWD_BLOCKS = dict(gpu=((2, 16), (1, 16), (2, 8)), sim=((1, 8), (2, 16)))
FP16_FWD_BLOCKS = dict(gpu=((4, 16), (2, 32), (2, 16)), sim=((1, 8), (1, 16)))
FP16_BWD_BLOCKS = dict(gpu=((2, 16), (1, 16), (2, 8)), sim=((1, 8), (1, 16)))


def aligned_rows(hs: int, *arrays) -> bool:
    """True when the tiles of these [B, T, C] arrays can be copied 4 floats at a time: hs and C
    multiples of 4 (a chunk never straddles two heads or two rows), C-contiguous float32 arrays
    starting on a 16-byte boundary. Never in the simulator (its copies go one float at a time)."""
    if SIMULATOR or hs % 4:
        return False
    for x in arrays:
        if x.ndim != 3 or x.shape[2] % 4 or x.strides != (4 * x.shape[1] * x.shape[2], 4 * x.shape[2], 4):
            return False
        if address(x) % 16:                        # (host arrays too: ptxcheck)
            return False
    return True


if SIMULATOR:
    @cuda.jit(device=True)
    def warp_sync():
        """The simulator has no warps (and no syncwarp): a block barrier, stronger, in its place."""
        cuda.syncthreads()
else:
    @cuda.jit(device=True)
    def warp_sync():
        """Wait for the other lanes of this warp; their shared-memory writes are then visible.
        PTX: bar.warp.sync 0xffffffff;"""
        cuda.syncwarp(0xFFFFFFFF)


# ---------------------------------------------------------------------------------------------
# The 3xTF32 format's pieces: the own tile's two planes and the two kinds of k step

def own_tile_tf32x3(HS, NK):
    """load_own(f, x, r0, c0, T, w, g, t): this lane's A fragments of the 16 rows r0 + 16 w .. of
    x [T, C] (channels c0 .. c0 + HS - 1, zero past T and past HS), split into big and small
    parts, into the planes f[0] and f[1] in fragment order (module docstring). One float at a
    time, straight from global memory: it runs once per block, before the first tile."""
    @cuda.jit(device=True)
    def load_own(f, x, r0, c0, T, w, g, t):
        lane = 4 * g + t
        for ks in range(NK):
            for i in range(4):                            # a0 A[g, t], a1 A[g+8, t], a2 A[g, t+4], a3 A[g+8, t+4]
                r = r0 + 16 * w + g + 8 * (i % 2)
                d = 8 * ks + t + 4 * (i // 2)
                val = x[r, c0 + d] if r < T and d < HS else float32(0.0)
                big = tf32_round(val)
                f[0, w, ks, 4 * lane + i] = big           # x = big + small (small: the next 11 bits)
                f[1, w, ks, 4 * lane + i] = tf32_round(val - big)
    return load_own


def kstep_own_tf32x3(WARPS, NK, NI):
    """step(acc, f, sb, ks, w, g, t): acc (2, 2 NI) += this thread's share of
    own[16 rows of warp w, channels 8 ks .. 8 ks + 7] @ tile^T, the own tile from its planes f,
    the tile [n, channel] in shared memory (rows of K, V, Q or dY), split as read: for each
    8-row fragment of the tile, three mma.sync m16n8k8, then acc += the 8-deep product."""
    PLANE = WARPS * NK * 4 * WARP                         # floats of one plane

    if SIMULATOR:
        # The twin (mma.sync needs 32 real lanes): rows g and g + 8 of the warp's A slice are the
        # values big + small of lanes 4 g .. 4 g + 3 (slots 0 and 2 make row g, slots 1 and 3 row
        # g + 8); this thread's 2 x 2 NI outputs are one NumPy product from the same shared tiles.
        COL = np.array([(j // 2) * 8 + j % 2 for j in range(2 * NI)])        # col(j) - 2t

        def step(acc, f, sb, ks, w, g, t):
            own = f[0, w, ks] + f[1, w, ks]
            a = own.reshape(WARP, 4)[4 * g:4 * g + 4]      # lanes 4g .. 4g+3, slots
            rows = np.stack([np.concatenate([a[:, 0], a[:, 2]]), np.concatenate([a[:, 1], a[:, 3]])])   # 2 x 8
            n = (COL + 2 * t)[:, None]                      # the tile's rows: this thread's columns
            k = np.arange(8 * ks, 8 * ks + 8)[None, :]
            acc += rows @ sb[n, k].T
        return step

    @cuda.jit(device=True)
    def step(acc, f, sb, ks, w, g, t):
        i = (w * NK + ks) * 4 * WARP + 4 * (4 * g + t)
        ab0, ab1, ab2, ab3 = load4(f, i)                  # big parts of a0 .. a3: one 128-bit load
        as0, as1, as2, as3 = load4(f, i + PLANE)          # small parts
        kk = 8 * ks
        zero = float32(0.0)
        for ni in range(NI):                              # b0 B[t, g] = tile[n, kk + t], b1 B[t+4, g]
            n = ni * 8 + g
            x0, x1 = sb[n, kk + t], sb[n, kk + t + 4]
            bb0, bb1 = tf32_round(x0), tf32_round(x1)
            bs0, bs1 = x0 - bb0, x1 - bb1                 # (the tensor core truncates them to TF32)
            c0, c1, c2, c3 = mma_tf32(as0, as1, as2, as3, bb0, bb1, zero, zero, zero, zero)   # small * big
            c0, c1, c2, c3 = mma_tf32(ab0, ab1, ab2, ab3, bs0, bs1, c0, c1, c2, c3)           # + big * small
            c0, c1, c2, c3 = mma_tf32(ab0, ab1, ab2, ab3, bb0, bb1, c0, c1, c2, c3)           # + big * big
            acc[0, 2 * ni] += c0                          # c0 C[g, 2t], c1 C[g, 2t+1], c2 C[g+8, 2t], c3 C[g+8, 2t+1]
            acc[0, 2 * ni + 1] += c1
            acc[1, 2 * ni] += c2
            acc[1, 2 * ni + 1] += c3
    return step


def kstep_nn_tf32x3(NI, BKV):
    """step(acc, sa, sb, kk, wm0, wn0, g, t): acc (2, 2 NI) += this thread's share of
    sa[rows wm0 .. wm0 + 15, keys kk .. kk + 7] @ sb[keys kk .. kk + 7, columns wn0 ..], both fp32
    tiles in shared memory (sa: p f or ds, [row, key]; sb: V, K, dY or Q, [key, channel]), every
    value split as read: for each 8-column fragment, three mma.sync m16n8k8. (BKV: kstep_nn16's
    argument; a TF32 step is 8 keys deep and BKV a multiple of 8.)"""
    if SIMULATOR:
        ROW = np.array([0, 8])                                               # row(i) - wm0 - g
        COL = np.array([(j // 2) * 8 + j % 2 for j in range(2 * NI)])        # col(j) - wn0 - 2t

        def step(acc, sa, sb, kk, wm0, wn0, g, t):
            a = sa[ROW + (wm0 + g), kk:kk + 8]             # 2 x 8
            b = sb[kk:kk + 8][:, COL + (wn0 + 2 * t)]       # 8 x 2 NI
            acc += a @ b
        return step

    @cuda.jit(device=True)
    def step(acc, sa, sb, kk, wm0, wn0, g, t):
        m = wm0 + g                                       # a0 A[g, t], a1 A[g+8, t], a2 A[g, t+4], a3 A[g+8, t+4]
        x0, x1, x2, x3 = sa[m, kk + t], sa[m + 8, kk + t], sa[m, kk + t + 4], sa[m + 8, kk + t + 4]
        ab0, ab1, ab2, ab3 = tf32_round(x0), tf32_round(x1), tf32_round(x2), tf32_round(x3)
        as0, as1, as2, as3 = x0 - ab0, x1 - ab1, x2 - ab2, x3 - ab3
        zero = float32(0.0)
        for ni in range(NI):                              # b0 B[t, g], b1 B[t+4, g]
            n = wn0 + ni * 8 + g
            y0, y1 = sb[kk + t, n], sb[kk + t + 4, n]
            bb0, bb1 = tf32_round(y0), tf32_round(y1)
            bs0, bs1 = y0 - bb0, y1 - bb1
            c0, c1, c2, c3 = mma_tf32(as0, as1, as2, as3, bb0, bb1, zero, zero, zero, zero)   # small * big
            c0, c1, c2, c3 = mma_tf32(ab0, ab1, ab2, ab3, bs0, bs1, c0, c1, c2, c3)           # + big * small
            c0, c1, c2, c3 = mma_tf32(ab0, ab1, ab2, ab3, bb0, bb1, c0, c1, c2, c3)           # + big * big
            acc[0, 2 * ni] += c0
            acc[0, 2 * ni + 1] += c1
            acc[1, 2 * ni] += c2
            acc[1, 2 * ni + 1] += c3
    return step


@dataclass(frozen=True)
class ProductFormat:
    """How the products are made: the kernels' only switch."""
    name: str              # the kernels' names end with it: k_attn_flash_fwd_tf32x3, ..._fp16
    KS: int                # the mma's k step (channels or keys a step)
    planes: int            # planes of the own tiles in shared memory
    own_type: object       # their element type: float32 values, or int32 words of two packed halves
    log2: bool             # the forward's softmax in base 2 with an integer maximum
    own_tile: Callable     # (HS, NK) -> load_own
    kstep_own: Callable    # (WARPS, NK, NI) -> step_own
    kstep_nn: Callable     # (NI, BKV) -> step_nn


TF32X3 = ProductFormat("tf32x3", 8, 2, float32, False, own_tile_tf32x3, kstep_own_tf32x3, kstep_nn_tf32x3)
FP16 = ProductFormat("fp16", 16, 1, int32, True, lambda HS, NK: own_tile16(HS, NK, "fp16"),
                     lambda WARPS, NK, NI: kstep_own16(NK, NI, "fp16"), lambda NI, BKV: kstep_nn16(NI, BKV, "fp16"))


def shared_bytes(hs: int, warps: int, bkv: int, fmt: ProductFormat = TF32X3, forward_only: bool = False) -> int:
    """Bytes of static shared memory of the forward (forward_only) or of the larger backward kernel."""
    HS8, BQ = cdiv(hs, fmt.KS) * fmt.KS, 16 * warps
    P, PK = HS8 + 4, bkv + 4
    own = fmt.planes * BQ * HS8 // (2 if fmt.own_type is int32 else 1)   # an own tile's planes (or packed words)
    fwd = own + 2 * bkv * P + BQ * PK + BQ * 4                # q, K and V tiles, p f, red
    dq = 2 * own + 2 * bkv * P + BQ * PK + BQ                 # q, dy, K and V tiles, ds, D of the rows
    dkdv = 2 * own + 2 * bkv * P + 2 * BQ * PK + 2 * bkv      # k, v, Q and dY tiles, P f, ds, lse, D
    return 4 * (fwd if forward_only else max(dq, dkdv))


# ---------------------------------------------------------------------------------------------
# The three kernels

def make_kernels(HS: int, WARPS: int, BKV: int, VEC: bool, fmt: ProductFormat):
    """The three kernels for head size HS, block (WARPS, BKV), 128-bit copies VEC (the caller
    checked the alignment: aligned_rows) and product format fmt, as compile-time constants."""
    KS = fmt.KS                   # the mma's k step: 8 (TF32), 16 (fp16)
    HS8 = cdiv(HS, KS) * KS       # head size rounded up to the k step (tiles zero-padded)
    BQ = 16 * WARPS               # rows of the block's own tile: 16 per warp
    NT = WARP * WARPS             # threads of a block
    P = HS8 + 4                   # pitch of the inner tiles: conflict-free fragment reads
    PK = BKV + 4                  # pitch of the p f and ds tiles
    NK = HS8 // KS                # k steps over the head's channels
    NQ, NH = BKV // 8, HS8 // 8   # 8-column fragments of a BKV-wide and of an HS8-wide product
    SQ, SH = 2 * NQ, 2 * NH       # a thread's columns of such a product (two per fragment)
    LPT = cdiv(BKV, NT)           # lse and D values per thread of a query tile (dk/dv kernel)
    assert BKV % 8 == 0 and (BKV * HS8) % NT == 0, f"block ({WARPS}, {BKV}) does not tile head size {HS}"
    E = BKV * HS8 // NT           # floats of an inner tile per thread
    fetch, put, _ = _copier(BKV, HS8, P, NT, VEC and E % 4 == 0, nonneg_index=True)
    load_own = fmt.own_tile(HS, NK)
    step_own = fmt.kstep_own(WARPS, NK, NQ)   # acc (2, SQ) += own[16 rows, KS] @ tile^T  (q k^T, dy v^T, ...)
    step_nn = fmt.kstep_nn(NH, BKV)           # acc (2, SH) += sa[16 rows, KS] @ tile     ((p f) v, ds k, ...)
    OWN, OWN_T = (fmt.planes, WARPS, NK, 4 * WARP), fmt.own_type   # an own tile: planes, warps, k steps, fragments
    LOG2 = fmt.log2

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
        """Block (b*H + h, query tile of BQ rows t0 ..); warp w owns rows t0 + 16 w .. + 15. Per key
        tile of BKV keys u0 <= the tile's last row: s = q k^T (q from its planes), the row maxima
        m and sums l of exp(s - m) updated online, y += (p f) v; at the end y /= l, lse = m + log l.
        The next K and V tiles load during the products (module docstring)."""
        key = key_value(dropout_key)
        fq = cuda.shared.array(OWN, OWN_T, alignment=16)   # q, in fragment order
        sk = cuda.shared.array((BKV, P), float32, alignment=16)     # the K tile of the current keys
        sv = cuda.shared.array((BKV, P), float32, alignment=16)     # the V tile of the same keys
        sp = cuda.shared.array((BQ, PK), float32)                   # p f of the tile (rows of each warp)
        red = cuda.shared.array((BQ, 4), float32)                   # a row's 4 lanes' partial max (or sum)
        rk = cuda.local.array(E, float32)                  # the next K tile, on its way in
        rv = cuda.local.array(E, float32)                  # the next V tile
        s = cuda.local.array((2, SQ), float32)             # s of rows g, g + 8 (this thread's columns)
        o = cuda.local.array((2, SH), float32)             # y's sums of rows g, g + 8
        m = cuda.local.array(2, float32)                   # running maximum of the two rows
        lsum = cuda.local.array(2, float32)                # this lane's part of their running sums
        T = q.shape[1]
        H = lse.shape[1]
        bh = nonneg(cuda.blockIdx.x)                       # grid (B*H, tiles)
        b, h = nonneg(bh // H), nonneg(bh % H)
        c0 = h * HS
        t0 = nonneg(cuda.gridDim.y - 1 - cuda.blockIdx.y) * BQ     # tile 0: the last rows, the longest
        w, lane = nonneg(cuda.threadIdx.x) // WARP, nonneg(cuda.threadIdx.x) % WARP
        wm0 = 16 * w
        g, tq = lane >> 2, lane & 3
        kb, vb = k[b], v[b]                                # [T, C] rows of this batch element
        zero(o)
        for hh in range(2):
            m[hh] = NEG_INF
            lsum[hh] = 0.0
        load_own(fq, q[b], t0, c0, T, w, g, tq)            # converted once, used for every key tile
        n_tiles = (min(T, t0 + BQ) + BKV - 1) // BKV       # keys 0 .. min(T, t0 + BQ) - 1
        fetch(rk, kb, 0, c0, T, c0 + HS)
        fetch(rv, vb, 0, c0, T, c0 + HS)
        put(sk, rk)
        put(sv, rv)
        cuda.syncthreads()                                 # q and the first tiles are in place
        for j in range(n_tiles):
            u0 = j * BKV
            more = j + 1 < n_tiles                         # the same in every thread of the block
            if more:                                       # the next keys' K and V: loads in flight
                fetch(rk, kb, u0 + BKV, c0, T, c0 + HS)    # during the products below
                fetch(rv, vb, u0 + BKV, c0, T, c0 + HS)
            zero(s)
            for ks in range(NK):                           # s = q k^T over the head's channels
                step_own(s, fq, sk, nonneg(ks), w, g, tq)
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
                if LOG2:                                   # fp16: s in base 2, m an integer
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
            for kk in range(0, BKV, KS):                   # y's sums += (p f) @ v
                step_nn(o, sp, sv, nonneg(kk), wm0, 0, g, tq)
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
        """Block (b*H + h, query tile of BQ rows t0 ..): first D[t] = dy[t] . y[t] of its rows, one
        thread a row in channel order, kept in shared memory and written to d_rowdot for the dk/dv
        kernel; then per key tile u0 <= the tile's last row: s = q k^T, datt' = dy v^T (q and dy
        from their planes), ds = P (f datt' - D) into the warp's rows of a shared tile,
        dq += ds k; at the end dq *= scale. The next K and V tiles load during the products."""
        key = key_value(dropout_key)
        fq = cuda.shared.array(OWN, OWN_T, alignment=16)   # q, in fragment order
        fdy = cuda.shared.array(OWN, OWN_T, alignment=16)  # dy, in fragment order
        sk = cuda.shared.array((BKV, P), float32, alignment=16)
        sv = cuda.shared.array((BKV, P), float32, alignment=16)
        sds = cuda.shared.array((BQ, PK), float32)
        sd = cuda.shared.array(BQ, float32)                # D of the tile's rows
        rk = cuda.local.array(E, float32)
        rv = cuda.local.array(E, float32)
        s = cuda.local.array((2, SQ), float32)
        da = cuda.local.array((2, SQ), float32)
        acc = cuda.local.array((2, SH), float32)
        lse_t = cuda.local.array(2, float32)
        d_t = cuda.local.array(2, float32)
        T = q.shape[1]
        H = lse.shape[1]
        bh = nonneg(cuda.blockIdx.x)
        b, h = nonneg(bh // H), nonneg(bh % H)
        c0 = h * HS
        t0 = nonneg(cuda.gridDim.y - 1 - cuda.blockIdx.y) * BQ
        w, lane = nonneg(cuda.threadIdx.x) // WARP, nonneg(cuda.threadIdx.x) % WARP
        wm0 = 16 * w
        g, tq = lane >> 2, lane & 3
        kb, vb = k[b], v[b]
        zero(acc)
        for hh in range(2):
            t = t0 + wm0 + 8 * hh + g
            lse_t[hh] = lse[b, h, t] if t < T else float32(0.0)
        for r in range(nonneg(cuda.threadIdx.x), BQ, NT):      # D[t] = sum_d dy[t, d] y[t, d]
            t = t0 + r
            dd = float32(0.0)
            if t < T:
                if VEC:                                    # 4 channels a load, the same sum in the same order
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
                d_rowdot[b, h, t] = dd                     # for the dk/dv kernel, launched next
            sd[r] = dd
        load_own(fq, q[b], t0, c0, T, w, g, tq)
        load_own(fdy, dy[b], t0, c0, T, w, g, tq)
        n_tiles = (min(T, t0 + BQ) + BKV - 1) // BKV
        fetch(rk, kb, 0, c0, T, c0 + HS)
        fetch(rv, vb, 0, c0, T, c0 + HS)
        put(sk, rk)
        put(sv, rv)
        cuda.syncthreads()                                 # (sd too)
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
                step_own(s, fq, sk, nonneg(ks), w, g, tq)       # q k^T
                step_own(da, fdy, sv, nonneg(ks), w, g, tq)     # dy v^T
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
                step_nn(acc, sds, sk, nonneg(kk), wm0, 0, g, tq)
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
            jj = nonneg(cuda.threadIdx.x) + i * NT
            regs[i] = a[b, h, t0 + jj] if jj < BKV and t0 + jj < T else float32(0.0)

    @cuda.jit(device=True)
    def put_rows(s, regs):
        for i in range(LPT):
            jj = nonneg(cuda.threadIdx.x) + i * NT
            if jj < BKV:
                s[jj] = regs[i]

    def k_attn_flash_bwd_dkdv(dk, dv, dy, q, k, v, lse, d_rowdot, scale, dropout_key, threshold, dscale):
        """Block (b*H + h, key tile of BQ keys u0 ..); per query tile of BKV queries t0 >= u0:
        s^T = k q^T, datt'^T = v dy^T (k and v from their planes), P^T = exp(scale s^T - lse),
        dv += (P f)^T dy and dk += ds^T q; at the end dk *= scale. The next Q and dY tiles and
        their lse and D load during the products."""
        key = key_value(dropout_key)
        fk = cuda.shared.array(OWN, OWN_T, alignment=16)   # k, in fragment order
        fv = cuda.shared.array(OWN, OWN_T, alignment=16)   # v, in fragment order
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
        bh = nonneg(cuda.blockIdx.x)
        b, h = nonneg(bh // H), nonneg(bh % H)
        c0 = h * HS
        u0 = nonneg(cuda.blockIdx.y) * BQ                  # tile 0: the first keys, the longest
        w, lane = nonneg(cuda.threadIdx.x) // WARP, nonneg(cuda.threadIdx.x) % WARP
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
                step_own(st, fk, sq, nonneg(ks), w, g, tq)      # k q^T
                step_own(dat, fv, sdy, nonneg(ks), w, g, tq)    # v dy^T
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
                step_nn(vacc, spf, sdy, nonneg(kk), wm0, 0, g, tq)  # dv += (P f)^T @ dy
                step_nn(kacc, sds, sq, nonneg(kk), wm0, 0, g, tq)   # dk += ds^T @ q
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

    def jit(fn):
        fn.__name__ = fn.__qualname__ = f"{fn.__name__}_{fmt.name}"     # k_attn_flash_fwd_tf32x3, ...
        return cuda.jit(fn)

    return jit(k_attn_flash_fwd), jit(k_attn_flash_bwd_dq), jit(k_attn_flash_bwd_dkdv)


# ---------------------------------------------------------------------------------------------
# The launchers

_KERNELS = {}       # (hs, WARPS, BKV, vec, format name) -> the three kernels


def kernels(hs, block, vec, fmt, forward_only=False):
    """The kernels of head size hs, block (WARPS, BKV) and format fmt, after checking that they fit."""
    warps, bkv = block
    need = shared_bytes(hs, warps, bkv, fmt, forward_only=forward_only)
    if need > SHARED_LIMIT:
        raise BlockDoesNotFit(f"flash attention ({fmt.name}): head size {hs} needs {need} bytes of shared memory "
                              f"with block {block}, more than {SHARED_LIMIT}")
    if bkv % 8 or (bkv * cdiv(hs, fmt.KS) * fmt.KS) % (WARP * warps):
        raise BlockDoesNotFit(f"flash attention ({fmt.name}): block {block} does not split a {bkv}-row tile of "
                              f"head size {hs} over {WARP * warps} threads (BKV a multiple of 8)")
    key = (hs, warps, bkv, vec, fmt.name)
    if key not in _KERNELS:
        _KERNELS[key] = make_kernels(hs, warps, bkv, vec, fmt)     # numba compiles each on its first launch
    return _KERNELS[key]


def _forward(fmt, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream):
    B, T, C, hs = _check(q, n_head)
    warps = block[0]
    fwd = kernels(hs, block, aligned_rows(hs, k, v), fmt, forward_only=True)[0]
    scale = 1.0 / math.sqrt(hs) * (1.0 / math.log(2.0) if fmt.log2 else 1.0)   # base 2: s log2(e)
    fwd[(B * n_head, cdiv(T, 16 * warps)), WARP * warps, stream](
        y, lse, q, k, v, np.float32(scale), *mask_args(dropout_p, dropout_key))


def _backward(fmt, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream):
    B, T, C, hs = _check(q, n_head)
    warps = block[0]
    _, dq_kernel, dkdv_kernel = kernels(hs, block, aligned_rows(hs, q, k, v, dy, y), fmt)
    scale = np.float32(1.0 / math.sqrt(hs))
    drop = mask_args(dropout_p, dropout_key)
    grid, NT = (B * n_head, cdiv(T, 16 * warps)), WARP * warps
    dq_kernel[grid, NT, stream](dq, d_rowdot, dy, q, k, v, y, lse, scale, *drop)      # writes D to d_rowdot
    dkdv_kernel[grid, NT, stream](dk, dv, dy, q, k, v, lse, d_rowdot, scale, *drop)   # reads it


@rung(8)
@blocks(**TF32X3_FWD_BLOCKS)
def attn_flash_fwd_tf32x3(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """y [B, T, C] and lse [B, H, T] with 3xTF32 products. Grid (B*H, T / (16 WARPS) query
    tiles), 32 WARPS threads; block = (WARPS, BKV)."""
    _forward(TF32X3, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream)


@rung(10)
@blocks(**TF32X3_BWD_BLOCKS)
def attn_flash_bwd_tf32x3(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                          block, stream=0):
    """dq, dk, dv [B, T, C] with 3xTF32 products; d_rowdot [B, H, T] receives D = dy . y from the dq
    kernel, which the dk/dv kernel reads. Both on grid (B*H, T / (16 WARPS) tiles), 32 WARPS
    threads; block = (WARPS, BKV)."""
    _backward(TF32X3, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream)


@rung(12)
@blocks(**FP16_FWD_BLOCKS)
def attn_flash_fwd_fp16(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """As attn_flash_fwd_tf32x3 with fp16 products (cvt.rn.f16x2.f32, mma.sync ... .f16.f16: 11
    significant bits, nothing above 65504) and the online softmax in base 2 with an integer maximum."""
    _forward(FP16, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream)


@rung(12)
@blocks(**FP16_BWD_BLOCKS)
def attn_flash_bwd_fp16(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                        block, stream=0):
    """As attn_flash_bwd_tf32x3 with fp16 products."""
    _backward(FP16, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream)


# the harness checks these against the twin under products_in("fp16")
attn_flash_fwd_fp16.precision = attn_flash_bwd_fp16.precision = "fp16"
