"""Flash attention with bf16 products (the bf16 recipes'): FlashAttention-2's shape, with bf16
tiles in shared memory read by ldmatrix, and the probabilities kept in registers.

    attn_flash_fwd_bf16, attn_flash_bwd_bf16                y, lse, dq, dk, dv in fp32
    attn_flash_fwd_bf16_out16, attn_flash_bwd_bf16_out16    the same, writing y's bf16 copy y16
                                                            and dq, dk, dv in bf16 (for the products)

Read attn_flash.py (the math), attn_flash_lowp.py (which inputs are rounded, the base-2 softmax
with an integer maximum), then half_tile.py (bf16 tiles, ldmatrix, the swizzle).

THE TILES. A block is (WARPS, BKV): BQ = 16 WARPS "own" rows (query rows in the forward and the
dq kernel, key rows in the dk/dv kernel), warp w owning rows 16 w .. 16 w + 15, and "inner"
tiles of BKV rows (keys, or queries in the dk/dv kernel) walked one after the other. At the
head size hs = 64 of 12M and 120M (HSP = 64 channels; in general hs is padded with zeros to
HSP = 16, 32 or a multiple of 64) with the default blocks:

    kernel   block    own tiles (bf16)               inner tiles (bf16, two buffers each)   shared
    forward  (8, 64)  Q      128 x 64:      16 KiB   K, V   2 x 2 x 64 x 64:  32 KiB        48 KiB
    dq       (4, 32)  Q, dY  2 x 64 x 64:   16 KiB   K, V   2 x 2 x 32 x 64:  16 KiB        32 KiB + D (256 B)
    dk/dv    (4, 32)  K, V   2 x 64 x 64:   16 KiB   Q, dY  2 x 2 x 32 x 64:  16 KiB        32 KiB + lse, D (512 B)

Every tile is stored as bf16, two values to a 32-bit word, a row of HSP values = HSP / 2 words,
its 16-byte chunks swizzled (chunk q of row r at chunk q ^ s(r): half_tile.py, point 3), so that
ldmatrix's eight row reads and the copies' stores are free of bank conflicts. Each value is
rounded once (cvt.rn.bf16x2.f32, ties to even), on its way in.

A thread's registers hold, for its warp's 16 rows (lane = 4 g + t, rows g and g + 8):
    s, dp  [2, BKV / 4] fp32   scores (and dy . v) of the current inner tile: C fragments
    o      [2, HSP / 4] fp32   the output rows being summed (y; dq; dk and dv in the dk/dv kernel)
    pf     [BKV / 16, 4] b32   p~ f (ds, (P f)^T, ds^T) packed to bf16 pairs: A fragments
    r      [BKV HSP / (32 WARPS)] fp32   this thread's share of the next inner tile, in flight
and nothing T x T or BQ x BKV goes through shared memory.

THE FRAGMENTS (PTX ISA, mma.m16n8k16 with .bf16; ptx.py's docstring). One warp, lane = 4 g + t:

    A 16 x 16:    a0 = A[g, 2t:2t+2]    a1 = A[g+8, 2t:2t+2]    a2 = A[g, 2t+8:2t+10]    a3 = A[g+8, 2t+8:2t+10]
    B 16 x 8:     b0 = B[2t:2t+2, g]    b1 = B[2t+8:2t+10, g]
    C 16 x 8:     c0 = C[g, 2t]   c1 = C[g, 2t+1]   c2 = C[g+8, 2t]   c3 = C[g+8, 2t+1]

    ldmatrix.x4:        lane 8 i + j gives the address of row j of 8 x 8 matrix i (16 bytes);
                        lane 4 g + t receives r_i = (M_i[g, 2t], M_i[g, 2t+1])
    ldmatrix.x4.trans:  the same rows; lane 4 g + t receives r_i = (M_i[2t, g], M_i[2t+1, g])

A thread's accumulator acc[hh, j] is row g + 8 hh, column 8 (j // 2) + 2 t + j % 2 (col below):
c0..c3 of 8-column fragment n go to acc[0, 2n], acc[0, 2n+1], acc[1, 2n], acc[1, 2n+1].

1. s = q k^T (and dy v^T, k q^T, v dy^T): both operands from shared tiles (mma_ss). The own
   tile [row, channel] is A with k = channel: ldmatrix.x4 of the 16 x 16 block at (16 w, 16 ks)
   gives a0..a3 (matrix i: rows + 8 (i & 1), channels + 8 (i >> 1)). The inner tile [key,
   channel] is B stored "n-major" (n = key, k = channel): one ldmatrix.x4 at (16 nj, 16 ks) gives
   b0, b1 of the two 8-key fragments 2 nj and 2 nj + 1 (matrix i: keys + 8 (i >> 1), channels
   + 8 (i & 1)). The sum over the HSP / 16 k steps runs inside the tensor core: D = A B + C.

2. Register reuse. The scores' C fragments of 8-key fragments 2 kc and 2 kc + 1 are exactly the
   A fragment of keys 16 kc .. 16 kc + 15 of the next product:
       a0 = (s[0, 4kc], s[0, 4kc+1])        a1 = (s[1, 4kc], s[1, 4kc+1])
       a2 = (s[0, 4kc+2], s[0, 4kc+3])      a3 = (s[1, 4kc+2], s[1, 4kc+3])
   so p~ f is rounded and packed where it was computed (pack), two values an instruction, and
   multiplies V without leaving the thread: no shared tile, no warp barrier (mma_rs).

3. o += p~ f @ V (and ds @ K, (P f)^T @ dY, ds^T @ Q): B is the inner tile read the other way,
   k = key along its rows, n = channel: ldmatrix.x4.trans at (16 kc, 16 nj) gives b0, b1 of the
   channel fragments 2 nj and 2 nj + 1 (matrix i: keys + 8 (i & 1), channels + 8 (i >> 1)). The
   same stored tile serves both products: K is read straight for s and transposed for dq.

4. The softmax's row statistics. A row's BKV scores are spread over the 4 lanes of a quad
   (t = 0..3, BKV / 4 each); the row maximum is two butterfly shuffles (shfl.sync.bfly with lane
   masks 1 and 2: every lane ends with the same maximum, no shared memory), and so is l at the
   end. Because the maximum is an integer it rarely moves once the first keys are seen: when
   neither of a thread's rows moved (alpha = 1 exactly) the rescale of o and l is skipped.

THE PIPELINE (one barrier a tile). The inner tiles come in two shared buffers; the next tile's
fp32 values are fetched into registers (r) one matrix at a time and stored, rounded, into the
other buffer once the current tile's first product is done:

    prologue:  K0 -> buffer 0, V0 -> buffer 0, fetch K1 into r; barrier
    tile j:    s = q K_j^T                 (buffer j % 2)
               put r (K_j+1) -> the other buffer; fetch V_j+1 into r
               softmax, o += p~ f V_j
               put r (V_j+1) -> the other buffer; fetch K_j+2 into r; barrier
The other buffer was last read before the previous barrier, so the puts need no barrier of their
own; K_j+1's loads are in flight across a barrier and a product, V_j+1's across the softmax and a
product. The backward kernels run the same pipeline with (K, V) or (Q, dY, lse, D) as inner tiles.

CAUSALITY. A warp whose 16 rows see none of a tile's keys (forward, dq: the tile starts after the
warp's last row, or all its rows are past T; dk/dv: the tile's last query is before the warp's
first key) skips its products and softmax for that tile (the block still copies the tile: every
warp reaches every barrier). Only tiles that cross the diagonal or the end T test each element
(and tiles with dropout draw its masks); the others take every score without a test. A skipped
tile would have added exact zeros (p = 0 to the sums, the integer m unchanged), so skipping moves
no bit. The grid is (B H, tiles), tile 0 the longest of its head: the GPU hands out blocks along
x first (in practice; CUDA promises no order, and the results do not depend on one), so every
head's longest tiles start first and the short ones fill the end.

THE BLOCKS (sm_90, hs = 64, ptxas 13.0 -v: registers a thread, spills, static shared memory):

    forward   (8, 64) 128 regs, no spill, 48 KiB     (4, 64) 168, none, 40 KiB
              (8, 32) 128, none, 32 KiB              (4, 32) 127, none, 24 KiB
    dq        (4, 32) 144, none, 33,024 B            (8, 16) 128, none, 41,472 B
              (4, 16) 128, none, 24,832 B            (2, 32) 168, none, 24,704 B
    dk/dv     (4, 32) 213, none, 33,280 B            (8, 16) 128, 24 B spilled, 41,216 B
              (4, 16) 172, none, 24,832 B            (2, 32) 244, none, 25,088 B

Blocks of 8 warps are compiled with launch bounds (256 threads, 2 blocks a multiprocessor), which
caps them at 128 registers: two blocks, 16 warps, share a multiprocessor (without the bounds
ptxas gave the forward 166 registers: one block, 8 warps).

THE MATH (the twin at bf16, reference.attn under products_in("bf16"), and the harness's
tolerances): the inputs of the five kinds of product rounded to bf16 (ties to even), every product
exact, sums in fp32; the forward's scores in base 2 (scale log2(e) / sqrt(hs) from the launcher),
the running maximum rounded up to an integer (so that p~ rounds alike in every tiling), p~ =
2^(s - m) and alpha = 2^(m_old - m_new), l summed before dropout, lse = ln 2 (m + log2 l); the
backward's P = exp(scale s - lse), ds = P (f dp - D), dq and dk multiplied by scale at the end;
D = dy . y by one thread a row in channel order. The order of the fp32 sums:
  - the k steps of every product are chained inside the tensor core (D = A B + C), and so are the
    key (query) tiles of o, dq, dk and dv;
  - l's four lane parts are added (l0 + l1) + (l2 + l3) (a butterfly);
  - a masked score is set to -inf and gives p~ = 2^-inf = 0;
  - a rescale by alpha = 1 is skipped (multiplying by 1 changes no bit).
Every output element is summed by one thread (one warp's tensor core) in a fixed order: no
atomics, bit-identical reruns.

THE SIMULATOR. ldmatrix, mma.sync and shfl.sync are warp instructions: one lane's result needs
the other lanes' registers. In the simulator (one Python thread a CUDA thread) each is a twin:
  - a product from shared tiles (mma_ss) and the B operand of mma_rs: every lane's ldmatrix
    addresses from the same index functions (ptx.ldmatrix_warp), the warp's product in NumPy
    (ptx.mma_bf16_warp), this lane's four results chained into its accumulator;
  - an operand in registers (mma_rs's p~ f, the quad's maxima and sums): ptx.warp_gather, where the
    32 lanes of the warp leave their values in a slot each and wait at a barrier of the warp's 32
    threads (a real warp barrier: warps of a block pass it independently, as they would a
    shfl.sync, so a warp may skip a tile that another computes).
"""
import math

