"""The lab's rungs of andrea_numba/kernels/mlp.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.

v1 runs the fused kernels (mlp.kernels) on matmul v2's tiles; v2 and v3 the same kernel text on the
SIMT and 3xTF32 warp tiles of matmul v3 and v4, v4 and v5 on the split and k-major tiles of matmul
v5 and v6 (the tile functions differ, the kernels do not); v6 is v5 with k_mlp_fwd_v2 and
k_mlp_bwd_v2, which keep the sums in registers; v7 and v8 are v5 on the tiles of matmul v7 and v8;
v9 takes the GELU out of the products (the engine's form since); v10 is v9 on matmul v9's SIMT
tiles; v11 splits the C-wide products over K too; the engine's v12 (mlp_fwd_tf32x3) takes the GELU
passes four elements a thread, and its v14 (mlp_fwd_fp16) is v12 in fp16. In bf16, on the products
of: v13 matmul v10, v15 v12, v16 (the engine's mlp_fwd_bf16) v13, v17 v16 with the gradients
rounded once (mlp._bwd_held), v18 v17, v19 (the engine's mlp_fwd_bf16_wgmma) v18; v20 has the GELU
in v18's epilogues.
"""
from numba import cuda, float32
import functools
import numpy as np
from andrea_numba.kernels.mlp import *  # noqa: F401,F403  (the engine's rungs and helpers)
from andrea_numba.kernels.mlp import _bwd_held, _bwd_split, _fwd_split  # noqa: F401
from lab.matmul import (HALF_OP_TILES, MN_TILES, RING_TILES, SIMT2_TILES, SPLIT_TILES, WARP_TILES, map_fits,
                        matmul_bf16_wgmma_cp_async, matmul_v3, matmul_v4, matmul_v5, matmul_v6, matmul_v7, matmul_v9,
                        matmul_v10, matmul_v12, matmul_v16, resolve, tma_fits)
from lab.wgmma_tma import tma_product


# v6: the engine's fused kernels (mlp.kernels: k_mlp_fwd, k_mlp_bwd) apply the GELU (or its
# derivative) in their own store loop: 64 outputs a thread on the warp tiles, each with a tanh, a loop too long for the compiler to unroll. Then
# acc[i, j] is read with indices known only at run time, and an array read that way cannot live
# in registers: the compiler puts the whole of acc in local memory (the PTX of k_mlp_fwd on the
# 128 x 64 k-major tile has a 256-byte __local_depot; Nsight Compute on the H200 counted its local
# loads and stores as the kernel's worst memory traffic). The v2 kernels write acc with the
# tile's own store (short loops, unrolled: acc stays in registers, as in the matmul kernels),
# then each thread reads back the elements it wrote itself and applies the GELU there. The same
# float32 values meet the same arithmetic: v2's bits are v1's.
@functools.cache
def kernels_v2(tile):
    t = make_tile(tile)
    mma_nn, mma_nt, zero, store, row, col, TM, TN = t.mma_nn, t.mma_nt, t.zero, t.store, t.row, t.col, t.TM, t.TN

    @cuda.jit
    def k_mlp_fwd_v2(h_pre, h, x, w_1):
        """h_pre = x @ W_1 from the registers, then h = gelu(h_pre) from this thread's own h_pre."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        mma_nn(acc, x, w_1)
        store(h_pre, acc, False)
        for i in range(TM):
            r = row(i)
            for j in range(TN):
                c = col(j)
                if r < h.shape[0] and c < h.shape[1]:
                    h[r, c] = gelu(h_pre[r, c])

    @cuda.jit
    def k_mlp_bwd_v2(dh_pre, dout, h_pre, w_2):
        """dh_pre = dout @ W_2^T from the registers, then dh_pre *= gelu'(h_pre), element by element."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        mma_nt(acc, dout, w_2)
        store(dh_pre, acc, False)
        for i in range(TM):
            r = row(i)
            for j in range(TN):
                c = col(j)
                if r < dh_pre.shape[0] and c < dh_pre.shape[1]:
                    dh_pre[r, c] = dh_pre[r, c] * gelu_grad(h_pre[r, c])

    return k_mlp_fwd_v2, k_mlp_bwd_v2


