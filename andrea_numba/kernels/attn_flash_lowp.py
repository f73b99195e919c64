"""Flash attention v11 (bf16 products) and v12 (fp16 products): v8's forward and v10's backward
with every product on mma.sync m16n8k16, its inputs rounded to a 16-bit format.

Read attn_flash.py (the math), then attn_flash_tf32x3.py (the tiles, the prefetch, the grid and
D): v12 is that kernel text with the pieces below in place of the 3xTF32 ones (its fp16 build,
attn_flash_fwd_fp16 / attn_flash_bwd_fp16); the lab's v11 (bf16) is the same text built from
flags (lab/attn_flash_v3.py's make_kernels, HALF = "bf16"). Both lie above this module. What
stays fp32: the softmax, its statistics (the running maximum m, the sum l, lse and D = dy . y),
every sum, and the tiles in shared memory.
What is rounded: the inputs of the five kinds of product, as fragments are formed,

    forward   s = q k^T       q (the own tile) and k         y += (p~ f) @ v       p~ f and v
    backward  s = q k^T       q and k (both kernels)        datt' = dy v^T        dy and v
              dv += (P f)^T dy     P f and dy                dq += ds @ k         ds and k
              dk += ds^T q         ds and q

and the scale 1/sqrt(hs) multiplies fp32 sums (the scores after q k^T, dq and dk at the end),
never a rounded input, as the twin (reference/attn.py) does. Where v8 ran six mma.sync m16n8k8 for
16 values of k (three products of TF32 parts, two k steps of 8), v11 runs one m16n8k16.

1. The own tile, rounded once. The rows a block owns (q; q and dy; k and v) are the A operand of
   every s-like product. v8 kept them as two TF32 planes of floats; v11 rounds and packs them once,
   two values to a 32-bit word (ptx.bf16x2: cvt.rn.bf16x2.f32), in fragment order:
       own[0, w, ks, 4 lane + i] = a_i of warp w's A fragment for channels 16 ks .. 16 ks + 15
   one 128-bit shared load (load4_b32) gives a thread its four registers a0..a3 of a k step, with
   no conversion in the loop; the tile takes a quarter of v8's two planes of shared memory.

2. Which channel is which k. An mma sums its 16 values of k in whatever order we name them, as
   long as A and B use the same names. The m16n8k16 fragment (ptx.py) gives lane t the k pairs
   (2t, 2t + 1) and (2t + 8, 2t + 9). For the s-like products the B operand is an inner tile read
   as [key, channel] (pitch HS16 + 4, v3's pad): lane (g, t) reading channel c of row g hits bank
   4 g + c (mod 32), free of conflicts when the four lanes t read four channels different mod 4.
   So lane t's pairs are named on the channels
       (c0 + t, c0 + t + 4)  ->  k pair (2t, 2t + 1)         (registers a0, a1 of A and b0 of B)
       (c0 + t + 8, c0 + t + 12)  ->  k pair (2t + 8, 2t + 9)   (a2, a3 and b1)
   which are v8's two k steps' columns t and t + 4: the same conflict-free reads. The own tile is
   packed with the same names.
   The other products (p~ f @ V, ds @ K, (P f)^T @ dY, ds^T @ Q) read their B tile as [key,
   channel] with k = key along its rows: lane (g, t) reading key row r of column g hits bank
   4 r + g, free of conflicts for the PTX's own naming r = 2t, 2t + 1, 2t + 8, 2t + 9 (v8's
   step read rows t and t + 4, two lanes to a bank). Their A operand (p~ f or ds, the warp's rows
   of a shared tile in fp32) is read with the same names, as v8 read it, and rounded as it is read.
   A tile of 8 keys (block (2, 8), and (1, 8) in the simulator) fills the lower half of one k16
   step; the upper half's registers are zero.

3. The online softmax in base 2 with an integer maximum. A kernel rounds p~ f with
   p~ = exp(s - m_j), m_j the running maximum after key tile j, not the final P = exp(s - lse):
   with a real m_j the rounded numbers would depend on the tiling, and no twin could round the
   same ones. v11 keeps the scores in base 2 (the launcher passes scale log2(e)) and rounds the
   maximum up to an integer: m_j = ceil(max s2), p~ = 2^(s2 - m_j), alpha = 2^(m_old - m_new).
   Then p~ is the same number in every tiling times a power of two, 2^(M - m_j), and a power of two
   moves no bit of a mantissa: p~ f rounds to the same bf16 times the same power (fp16: above its
   subnormals, 6.1e-5, where p~ f counts for little). The twin rounds 2^(s2 - M) f with M the last
   tile's m. p~ stays in (0, 1] and the largest p~ of a row is at least 1/2 (no overflow, l >= 1/2);
   lse = ln 2 (m + log2 l). The backward recomputes P = exp(s - lse), the same in every tiling.

4. Left for a later version: register reuse. A thread's score accumulators s[hh, jj] are C
   fragments: rows g and g + 8, keys 8 j + 2t and 8 j + 2t + 1 of 8-key fragment j. The A fragment
   of an m16n8k16 over keys 16 i .. 16 i + 15 wants rows g and g + 8 at keys 2t, 2t + 1 (a0, a1)
   and 2t + 8, 2t + 9 (a2, a3): the C values of fragments j = 2i and 2i + 1 of the same thread,
       a0 = pack(s[0, 4i], s[0, 4i + 1])   a1 = pack(s[1, 4i], s[1, 4i + 1])
       a2 = pack(s[0, 4i + 2], s[0, 4i + 3])   a3 = pack(s[1, 4i + 2], s[1, 4i + 3])
   so p~ f (and ds, (P f)^T, ds^T in the backward) could go from registers straight into the next
   product, without the shared tiles sp, sds, spf and their warp syncs (FlashAttention-2's way;
   point 2's naming of keys is already the PTX's for those products). v11 keeps v8's shared tiles,
   so that one kernel text (lab/attn_flash_v3.py's make_kernels) serves v3 to v12.

Order and determinism are v8's: each output element is summed by one thread in a fixed order, no
atomics, bit-identical reruns. Shared memory and registers are v8's or less; the blocks are v8's
and v10's (the first is the default). In the simulator the k16 steps are NumPy twins: each thread's
outputs from the same shared tiles, the inputs rounded as the GPU rounds them (ptx.py's twins of
bf16x2 and f16x2, reference/precision.py), fp32 sums.
"""
import numpy as np
from numba import cuda, float32, int32