import numpy as np
from numba import cuda, float32, int32, uint64

from .attn import NEG_INF, _check
from .attn_flash_tf32x3 import aligned_rows
from .common import BlockDoesNotFit, blocks, cdiv, nonneg, rung, SIMULATOR
from .dropout import dropout_factor, key_value, mask_args
from .half_tile import _word
from .ptx import bf16x2, ldmatrix_x4, ldmatrix_x4_trans, load4, mma_bf16, store2
from .warp_tile import WARP

if SIMULATOR:
    from .ptx import ldmatrix_warp, mma_bf16_warp, warp_gather     # the warp instructions' NumPy twins

# (WARPS, BKV): 16 WARPS own rows, inner tiles of BKV rows (a multiple of 16). GPU: the first is
# the default; each fits 48 KiB of static shared memory at hs = 64 and compiles for sm_90 without
# spills but dk/dv at (8, 16) (module docstring, THE BLOCKS). Simulator: one warp, and two warps
# (a warp that skips a tile while the other computes it), tiles of 16.
FLASH_BF16_FWD_BLOCKS = dict(gpu=((8, 64), (4, 64), (8, 32), (4, 32)), sim=((1, 16), (2, 16)))
FLASH_BF16_BWD_BLOCKS = dict(gpu=((4, 32), (8, 16), (4, 16), (2, 32)), sim=((1, 16), (2, 16)))
SHARED_LIMIT = 48 * 1024                    # bytes of static shared memory per block
LN2 = 0.6931471805599453
FULL = 0xFFFFFFFF                           # every lane of the warp takes part in a shuffle


def padded_head(hs: int) -> int:
    """Channels of a stored tile row: hs rounded up to 16 (one k step), 32, or a multiple of 64,
    so that a row is 2, 4 or a multiple of 8 chunks of 16 bytes (the swizzle's row widths)."""
    for p in (16, 32):
        if hs <= p:
            return p
    return cdiv(hs, 64) * 64


def fragment_words(W: int):
    """(lane_frag, frag_word) for tiles of W words a row: the words lanes hand to ldmatrix.

    ldmatrix (half_tile.py, point 2): lane 8 i + j gives row j of 8 x 8 matrix i. In the 16 x 16
    block at tile rows r0 + 0..15 (r0 a multiple of 16) and 16-byte chunks 2 step, 2 step + 1, the
    lane's row is r0 + 8 b + (lane & 7) and its chunk 2 step + b', b and b' two bits of the lane.
    The swizzle s of a row reads only its bits 0..2, lane & 7 (the 8 b and r0 leave them), so the
    chunk is stored at (2 step) ^ (b' ^ s(lane & 7)), and the word is
        r0 W  +  (8 b + (lane & 7)) W  +  ((8 step) ^ (4 (b' ^ s(lane & 7))))
    a constant, a per-lane offset, and one XOR of a per-lane value with 8 step: lane_frag(lane)
    gives the per-lane values once, frag_word(r0, step, off, bits) the word.
        A of an own tile (rows m, chunks: k steps ks)              b = lane bit 3, b' = bit 4   (offA, bitsA)
        B of an inner tile as [n = key, k = channel] (chunks ks)   b = lane bit 4, b' = bit 3   (offB, bitsB)
        B of an inner tile as [k = key, n = channel] (.trans; rows: keys 16 kc.., chunks: channel
          pairs nj)                                                b = lane bit 3, b' = bit 4   (offA, bitsA)
    Device functions, or in the simulator plain functions (they take NumPy arrays of lanes too)."""
    C = W // 4
    X = min(C, 8)
    shift = {1: 3, 2: 2, 4: 1, 8: 0}[X]               # half_tile._word's s(r) = (r >> shift) & (X - 1)

    def lane_frag(lane):
        """(offA, bitsA, offB, bitsB) of this lane."""
        sw = ((lane & 7) >> shift) & (X - 1)
        return (((lane & 7) + 8 * ((lane >> 3) & 1)) * W, (((lane >> 4) & 1) ^ sw) << 2,
                ((lane & 7) + 8 * ((lane >> 4) & 1)) * W, (((lane >> 3) & 1) ^ sw) << 2)

    def frag_word(r0, step, off, bits):
        """The word this lane hands to ldmatrix for the block at tile rows r0.., chunk pair step."""
        return r0 * W + off + ((8 * step) ^ bits)

    if SIMULATOR:
        return lane_frag, frag_word
    return cuda.jit(device=True, inline="always")(lane_frag), cuda.jit(device=True, inline="always")(frag_word)