# v2, v3: the same kernels on the warp tiles of matmul v3 (SIMT) and v4 (3xTF32 tensor cores);
# the plain products through that matmul, the weight gradients with split-K (work: its buffer):
# mm, a product launcher of the lab's (or the engine's); its tile family (mm.family) runs the kernels.
def _fwd_warp(mm, out, h_pre, h, x, w_1, w_2, block, stream, built=kernels):
    N, F = h.shape
    tile = resolve(mm.family, block, x, w_1)
    t = make_tile(tile)
    built(tile)[0][t.grid(N, F), t.THREADS, stream](h_pre, h, x, w_1)
    mm(out, None, h, w_2, block=block, stream=stream)                     # out = h @ W_2


def _bwd_warp(mm, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream, built=kernels):
    N, F = h.shape
    tile = resolve(mm.family, block, dout, w_2)
    t = make_tile(tile)
    mm(dw_2, work, h, dout, trans_a=True, accumulate=True, block=block, stream=stream)     # dW_2 += h^T @ dout
    built(tile)[1][t.grid(N, F), t.THREADS, stream](dh_pre, dout, h_pre, w_2)
    mm(dw_1, work, x, dh_pre, trans_a=True, accumulate=True, block=block, stream=stream)   # dW_1 += x^T @ dh_pre
    mm(dx, None, dh_pre, w_1, trans_b=True, block=block, stream=stream)                    # dx = dh_pre @ W_1^T


@blocks(**WARP_TILES)
def mlp_fwd_v2(out, h_pre, h, x, w_1, w_2, *, block, stream=0):
    """v1 on SIMT warp tiles; block = (BM, BN, BK, WM, WN)."""
    _fwd_warp(matmul_v3, out, h_pre, h, x, w_1, w_2, block, stream)


