"""Warp tiles: the product tiles of matmul_tf32x3 and matmul_fp16, and what every tile family shares.

A block computes a BM x BN tile of out = op(a) @ op(b), as matmul's shared tiles do, with warps
owning its pieces:

1. Warps own sub-tiles. The block's 32 * (BM/WM) * (BN/WN) threads form warps laid out
   (BM/WM) x (BN/WN); warp w owns the WM x WN piece at rows wm0 = (w // (BN/WN)) * WM, columns
   wn0 = (w % (BN/WN)) * WN. Inside it, a thread owns the outputs of the tensor-core fragment
   layout (lane = 4 g + t):

       rows    wm0 + 16 mi + g,  wm0 + 16 mi + 8 + g        mi = 0 .. WM/16 - 1
       columns wn0 + 8 ni + 2 t, wn0 + 8 ni + 2 t + 1        ni = 0 .. WN/8 - 1

   so acc is TM x TN = (2 WM/16) x (2 WN/8): acc[2 mi + h, 2 ni + c] is row wm0 + 16 mi + 8 h + g,
   column wn0 + 8 ni + 2 t + c. fragment_tile gives a family's tile this layout's row(i), col(j)
   and epilogue (zero, store) around its products; the bf16 tiles (half_tile.py, wgmma_mn.py) use
   it too.

2. The engine's two families, on split_tile.py's k-major tiles (BK = 16, swizzled rows, 128-bit
   stores of transposed operands):
       "tf32x3" (matmul_tf32x3)   3xTF32: each value split into its TF32 parts as its fragment is
                                  read, three mma.sync a fragment, the small part's low bits left
                                  for the tensor core to drop (split_tile.tf32x3_tile_mma)
       "fp16" (matmul_fp16)       the same tiles, each value rounded to fp16 as it is read, one
                                  mma.sync m16n8k16 a fragment a stage (split_tile.fp16_tile_mma)
   The lab builds its families on the lab's flag-built k-major tiles (lab/split_tile.py) and on
   the padded tiles below (lab/warp_tile.py).

3. 128-bit copies and double buffering. When every operand row starts on a 16-byte boundary (the
   launcher checks the pointers and the row lengths: aligned, resolve), each thread copies its
   share of the next tiles in 4-float chunks (ld.global.v4 / st.shared.v4 from kernels/ptx.py),
   and it loads them from global memory into registers *before* multiplying the current tiles, so
   the loads are in flight during the arithmetic. Two shared buffers (stages) alternate: one
   barrier per BK step (tile_loop.make_pipeline). Otherwise (and in the simulator) the copy is one
   float at a time, with the same stages.

4. A K range. The tile function sums only k in [kb, ke): split-K launches give each of S blocks
   one slice of K and add the S partial tiles afterwards in a fixed order (matmul.py).

The padded tiles and their 8-deep step (_copier, _kstep), which flash attention's tf32x3 kernels
(attn_flash_v3.py) are built from:
- Shared tiles keep the orientation the operand has in global memory, with a pad that removes
  bank conflicts (32 banks of 4 bytes; a warp's 32 reads are conflict-free when they fall in 32
  different banks):
       a [M, K] -> sa[m, k], pitch BK + 4      a^T (a stored [K, M]) -> sa[k, m], pitch BM + 8
       b [K, N] -> sb[k, n], pitch BN + 8      b^T (b stored [N, K]) -> sb[n, k], pitch BK + 4
  A fragment read sa[m0 + g, k0 + t] hits bank (g (BK + 4) + t) mod 32 = 4 g + t for BK = 16 or
  32: 32 lanes, 32 banks. sa[k0 + t, m0 + g] hits (t (BM + 8) + g) mod 32 = 8 t + g: the same.
  The copy from global memory is then a straight copy: rows of the stored matrix to rows of the
  shared tile.
- The step over 8 values of k, on tensor cores (3xTF32): read the warp's A and B fragments (module
  docstring of ptx.py), split each value x = big + small, big = tf32(x), small = tf32(x - big), and
  add three tensor-core products small*big + big*small + big*big per 16 x 8 fragment of acc
  (small*small, about 2^-22 of the product, is left out). TF32 keeps 10 mantissa bits; big + small
  carries about 21, so the sum is as accurate as an fp32 product (CUTLASS calls this 3xTF32). The
  small products come first so they are not lost against the large one. Each 8-deep product
  starts from zero and is then added to acc with an ordinary fp32 add: a chain of K/8
  accumulations inside the tensor core drifted (measured on the H200: 3e-5 relative error at
  K = 4096, ten times a SIMT kernel's, growing with K, as an adder that does not round to nearest
  would). Without tensor cores (tensor_cores=False, the lab's matmul v3) the step is TM * TN SIMT
  multiply-adds for each k.
In the simulator the tensor-core step is a NumPy twin: mma.sync needs 32 real lanes, so each
thread computes its own TM x TN outputs of the 8-deep product with one NumPy product (fp32) and
adds them to acc, the same outputs in the same tiles as on the GPU.
"""
from types import SimpleNamespace