def shared_bytes(hs: int, warps: int, bkv: int, kernel: str) -> int:
    """Static shared memory of kernel "fwd", "dq" or "dkdv" at head size hs and block (warps, bkv)."""
    row = padded_head(hs) * 2                        # bytes of a bf16 tile row
    BQ = 16 * warps
    inner = 2 * 2 * bkv * row                        # two matrices, two buffers each
    return {"fwd": BQ * row + inner, "dq": 2 * BQ * row + inner + 4 * BQ,
            "dkdv": 2 * BQ * row + inner + 2 * 2 * 4 * bkv}[kernel]


if SIMULATOR:
    def quad_max2(x0, x1, w, lane):
        """The maxima of x0 and of x1 over the 4 lanes of this lane's quad (the twin of quad_max2)."""
        v = warp_gather(np.array([x0, x1], np.float32), w, lane)
        q = lane & ~3
        return (max(max(v[q, 0], v[q + 1, 0]), max(v[q + 2, 0], v[q + 3, 0])),
                max(max(v[q, 1], v[q + 1, 1]), max(v[q + 2, 1], v[q + 3, 1])))

    def quad_sum2(x0, x1, w, lane):
        """The sums of x0 and of x1 over the quad, as the butterfly adds them: (x_q + x_q+1) +
        (x_q+2 + x_q+3) in float32 (every lane of the quad gets the same bits)."""
        v = warp_gather(np.array([x0, x1], np.float32), w, lane)
        q = lane & ~3
        return ((v[q, 0] + v[q + 1, 0]) + (v[q + 2, 0] + v[q + 3, 0]),
                (v[q, 1] + v[q + 1, 1]) + (v[q + 2, 1] + v[q + 3, 1]))
else:
    @cuda.jit(device=True, inline="always")
    def quad_max2(x0, x1, w, lane):
        """The maxima of x0 and x1 over the quad of lanes 4 g .. 4 g + 3 (a row's four lanes):
        after the exchange with lane ^ 1 and then with lane ^ 2 every lane holds all four.
        PTX: shfl.sync.bfly.b32 (twice per value)"""
        x0 = max(x0, cuda.shfl_xor_sync(FULL, x0, 1))
        x1 = max(x1, cuda.shfl_xor_sync(FULL, x1, 1))
        x0 = max(x0, cuda.shfl_xor_sync(FULL, x0, 2))
        x1 = max(x1, cuda.shfl_xor_sync(FULL, x1, 2))
        return x0, x1

    @cuda.jit(device=True, inline="always")
    def quad_sum2(x0, x1, w, lane):
        """The sums of x0 and x1 over the quad: (x_l + x_l^1) + (x_l^2 + x_l^3), the same bits in
        every lane of the quad (fp32 addition commutes).   PTX: shfl.sync.bfly.b32"""
        x0 = x0 + cuda.shfl_xor_sync(FULL, x0, 1)
        x1 = x1 + cuda.shfl_xor_sync(FULL, x1, 1)
        x0 = x0 + cuda.shfl_xor_sync(FULL, x0, 2)
        x1 = x1 + cuda.shfl_xor_sync(FULL, x1, 2)
        return x0, x1