@blocks(**WARP_TILES)
def mlp_bwd_v2(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v1 on SIMT warp tiles, the weight gradients split over K into work."""
    _bwd_warp(matmul_v3, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream)


@blocks(**WARP_TILES)
def mlp_fwd_v3(out, h_pre, h, x, w_1, w_2, *, block, stream=0):
    """v1 on 3xTF32 tensor-core warp tiles."""
    _fwd_warp(matmul_v4, out, h_pre, h, x, w_1, w_2, block, stream)


@blocks(**WARP_TILES)
def mlp_bwd_v3(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v1 on 3xTF32 tensor-core warp tiles, the weight gradients split over K into work."""
    _bwd_warp(matmul_v4, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream)


@blocks(**SPLIT_TILES)
def mlp_fwd_v4(out, h_pre, h, x, w_1, w_2, *, block, stream=0):
    """v1 on the split tiles of matmul v5 (3xTF32, parts made once, BK = 16)."""
    _fwd_warp(matmul_v5, out, h_pre, h, x, w_1, w_2, block, stream)


@blocks(**SPLIT_TILES)
def mlp_bwd_v4(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v1 on the split tiles of matmul v5, the weight gradients split over K into work."""
    _bwd_warp(matmul_v5, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream)


@blocks(**KMAJOR_TILES)
def mlp_fwd_v5(out, h_pre, h, x, w_1, w_2, *, block, stream=0):
    """v1 on the k-major tiles of matmul v6 (3xTF32, split as read, BK = 16)."""
    _fwd_warp(matmul_v6, out, h_pre, h, x, w_1, w_2, block, stream)


@blocks(**KMAJOR_TILES)
def mlp_bwd_v5(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v1 on the k-major tiles of matmul v6, the weight gradients split over K into work."""
    _bwd_warp(matmul_v6, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream)


@blocks(**KMAJOR_TILES)
def mlp_fwd_v6(out, h_pre, h, x, w_1, w_2, *, block, stream=0):
    """v5 with k_mlp_fwd_v2: acc in registers, the GELU applied from the h_pre just written."""
    _fwd_warp(matmul_v6, out, h_pre, h, x, w_1, w_2, block, stream, built=kernels_v2)


@blocks(**KMAJOR_TILES)
def mlp_bwd_v6(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v5 with k_mlp_bwd_v2: acc in registers, GELU's derivative applied to the dh_pre just written."""
    _bwd_warp(matmul_v6, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream, built=kernels_v2)


@blocks(**KMAJOR_TILES)
def mlp_fwd_v7(out, h_pre, h, x, w_1, w_2, *, block, stream=0):
    """v5 on the tiles of matmul v7 (the small parts truncated by the tensor core). v6's store loop
    was not faster on the H200 (2026-12-01): v7 keeps v5's kernels."""
    _fwd_warp(matmul_v7, out, h_pre, h, x, w_1, w_2, block, stream)


@blocks(**KMAJOR_TILES)
def mlp_bwd_v7(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v5 on the tiles of matmul v7, the weight gradients split over K into work."""
    _bwd_warp(matmul_v7, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream)


@blocks(**KMAJOR_TILES)
def mlp_fwd_v8(out, h_pre, h, x, w_1, w_2, *, block, stream=0):
    """v7 on the swizzled tiles of matmul v8 (v7's bits)."""
    _fwd_warp(matmul_tf32x3, out, h_pre, h, x, w_1, w_2, block, stream)


@blocks(**KMAJOR_TILES)
def mlp_bwd_v8(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v7 on the swizzled tiles of matmul v8, the weight gradients split over K into work."""
    _bwd_warp(matmul_tf32x3, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream)


def _fwd_plain(mm, out, h_pre, h, x, w_1, w_2, block, stream):
    """h_pre = x @ W_1, h = gelu(h_pre) (k_gelu_fwd), out = h @ W_2, the products on kind's matmul."""
    _fwd_split(mm, out, h_pre, h, None, x, w_1, w_2, block, stream, gelu_fwd)


def _bwd_plain(mm, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream):
    """The backward with dh_pre = dout @ W_2^T a plain product, then k_gelu_bwd in place; only the
    weight gradients split over K."""
    _bwd_split(mm, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream, gelu_bwd,
               split_dx=False)


@blocks(**KMAJOR_TILES)
def mlp_fwd_v9(out, h_pre, h, x, w_1, w_2, *, block, stream=0):
    """h_pre = x @ W_1 (matmul v8), h = gelu(h_pre) (k_gelu_fwd), out = h @ W_2."""
    _fwd_plain(matmul_tf32x3, out, h_pre, h, x, w_1, w_2, block, stream)


@blocks(**KMAJOR_TILES)
def mlp_bwd_v9(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """As v8's backward with dh_pre = dout @ W_2^T a plain product, then k_gelu_bwd in place."""
    _bwd_plain(matmul_tf32x3, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream)


# v10: v9's form on the SIMT tiles of matmul v9 (products="simt2": no tensor cores).
@blocks(**SIMT2_TILES)
def mlp_fwd_v10(out, h_pre, h, x, w_1, w_2, *, block, stream=0):
    """v9 with the products of matmul v9 (SIMT multiply-adds)."""
    _fwd_plain(matmul_v9, out, h_pre, h, x, w_1, w_2, block, stream)


@blocks(**SIMT2_TILES)
def mlp_bwd_v10(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v9's backward with the products of matmul v9."""
    _bwd_plain(matmul_v9, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream)


@blocks(**KMAJOR_TILES)
def mlp_fwd_v11(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0):
    """v9 with the products split over K into work where a wave would run part-empty."""
    _fwd_split(matmul_tf32x3, out, h_pre, h, work, x, w_1, w_2, block, stream, gelu_fwd)


@blocks(**KMAJOR_TILES)
def mlp_bwd_v11(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v9's backward with dh = dout @ W_2^T and dx split over K into work where a wave would run part-empty."""
    _bwd_split(matmul_tf32x3, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream, gelu_bwd)


# bf16 products (the first rung in bf16): the kernels of the tf32x3w version on matmul v10's tiles,
# every product's inputs rounded to bf16 as its fragments are read, fp32 sums. .precision tells the
# harness to check them against the twin at that precision (check.py, low_precision_reference).
@blocks(**KMAJOR_TILES)
def mlp_fwd_v13(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0):
    """v12 with bf16 products (matmul v10's tiles)."""
    _fwd_split(matmul_v10, out, h_pre, h, work, x, w_1, w_2, block, stream, gelu_fwd_vec4)


@blocks(**KMAJOR_TILES)
def mlp_bwd_v13(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v12's backward with bf16 products."""
    _bwd_split(matmul_v10, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream, gelu_bwd_vec4)


mlp_fwd_v13.precision = mlp_bwd_v13.precision = "bf16"


# bf16 products on matmul v12's tiles (kernels/half_tile.py): each operand rounded to bf16 once, on
# its way into shared memory, the fragments read with ldmatrix; the same kernels as v13 (same math,
# other order of the sums).
@blocks(**HALF_OP_TILES)
def mlp_fwd_v15(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0):
    """v13 on matmul v12's tiles (bf16 shared tiles, ldmatrix)."""
    _fwd_split(matmul_v12, out, h_pre, h, work, x, w_1, w_2, block, stream, gelu_fwd_vec4)


@blocks(**HALF_OP_TILES)
def mlp_bwd_v15(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v13's backward on matmul v12's tiles."""
    _bwd_split(matmul_v12, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream, gelu_bwd_vec4)


mlp_fwd_v15.precision = mlp_bwd_v15.precision = "bf16"


@blocks(**RING_TILES)
def mlp_fwd_v17(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0):
    """v16 with its products from matmul v16; h fp32, or uint16 (saved as bf16)."""
    gelu_pass = gelu_fwd_bf16 if h.dtype == np.uint16 else gelu_fwd_vec4
    _fwd_split(matmul_v16, out, h_pre, h, work, x, w_1, w_2, block, stream, gelu_pass)


@blocks(**RING_TILES)
def mlp_bwd_v17(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v16's backward with its products from matmul v16, dout and dh_pre rounded to bf16 once each
    (operands.HELD; dh_pre by the GELU' pass itself, k_gelu_bwd_bf16, where the views allow it)."""
    _bwd_held(matmul_v16, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream)


# v18: v17 on matmul v17 (wgmma for every product, the weight gradients' operands read as stored).
@blocks(**MN_TILES)
def mlp_fwd_v18(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0):
    """v17 with its products from matmul v17; h fp32, or uint16 (saved as bf16)."""
    gelu_pass = gelu_fwd_bf16 if h.dtype == np.uint16 else gelu_fwd_vec4
    _fwd_split(matmul_bf16_wgmma_cp_async, out, h_pre, h, work, x, w_1, w_2, block, stream, gelu_pass)


@blocks(**MN_TILES)
def mlp_bwd_v18(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v17's backward with its products from matmul v17."""
    _bwd_held(matmul_bf16_wgmma_cp_async, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream)


# v20: v19 with the GELU in the products' epilogues (matmul v18's fused stores, lab/wgmma_tma.py,
# point 5). On the H200 at 120M k_gelu_fwd_bf16 took 0.46 ms a step and k_gelu_bwd_bf16 0.69:
# passes that read h_pre (100 MB a layer) and, backward, dh = dout @ W_2^T, which the product had
# just written in fp32 (another 100 MB) only to be read once. Here
#     forward:  h_pre = x @ W_1 and h = bf16(gelu(h_pre)) stored from the same registers
#     backward: dh_pre = bf16((dout @ W_2^T) gelu'(h_pre)) stored from the registers, h_pre read there;
#               dh never exists in fp32 (dh_pre's bf16 copy lives in the first half of dh_pre's own
#               fp32 buffer, which nothing else reads)
# The same functions (gelu, gelu_grad, the bf16 rounding of bf16x2) on the same fp32 values as
# v19's passes. Where a tensor map cannot read an operand, or h is not saved as bf16: v19.
def _gelu_pair(x0, x1):
    """Two accumulators' GELU as one word of two bf16 (x0 in the low half)."""
    return bf16x2(gelu(x0), gelu(x1))


def _dgelu_pair(x0, x1, z0, z1):
    """dh_pre = dh gelu'(h_pre) of two accumulators (dh) at two h_pre values, one word of two bf16."""
    return bf16x2(x0 * gelu_grad(z0), x1 * gelu_grad(z1))


GELU_EPILOGUE, DGELU_EPILOGUE = ("gelu", _gelu_pair), ("dgelu", _dgelu_pair)


@blocks(**TMA_OP_TILES)
def mlp_fwd_v20(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0):
    """v19 with h = bf16(gelu(x @ W_1)) stored by the product itself, beside h_pre; h uint16 (saved
    as bf16), else (or where v18 would hand the product to v17) v19."""
    if h.dtype != np.uint16 or not (tma_fits(x, w_1) and map_fits(h)):
        mlp_fwd_bf16_wgmma(out, h_pre, h, work, x, w_1, w_2, block=block, stream=stream)
        return
    tma_product(h_pre, None, x, w_1, False, False, False, block, stream, GELU_EPILOGUE, h)   # h_pre, h
    matmul_bf16_wgmma(out, work, h, w_2, block=block, stream=stream)                      # out = h @ W_2


@blocks(**TMA_OP_TILES)
def mlp_bwd_v20(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """v19's backward with dh_pre = bf16(dout @ W_2^T gelu'(h_pre)) stored by the product itself (in
    the first half of dh_pre's fp32 buffer, its bits: dh_pre itself holds no fp32 values after it);
    where a tensor map cannot read an operand, v19."""
    N, F = h.shape
    dh16 = dh_pre.reshape(N * F).view(np.uint16)[:N * F].reshape(N, F)
    if not (tma_fits(dout, w_2) and tma_fits(x, dh16) and map_fits(dh16)):
        mlp_bwd_bf16_wgmma(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block=block, stream=stream)
        return
    mm = matmul_bf16_wgmma
    d16 = HELD.round(dout, stream)                                                   # dout, rounded once
    mm(dw_2, work, h, d16, trans_a=True, accumulate=True, block=block, stream=stream)    # dW_2 += h^T @ dout
    tma_product(h_pre, None, d16, w_2, False, True, False, block, stream, DGELU_EPILOGUE, dh16)   # dh_pre
    mm(dw_1, work, x, dh16, trans_a=True, accumulate=True, block=block, stream=stream)   # dW_1 += x^T @ dh_pre
    mm(dx, work, dh16, w_1, trans_b=True, block=block, stream=stream)                    # dx = dh_pre @ W_1^T


mlp_fwd_v20.precision = mlp_bwd_v20.precision = "bf16"


mlp_fwd_v17.precision = mlp_bwd_v17.precision = "bf16"


mlp_fwd_v18.precision = mlp_bwd_v18.precision = "bf16"


k_mlp_fwd_v2, k_mlp_bwd_v2 = kernels_v2(mlp_fwd.blocks[0])


VERSIONS = {"mlp_fwd": {1: mlp_fwd, 2: mlp_fwd_v2, 3: mlp_fwd_v3, 4: mlp_fwd_v4, 5: mlp_fwd_v5, 6: mlp_fwd_v6, 7: mlp_fwd_v7, 8: mlp_fwd_v8, 9: mlp_fwd_v9,
                        10: mlp_fwd_v10, 11: mlp_fwd_v11, 12: mlp_fwd_tf32x3, 13: mlp_fwd_v13, 14: mlp_fwd_fp16, 15: mlp_fwd_v15, 16: mlp_fwd_bf16, 17: mlp_fwd_v17, 18: mlp_fwd_v18, 19: mlp_fwd_bf16_wgmma, 20: mlp_fwd_v20,
                        21: mlp_fwd_tf32x3_wgmma},
            "mlp_bwd": {1: mlp_bwd, 2: mlp_bwd_v2, 3: mlp_bwd_v3, 4: mlp_bwd_v4, 5: mlp_bwd_v5, 6: mlp_bwd_v6, 7: mlp_bwd_v7, 8: mlp_bwd_v8, 9: mlp_bwd_v9,
                        10: mlp_bwd_v10, 11: mlp_bwd_v11, 12: mlp_bwd_tf32x3, 13: mlp_bwd_v13, 14: mlp_bwd_fp16, 15: mlp_bwd_v15, 16: mlp_bwd_bf16, 17: mlp_bwd_v17, 18: mlp_bwd_v18, 19: mlp_bwd_bf16_wgmma, 20: mlp_bwd_v20,
                        21: mlp_bwd_tf32x3_wgmma}}