import numpy as np
from numba import cuda, float32

from .common import SIMULATOR, address, as_is, cdiv, nonneg
from .ptx import load4, mma_tf32, store4, tf32_round
from .split_tile import fp16_tile_mma, tf32x3_tile_mma
from .tile_loop import WARP, add_fragment

@cuda.jit(device=True)
def col_swizzle(r):
    """Flash attention v6's column swizzle: row r of a tile with a pitch of a multiple of 32 floats
    keeps its column c at c ^ col_swizzle(r), a multiple of 4 below 32 that is different for each
    r mod 8 (kernels/attn_flash_v3.py says why)."""
    return ((r & 3) << 3) | (((r >> 2) & 1) << 2)


def _copier(R, Cc, P, THREADS, vec, swizzle=False, nonneg_index=False):
    """fetch(regs, g, r0, c0, rlim, clim): this thread's share of the R x Cc tile of the stored
    matrix g at (r0, c0) into registers (zero outside rows < rlim, columns < clim);
    put(s, regs): the registers into the shared tile s (rows of pitch P; swizzle: column c of
    row r at c ^ col_swizzle(r)). nonneg_index: the thread index through common.nonneg (flash
    attention v7), so its divisions and indexing carry no code for negative values."""
    ix = nonneg if nonneg_index else as_is
    E = R * Cc // THREADS                 # elements per thread
    assert E * THREADS == R * Cc, f"a {R} x {Cc} tile does not split over {THREADS} threads"
    if vec:
        assert E % 4 == 0 and Cc % 4 == 0, f"a {R} x {Cc} tile does not split into 4-float chunks"
        CH, CPR = E // 4, Cc // 4         # chunks per thread, chunks per row

        @cuda.jit(device=True)
        def fetch(regs, g, r0, c0, rlim, clim):
            for j in range(CH):
                e = ix(cuda.threadIdx.x) + j * THREADS
                r, c = r0 + e // CPR, c0 + (e % CPR) * 4
                if r < rlim and c < clim:                 # clim is a multiple of 4: a chunk is all in or all out
                    regs[4 * j], regs[4 * j + 1], regs[4 * j + 2], regs[4 * j + 3] = load4(g, r * g.shape[1] + c)
                else:
                    for i in range(4):
                        regs[4 * j + i] = float32(0.0)

        @cuda.jit(device=True)
        def put(s, regs):
            for j in range(CH):
                e = ix(cuda.threadIdx.x) + j * THREADS
                r, c = e // CPR, (e % CPR) * 4
                if swizzle:
                    c = c ^ col_swizzle(r)
                store4(s, r * P + c, regs[4 * j], regs[4 * j + 1], regs[4 * j + 2], regs[4 * j + 3])
    else:
        @cuda.jit(device=True)
        def fetch(regs, g, r0, c0, rlim, clim):
            for j in range(E):
                e = ix(cuda.threadIdx.x) + j * THREADS
                r, c = r0 + e // Cc, c0 + e % Cc
                regs[j] = g[r, c] if r < rlim and c < clim else float32(0.0)

        @cuda.jit(device=True)
        def put(s, regs):
            for j in range(E):
                e = ix(cuda.threadIdx.x) + j * THREADS
                r, c = e // Cc, e % Cc
                if swizzle:
                    c = c ^ col_swizzle(r)
                s[r, c] = regs[j]
    return fetch, put, E


