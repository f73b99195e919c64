"""Flash attention v15: FlashAttention-3's shape on Hopper's warpgroup product wgmma (sm_90a),
bf16 operands, fp32 sums, causal, head size up to 64.

    attn_flash_fwd_v15, attn_flash_bwd_v15     v13's arguments, outputs and numbers (and v14's bf16
                                               outputs: y16; dq, dk, dv given as uint16)

Read kernels/attn_flash_bf16.py first (v13: the math, the fragments, the pipeline this rung keeps),
then kernels/wgmma.py (the instruction, its descriptors and layouts). What changes from v13 is who
multiplies: v13's warps each issue mma.sync m16n8k16 on fragments that ldmatrix fetched from shared
memory; here a warpgroup (four warps, 128 threads) issues one wgmma m64nNk16 that reads its B
operand (and for S its A operand too) straight from shared memory through a descriptor, 64 rows x
N columns x 16 values of k an instruction, asynchronously. No ldmatrix, no B fragments in registers.

THE TILES. A block is (NWG, BKV): NWG = 1 or 2 warpgroups, each owning 64 "own" rows (queries in the
forward and the dq kernel, keys in the dk/dv kernel), BQ = 64 NWG rows a block, and "inner" tiles
of BKV rows (keys; queries in the dk/dv kernel), BKV a multiple of 16, walked one after the other.
The head size hs <= 64 is padded with zeros to HSP = 64 channels: a stored row is 64 bf16 = 128
bytes, one row of wgmma's 128-byte swizzle. Shared memory (dynamic, from a 1024-byte boundary):

    kernel   own tiles              inner tiles (two buffers each)   (1, 64)   (1, 32)   (2, 64)
    forward  Q      BQ x 64         K, V    2 x 2 x BKV x 64         40 KiB    24 KiB    48 KiB
    dq       Q, dY  2 x BQ x 64     K, V    2 x 2 x BKV x 64         48 KiB    32 KiB    64 KiB   (+ D, static)
    dk/dv    K, V   2 x BQ x 64     Q, dY   2 x 2 x BKV x 64         48 KiB    32 KiB    64 KiB   (+ lse, D, static)

(+ 1 KiB to find the boundary; past 48 KiB the launch allows the kernel more: matmul.allow_shared).
Warp w of the block (w = 4 wg + w4, w4 its warp in warpgroup wg) owns rows 16 w .. 16 w + 15: the
same rows as v13's warp w, so everything a thread does to its rows (the softmax, the masks,
dropout, the epilogue) is v13's code.

THE STORED TILE (every tile, own or inner). Row r of the tile (a query, key, dy or v row) is 128
bytes, channel c at byte 2 c, its 16-byte chunk q (channels 8q .. 8q + 7) stored at chunk q ^ (r & 7):
the 128-byte swizzle (wgmma.py, mode 1), applied by the hardware on absolute shared addresses, hence
the 1024-byte boundaries. The same stored tile is read two ways:

  K-major (imm-trans 0: wgmma.kmajor_offset with swizzle 1): rows are m (A) or n (B^T), k = channel.
      Descriptor: LBO 16 (unused), SBO 1024 (the next 8 rows), mode 1; k16 step ks (channels
      16 ks ..) starts 32 ks bytes into the rows (the hardware applies the XOR to the addresses it
      computes). This is how S = Q K^T reads Q (A) and K (B^T) - the rows' natural [T, hs] layout.
  N-major (imm-trans-b 1: wgmma.mnmajor_offset with swizzle 1, depth BKV): k = row, n = channel.
      Each row is 64 consecutive n of one k, so the tile is one 64-wide column block of the
      MN-major layout: LBO = 128 BKV (the next 64 n: unused at N = 64), SBO = 1024 (the next 8 k),
      k16 step kc (rows 16 kc ..) starts 2048 kc bytes on. This is how O += P V reads V, and the
      backward reads K (dq += dS K), dY (dv += P^T dY) and Q (dk += dS^T Q): no transposed copy.

THE FRAGMENTS (wgmma.py; PTX ISA "Matrix Fragments for wgmma .m64nNk16"). Thread 32 w4 + 4 g + t of
a warpgroup holds, of an m64nN accumulator (N / 2 fp32 registers), for each 8-column block j:

    d[4j + 2h + c] = D[16 w4 + g + 8 h, 8 j + 2 t + c]          (h, c = 0, 1)

which is v13's C fragment once per 8 columns: frag_store copies d into a local array
acc[h, 2 j + c] = d[4 j + 2 h + c], v13's acc[hh, jj] (column col(jj, t) = 8 (jj // 2) + 2 t + jj % 2).
The register-A wgmma (wgmma.wgmma_bf16_rs) takes A 64 x 16 from the same threads' registers in the
layout of an m64n16 accumulator (wgmma.register_a_matrix): a0 = A[g, 2t : 2t + 2], a1 = A[g + 8,
...], a2 = A[g, 2t + 8 : 2t + 10], a3 = A[g + 8, ...] (rows of warp w4). So the scores' registers of
keys 16 kc .. 16 kc + 15, rounded to bf16 and packed in pairs, are the A operand of the next
product, exactly as v13's pack builds an mma.sync A fragment:

    a0 = (s[0, 4kc], s[0, 4kc+1])    a1 = (s[1, 4kc], s[1, 4kc+1])
    a2 = (s[0, 4kc+2], s[0, 4kc+3])  a3 = (s[1, 4kc+2], s[1, 4kc+3])

p~ f (and ds, P^T f, ds^T) never goes through shared memory (FlashAttention-3's "RS" product).

The products (NK = HSP / 16 = 4 k16 steps over the channels, KC = BKV / 16 over an inner tile):

    forward   S = Q K^T           m64nBKVk16 x 4, A and B^T K-major (mma_ss)
              O += (p~ f) V       m64n64k16 x KC, A in registers, V N-major (mma_rs)
    dq        S = Q K^T, dP = dY V^T (mma_ss)            dQ += dS K        (mma_rs, K N-major)
    dk/dv     S^T = K Q^T, dP^T = V dY^T (mma_ss)        dV += (P^T f) dY, dK += dS^T Q (mma_rs)

THE PIPELINE (per inner tile j, every thread; one barrier a tile). v13's: the next tile's fp32
values are fetched into registers (r) one matrix at a time and stored, rounded to bf16, into the
other buffer while this tile's products run, now in the shadow of an asynchronous wgmma:

    wgmma.fence; S = Q K_j^T (4 wgmma); commit          (buffer j % 2)
    put r (K_j+1) -> the other buffer; fetch V_j+1 into r          (during S's wgmmas)
    wgmma.wait 0; the softmax on S's registers; p~ f packed to bf16 pairs
    wgmma.fence; O += p~ f V_j (KC wgmma); commit
    put r (V_j+1) -> the other buffer; fetch K_j+2 into r          (during O's wgmmas)
    wgmma.wait 0; fence.proxy.async; bar.sync

The other buffer was last read by tile j - 1's wgmmas, which the wait of tile j - 1 saw complete
before its barrier, so the puts need no barrier of their own. Plain st.shared is the "generic
proxy" and wgmma reads through the "async proxy": fence.proxy.async before the barrier makes every
thread's puts visible to the next tile's wgmmas (wgmma.py's protocol). The O accumulator is chained
through the tiles in the tensor core (D = A B + D), rescaled in registers between them (frag_scale)
when a row's maximum moves; the wgmma.fence before each group orders those register writes.

CAUSALITY. A wgmma is one instruction of all 128 threads of a warpgroup, so a tile is skipped by a
whole warpgroup (its index read through uniform(), a shuffle from lane 0, so that ptxas sees the
branch around the wgmmas as taken alike by the whole warp; on tid // 128 itself it serializes every
wgmma of the kernel, warning C7518): one whose 64 rows see none of the tile's keys (forward, dq: the tile starts after
its last row, or all its rows are past T; dk/dv: the tile's last query is before its first key).
Inside a working warpgroup a warp whose 16 rows see none of the keys computes scores that its
mask sets to -inf (p~ = 0; its rows' integer maxima were set by key tile 0, which every row sees):
zeros added, no bit moved. Each warp tests every element only where its rows cross the diagonal or
T (v13's tests, on the same rows). The grid is (B H, tiles), each head's longest tiles first.

THE MATH is v13's, and so are its numbers but for the order of fp32 sums inside a product (the
tensor core's; the k steps chained in it as in v13) - the harness's bf16 tolerance decides: inputs
of the five products rounded to bf16 once (cvt.rn, ties to even) on their way into shared memory,
the forward's scores in base 2 with an integer running maximum, p~ = 2^(s - m) with l summed before
dropout, lse = ln 2 (m + log2 l); the backward's P = exp(scale s - lse), ds = P (f dp - D), dq and
dk multiplied by scale at the end; D = dy . y by one thread a row in channel order (v13's bits).
Every output element is summed by one warpgroup in a fixed order: no atomics, bit-identical reruns.

THE SIMULATOR cannot run wgmma. Its twins: a product from shared memory (mma_ss) is
wgmma.wgmma_warpgroup on the shared array's bytes through the same descriptors, a register-A product
(mma_rs) first gathers the 128 threads' packed registers (wgmma.warpgroup_gather, a barrier of the
warpgroup's threads) and runs wgmma.wgmma_warpgroup_rs; each thread keeps its own row of results.
The fences, commits and waits do nothing there, so the simulator checks the layouts, descriptors,
fragments, masks and math, not the asynchrony (lab/bench/flash_wgmma.py asks a GPU).
"""
import math