from .common import SIMULATOR
from .ptx import bf16x2, f16x2, mma_bf16, mma_f16, sim_round_bf16, sim_round_fp16
from .warp_tile import WARP

if not SIMULATOR:      # the code generator of load4_b32 (below)
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

HALF = {"bf16": (bf16x2, mma_bf16, sim_round_bf16), "fp16": (f16x2, mma_f16, sim_round_fp16)}   # pack, mma, the simulator's rounding
HALF_VERSION = {"bf16": 11, "fp16": 12}

# The own tile's 16 channels of a k step in the order of a lane's registers: lane t packs channels
# t, t + 4 (its k pair 2t, 2t + 1) and t + 8, t + 12 (2t + 8, 2t + 9); point 2 of the docstring.
OWN_CHANNELS = np.array([[t + 8 * hi + 4 * e for hi in range(2) for e in range(2)] for t in range(4)])   # [t, 4]

if SIMULATOR:
    def load4_b32(arr, index):
        flat = arr.reshape(-1)
        return flat[index], flat[index + 1], flat[index + 2], flat[index + 3]
else:
    _I4 = types.UniTuple(types.int32, 4)

    @intrinsic
    def load4_b32(typingctx, arr, index):
        """(arr.flat[index], ..., arr.flat[index + 3]) of a C-contiguous int32 array, element `index`
        on a 16-byte boundary: ptx.load4 for 32-bit words (four packed bf16 pairs).   PTX: ld.v4.u32"""
        if not (isinstance(arr, types.Array) and arr.dtype == types.int32 and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            ptr = builder.gep(data, [context.cast(builder, args[1], sig.args[1], types.intp)])
            i32 = ir.IntType(32)
            vec = builder.load(builder.bitcast(ptr, ir.VectorType(i32, 4).as_pointer()), align=16)
            return context.make_tuple(builder, _I4, [builder.extract_element(vec, ir.Constant(i32, i))
                                                     for i in range(4)])
        return _I4(arr, index), codegen


def unpack(fmt, words):
    """Simulator only: the values of packed bf16 or fp16 pairs (int32 words), as float32
    [..., 2]: the low half first."""
    bits = np.asarray(words, np.int32).view(np.uint32)
    halves = np.stack([bits & np.uint32(0xFFFF), bits >> np.uint32(16)], axis=-1)
    if fmt == "bf16":
        return (halves << np.uint32(16)).view(np.float32)
    return halves.astype(np.uint16).view(np.float16).astype(np.float32)


# Simulator only: where the 32 values of the 16 words of lanes 4g .. 4g + 3 (4 slots each, two
# halves a word) go in rows g and g + 8 of a k step: slot i is row i % 2, channels
# OWN_CHANNELS[t, 2 (i // 2)] and the next one.
_SLOT_ROW = np.array([[i % 2] * 2 for t in range(4) for i in range(4)])                              # [16, 2]
_SLOT_CHANNEL = np.array([OWN_CHANNELS[t, 2 * (i // 2):2 * (i // 2) + 2] for t in range(4) for i in range(4)])


def own_tile16(HS, NK, fmt):
    """load_own(f, x, r0, c0, T, w, g, t): this lane's A fragments of the 16 rows r0 + 16 w .. of
    x [T, C] (channels c0 .. c0 + HS - 1, zero past T and past HS), rounded and packed two to a
    word, into f[0, w, ks, 4 lane + i] (docstring, points 1 and 2): slot i is row g + 8 (i % 2),
    channels 16 ks + t + 8 (i // 2) and 4 further. One float at a time, once per block."""
    pack = HALF[fmt][0]

    @cuda.jit(device=True)
    def load_own(f, x, r0, c0, T, w, g, t):
        lane = 4 * g + t
        for ks in range(NK):
            for i in range(4):                 # a0 A[g, k 2t..], a1 A[g+8, 2t..], a2 A[g, 2t+8..], a3 A[g+8, 2t+8..]
                r = r0 + 16 * w + g + 8 * (i % 2)
                d = 16 * ks + t + 8 * (i // 2)  # the pair's channels d, d + 4
                lo = x[r, c0 + d] if r < T and d < HS else float32(0.0)
                hi = x[r, c0 + d + 4] if r < T and d + 4 < HS else float32(0.0)
                f[0, w, ks, 4 * lane + i] = pack(lo, hi)
    return load_own


def kstep_own16(NK, NI, fmt):
    """step(acc, f, sb, ks, w, g, t): acc (2, 2 NI) += this thread's share of
    own[16 rows of warp w, channels 16 ks ..] @ tile^T, the own tile packed in f (own_tile16), the
    tile [n, channel] in shared memory in fp32, rounded as read: one mma.sync m16n8k16 an 8-row
    fragment of the tile, added to acc in fp32 as v8 adds each product."""
    pack, mma16, rnd = HALF[fmt]

    if SIMULATOR:
        COL = np.array([(j // 2) * 8 + j % 2 for j in range(2 * NI)])        # col(j) - 2t

        def step(acc, f, sb, ks, w, g, t):
            rows = np.zeros((2, 16), np.float32)        # rows g and g + 8 by channel, from lanes 4g .. 4g + 3
            rows[_SLOT_ROW, _SLOT_CHANNEL] = unpack(fmt, f[0, w, ks, 16 * g:16 * g + 16])
            n = COL + 2 * t                             # the tile's rows: this thread's columns
            with np.errstate(over="ignore", invalid="ignore"):
                acc += rows @ rnd(sb[n, 16 * ks:16 * ks + 16]).T
        return step

    @cuda.jit(device=True)
    def step(acc, f, sb, ks, w, g, t):
        a0, a1, a2, a3 = load4_b32(f, (w * NK + ks) * 4 * WARP + 4 * (4 * g + t))   # one 128-bit load
        kk = 16 * ks
        zero = float32(0.0)
        for ni in range(NI):                          # b0: channels kk + t, + 4; b1: kk + t + 8, + 12 (row n)
            n = ni * 8 + g
            b0 = pack(sb[n, kk + t], sb[n, kk + t + 4])
            b1 = pack(sb[n, kk + t + 8], sb[n, kk + t + 12])
            c0, c1, c2, c3 = mma16(a0, a1, a2, a3, b0, b1, zero, zero, zero, zero)
            acc[0, 2 * ni] += c0                      # c0 C[g, 2t], c1 C[g, 2t+1], c2 C[g+8, 2t], c3 C[g+8, 2t+1]
            acc[0, 2 * ni + 1] += c1
            acc[1, 2 * ni] += c2
            acc[1, 2 * ni + 1] += c3
    return step


def kstep_nn16(NI, BKV, fmt):
    """step(acc, sa, sb, kk, wm0, wn0, g, t): acc (2, 2 NI) += this thread's share of
    sa[rows wm0 .. wm0 + 15, keys kk .. kk + 15] @ sb[keys kk .., columns wn0 ..], both fp32 tiles
    in shared memory (sa: p~ f or ds, [row, key]; sb: V, K, dY or Q, [key, channel]) rounded as read,
    with the PTX's names for k (docstring, point 2): one mma.sync m16n8k16 an 8-column fragment.
    When BKV % 16 == 8 the last step has 8 keys: its upper half (a2, a3, b1) is zero."""
    pack, mma16, rnd = HALF[fmt]
    HALF_LAST = BKV % 16 == 8

    if SIMULATOR:
        COL = np.array([(j // 2) * 8 + j % 2 for j in range(2 * NI)])

        def step(acc, sa, sb, kk, wm0, wn0, g, t):
            keys = slice(kk, min(kk + 16, BKV))
            with np.errstate(over="ignore", invalid="ignore"):
                acc += rnd(sa[[wm0 + g, wm0 + g + 8], keys]) @ rnd(sb[keys][:, COL + (wn0 + 2 * t)])
        return step

    @cuda.jit(device=True)
    def step(acc, sa, sb, kk, wm0, wn0, g, t):
        m = wm0 + g
        k0 = kk + 2 * t                               # a0 A[g, k0, k0+1], a1 row g + 8; a2, a3: k0 + 8, k0 + 9
        a0 = pack(sa[m, k0], sa[m, k0 + 1])
        a1 = pack(sa[m + 8, k0], sa[m + 8, k0 + 1])
        a2 = a3 = int32(0)
        if not HALF_LAST or kk + 8 < BKV:             # (a constant True unless BKV % 16 == 8)
            a2 = pack(sa[m, k0 + 8], sa[m, k0 + 9])
            a3 = pack(sa[m + 8, k0 + 8], sa[m + 8, k0 + 9])
        zero = float32(0.0)
        for ni in range(NI):                          # b0 B[k0, k0+1; n], b1 B[k0+8, k0+9; n]
            n = wn0 + ni * 8 + g
            b0 = pack(sb[k0, n], sb[k0 + 1, n])
            b1 = int32(0)
            if not HALF_LAST or kk + 8 < BKV:
                b1 = pack(sb[k0 + 8, n], sb[k0 + 9, n])
            c0, c1, c2, c3 = mma16(a0, a1, a2, a3, b0, b1, zero, zero, zero, zero)
            acc[0, 2 * ni] += c0
            acc[0, 2 * ni + 1] += c1
            acc[1, 2 * ni] += c2
            acc[1, 2 * ni + 1] += c3
    return step