def make_kernels(HS: int, WARPS: int, BKV: int, VEC: bool, OUT16: bool = False):
    """The three kernels (forward, dq, dk/dv) for head size HS, block (WARPS, BKV) and 128-bit
    global loads VEC (the caller checked the alignment: aligned_rows); OUT16 (HS even): the forward
    writes y's bf16 copy besides y, the backward writes dq, dk, dv in bf16 only (pairs of adjacent
    channels, one 32-bit word a pair: store16)."""
    HSP = padded_head(HS)          # channels of a stored row (zeros past HS)
    W = HSP // 2                   # 32-bit words of a stored row
    BQ = 16 * WARPS                # own rows of a block
    NT = WARP * WARPS              # threads of a block
    NK = HSP // 16                 # k steps over the channels (s-like products)
    NB = BKV // 8                  # 8-column fragments across an inner tile (s-like products)
    NH = HSP // 8                  # 8-column fragments across the channels (o-like products)
    KC = BKV // 16                 # k steps over an inner tile's keys (o-like products)
    SB, SH = 2 * NB, 2 * NH        # a thread's columns of an s-like and of an o-like product
    LPT = cdiv(BKV, NT)            # lse and D values a thread copies (dk/dv kernel)
    OWN_WORDS = BQ * W             # an own tile's words (bf16 pairs)
    INNER_WORDS = (2, BKV * W)     # an inner matrix's two buffers
    ROWS2 = (2, BKV)               # two buffers of a tile's lse (or D) values
    assert BKV % 16 == 0, f"inner tiles of {BKV} rows: a multiple of 16"

    word = _word(W)                # the swizzled word of (tile row, 16-byte chunk): half_tile.py, point 3

    def copier(R):
        """fetch(regs, x, r0, c0, T): this thread's 4-float chunks of the R x HSP tile of x [T, C]
        at row r0, channel c0 (zero past row T and past channel c0 + HS) into registers;
        put(s, regs): each chunk rounded to two bf16 pairs (cvt.rn.bf16x2) and stored with one
        64-bit store at its swizzled place in the tile s (R rows of W words).
        Thread i of the block takes the chunk at column 4 (i % CPR) of rows i // CPR + RPI j,
        j = 0, 1, ... (CPR chunks a row, RPI = NT / CPR rows a pass): a warp reads 512
        consecutive bytes of global memory, 16 lanes store one 128-byte line of bf16. A thread's
        column, its first row and (RPI a multiple of the swizzle's 8-row period) its swizzled
        column are worked out once; pass j adds RPI rows."""
        CPR = HSP // 4                        # chunks a row
        if NT % CPR:
            raise BlockDoesNotFit(f"flash attention (bf16): {NT} threads do not cover whole rows of {CPR} chunks")
        RPI = NT // CPR                       # rows a pass
        CH = cdiv(R, RPI)                     # passes (chunks a thread)
        ALL = R % RPI == 0                    # every pass whole (else the last one is guarded)
        FIXED = RPI % 8 == 0                  # the swizzle of a thread's rows is the same in every pass

        @cuda.jit(device=True)
        def fetch(regs, x, r0, c0, T):
            tid = nonneg(cuda.threadIdx.x)
            rt, ct = tid // CPR, 4 * (tid % CPR)
            C = x.shape[1]
            base = (r0 + rt) * C + c0 + ct            # the first chunk's element in x
            whole = r0 + R <= T                       # the tile ends before T: no row test
            for i in range(CH):
                r = r0 + rt + i * RPI
                ok = (ALL or rt + i * RPI < R) and (whole or r < T)
                if VEC:
                    if ok and (HS == HSP or ct < HS):  # HS % 4 == 0: a chunk is all in or all out
                        regs[4 * i], regs[4 * i + 1], regs[4 * i + 2], regs[4 * i + 3] = load4(x, base + i * RPI * C)
                    else:
                        for k in range(4):
                            regs[4 * i + k] = float32(0.0)
                else:
                    for k in range(4):
                        regs[4 * i + k] = x[r, c0 + ct + k] if ok and ct + k < HS else float32(0.0)

        @cuda.jit(device=True)
        def put(s, regs):
            tid = nonneg(cuda.threadIdx.x)
            rt, q4 = tid // CPR, tid % CPR        # q4: half of the 16-byte chunk q4 // 2
            w0 = word(rt, q4 >> 1) + 2 * (q4 & 1)
            for i in range(CH):
                if ALL or rt + i * RPI < R:
                    wi = w0 + i * RPI * W if FIXED else word(rt + i * RPI, q4 >> 1) + 2 * (q4 & 1)
                    store2(s, wi, bf16x2(regs[4 * i], regs[4 * i + 1]), bf16x2(regs[4 * i + 2], regs[4 * i + 3]))
        return fetch, put, 4 * CH

    lane_frag, frag_word = fragment_words(W)       # ldmatrix's addresses (fragment_words)

    fetch_own, put_own, EO = copier(BQ)
    fetch, put, E = copier(BKV)

    @cuda.jit(device=True)
    def store16(out, b, t, c0, acc, hh, tq, f, divide):
        """The bf16 stores (OUT16): out [B, T, C / 2] int32 (a uint16 [B, T, C] buffer seen as words)
        gets acc[hh, :] / f (divide) or * f, the very fp32 values the fp32 outputs receive, rounded
        to bf16 (ties to even, as the products' copy kernel rounds them), accumulators jj and
        jj + 1 (adjacent channels d, d + 1: col) packed in one word."""
        for jj in range(0, SH, 2):
            d = col(jj, tq)
            if d < HS:
                if divide:
                    x0, x1 = acc[hh, jj] / f, acc[hh, jj + 1] / f
                else:
                    x0, x1 = acc[hh, jj] * f, acc[hh, jj + 1] * f
                out[b, t, (c0 + d) // 2] = bf16x2(x0, x1)

    @cuda.jit(device=True)
    def zero(acc):
        for i in range(acc.shape[0]):
            for j in range(acc.shape[1]):
                acc[i, j] = 0.0

    @cuda.jit(device=True)
    def col(j, tq):
        """Column (within a product of 8-column fragments) of acc[:, j] for lane t = tq."""
        return (j // 2) * 8 + 2 * tq + j % 2

    @cuda.jit(device=True)
    def pack(af, p):
        """af[kc] = the A fragment of keys 16 kc .. 16 kc + 15 from the C fragments p (module
        docstring, point 2): four bf16 pairs, rounded to nearest even (cvt.rn.bf16x2.f32)."""
        for kc in range(KC):
            af[kc, 0] = bf16x2(p[0, 4 * kc], p[0, 4 * kc + 1])             # a0: row g, keys 2t, 2t+1
            af[kc, 1] = bf16x2(p[1, 4 * kc], p[1, 4 * kc + 1])             # a1: row g+8
            af[kc, 2] = bf16x2(p[0, 4 * kc + 2], p[0, 4 * kc + 3])         # a2: row g, keys 2t+8, 2t+9
            af[kc, 3] = bf16x2(p[1, 4 * kc + 2], p[1, 4 * kc + 3])         # a3: row g+8

    if SIMULATOR:
        LANES = np.arange(WARP)
        KS_NJ = [[(ks, nj) for nj in range(NB // 2)] for ks in range(NK)]
        KC_NJ = [[(kc, nj) for nj in range(NH // 2)] for kc in range(KC)]

        def pairs(regs, n):
            """ldmatrix.x4 registers [..., J, 32, 4] (b0, b1 of fragment 2j, then of 2j + 1) as
            [..., n, 32, 2]: b0, b1 of each 8-column fragment."""
            lead = regs.shape[:-3]
            return regs.reshape(*lead, n // 2, WARP, 2, 2).swapaxes(-3, -2).reshape(*lead, n, WARP, 2)

        def chain(acc, d, lane):
            """acc += this lane's c0..c3 of D [steps, fragments, 32, 4], step after step."""
            n = d.shape[1]
            for step in d[:, :, lane]:                               # [fragments, 4]
                acc += step.reshape(n, 2, 2).transpose(1, 0, 2).reshape(2, 2 * n)

        def mma_ss(acc, sa, arow, sb, fr, w, lane):
            """Twin of mma_ss: the warp's A and B fragments from the shared words, as ldmatrix gives them."""
            offa, bitsa, offb, bitsb = lane_frag(LANES)                                          # every lane's
            a = np.stack([ldmatrix_warp(sa, frag_word(arow, ks, offa, bitsa)) for ks in range(NK)])   # [NK, 32, 4]
            idx = np.array([[frag_word(16 * nj, ks, offb, bitsb) for ks, nj in row] for row in KS_NJ])  # [NK, NB/2, 32]
            b = pairs(ldmatrix_warp(sb, idx), NB)                                                # [NK, NB, 32, 2]
            with np.errstate(over="ignore", invalid="ignore"):
                chain(acc, mma_bf16_warp(a[:, None], b), lane)

        def mma_rs(acc, af, sb, fr, w, lane):
            """Twin of mma_rs: the A fragments are the 32 lanes' registers af (warp_gather)."""
            offa, bitsa, _, _ = lane_frag(LANES)
            a = warp_gather(af, w, lane).swapaxes(0, 1)                                          # [KC, 32, 4]
            idx = np.array([[frag_word(16 * kc, nj, offa, bitsa) for kc, nj in row] for row in KC_NJ])  # [KC, NH/2, 32]
            b = pairs(ldmatrix_warp(sb, idx, trans=True), NH)                                    # [KC, NH, 32, 2]
            with np.errstate(over="ignore", invalid="ignore"):
                chain(acc, mma_bf16_warp(a[:, None], b), lane)
    else:
        @cuda.jit(device=True)
        def mma_ss(acc, sa, arow, sb, fr, w, lane):
            """acc [2, SB] += this lane's share of sa[rows arow .. arow + 15] @ sb^T over the HSP
            channels: the own tile's A fragments and the inner tile's B fragments by ldmatrix.x4
            (module docstring, point 1), NK k steps chained in the tensor core."""
            offa, bitsa, offb, bitsb = fr
            for ks in range(NK):
                a0, a1, a2, a3 = ldmatrix_x4(sa, frag_word(arow, ks, offa, bitsa))
                for nj in range(NB // 2):        # b0, b1 of key fragments 2 nj (x0, x1) and 2 nj + 1 (x2, x3)
                    x0, x1, x2, x3 = ldmatrix_x4(sb, frag_word(16 * nj, ks, offb, bitsb))
                    j = 4 * nj                   # c0 C[g, 2t], c1 C[g, 2t+1], c2 C[g+8, 2t], c3 C[g+8, 2t+1]
                    acc[0, j], acc[0, j + 1], acc[1, j], acc[1, j + 1] = mma_bf16(
                        a0, a1, a2, a3, x0, x1, acc[0, j], acc[0, j + 1], acc[1, j], acc[1, j + 1])
                    acc[0, j + 2], acc[0, j + 3], acc[1, j + 2], acc[1, j + 3] = mma_bf16(
                        a0, a1, a2, a3, x2, x3, acc[0, j + 2], acc[0, j + 3], acc[1, j + 2], acc[1, j + 3])

        @cuda.jit(device=True)
        def mma_rs(acc, af, sb, fr, w, lane):
            """acc [2, SH] += this lane's share of P @ sb, P the warp's 16 x BKV A fragments in
            registers (af, point 2) and sb an inner tile read as [k = key, n = channel] by
            ldmatrix.x4.trans (point 3); the KC key steps chained in the tensor core."""
            offa, bitsa, _, _ = fr
            for kc in range(KC):
                for nj in range(NH // 2):        # b0, b1 of channel fragments 2 nj (x0, x1) and 2 nj + 1 (x2, x3)
                    x0, x1, x2, x3 = ldmatrix_x4_trans(sb, frag_word(16 * kc, nj, offa, bitsa))
                    j = 4 * nj
                    acc[0, j], acc[0, j + 1], acc[1, j], acc[1, j + 1] = mma_bf16(
                        af[kc, 0], af[kc, 1], af[kc, 2], af[kc, 3], x0, x1,
                        acc[0, j], acc[0, j + 1], acc[1, j], acc[1, j + 1])
                    acc[0, j + 2], acc[0, j + 3], acc[1, j + 2], acc[1, j + 3] = mma_bf16(
                        af[kc, 0], af[kc, 1], af[kc, 2], af[kc, 3], x2, x3,
                        acc[0, j + 2], acc[0, j + 3], acc[1, j + 2], acc[1, j + 3])

    def k_attn_flash_fwd(y, y16, lse, q, k, v, scale, dropout_key, threshold, dscale):
        """Block (b*H + h, query tile of BQ rows, the last tile first); warp w owns rows 16 w ...
        Online softmax over the key tiles 0 .. the tile's last query, in base 2: per tile
            s = scale q k^T            (mma_ss; u > t: -inf)        m_new = ceil(max(m, max_u s))
            alpha = 2^(m - m_new)      l *= alpha, o *= alpha
            p~ = 2^(s - m_new)         l += p~ (before dropout)     o += (p~ f) @ v   (mma_rs)
        and at the end y = o / l, lse = ln 2 (m + log2 l); with OUT16 also y16 = bf16(y) (without
        OUT16 the launcher passes y as y16, never written)."""
        key = key_value(dropout_key)
        sq = cuda.shared.array(OWN_WORDS, int32, alignment=16)     # the block's q rows, bf16
        sk = cuda.shared.array(INNER_WORDS, int32, alignment=16)   # K tiles, two buffers
        sv = cuda.shared.array(INNER_WORDS, int32, alignment=16)   # V tiles of the same keys
        ro = cuda.local.array(EO, float32)                 # this thread's share of the q rows
        r = cuda.local.array(E, float32)                   # the next K or V tile, on its way in
        s = cuda.local.array((2, SB), float32)             # scores, then p~ f: rows g, g + 8
        o = cuda.local.array((2, SH), float32)             # y's running sums
        pf = cuda.local.array((KC, 4), int32)              # p~ f as A fragments
        m = cuda.local.array(2, float32)                   # running (integer) maximum of rows g, g + 8
        lsum = cuda.local.array(2, float32)                # this lane's part of their running sums
        mx = cuda.local.array(2, float32)
        T = q.shape[1]
        H = lse.shape[1]
        bh, tile = nonneg(cuda.blockIdx.x), nonneg(cuda.blockIdx.y)
        b, h = bh // H, bh % H
        c0 = h * HS
        t0 = (nonneg(cuda.gridDim.y) - 1 - tile) * BQ     # the longest rows first
        tid = nonneg(cuda.threadIdx.x)
        w, lane = tid // WARP, tid % WARP
        g, tq = lane >> 2, lane & 3
        fr = lane_frag(lane)                               # this lane's ldmatrix offsets
        row0 = t0 + 16 * w                                 # the warp's first query
        qb, kb, vb = q[b], k[b], v[b]
        drop = threshold != uint64(0)
        zero(o)
        for hh in range(2):
            m[hh] = NEG_INF
            lsum[hh] = 0.0
        fetch_own(ro, qb, t0, c0, T)
        put_own(sq, ro)
        n_tiles = (min(T, t0 + BQ) + BKV - 1) // BKV     # keys 0 .. min(T, t0 + BQ) - 1
        fetch(r, kb, 0, c0, T)
        put(sk[0], r)
        fetch(r, vb, 0, c0, T)
        put(sv[0], r)
        if n_tiles > 1:
            fetch(r, kb, BKV, c0, T)
        cuda.syncthreads()
        for j in range(n_tiles):
            u0 = j * BKV
            cur = j & 1
            more = j + 1 < n_tiles                         # the same in every thread of the block
            active = u0 <= row0 + 15 and row0 < T          # the warp's rows see some of these keys
            if active:
                zero(s)
                mma_ss(s, sq, 16 * w, sk[cur], fr, w, lane)  # s = q k^T
            if more:
                put(sk[1 - cur], r)                        # K of the next tile (read before the last barrier)
                fetch(r, vb, u0 + BKV, c0, T)             # V of the next tile: in flight from here
            if active:
                diag = u0 + BKV - 1 > row0                 # some key of the tile after some row: mask
                for hh in range(2):
                    t = row0 + 8 * hh + g
                    mt = NEG_INF
                    if diag:
                        for jj in range(SB):
                            x = s[hh, jj] * scale
                            if u0 + col(jj, tq) > t:
                                x = NEG_INF                # causal: 2^(-inf - m) = 0
                            s[hh, jj] = x
                            mt = max(mt, x)
                    else:                                  # every key of the tile <= every row of the warp
                        for jj in range(SB):
                            x = s[hh, jj] * scale
                            s[hh, jj] = x
                            mt = max(mt, x)
                    mx[hh] = mt
                mx[0], mx[1] = quad_max2(mx[0], mx[1], w, lane)   # the rows' maxima over their 4 lanes
                for hh in range(2):
                    mx[hh] = float32(math.ceil(max(m[hh], mx[hh])))  # m_new, an integer: p~ rounds alike
                    #                                                   in every tiling (THE MATH)
                if mx[0] != m[0] or mx[1] != m[1]:         # else alpha = 1 for both rows (most tiles): skip
                    for hh in range(2):
                        alpha = math.exp2(m[hh] - mx[hh])  # a power of two; 0 at the first tile
                        lsum[hh] *= alpha
                        for jj in range(SH):
                            o[hh, jj] *= alpha
                for hh in range(2):
                    m_new = mx[hh]
                    rowflat = ((b * H + h) * T + row0 + 8 * hh + g) * T + u0     # [b, h, t, u0] (dropout)
                    for jj in range(SB):
                        p = math.exp2(s[hh, jj] - m_new)
                        lsum[hh] += p                      # the softmax's sum: before dropout
                        if drop:
                            p *= dropout_factor(key, rowflat + col(jj, tq), threshold, dscale)
                        s[hh, jj] = p
                    m[hh] = m_new
                pack(pf, s)
                mma_rs(o, pf, sv[cur], fr, w, lane)        # o += (p~ f) @ v
            if more:
                put(sv[1 - cur], r)
                if j + 2 < n_tiles:
                    fetch(r, kb, u0 + 2 * BKV, c0, T)     # K two tiles on: in flight across a barrier
                cuda.syncthreads()                         # the next tiles are in; this tile's buffers free
        l0, l1 = quad_sum2(lsum[0], lsum[1], w, lane)      # l: the four lanes' parts
        for hh in range(2):
            t = row0 + 8 * hh + g
            lt = l0 if hh == 0 else l1
            if t < T:
                for jj in range(SH):
                    d = col(jj, tq)
                    if d < HS:
                        y[b, t, c0 + d] = o[hh, jj] / lt
                if OUT16:                                  # y's bf16 copy, the same quotients
                    store16(y16, b, t, c0, o, hh, tq, lt, True)
                if tq == 0:                                # lse = ln 2 (m + log2 l), in natural units
                    lse[b, h, t] = (m[hh] + math.log2(lt)) * float32(LN2)

    def k_attn_flash_bwd_dq(dq, d_rowdot, dy, q, k, v, y, lse, scale, dropout_key, threshold, dscale):
        """Block (b*H + h, query tile of BQ rows); per key tile u0 <= the tile's last query:
            s = q k^T, dp = dy v^T (mma_ss)     P = exp(scale s - lse)     ds = P (f dp - D)
            dq += ds @ k (mma_rs, K read transposed); at the end dq *= scale.
        D[t] = dy[t] . y[t] is worked out here, a thread a row in channel order, and written to
        d_rowdot for the dk/dv kernel."""
        key = key_value(dropout_key)
        sq = cuda.shared.array(OWN_WORDS, int32, alignment=16)     # the block's q rows, bf16
        sdy = cuda.shared.array(OWN_WORDS, int32, alignment=16)    # its dy rows
        sk = cuda.shared.array(INNER_WORDS, int32, alignment=16)
        sv = cuda.shared.array(INNER_WORDS, int32, alignment=16)
        sd = cuda.shared.array(BQ, float32)                        # D of the block's rows
        ro = cuda.local.array(EO, float32)
        r = cuda.local.array(E, float32)
        s = cuda.local.array((2, SB), float32)             # scores, then ds
        dp = cuda.local.array((2, SB), float32)            # dy . v
        acc = cuda.local.array((2, SH), float32)           # dq / scale
        dsf = cuda.local.array((KC, 4), int32)             # ds as A fragments
        lse_t = cuda.local.array(2, float32)
        d_t = cuda.local.array(2, float32)
        T = q.shape[1]
        H = lse.shape[1]
        bh, tile = nonneg(cuda.blockIdx.x), nonneg(cuda.blockIdx.y)
        b, h = bh // H, bh % H
        c0 = h * HS
        t0 = (nonneg(cuda.gridDim.y) - 1 - tile) * BQ
        tid = nonneg(cuda.threadIdx.x)
        w, lane = tid // WARP, tid % WARP
        g, tq = lane >> 2, lane & 3
        fr = lane_frag(lane)                               # this lane's ldmatrix offsets
        row0 = t0 + 16 * w
        qb, kb, vb = q[b], k[b], v[b]
        drop = threshold != uint64(0)
        zero(acc)
        for rr in range(tid, BQ, NT):                      # D[t] = sum_d dy[t, d] y[t, d], channel order
            t = t0 + rr
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
            sd[rr] = dd
        for hh in range(2):
            t = row0 + 8 * hh + g
            lse_t[hh] = lse[b, h, t] if t < T else float32(0.0)
        fetch_own(ro, qb, t0, c0, T)
        put_own(sq, ro)
        fetch_own(ro, dy[b], t0, c0, T)
        put_own(sdy, ro)
        n_tiles = (min(T, t0 + BQ) + BKV - 1) // BKV
        fetch(r, kb, 0, c0, T)
        put(sk[0], r)
        fetch(r, vb, 0, c0, T)
        put(sv[0], r)
        if n_tiles > 1:
            fetch(r, kb, BKV, c0, T)
        cuda.syncthreads()
        for hh in range(2):
            d_t[hh] = sd[16 * w + 8 * hh + g]
        for j in range(n_tiles):
            u0 = j * BKV
            cur = j & 1
            more = j + 1 < n_tiles
            active = u0 <= row0 + 15 and row0 < T
            if active:
                zero(s)
                zero(dp)
                mma_ss(s, sq, 16 * w, sk[cur], fr, w, lane)  # q k^T
                mma_ss(dp, sdy, 16 * w, sv[cur], fr, w, lane)  # dy v^T
            if more:
                put(sk[1 - cur], r)
                fetch(r, vb, u0 + BKV, c0, T)
            if active:
                edge = u0 + BKV - 1 > row0 or row0 + 15 >= T   # the diagonal, or rows past T
                if edge or drop:                           # (the same in the whole warp)
                    for hh in range(2):
                        t = row0 + 8 * hh + g
                        rowflat = ((b * H + h) * T + t) * T + u0
                        for jj in range(SB):
                            c = col(jj, tq)
                            gr = float32(0.0)
                            if u0 + c <= t and t < T:
                                p = math.exp(s[hh, jj] * scale - lse_t[hh])
                                da = dp[hh, jj]
                                if drop:
                                    da *= dropout_factor(key, rowflat + c, threshold, dscale)
                                gr = p * (da - d_t[hh])
                            s[hh, jj] = gr
                else:                                      # every score of the tile counts, f = 1
                    for hh in range(2):
                        for jj in range(SB):
                            s[hh, jj] = math.exp(s[hh, jj] * scale - lse_t[hh]) * (dp[hh, jj] - d_t[hh])
                pack(dsf, s)
                mma_rs(acc, dsf, sk[cur], fr, w, lane)     # dq += ds @ k
            if more:
                put(sv[1 - cur], r)
                if j + 2 < n_tiles:
                    fetch(r, kb, u0 + 2 * BKV, c0, T)
                cuda.syncthreads()
        for hh in range(2):
            t = row0 + 8 * hh + g
            if t < T:
                if OUT16:                                  # dq in bf16 only (dq: its words)
                    store16(dq, b, t, c0, acc, hh, tq, scale, False)
                else:
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
        """Block (b*H + h, key tile of BQ keys, the first keys first); per query tile t0 >= u0:
            s^T = k q^T, dp^T = v dy^T (mma_ss)    P^T = exp(scale s^T - lse)    ds^T = P^T (f dp^T - D)
            dv += (P^T f) @ dy,  dk += ds^T @ q    (mma_rs, dY and Q read transposed)
        and at the end dk *= scale. Each key row's dk and dv are summed by its warp alone."""
        key = key_value(dropout_key)
        sk = cuda.shared.array(OWN_WORDS, int32, alignment=16)     # the block's k rows, bf16
        sv = cuda.shared.array(OWN_WORDS, int32, alignment=16)     # its v rows
        sq = cuda.shared.array(INNER_WORDS, int32, alignment=16)   # Q tiles, two buffers
        sdy = cuda.shared.array(INNER_WORDS, int32, alignment=16)  # dY tiles of the same queries
        slse = cuda.shared.array(ROWS2, float32)
        sd = cuda.shared.array(ROWS2, float32)
        ro = cuda.local.array(EO, float32)
        r = cuda.local.array(E, float32)
        rl = cuda.local.array(LPT, float32)                # the next lse values
        rd = cuda.local.array(LPT, float32)                # the next D values
        st = cuda.local.array((2, SB), float32)            # s^T, then P^T f
        dat = cuda.local.array((2, SB), float32)           # dp^T, then ds^T
        vacc = cuda.local.array((2, SH), float32)
        kacc = cuda.local.array((2, SH), float32)
        pff = cuda.local.array((KC, 4), int32)             # P^T f as A fragments
        dsf = cuda.local.array((KC, 4), int32)             # ds^T as A fragments
        T = q.shape[1]
        H = lse.shape[1]
        bh, tile = nonneg(cuda.blockIdx.x), nonneg(cuda.blockIdx.y)
        b, h = bh // H, bh % H
        c0 = h * HS
        u0 = tile * BQ                                     # the longest columns (small u) first
        tid = nonneg(cuda.threadIdx.x)
        w, lane = tid // WARP, tid % WARP
        g, tq = lane >> 2, lane & 3
        fr = lane_frag(lane)                               # this lane's ldmatrix offsets
        row0 = u0 + 16 * w                                 # the warp's first key
        qb, dyb = q[b], dy[b]
        drop = threshold != uint64(0)
        zero(vacc)
        zero(kacc)
        fetch_own(ro, k[b], u0, c0, T)
        put_own(sk, ro)
        fetch_own(ro, v[b], u0, c0, T)
        put_own(sv, ro)
        n_tiles = (T - u0 + BKV - 1) // BKV                # queries u0 .. T - 1
        fetch(r, qb, u0, c0, T)
        put(sq[0], r)
        fetch(r, dyb, u0, c0, T)
        put(sdy[0], r)
        fetch_rows(rl, lse, b, h, u0, T)
        fetch_rows(rd, d_rowdot, b, h, u0, T)
        put_rows(slse[0], rl)
        put_rows(sd[0], rd)
        if n_tiles > 1:
            fetch(r, qb, u0 + BKV, c0, T)
            fetch_rows(rl, lse, b, h, u0 + BKV, T)
            fetch_rows(rd, d_rowdot, b, h, u0 + BKV, T)
        cuda.syncthreads()
        for j in range(n_tiles):
            t0 = u0 + j * BKV
            cur = j & 1
            more = j + 1 < n_tiles
            active = t0 + BKV - 1 >= row0 and row0 < T     # some query of the tile sees the warp's keys
            if active:
                zero(st)
                zero(dat)
                mma_ss(st, sk, 16 * w, sq[cur], fr, w, lane)  # k q^T
                mma_ss(dat, sv, 16 * w, sdy[cur], fr, w, lane)  # v dy^T
            if more:
                put(sq[1 - cur], r)
                fetch(r, dyb, t0 + BKV, c0, T)
            if active:
                edge = t0 < row0 + 15 or t0 + BKV > T       # the diagonal, or queries past T
                if edge or drop:                           # (the same in the whole warp)
                    for hh in range(2):
                        u = row0 + 8 * hh + g
                        for jj in range(SB):
                            c = col(jj, tq)
                            tt = t0 + c
                            pf = float32(0.0)
                            gr = float32(0.0)
                            if u <= tt and tt < T:
                                p = math.exp(st[hh, jj] * scale - slse[cur, c])
                                da = dat[hh, jj]
                                pf = p
                                if drop:
                                    f = dropout_factor(key, ((b * H + h) * T + tt) * T + u, threshold, dscale)
                                    pf = p * f
                                    da = da * f
                                gr = p * (da - sd[cur, c])
                            st[hh, jj] = pf
                            dat[hh, jj] = gr
                else:                                      # every score of the tile counts, f = 1
                    for jj in range(SB):
                        c = col(jj, tq)
                        lse_c, d_c = slse[cur, c], sd[cur, c]     # the query's lse and D, for both rows
                        for hh in range(2):
                            p = math.exp(st[hh, jj] * scale - lse_c)
                            st[hh, jj] = p
                            dat[hh, jj] = p * (dat[hh, jj] - d_c)
                pack(pff, st)
                pack(dsf, dat)
                mma_rs(vacc, pff, sdy[cur], fr, w, lane)   # dv += (P^T f) @ dy
                mma_rs(kacc, dsf, sq[cur], fr, w, lane)    # dk += ds^T @ q
            if more:
                put(sdy[1 - cur], r)
                put_rows(slse[1 - cur], rl)
                put_rows(sd[1 - cur], rd)
                if j + 2 < n_tiles:
                    fetch(r, qb, t0 + 2 * BKV, c0, T)
                    fetch_rows(rl, lse, b, h, t0 + 2 * BKV, T)
                    fetch_rows(rd, d_rowdot, b, h, t0 + 2 * BKV, T)
                cuda.syncthreads()
        for hh in range(2):
            u = row0 + 8 * hh + g
            if u < T:
                if OUT16:                                  # dk, dv in bf16 only (their words)
                    store16(dv, b, u, c0, vacc, hh, tq, float32(1.0), False)
                    store16(dk, b, u, c0, kacc, hh, tq, scale, False)
                else:
                    for jj in range(SH):
                        d = col(jj, tq)
                        if d < HS:
                            dv[b, u, c0 + d] = vacc[hh, jj]
                            dk[b, u, c0 + d] = kacc[hh, jj] * scale

    # Blocks of 8 warps ask ptxas for two resident blocks a multiprocessor (launch bounds (256, 2):
    # at most 128 registers a thread, 16 warps); left to itself ptxas gives them up to 172 registers,
    # one block (8 warps) a multiprocessor. Smaller blocks keep ptxas's own count, without bounds
    # (a bound of threads alone moves ptxas's own choice: the dq kernel at (4, 32) then spilled).
    # (The simulator's jit takes no launch bounds.)
    def jit(f):
        f.__name__ = f.__qualname__ = f"{f.__name__}_bf16{'_out16' if OUT16 else ''}"     # k_attn_flash_fwd_bf16, ...
        return cuda.jit(launch_bounds=(NT, 2))(f) if WARPS == 8 and not SIMULATOR else cuda.jit(f)
    return tuple(jit(f) for f in (k_attn_flash_fwd, k_attn_flash_bwd_dq, k_attn_flash_bwd_dkdv))


_KERNELS = {}       # (hs, WARPS, BKV, vec, out16) -> the three kernels (out16: with bf16 outputs)


def kernels(hs, block, vec, which, out16=False):
    """The kernels of head size hs and block (WARPS, BKV), after checking that `which` ("fwd",
    or "bwd": the dq and dk/dv kernels) fits: BKV a multiple of 16, shared memory within 48 KiB;
    out16: the kernels with bf16 outputs."""
    warps, bkv = block
    if bkv % 16 or warps < 1:
        raise BlockDoesNotFit(f"flash attention (bf16): block {block}: inner tiles of a multiple of 16 rows")
    for name in (("fwd",) if which == "fwd" else ("dq", "dkdv")):
        need = shared_bytes(hs, warps, bkv, name)
        if need > SHARED_LIMIT:
            raise BlockDoesNotFit(f"flash attention (bf16): head size {hs} needs {need} bytes of shared memory in "
                                  f"its {name} kernel with block {block}, more than {SHARED_LIMIT}")
    key = (hs, warps, bkv, vec, out16)
    if key not in _KERNELS:
        _KERNELS[key] = make_kernels(hs, warps, bkv, vec, out16)    # numba compiles each on its first launch
    return _KERNELS[key]


def _launch_fwd(y, y16, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, out16):
    """The forward's launch: grid (B*H, T / (16 WARPS)), 32 WARPS threads; out16 False (y16 = y,
    unread) or True (y16: y's bf16 words)."""
    B, T, C, hs = _check(q, n_head)
    warps = block[0]
    fwd = kernels(hs, block, aligned_rows(hs, q, k, v), "fwd", out16)[0]
    scale = 1.0 / math.sqrt(hs) * (1.0 / math.log(2.0))          # the scores in base 2
    fwd[(B * n_head, cdiv(T, 16 * warps)), WARP * warps, stream](
        y, y16, lse, q, k, v, np.float32(scale), *mask_args(dropout_p, dropout_key))


def _launch_bwd(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream, out16):
    """The backward's two launches, both on grid (B*H, T / (16 WARPS)), 32 WARPS threads: fp32 dq,
    dk, dv, or with out16 their bf16 words."""
    B, T, C, hs = _check(q, n_head)
    warps = block[0]
    _, dq_kernel, dkdv_kernel = kernels(hs, block, aligned_rows(hs, q, k, v, dy, y), "bwd", out16)
    scale = np.float32(1.0 / math.sqrt(hs))
    drop = mask_args(dropout_p, dropout_key)
    grid = (B * n_head, cdiv(T, 16 * warps))
    dq_kernel[grid, WARP * warps, stream](dq, d_rowdot, dy, q, k, v, y, lse, scale, *drop)
    dkdv_kernel[grid, WARP * warps, stream](dk, dv, dy, q, k, v, lse, d_rowdot, scale, *drop)


@rung(13)
@blocks(**FLASH_BF16_FWD_BLOCKS)
def attn_flash_fwd_bf16(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """y [B, T, C] and lse [B, H, T], with bf16 products (the base-2 softmax with an integer
    maximum), bf16 tiles read by ldmatrix and p~ f kept in registers. Grid (B*H, T / (16 WARPS)),
    32 WARPS threads; block = (WARPS, BKV)."""
    _launch_fwd(y, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, False)   # (y as y16: unread)


@rung(13)
@blocks(**FLASH_BF16_BWD_BLOCKS)
def attn_flash_bwd_bf16(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                       block, stream=0):
    """dq, dk, dv [B, T, C] with bf16 products, bf16 tiles read by ldmatrix and ds, P f kept in
    registers: the dq kernel (which writes D = dy . y to d_rowdot [B, H, T]), then the dk/dv kernel,
    both on grid (B*H, T / (16 WARPS)), 32 WARPS threads; block = (WARPS, BKV)."""
    _launch_bwd(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream, False)


attn_flash_fwd_bf16.precision = "bf16"     # the harness checks it against the twin under products_in("bf16")
attn_flash_bwd_bf16.precision = "bf16"


# The _out16 pair: the outputs in bf16 where only bf16 products read them. In the bf16-hopper recipe
# (bf16_outputs) y is read by attn_out's two products (y @ W_O, y^T @ dout) and by the backward's
# D = dy . y; dq, dk, dv only by attn_qkv's six products. Stored in fp32, each product's operand
# copy (cublaslt.round_into) would read them back to round them: five passes of [N, C] a layer. The
# forward writes y and, from the same fp32 quotients, y16 = bf16(y); the backward writes dq, dk, dv
# straight as bf16, each value the fp32 number attn_flash_bwd_bf16 would store, rounded as the copy
# would round it (ties to even): the products see the same bits, and the five copies and 3 N C fp32
# stores go. Without y16 and with float32 dq, dk, dv (the harness's call) the pair is
# attn_flash_fwd_bf16 / attn_flash_bwd_bf16.
def _words(a):
    """A uint16 [B, T, C] array (C even) as int32 [B, T, C / 2]: the words store16 writes."""
    B, T, C = a.shape
    assert a.dtype == np.uint16 and C % 2 == 0, "bf16 outputs: uint16 [B, T, C] arrays, C even"
    return a.reshape(B * T * C).view(np.int32).reshape(B, T, C // 2)


@rung(14)
@blocks(**FLASH_BF16_FWD_BLOCKS)
def attn_flash_fwd_bf16_out16(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, y16=None, block, stream=0):
    """attn_flash_fwd_bf16 (its launch); with y16 (uint16 [B, T, C], head size even) also y rounded
    to bf16 into y16."""
    if y16 is not None:
        assert _check(q, n_head)[3] % 2 == 0, "flash attention's bf16 y16: an even head size"
    _launch_fwd(y, y if y16 is None else _words(y16), lse, q, k, v, n_head, dropout_p, dropout_key, block, stream,
                y16 is not None)


@rung(14)
@blocks(**FLASH_BF16_BWD_BLOCKS)
def attn_flash_bwd_bf16_out16(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                       block, stream=0):
    """attn_flash_bwd_bf16 (its launch); with dq, dk, dv uint16 [B, T, C] (head size even) they
    receive bf16 (the fp32 values rounded, ties to even) instead of fp32."""
    out16 = dq.dtype == np.uint16
    if out16:
        assert _check(q, n_head)[3] % 2 == 0, "flash attention's bf16 dq, dk, dv: an even head size"
        dq, dk, dv = _words(dq), _words(dk), _words(dv)
    _launch_bwd(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream, out16)


attn_flash_fwd_bf16_out16.precision = attn_flash_bwd_bf16_out16.precision = "bf16"