import numpy as np
from numba import cuda, float32, int32, uint64

from andrea_numba.kernels.attn import NEG_INF, _check
from andrea_numba.kernels.attn_flash_bf16 import FULL, LN2, _words, quad_max2, quad_sum2
from andrea_numba.kernels.attn_flash_tf32x3 import aligned_rows
from andrea_numba.kernels.common import SIMULATOR, BlockDoesNotFit, blocks, cdiv, nonneg
from andrea_numba.kernels.dropout import dropout_factor, key_value, mask_args
from andrea_numba.kernels.matmul import allow_shared
from andrea_numba.kernels.ptx import bf16x2, load4, store2
from andrea_numba.kernels.warp_tile import WARP
from andrea_numba.kernels.wgmma import (SWIZZLE_128B, fence_proxy_async, mnmajor_lbo_sbo, shared_address, smem_desc,
                                        wgmma_acc_zeros, wgmma_bf16, wgmma_bf16_rs, wgmma_commit, wgmma_fence,
                                        wgmma_keep, wgmma_wait0)
from andrea_numba.kernels.wgmma_tile import WARPGROUP

if SIMULATOR:
    from andrea_numba.kernels.wgmma import (warpgroup_gather, warpgroup_once, wgmma_warpgroup,   # the twins
                                            wgmma_warpgroup_rs)
else:                   # the code generators of frag_store and frag_scale
    from numba import types
    from numba.core import cgutils
    from numba.cuda.extending import intrinsic

HSP = 64                # channels of a stored row (zeros past hs): 128 bytes of bf16, the 128-byte swizzle's row
ROW_WORDS = HSP // 2    # 32-bit words of a stored row
ROW_BYTES = 2 * HSP
ALIGN = 1024            # the swizzle's atom, 8 rows of 128 bytes: every tile starts on such a boundary
KM_LBO, KM_SBO = 16, 1024                     # K-major descriptor: LBO unused, SBO = the next 8 rows
KM_STEP = 32 // 4       # words: k16 step ks of a K-major operand starts 32 ks bytes into its rows
MN_STEP = 16 * ROW_BYTES // 4                 # words: k16 step kc of an N-major operand starts 16 rows on
NK = HSP // 16          # k16 steps over the channels (S-like products)

# (NWG, BKV): warpgroups a block (64 own rows each) and the inner tile's rows. GPU: the first is the
# default, chosen without a measurement (ptxas 13.0, sm_90a, hs = 64: registers a thread, spills):
#     forward  (2, 64) 128 (bounds), none   (1, 64) 168, none     (1, 128) 255, none     (1, 32) 128, none
#     dq       (1, 32) 168, none            (2, 32) 168, none     (1, 64) 248, none      (2, 64) 234, none
#     dk/dv    (1, 32) 181, none            (2, 32) 179, none     (1, 64) 255, 8 bytes   (2, 64) 255, 12 bytes
# The forward: 128 query rows a block as v13's, so each K and V tile is read from L2 once for 128
# rows (in fp32: the rows are rounded on their way in), two blocks a multiprocessor (launch bounds,
# jit below). The backward: one warpgroup a block, two blocks a multiprocessor, each on its own
# barrier. Simulator: one warpgroup with inner tiles of 32 and of 16 (the harness's blocks); two
# warpgroups with tiles of 16 are run by tests/test_attn_flash_v15.py, which checks they give one
# warpgroup's bits (at the harness's T = 13 the second warpgroup's rows would all be past T).
FLASH_WGMMA_FWD_BLOCKS = dict(gpu=((2, 64), (1, 64), (1, 128), (1, 32)), sim=((1, 32), (1, 16)))
FLASH_WGMMA_BWD_BLOCKS = dict(gpu=((1, 32), (2, 32), (1, 64), (2, 64)), sim=((1, 32), (1, 16)))
DYNAMIC_LIMIT = 227 * 1024      # dynamic shared memory a Hopper block may ask for