def _kstep(trans_a, trans_b, MI, NI, tensor_cores, trunc=False, swizzle_b=False):
    """step(acc, sa, sb, kk, wm0, wn0, g, t): acc += this thread's share of
    op(a)[tile rows, kk:kk+8] @ op(b)[kk:kk+8, tile columns], from one stage of shared memory.
    trunc: the small TF32 parts go to the tensor core as x - big, truncated there (matmul_tf32x3's
    split, kernels/matmul.py; flash attention v5). swizzle_b (b stored [k, n] only): op(b)[k, n]
    is at column n ^ col_swizzle(k) of the shared tile (flash attention v6)."""
    assert not (swizzle_b and trans_b), "the swizzle is for b stored [k, n]"
    TM, TN = 2 * MI, 2 * NI

    @cuda.jit(device=True)
    def A(sa, m, k):                       # op(a)[m, k] of the shared tile
        return sa[k, m] if trans_a else sa[m, k]

    @cuda.jit(device=True)
    def B(sb, k, n):                       # op(b)[k, n] of the shared tile
        if swizzle_b:
            return sb[k, n ^ col_swizzle(k)]
        return sb[n, k] if trans_b else sb[k, n]

    if tensor_cores and SIMULATOR:
        # The 8-deep tensor-core product's twin for the simulator (one lane cannot run mma.sync:
        # ptx.py): this thread's TM x TN outputs of op(a)[rows, kk:kk+8] @ op(b)[kk:kk+8, cols],
        # one NumPy product added to acc at once, as the GPU adds each 8-deep mma result.
        ROW = np.array([(i // 2) * 16 + (i % 2) * 8 for i in range(TM)])      # row(i) - wm0 - g
        COL = np.array([(j // 2) * 8 + j % 2 for j in range(TN)])            # col(j) - wn0 - 2t

        def step(acc, sa, sb, kk, wm0, wn0, g, t):
            rows, cols = ROW + (wm0 + g), COL + (wn0 + 2 * t)
            a = sa[kk:kk + 8][:, rows].T if trans_a else sa[rows, kk:kk + 8]     # TM x 8
            if swizzle_b:                                                       # 8 x TN, from swizzled columns
                ks = np.arange(kk, kk + 8)[:, None]
                b = sb[ks, cols[None, :] ^ (((ks & 3) << 3) | (((ks >> 2) & 1) << 2))]
            else:
                b = sb[cols, kk:kk + 8].T if trans_b else sb[kk:kk + 8][:, cols]     # 8 x TN
            acc += a @ b
        return step

    if not tensor_cores:
        @cuda.jit(device=True)
        def step(acc, sa, sb, kk, wm0, wn0, g, t):
            ra = cuda.local.array(TM, float32)
            rb = cuda.local.array(TN, float32)
            for k in range(kk, kk + 8):
                for i in range(TM):                       # rows wm0 + 16 (i // 2) + 8 (i % 2) + g
                    ra[i] = A(sa, wm0 + (i // 2) * 16 + (i % 2) * 8 + g, k)
                for j in range(TN):                       # columns wn0 + 8 (j // 2) + 2 t + j % 2
                    rb[j] = B(sb, k, wn0 + (j // 2) * 8 + 2 * t + j % 2)
                for i in range(TM):
                    for j in range(TN):
                        acc[i, j] += ra[i] * rb[j]
        return step

    @cuda.jit(device=True)
    def split(x):
        big = tf32_round(x)
        if trunc:
            return big, x - big
        return big, tf32_round(x - big)

    @cuda.jit(device=True)
    def step(acc, sa, sb, kk, wm0, wn0, g, t):
        ab = cuda.local.array((MI, 4), float32)          # A fragments, big parts
        as_ = cuda.local.array((MI, 4), float32)         # small parts
        bb = cuda.local.array((NI, 2), float32)
        bs = cuda.local.array((NI, 2), float32)
        for mi in range(MI):                             # a0 A[g, t], a1 A[g+8, t], a2 A[g, t+4], a3 A[g+8, t+4]
            m = wm0 + mi * 16 + g
            ab[mi, 0], as_[mi, 0] = split(A(sa, m, kk + t))
            ab[mi, 1], as_[mi, 1] = split(A(sa, m + 8, kk + t))
            ab[mi, 2], as_[mi, 2] = split(A(sa, m, kk + t + 4))
            ab[mi, 3], as_[mi, 3] = split(A(sa, m + 8, kk + t + 4))
        for ni in range(NI):                             # b0 B[t, g], b1 B[t+4, g]
            n = wn0 + ni * 8 + g
            bb[ni, 0], bs[ni, 0] = split(B(sb, kk + t, n))
            bb[ni, 1], bs[ni, 1] = split(B(sb, kk + t + 4, n))
        zero = float32(0.0)
        for mi in range(MI):
            for ni in range(NI):                         # c0 C[g, 2t], c1 C[g, 2t+1], c2 C[g+8, 2t], c3 C[g+8, 2t+1]
                c0, c1, c2, c3 = mma_tf32(as_[mi, 0], as_[mi, 1], as_[mi, 2], as_[mi, 3], bb[ni, 0], bb[ni, 1],
                                          zero, zero, zero, zero)                          # small * big
                c0, c1, c2, c3 = mma_tf32(ab[mi, 0], ab[mi, 1], ab[mi, 2], ab[mi, 3], bs[ni, 0], bs[ni, 1],
                                          c0, c1, c2, c3)                                  # + big * small
                c0, c1, c2, c3 = mma_tf32(ab[mi, 0], ab[mi, 1], ab[mi, 2], ab[mi, 3], bb[ni, 0], bb[ni, 1],
                                          c0, c1, c2, c3)                                  # + big * big
                add_fragment(acc, mi, ni, c0, c1, c2, c3)      # acc += the 8-deep product, in fp32 (see above)
    return step


def whole_k(ranged):
    """mma_nn, mma_nt, mma_tn, mma_tt (acc += op(a) @ op(b) over all of K) from the ranged tile
    functions ranged[(trans_a, trans_b)](acc, a, b, kb, ke)."""
    def full(f, trans_a):
        @cuda.jit(device=True)
        def mma_all(acc, a, b):
            f(acc, a, b, 0, a.shape[0] if trans_a else a.shape[1])
        return mma_all
    return {f"mma_{'t' if ta else 'n'}{'t' if tb else 'n'}": full(f, ta) for (ta, tb), f in ranged.items()}


def make_epilogue(row, col, TM, TN):
    """zero(acc) and store(out, acc, accumulate) for a thread's TM x TN sums acc, whose element
    [i, j] belongs to out[row(i), col(j)] (the tile's layout: matmul v2's or a warp tile's)."""
    @cuda.jit(device=True)
    def zero(acc):
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0

    @cuda.jit(device=True)
    def store(out, acc, accumulate):
        """out (+)= acc for this thread's outputs that fall inside out."""
        for i in range(TM):
            r = row(i)
            if r < out.shape[0]:
                for j in range(TN):
                    c = col(j)
                    if c < out.shape[1]:
                        if accumulate:
                            out[r, c] += acc[i, j]
                        else:
                            out[r, c] = acc[i, j]
    return zero, store


def kmajor_tile(tile, tile_mma):
    """Everything a kernel needs for one warp tile of split_tile.py's k-major tiles (BK = 16), the same
    names as matmul.make_tile:
        mma_nn, mma_nt, mma_tn, mma_tt     acc += a @ b, a @ b^T, a^T @ b, a^T @ b^T over all of K
        mma[(trans_a, trans_b)]            the same over k in [kb, ke): f(acc, a, b, kb, ke)
        row(i), col(j), zero(acc), store(out, acc, accumulate)
        TM, TN, THREADS, BK, grid(M, N, z)
    tile = (family, BM, BN, BK, WM, WN, vec); tile_mma(trans_a, trans_b, BM, BN, BK, WM, WN, vec)
    builds the ranged product and its THREADS (split_tile.tf32x3_tile_mma, fp16_tile_mma)."""
    family, BM, BN, BK, WM, WN, vec = tile
    assert BM % WM == 0 and BN % WN == 0 and WM % 16 == 0 and WN % 8 == 0 and BK % 8 == 0, f"tile {tile}"
    ranged = {}
    for ta in (False, True):
        for tb in (False, True):
            ranged[(ta, tb)], THREADS = tile_mma(ta, tb, BM, BN, BK, WM, WN, vec)
    return fragment_tile(ranged, BM, BN, BK, WM, WN, THREADS)


def make_tf32x3_tile(tile):
    """The tile of family "tf32x3" (matmul_tf32x3): 3xTF32 on swizzled k-major tiles, each value split
    as its fragment is read, the small part's low bits left for the tensor core to drop."""
    return kmajor_tile(tile, tf32x3_tile_mma)


def make_fp16_tile(tile):
    """The tile of family "fp16" (matmul_fp16): the same swizzled k-major tiles, the values rounded to
    fp16 as read (one mma.sync m16n8k16 a fragment a stage, fp32 sums)."""
    return kmajor_tile(tile, fp16_tile_mma)


def fragment_tile(ranged, BM, BN, BK, WM, WN, THREADS):
    """A tile's names (kmajor_tile's docstring) from its ranged products `ranged` (trans_a,
    trans_b) -> f(acc, a, b, kb, ke), for warps of WM x WN outputs held in the mma.sync
    accumulator layout: acc[i, j] of a thread is out[row(i), col(j)]. Shared by the bf16 tiles
    (half_tile.py, wgmma_mn.py)."""
    TM, TN, WARPS_N = 2 * (WM // 16), 2 * (WN // 8), BN // WN

    @cuda.jit(device=True)
    def row(i):
        """Row of out that acc[i, :] belongs to: wm0 + 16 (i // 2) + 8 (i % 2) + g."""
        warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
        return cuda.blockIdx.y * BM + (warp // WARPS_N) * WM + (i // 2) * 16 + (i % 2) * 8 + (lane >> 2)

    @cuda.jit(device=True)
    def col(j):
        """Column of out that acc[:, j] belongs to: wn0 + 8 (j // 2) + 2 t + j % 2."""
        warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
        return cuda.blockIdx.x * BN + (warp % WARPS_N) * WN + (j // 2) * 8 + 2 * (lane & 3) + j % 2

    zero, store = make_epilogue(row, col, TM, TN)

    return SimpleNamespace(
        mma=ranged, **whole_k(ranged), row=row, col=col, zero=zero, store=store, TM=TM, TN=TN, THREADS=THREADS,
        BK=BK, grid=lambda M, N, z=1: (cdiv(N, BN), cdiv(M, BM), z))


def aligned(*arrays) -> bool:
    """True when 128-bit copies are safe for these operands: C-contiguous 2-D float32 arrays whose
    rows start on 16-byte boundaries (a first element at a multiple of 16 bytes, rows a multiple
    of 4 floats). Never in the simulator (its copies go one float at a time)."""
    if SIMULATOR:
        return False
    for x in arrays:
        if x.ndim != 2 or x.shape[1] % 4 or x.strides != (4 * x.shape[1], 4):
            return False
        if address(x) % 16:                        # (host arrays too: ptxcheck)
            return False
    return True


def resolve(family, block, *arrays):
    """The full tile of a launch: the tile family, the declared block (BM, BN, BK, WM, WN) and whether
    the operands allow 128-bit copies."""
    return (family, *block, aligned(*arrays))