def layout(block, kernel: str):
    """{tile: (first word, words)} of kernel "fwd", "dq" or "dkdv"'s shared tiles at block (NWG, BKV),
    words from the 1024-byte boundary: own tiles of BQ = 64 NWG rows, inner tiles of two buffers of
    BKV rows, 32 words a row."""
    nwg, bkv = block
    own, inner = 64 * nwg * ROW_WORDS, 2 * bkv * ROW_WORDS
    names = {"fwd": (("q", own), ("k", inner), ("v", inner)), "dq": (("q", own), ("dy", own), ("k", inner), ("v", inner)),
             "dkdv": (("k", own), ("v", own), ("q", inner), ("dy", inner))}[kernel]
    out, at = {}, 0
    for name, words in names:
        out[name] = (at, words)
        at += words
    return out


def shared_bytes(block, kernel: str) -> int:
    """Dynamic shared memory of a launch: the tiles plus 1 KiB to start them on a 1024-byte boundary."""
    return 4 * sum(w for _, w in layout(block, kernel).values()) + ALIGN


# ------------------------------------------------------------------------------------------------
# The warpgroup's index, and accumulator tuples <-> the thread's local arrays

if SIMULATOR:
    def uniform(x):
        """Twin: x itself."""
        return x
else:
    @cuda.jit(device=True, inline="always")
    def uniform(x):
        """x as lane 0 of the warp holds it, for a value that is the same in every lane (the warpgroup's
        index, tid // 128): the same number, but now one the compiler knows to be the same in the warp
        (CUTLASS's canonical_warp_group_idx). A branch on it around a wgmma is then not "divergent";
        on tid // 128 itself ptxas serializes every wgmma of the kernel (warning C7518).
        PTX: shfl.sync.idx.b32"""
        return cuda.shfl_sync(FULL, x, 0)


if SIMULATOR:
    def frag_store(arr, d):
        """Twin: arr[h, 2 j + c] = d[4 j + 2 h + c]."""
        for r in range(len(d)):
            arr[(r >> 1) & 1, 2 * (r >> 2) + (r & 1)] = d[r]

    def frag_scale(d, f0, f1):
        """Twin: d with the registers of row g (h = 0) times f0 and of row g + 8 times f1, in fp32."""
        return tuple(np.float32(x) * np.float32(f1 if (r >> 1) & 1 else f0) for r, x in enumerate(d))
else:
    def _tuple_of_f32(d):
        return isinstance(d, types.UniTuple) and d.dtype == types.float32 and d.count % 4 == 0

    @intrinsic
    def frag_store(typingctx, arr, d):
        """arr[h, 2 j + c] = d[4 j + 2 h + c] for every register of an m64nNk16 accumulator d (the
        module docstring's fragments), arr a C-contiguous float32 [2, N / 4] array: straight-line code,
        every index a constant (a loop over d[r] with r a variable would compile to a switch a register).
        PTX: mov / st.local (registers, once LLVM has promoted arr)"""
        ok = (isinstance(arr, types.Array) and arr.ndim == 2 and arr.dtype == types.float32 and arr.layout == "C"
              and _tuple_of_f32(d))
        if not ok:
            return None

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            shape = cgutils.unpack_tuple(builder, ary.shape, 2)
            strides = cgutils.unpack_tuple(builder, ary.strides, 2)
            for r in range(sig.args[1].count):
                inds = [context.get_constant(types.intp, (r >> 1) & 1),
                        context.get_constant(types.intp, 2 * (r >> 2) + (r & 1))]
                ptr = cgutils.get_item_pointer2(context, builder, ary.data, shape, strides, "C", inds)
                builder.store(builder.extract_value(args[1], r), ptr)
            return context.get_dummy_value()
        return types.void(arr, d), codegen

    @intrinsic
    def frag_scale(typingctx, d, f0, f1):
        """d with the registers of row g (d[4 j + c]) times f0 and those of row g + 8 (d[4 j + 2 + c])
        times f1: the rescale of a chained accumulator between two wgmma groups.   PTX: mul.f32"""
        if not (_tuple_of_f32(d) and isinstance(f0, types.Float) and isinstance(f1, types.Float)):
            return None

        def codegen(context, builder, sig, args):
            a, b = (context.cast(builder, v, t, types.float32) for v, t in zip(args[1:], sig.args[1:]))
            out = [builder.fmul(builder.extract_value(args[0], r), b if (r >> 1) & 1 else a)
                   for r in range(sig.args[0].count)]
            return context.make_tuple(builder, sig.return_type, out)
        return d(d, f0, f1), codegen


# ------------------------------------------------------------------------------------------------
# The kernels

def make_kernels(HS: int, NWG: int, BKV: int, VEC: bool, OUT16: bool = False):
    """The three kernels (forward, dq, dk/dv) for head size HS <= 64, NWG warpgroups a block, inner
    tiles of BKV rows, 128-bit global loads VEC (aligned_rows checked them); OUT16 (HS even): y's
    bf16 copy besides y, and dq, dk, dv in bf16 only (v14's store16)."""
    BQ = 64 * NWG                  # own rows of a block
    NT = WARPGROUP * NWG           # threads of a block
    SB = BKV // 4                  # a thread's columns of an S-like accumulator (2 rows x SB = BKV / 2 registers)
    SH = HSP // 4                  # ... of an O-like accumulator (HSP / 2 registers)
    KC = BKV // 16                 # k16 steps over an inner tile (O-like products)
    TILE = BKV * ROW_WORDS         # words of one buffer of an inner tile
    MN_LBO, MN_SBO = mnmajor_lbo_sbo(BKV, SWIZZLE_128B)      # an inner tile read N-major (depth BKV)
    LPT = cdiv(BKV, NT)            # lse and D values a thread copies (dk/dv kernel)
    ROWS2 = (2, BKV)               # two buffers of an inner tile's lse (or D) values
    # where each kernel's tiles start (words from the 1024-byte boundary: layout)
    FWD_Q, FWD_K, FWD_V = (layout((NWG, BKV), "fwd")[t][0] for t in ("q", "k", "v"))
    DQ_Q, DQ_DY, DQ_K, DQ_V = (layout((NWG, BKV), "dq")[t][0] for t in ("q", "dy", "k", "v"))
    KV_K, KV_V, KV_Q, KV_DY = (layout((NWG, BKV), "dkdv")[t][0] for t in ("k", "v", "q", "dy"))
    assert BKV % 16 == 0 and NWG in (1, 2) and HS <= HSP

    def copier(R):
        """fetch(regs, x, r0, c0, T): this thread's 4-float chunks of the R x HSP tile of x [T, C] at
        row r0, channel c0 (zero past row T and past channel c0 + HS) into registers; put(smem, at,
        regs): each chunk rounded to two bf16 pairs (cvt.rn.bf16x2) and stored with one 64-bit store
        at its swizzled place in the tile at word `at` (the stored tile: row r, 16-byte chunk q at
        q ^ (r & 7)). Thread i takes the chunk at channel 4 (i % 16) of rows i // 16 + RPI p (RPI =
        NT / 16 rows a pass, a multiple of 8: its swizzled column is the same in every pass p); 16
        lanes read a row's 256 bytes of fp32 and store its 128 bytes of bf16."""
        CPR = HSP // 4                        # chunks of 4 floats a row
        RPI = NT // CPR                       # rows a pass: 8 or 16
        CH = R // RPI                         # passes (chunks a thread)
        assert R % RPI == 0

        @cuda.jit(device=True)
        def fetch(regs, x, r0, c0, T):
            tid = nonneg(cuda.threadIdx.x)
            rt, ct = tid // CPR, 4 * (tid % CPR)
            C = x.shape[1]
            base = (r0 + rt) * C + c0 + ct            # the first chunk's element in x
            whole = r0 + R <= T                       # the tile ends before T: no row test
            for i in range(CH):
                r = r0 + rt + i * RPI
                ok = whole or r < T
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
        def put(smem, at, regs):
            tid = nonneg(cuda.threadIdx.x)
            rt, q4 = tid // CPR, tid % CPR        # q4: half of the 16-byte chunk q4 // 2
            w0 = at + rt * ROW_WORDS + 4 * ((q4 >> 1) ^ (rt & 7)) + 2 * (q4 & 1)
            if SIMULATOR:                         # the same words, every pass at once (bf16x2's twin takes arrays)
                words = bf16x2(regs[0::2], regs[1::2])                     # [2 CH]: pass i's two words
                at_i = w0 + np.arange(CH) * (RPI * ROW_WORDS)
                smem[at_i], smem[at_i + 1] = words[0::2], words[1::2]
                return
            for i in range(CH):
                store2(smem, w0 + i * RPI * ROW_WORDS, bf16x2(regs[4 * i], regs[4 * i + 1]),
                       bf16x2(regs[4 * i + 2], regs[4 * i + 3]))
        return fetch, put, 4 * CH

    fetch_own, put_own, EO = copier(BQ)
    fetch, put, E = copier(BKV)

    @cuda.jit(device=True)
    def tile_memory():
        """The dynamic shared array (int32 words) and the word where the tiles start: its first
        1024-byte boundary (the launch gave the tiles' bytes + 1024). The simulator's starts at 0."""
        smem = cuda.shared.array(0, int32)
        pad = (ALIGN - (shared_address(smem, 0) & (ALIGN - 1))) & (ALIGN - 1)
        return smem, pad // 4

    @cuda.jit(device=True)
    def col(j, tq):
        """Column (within an accumulator of 8-column blocks) of acc[:, j] for lane t = tq."""
        return (j // 2) * 8 + 2 * tq + j % 2

    @cuda.jit(device=True)
    def pack(af, p):
        """af[kc] = the register-A operand of keys 16 kc .. 16 kc + 15 from the accumulator values p
        (module docstring, THE FRAGMENTS): four bf16 pairs, rounded to nearest even (cvt.rn.bf16x2.f32)."""
        if SIMULATOR:                             # the same pairs, all at once (bf16x2's twin takes arrays):
            lo = np.stack([p[i & 1, 2 * (i >> 1)::4] for i in range(4)], axis=1)    # a_i's low halves [KC, 4]:
            hi = np.stack([p[i & 1, 2 * (i >> 1) + 1::4] for i in range(4)], axis=1)  # row g + 8 (i & 1), keys
            af[:, :] = bf16x2(lo, hi)                                                # 2t + 8 (i >> 1) (+ 1)
            return
        for kc in range(KC):
            af[kc, 0] = bf16x2(p[0, 4 * kc], p[0, 4 * kc + 1])             # a0: row g, keys 2t, 2t+1
            af[kc, 1] = bf16x2(p[1, 4 * kc], p[1, 4 * kc + 1])             # a1: row g+8
            af[kc, 2] = bf16x2(p[0, 4 * kc + 2], p[0, 4 * kc + 3])         # a2: row g, keys 2t+8, 2t+9
            af[kc, 3] = bf16x2(p[1, 4 * kc + 2], p[1, 4 * kc + 3])         # a3: row g+8

    @cuda.jit(device=True)
    def store16(out, b, t, c0, acc, hh, tq, f, divide):
        """The bf16 stores (OUT16), v14's: out [B, T, C / 2] int32 gets acc[hh, :] / f (divide) or
        * f, the fp32 values the fp32 outputs receive, rounded to bf16, two channels a word."""
        for jj in range(0, SH, 2):
            d = col(jj, tq)
            if d < HS:
                if divide:
                    x0, x1 = acc[hh, jj] / f, acc[hh, jj + 1] / f
                else:
                    x0, x1 = acc[hh, jj] * f, acc[hh, jj + 1] * f
                out[b, t, (c0 + d) // 2] = bf16x2(x0, x1)

    if SIMULATOR:
        def desc_k(smem, at):
            return smem_desc(smem, at, KM_LBO, KM_SBO, SWIZZLE_128B)

        def mma_ss(acc, smem, a_at, b_at, tid):
            """Twin of mma_ss: the warpgroup's product of each k16 step from the shared array's bytes
            (wgmma_warpgroup), the registers summed step after step in fp32, worked out once for the
            warpgroup (warpgroup_once); this thread's registers."""
            n, wg, wt = 2 * len(acc), tid // WARPGROUP, tid % WARPGROUP

            def product():
                d = np.zeros((WARPGROUP, n // 2), np.float32)
                for ks in range(NK):
                    d = d + wgmma_warpgroup(smem, desc_k(smem, a_at + ks * KM_STEP), desc_k(smem, b_at + ks * KM_STEP), n)
                return d
            return tuple(warpgroup_once(product, wg, wt)[wt])

        def mma_rs(acc, af, smem, b_at, tid):
            """Twin of mma_rs: the 128 threads' packed registers and accumulators (warpgroup_gather),
            then each k16 step's register-A product (wgmma_warpgroup_rs) added in fp32, once for the
            warpgroup; this thread's registers."""
            n, wg, wt = 2 * len(acc), tid // WARPGROUP, tid % WARPGROUP
            regs = warpgroup_gather(np.concatenate([af.reshape(-1).view(np.float32), np.array(acc, np.float32)]), wg, wt)
            a_regs = regs[:, :4 * KC].view(np.int32).reshape(WARPGROUP, KC, 4)   # [128, KC, 4]

            def product():
                d = regs[:, 4 * KC:]                                               # [128, n / 2]
                for kc in range(KC):
                    desc = smem_desc(smem, b_at + kc * MN_STEP, MN_LBO, MN_SBO, SWIZZLE_128B)
                    d = d + wgmma_warpgroup_rs(a_regs[:, kc], smem, desc, n, trans_b=1)
                return d
            return tuple(warpgroup_once(product, wg, wt)[wt])
    else:
        @cuda.jit(device=True, inline="always")
        def mma_ss(acc, smem, a_at, b_at, tid):
            """acc = A @ B^T over the HSP channels, A the warpgroup's 64 rows of a stored tile at word
            a_at and B^T the BKV rows of an inner tile at b_at, both read K-major: NK wgmma k16 steps
            chained in the tensor core, the first with scale-d 0 (acc's values unused). Issued only:
            the caller fences before and commits and waits after."""
            for ks in range(NK):
                acc = wgmma_bf16(acc, smem_desc(smem, a_at + ks * KM_STEP, KM_LBO, KM_SBO, SWIZZLE_128B),
                                 smem_desc(smem, b_at + ks * KM_STEP, KM_LBO, KM_SBO, SWIZZLE_128B), ks)
            return acc

        @cuda.jit(device=True, inline="always")
        def mma_rs(acc, af, smem, b_at, tid):
            """acc += P @ B over the BKV rows of an inner tile: P the warpgroup's 64 x BKV operand in
            registers (af[kc], pack), B the inner tile at b_at read N-major (k = its rows, n = the
            channels): KC register-A wgmma k16 steps, chained. Issued only, as mma_ss."""
            for kc in range(KC):
                acc = wgmma_bf16_rs(acc, af[kc, 0], af[kc, 1], af[kc, 2], af[kc, 3],
                                    smem_desc(smem, b_at + kc * MN_STEP, MN_LBO, MN_SBO, SWIZZLE_128B), 1, 1)
            return acc

    def k_attn_flash_fwd(y, y16, lse, q, k, v, scale, dropout_key, threshold, dscale):
        """Block (b*H + h, query tile of BQ rows, the last tile first); warpgroup wg owns rows
        64 wg .., warp w rows 16 w ... Online softmax over the key tiles 0 .. the tile's last
        query, in base 2 (v13's): per tile
            s = scale q k^T            (mma_ss; u > t: -inf)        m_new = ceil(max(m, max_u s))
            alpha = 2^(m - m_new)      l *= alpha, o *= alpha (frag_scale)
            p~ = 2^(s - m_new)         l += p~ (before dropout)     o += (p~ f) @ v   (mma_rs)
        and at the end y = o / l, lse = ln 2 (m + log2 l); with OUT16 also y16 = bf16(y)."""
        key = key_value(dropout_key)
        smem, at0 = tile_memory()
        ro = cuda.local.array(EO, float32)                 # this thread's share of the q rows
        r = cuda.local.array(E, float32)                   # the next K or V tile, on its way in
        s = cuda.local.array((2, SB), float32)             # scores, then p~ f: rows g, g + 8
        ob = cuda.local.array((2, SH), float32)            # y's sums, at the end
        pf = cuda.local.array((KC, 4), int32)              # p~ f as register-A operands
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
        wg = uniform(tid // WARPGROUP)                     # (warp-uniform for ptxas: uniform)
        row0 = t0 + 16 * w                                 # the warp's first query
        wrow0 = t0 + 64 * wg                               # the warpgroup's first query
        q_at = at0 + FWD_Q + wg * 64 * ROW_WORDS     # its 64 rows of the Q tile
        k_at, v_at = at0 + FWD_K, at0 + FWD_V
        qb, kb, vb = q[b], k[b], v[b]
        drop = threshold != uint64(0)
        for hh in range(2):
            m[hh] = NEG_INF
            lsum[hh] = 0.0
        o = wgmma_keep(wgmma_acc_zeros(HSP))               # the zeros set before the first fence
        sacc = wgmma_acc_zeros(BKV)
        fetch_own(ro, qb, t0, c0, T)
        put_own(smem, at0 + FWD_Q, ro)
        n_tiles = (min(T, t0 + BQ) + BKV - 1) // BKV     # keys 0 .. min(T, t0 + BQ) - 1
        fetch(r, kb, 0, c0, T)
        put(smem, k_at, r)
        fetch(r, vb, 0, c0, T)
        put(smem, v_at, r)
        if n_tiles > 1:
            fetch(r, kb, BKV, c0, T)
        fence_proxy_async()                                # the puts, visible to wgmma's proxy ...
        cuda.syncthreads()                                 # ... in every thread
        for j in range(n_tiles):
            u0 = j * BKV
            cur = j & 1
            more = j + 1 < n_tiles                         # the same in every thread of the block
            active = u0 <= wrow0 + 63 and wrow0 < T        # the warpgroup's rows see some of these keys
            if active:
                wgmma_fence()
                sacc = mma_ss(sacc, smem, q_at, k_at + cur * TILE, tid)  # s = q k^T
                wgmma_commit()
            if more:
                put(smem, k_at + (1 - cur) * TILE, r)      # K of the next tile (last read before the last barrier)
                fetch(r, vb, u0 + BKV, c0, T)             # V of the next tile: in flight from here
            if active:
                wgmma_wait0()
                sacc = wgmma_keep(sacc)
                frag_store(s, sacc)
                diag = u0 + BKV - 1 > row0                 # some key of the tile after some row of the warp
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
                    else:
                        for jj in range(SB):
                            x = s[hh, jj] * scale
                            s[hh, jj] = x
                            mt = max(mt, x)
                    mx[hh] = mt
                mx[0], mx[1] = quad_max2(mx[0], mx[1], w, lane)   # the rows' maxima over their 4 lanes
                for hh in range(2):
                    mx[hh] = float32(math.ceil(max(m[hh], mx[hh])))  # m_new, an integer (v13's THE MATH)
                if mx[0] != m[0] or mx[1] != m[1]:         # else alpha = 1 for both rows: skip
                    alpha0 = math.exp2(m[0] - mx[0])       # a power of two; 0 at the first tile
                    alpha1 = math.exp2(m[1] - mx[1])
                    lsum[0] *= alpha0
                    lsum[1] *= alpha1
                    o = frag_scale(o, alpha0, alpha1)
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
                wgmma_fence()                              # pf and o's rescale were written: order them
                o = mma_rs(o, pf, smem, v_at + cur * TILE, tid)   # o += (p~ f) @ v
                wgmma_commit()
            if more:
                put(smem, v_at + (1 - cur) * TILE, r)
                if j + 2 < n_tiles:
                    fetch(r, kb, u0 + 2 * BKV, c0, T)     # K two tiles on: in flight across a barrier
            if active:
                wgmma_wait0()                              # o is ready and this tile's buffers are read
                o = wgmma_keep(o)
            if more:
                fence_proxy_async()
                cuda.syncthreads()                         # the next tiles are in; this tile's buffers free
        l0, l1 = quad_sum2(lsum[0], lsum[1], w, lane)      # l: the four lanes' parts
        frag_store(ob, o)
        for hh in range(2):
            t = row0 + 8 * hh + g
            lt = l0 if hh == 0 else l1
            if t < T:
                for jj in range(SH):
                    d = col(jj, tq)
                    if d < HS:
                        y[b, t, c0 + d] = ob[hh, jj] / lt
                if OUT16:                                  # y's bf16 copy, the same quotients
                    store16(y16, b, t, c0, ob, hh, tq, lt, True)
                if tq == 0:                                # lse = ln 2 (m + log2 l), in natural units
                    lse[b, h, t] = (m[hh] + math.log2(lt)) * float32(LN2)

    def k_attn_flash_bwd_dq(dq, d_rowdot, dy, q, k, v, y, lse, scale, dropout_key, threshold, dscale):
        """Block (b*H + h, query tile of BQ rows); per key tile u0 <= the tile's last query:
            s = q k^T, dp = dy v^T (mma_ss)     P = exp(scale s - lse)     ds = P (f dp - D)
            dq += ds @ k (mma_rs, K read N-major); at the end dq *= scale.
        D[t] = dy[t] . y[t] is worked out here, a thread a row in channel order (v13's bits), and
        written to d_rowdot for the dk/dv kernel."""
        key = key_value(dropout_key)
        smem, at0 = tile_memory()
        sd = cuda.shared.array(BQ, float32)                # D of the block's rows
        ro = cuda.local.array(EO, float32)
        r = cuda.local.array(E, float32)
        s = cuda.local.array((2, SB), float32)             # scores, then ds
        dp = cuda.local.array((2, SB), float32)            # dy . v
        ab = cuda.local.array((2, SH), float32)            # dq / scale, at the end
        dsf = cuda.local.array((KC, 4), int32)             # ds as register-A operands
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
        wg = uniform(tid // WARPGROUP)                     # (warp-uniform for ptxas: uniform)
        row0 = t0 + 16 * w
        wrow0 = t0 + 64 * wg
        q_at = at0 + DQ_Q + wg * 64 * ROW_WORDS
        dy_at = at0 + DQ_DY + wg * 64 * ROW_WORDS
        k_at, v_at = at0 + DQ_K, at0 + DQ_V
        qb, kb, vb = q[b], k[b], v[b]
        drop = threshold != uint64(0)
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
        acc = wgmma_keep(wgmma_acc_zeros(HSP))
        sacc = wgmma_acc_zeros(BKV)
        pacc = wgmma_acc_zeros(BKV)
        fetch_own(ro, qb, t0, c0, T)
        put_own(smem, at0 + DQ_Q, ro)
        fetch_own(ro, dy[b], t0, c0, T)
        put_own(smem, at0 + DQ_DY, ro)
        n_tiles = (min(T, t0 + BQ) + BKV - 1) // BKV
        fetch(r, kb, 0, c0, T)
        put(smem, k_at, r)
        fetch(r, vb, 0, c0, T)
        put(smem, v_at, r)
        if n_tiles > 1:
            fetch(r, kb, BKV, c0, T)
        fence_proxy_async()
        cuda.syncthreads()
        for hh in range(2):
            d_t[hh] = sd[16 * w + 8 * hh + g]
        for j in range(n_tiles):
            u0 = j * BKV
            cur = j & 1
            more = j + 1 < n_tiles
            active = u0 <= wrow0 + 63 and wrow0 < T
            if active:
                wgmma_fence()
                sacc = mma_ss(sacc, smem, q_at, k_at + cur * TILE, tid)     # q k^T
                pacc = mma_ss(pacc, smem, dy_at, v_at + cur * TILE, tid)    # dy v^T
                wgmma_commit()
            if more:
                put(smem, k_at + (1 - cur) * TILE, r)
                fetch(r, vb, u0 + BKV, c0, T)
            if active:
                wgmma_wait0()
                sacc = wgmma_keep(sacc)
                pacc = wgmma_keep(pacc)
                frag_store(s, sacc)
                frag_store(dp, pacc)
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
                wgmma_fence()
                acc = mma_rs(acc, dsf, smem, k_at + cur * TILE, tid)        # dq += ds @ k
                wgmma_commit()
            if more:
                put(smem, v_at + (1 - cur) * TILE, r)
                if j + 2 < n_tiles:
                    fetch(r, kb, u0 + 2 * BKV, c0, T)
            if active:
                wgmma_wait0()
                acc = wgmma_keep(acc)
            if more:
                fence_proxy_async()
                cuda.syncthreads()
        frag_store(ab, acc)
        for hh in range(2):
            t = row0 + 8 * hh + g
            if t < T:
                if OUT16:                                  # dq in bf16 only (dq: its words)
                    store16(dq, b, t, c0, ab, hh, tq, scale, False)
                else:
                    for jj in range(SH):
                        d = col(jj, tq)
                        if d < HS:
                            dq[b, t, c0 + d] = ab[hh, jj] * scale

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
            dv += (P^T f) @ dy,  dk += ds^T @ q    (mma_rs, dY and Q read N-major)
        and at the end dk *= scale. Each key row's dk and dv are summed by its warpgroup alone."""
        key = key_value(dropout_key)
        smem, at0 = tile_memory()
        slse = cuda.shared.array(ROWS2, float32)
        sd = cuda.shared.array(ROWS2, float32)
        ro = cuda.local.array(EO, float32)
        r = cuda.local.array(E, float32)
        rl = cuda.local.array(LPT, float32)                # the next lse values
        rd = cuda.local.array(LPT, float32)                # the next D values
        st = cuda.local.array((2, SB), float32)            # s^T, then P^T f
        dat = cuda.local.array((2, SB), float32)           # dp^T, then ds^T
        dvb = cuda.local.array((2, SH), float32)           # dv, at the end
        dkb = cuda.local.array((2, SH), float32)           # dk / scale, at the end
        pff = cuda.local.array((KC, 4), int32)             # P^T f as register-A operands
        dsf = cuda.local.array((KC, 4), int32)             # ds^T as register-A operands
        T = q.shape[1]
        H = lse.shape[1]
        bh, tile = nonneg(cuda.blockIdx.x), nonneg(cuda.blockIdx.y)
        b, h = bh // H, bh % H
        c0 = h * HS
        u0 = tile * BQ                                     # the longest columns (small u) first
        tid = nonneg(cuda.threadIdx.x)
        w, lane = tid // WARP, tid % WARP
        g, tq = lane >> 2, lane & 3
        wg = uniform(tid // WARPGROUP)                     # (warp-uniform for ptxas: uniform)
        row0 = u0 + 16 * w                                 # the warp's first key
        wrow0 = u0 + 64 * wg                               # the warpgroup's first key
        k_at = at0 + KV_K + wg * 64 * ROW_WORDS
        v_at = at0 + KV_V + wg * 64 * ROW_WORDS
        q_at, dy_at = at0 + KV_Q, at0 + KV_DY
        qb, dyb = q[b], dy[b]
        drop = threshold != uint64(0)
        vacc = wgmma_keep(wgmma_acc_zeros(HSP))
        kacc = wgmma_keep(wgmma_acc_zeros(HSP))
        sacc = wgmma_acc_zeros(BKV)
        pacc = wgmma_acc_zeros(BKV)
        fetch_own(ro, k[b], u0, c0, T)
        put_own(smem, at0 + KV_K, ro)
        fetch_own(ro, v[b], u0, c0, T)
        put_own(smem, at0 + KV_V, ro)
        n_tiles = (T - u0 + BKV - 1) // BKV                # queries u0 .. T - 1
        fetch(r, qb, u0, c0, T)
        put(smem, q_at, r)
        fetch(r, dyb, u0, c0, T)
        put(smem, dy_at, r)
        fetch_rows(rl, lse, b, h, u0, T)
        fetch_rows(rd, d_rowdot, b, h, u0, T)
        put_rows(slse[0], rl)
        put_rows(sd[0], rd)
        if n_tiles > 1:
            fetch(r, qb, u0 + BKV, c0, T)
            fetch_rows(rl, lse, b, h, u0 + BKV, T)
            fetch_rows(rd, d_rowdot, b, h, u0 + BKV, T)
        fence_proxy_async()
        cuda.syncthreads()
        for j in range(n_tiles):
            t0 = u0 + j * BKV
            cur = j & 1
            more = j + 1 < n_tiles
            active = t0 + BKV - 1 >= wrow0 and wrow0 < T   # some query of the tile sees the warpgroup's keys
            if active:
                wgmma_fence()
                sacc = mma_ss(sacc, smem, k_at, q_at + cur * TILE, tid)     # k q^T
                pacc = mma_ss(pacc, smem, v_at, dy_at + cur * TILE, tid)    # v dy^T
                wgmma_commit()
            if more:
                put(smem, q_at + (1 - cur) * TILE, r)
                fetch(r, dyb, t0 + BKV, c0, T)
            if active:
                wgmma_wait0()
                sacc = wgmma_keep(sacc)
                pacc = wgmma_keep(pacc)
                frag_store(st, sacc)
                frag_store(dat, pacc)
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
                wgmma_fence()
                vacc = mma_rs(vacc, pff, smem, dy_at + cur * TILE, tid)     # dv += (P^T f) @ dy
                kacc = mma_rs(kacc, dsf, smem, q_at + cur * TILE, tid)      # dk += ds^T @ q
                wgmma_commit()
            if more:
                put(smem, dy_at + (1 - cur) * TILE, r)
                put_rows(slse[1 - cur], rl)
                put_rows(sd[1 - cur], rd)
                if j + 2 < n_tiles:
                    fetch(r, qb, t0 + 2 * BKV, c0, T)
                    fetch_rows(rl, lse, b, h, t0 + 2 * BKV, T)
                    fetch_rows(rd, d_rowdot, b, h, t0 + 2 * BKV, T)
            if active:
                wgmma_wait0()
                vacc = wgmma_keep(vacc)
                kacc = wgmma_keep(kacc)
            if more:
                fence_proxy_async()
                cuda.syncthreads()
        frag_store(dvb, vacc)
        frag_store(dkb, kacc)
        for hh in range(2):
            u = row0 + 8 * hh + g
            if u < T:
                if OUT16:                                  # dk, dv in bf16 only (their words)
                    store16(dv, b, u, c0, dvb, hh, tq, float32(1.0), False)
                    store16(dk, b, u, c0, dkb, hh, tq, scale, False)
                else:
                    for jj in range(SH):
                        d = col(jj, tq)
                        if d < HS:
                            dv[b, u, c0 + d] = dvb[hh, jj]
                            dk[b, u, c0 + d] = dkb[hh, jj] * scale

    # The forward of two warpgroups asks ptxas for two resident blocks a multiprocessor (launch bounds
    # (256, 2): at most 128 registers a thread, which it fits without a spill; left to itself ptxas
    # takes 168 and one block, 8 warps, runs a multiprocessor). The other kernels keep ptxas's count
    # (capped at 128 the backward's spill). The simulator's jit takes no launch bounds.
    def jit(f):
        two = NWG == 2 and f is k_attn_flash_fwd and not SIMULATOR
        f.__name__ = f.__qualname__ = f"{f.__name__}_wgmma{'_out16' if OUT16 else ''}"   # k_attn_flash_fwd_wgmma, ...
        return cuda.jit(launch_bounds=(NT, 2))(f) if two else cuda.jit(f)
    return tuple(jit(f) for f in (k_attn_flash_fwd, k_attn_flash_bwd_dq, k_attn_flash_bwd_dkdv))


_KERNELS = {}       # (hs, NWG, BKV, vec, out16) -> the three kernels


def kernels(hs, block, vec, out16=False):
    """The kernels of head size hs and block (NWG, BKV), after checking that they can run it: hs <= 64
    (a stored row is one 128-byte swizzle row), NWG 1 or 2, BKV a multiple of 16 (a k16 step of the
    register-A products) and at most 256 (wgmma's widest N), shared memory within Hopper's 227 KiB."""
    nwg, bkv = block
    if hs > HSP:
        raise BlockDoesNotFit(f"flash attention v15 (wgmma): head size {hs}: at most {HSP} (a tile row is "
                              f"{HSP} bf16, one row of the 128-byte swizzle)")
    if nwg not in (1, 2) or bkv % 16 or not 16 <= bkv <= 256:
        raise BlockDoesNotFit(f"flash attention v15 (wgmma): block {block}: 1 or 2 warpgroups, inner tiles of a "
                              f"multiple of 16 rows up to 256")
    need = max(shared_bytes(block, k) for k in ("fwd", "dq", "dkdv"))
    if need > DYNAMIC_LIMIT:
        raise BlockDoesNotFit(f"flash attention v15 (wgmma): block {block} needs {need} bytes of shared memory")
    key = (hs, nwg, bkv, vec, out16)
    if key not in _KERNELS:
        _KERNELS[key] = make_kernels(hs, nwg, bkv, vec, out16)     # numba compiles each on its first launch
    return _KERNELS[key]


def _launch(kernel, grid, threads, nbytes, stream, args):
    """kernel[grid, threads, stream, nbytes](*args), allowed its dynamic shared memory first."""
    allow_shared(kernel, args, nbytes)
    kernel[grid, threads, stream, nbytes](*args)


def _launch_fwd(y, y16, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, out16):
    """The forward's launch: grid (B*H, T / (64 NWG)), 128 NWG threads; out16 False (y16 = y, unread)
    or True (y16: y's bf16 words)."""
    B, T, C, hs = _check(q, n_head)
    fwd = kernels(hs, block, aligned_rows(hs, q, k, v), out16)[0]
    scale = 1.0 / math.sqrt(hs) * (1.0 / math.log(2.0))          # the scores in base 2
    args = (y, y16, lse, q, k, v, np.float32(scale), *mask_args(dropout_p, dropout_key))
    _launch(fwd, (B * n_head, cdiv(T, 64 * block[0])), WARPGROUP * block[0], shared_bytes(block, "fwd"), stream, args)


def _launch_bwd(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream, out16):
    """The backward's two launches, both on grid (B*H, T / (64 NWG)), 128 NWG threads."""
    B, T, C, hs = _check(q, n_head)
    _, dq_kernel, dkdv_kernel = kernels(hs, block, aligned_rows(hs, q, k, v, dy, y), out16)
    scale = np.float32(1.0 / math.sqrt(hs))
    drop = mask_args(dropout_p, dropout_key)
    grid, threads = (B * n_head, cdiv(T, 64 * block[0])), WARPGROUP * block[0]
    _launch(dq_kernel, grid, threads, shared_bytes(block, "dq"), stream,
            (dq, d_rowdot, dy, q, k, v, y, lse, scale, *drop))
    _launch(dkdv_kernel, grid, threads, shared_bytes(block, "dkdv"), stream,
            (dk, dv, dy, q, k, v, lse, d_rowdot, scale, *drop))


@blocks(**FLASH_WGMMA_FWD_BLOCKS)
def attn_flash_fwd_v15(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, y16=None, block, stream=0):
    """y [B, T, C] and lse [B, H, T] with bf16 products on wgmma (sm_90a), v13's math: S = Q K^T from
    shared tiles, p~ f kept in registers as the A operand of O += p~ f V. With y16 (uint16 [B, T, C],
    head size even) also y rounded to bf16 (v14's form). Head size at most 64. Grid (B*H, T / (64 NWG)),
    128 NWG threads; block = (NWG, BKV)."""
    out16 = y16 is not None
    if out16:
        assert _check(q, n_head)[3] % 2 == 0, "flash attention's bf16 y16: an even head size"
    _launch_fwd(y, _words(y16) if out16 else y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, out16)


@blocks(**FLASH_WGMMA_BWD_BLOCKS)
def attn_flash_bwd_v15(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                       block, stream=0):
    """dq, dk, dv [B, T, C] with bf16 products on wgmma, v13's math: the dq kernel (which writes D =
    dy . y to d_rowdot [B, H, T]), then the dk/dv kernel, both on grid (B*H, T / (64 NWG)), 128 NWG
    threads; block = (NWG, BKV). dq, dk, dv given as uint16 (head size even) receive bf16 (v14's form)."""
    out16 = dq.dtype == np.uint16
    if out16:
        assert _check(q, n_head)[3] % 2 == 0, "flash attention's bf16 dq, dk, dv: an even head size"
        dq, dk, dv = _words(dq), _words(dk), _words(dv)
    _launch_bwd(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream, out16)


attn_flash_fwd_v15.precision = attn_flash_bwd_v15.precision = "bf16"     # checked against the twin at bf16
