"""MLP with GELU: k_mlp_fwd / k_mlp_bwd. NumPy twin: reference/mlp.py.

Arrays are 2-D: N = B*T rows, F = 4C hidden units. x [N, C] is LN2's output, w_1 [C, F], w_2 [F, C].

    h_pre = x @ W_1                  saved
    h     = gelu(h_pre)              saved; gelu(z) = 0.5 z (1 + tanh(k (z + 0.044715 z^3))), k = sqrt(2/pi)
    out   = h @ W_2

Backward:
    dh_pre = (dout @ W_2^T) * gelu'(h_pre)       (the GELU derivative is applied as the tile is stored)
    dW_2 += h^T @ dout        dW_1 += x^T @ dh_pre        dx = dh_pre @ W_1^T

The lessons' pair (mlp_fwd, mlp_bwd) runs fused kernels on matmul's shared tiles: k_mlp_fwd
writes h_pre and h = gelu(h_pre) from the same registers, k_mlp_bwd applies gelu' as it stores
dh_pre (`kernels`, built once per tile shape: `block` of the launchers). The recipes' launchers run
the plain products of matmul_tf32x3, matmul_fp16, matmul_bf16 or matmul_bf16_wgmma and the GELU in
a pass of its own (the comment above k_gelu_fwd), every product offered the split-K work buffer.
"""
import functools
import math

import numpy as np

from numba import cuda, float32

from .common import address, blocks, elementwise_launch, nonneg, rung
from .ptx import bf16x2, load4, store4
from .operands import HELD
from .matmul import (ASYNC_OP_TILES, KMAJOR_TILES, SPLIT_WGMMA_TILES, TILES, TMA_OP_TILES, make_tile, matmul,
                     matmul_bf16, matmul_bf16_wgmma, matmul_fp16, matmul_tf32x3, matmul_tf32x3_wgmma)

GELU_K = float32(math.sqrt(2.0 / math.pi))
GELU_C = float32(0.044715)


@cuda.jit(device=True)
def gelu(z):
    return float32(0.5) * z * (float32(1.0) + math.tanh(GELU_K * (z + GELU_C * z * z * z)))


@cuda.jit(device=True)
def gelu_grad(z):
    """d gelu / dz = 0.5 (1 + tanh u) + 0.5 z (1 - tanh^2 u) k (1 + 3 * 0.044715 z^2)"""
    th = math.tanh(GELU_K * (z + GELU_C * z * z * z))
    return (float32(0.5) * (float32(1.0) + th)
            + float32(0.5) * z * (float32(1.0) - th * th) * GELU_K * (float32(1.0) + float32(3.0) * GELU_C * z * z))


@functools.cache
def kernels(tile):
    t = make_tile(tile)
    mma_nn, mma_nt, zero, row, col, TM, TN = t.mma_nn, t.mma_nt, t.zero, t.row, t.col, t.TM, t.TN

    @cuda.jit
    def k_mlp_fwd(h_pre, h, x, w_1):
        """h_pre = x @ W_1 and h = gelu(h_pre), written together from the same registers."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        mma_nn(acc, x, w_1)
        for i in range(TM):
            r = row(i)
            for j in range(TN):
                c = col(j)
                if r < h.shape[0] and c < h.shape[1]:
                    h_pre[r, c] = acc[i, j]
                    h[r, c] = gelu(acc[i, j])

    @cuda.jit
    def k_mlp_bwd(dh_pre, dout, h_pre, w_2):
        """dh_pre = (dout @ W_2^T) * gelu'(h_pre): back through W_2 and the GELU in one pass."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        mma_nt(acc, dout, w_2)
        for i in range(TM):
            r = row(i)
            for j in range(TN):
                c = col(j)
                if r < dh_pre.shape[0] and c < dh_pre.shape[1]:
                    dh_pre[r, c] = acc[i, j] * gelu_grad(h_pre[r, c])

    return k_mlp_fwd, k_mlp_bwd


@rung(1)
@blocks(**TILES)
def mlp_fwd(out, h_pre, h, x, w_1, w_2, *, block, stream=0):
    """out, x [N, C]; h_pre, h [N, F]: saved for backward. block = the tile."""
    N, F = h.shape
    t = make_tile(block)
    kernels(block)[0][t.grid(N, F), t.THREADS, stream](h_pre, h, x, w_1)
    matmul(out, h, w_2, block=block, stream=stream)                                    # out = h @ W_2


@rung(1)
@blocks(**TILES)
def mlp_bwd(dx, dw_1, dw_2, dh_pre, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """dx (written) [N, C]; dw_1, dw_2 (+=); dh_pre [N, F] is scratch (written, then read)."""
    N, F = h.shape
    t = make_tile(block)
    matmul(dw_2, h, dout, trans_a=True, accumulate=True, block=block, stream=stream)    # dW_2 += h^T @ dout
    kernels(block)[1][t.grid(N, F), t.THREADS, stream](dh_pre, dout, h_pre, w_2)
    matmul(dw_1, x, dh_pre, trans_a=True, accumulate=True, block=block, stream=stream)  # dW_1 += x^T @ dh_pre
    matmul(dx, dh_pre, w_1, trans_b=True, block=block, stream=stream)                   # dx = dh_pre @ W_1^T


# The GELU out of the products. The fused kernels (k_mlp_fwd, k_mlp_bwd) on matmul_tf32x3's
# tiles ran at about 41 TFLOP/s on the H200 at 120M where the plain product of the same shape ran
# at 50-54 (docs/kernels.md): their epilogue, a tanh for each of 64 outputs a thread and two
# [N, 4C] tensors written (or one read) from the fragment layout, runs while the block's tensor
# cores wait. The recipes' launchers run the plain products and apply the GELU, or its derivative,
# in a pass of its own over [N, 4C]: 2 (or 3) x 4 N C floats more through memory, about 0.1 ms at
# 120M where the fused epilogue cost about 0.2. The same float32 values meet the same operations:
# the fused kernels' bits.

@cuda.jit
def k_gelu_fwd(h, h_pre):
    """h = gelu(h_pre), element by element (flat views)."""
    i = cuda.grid(1)
    if i < h.shape[0]:
        h[i] = gelu(h_pre[i])


@cuda.jit
def k_gelu_bwd(dh_pre, h_pre):
    """dh_pre *= gelu'(h_pre) in place: dh_pre holds dout @ W_2^T on entry (flat views)."""
    i = cuda.grid(1)
    if i < dh_pre.shape[0]:
        dh_pre[i] = dh_pre[i] * gelu_grad(h_pre[i])


# Every product is offered the split-K work buffer, and the C-wide ones split. At 12M the
# products of width C (out = h @ W_2, dx = dh_pre @ W_1^T: 8192 x 384 outputs, K = 1536) are
# 64 x 6 = 384 tiles of 128 x 64 on a GPU that runs 264 at once: one full wave and one of 120
# blocks, the GPU 73% busy, and they took 0.256 and 0.246 ms against 0.221 and 0.213 for the
# products of width 4C with the same FLOPs (Nsight Compute, the training step on the H200). With
# the work buffer matmul.splitk weighs the waves (the comment above splitk in matmul.py): S = 2
# slices of K = 768 make 768 blocks, three waves of half the length, and k_splitk_sum adds the
# two partial tiles in order (no atomics). The 4C-wide products and every 120M product stay
# whole (S = 1: their waves are already full). Other sums than unsplit products', so other bits;
# the same at every run. work is the engine's split-K buffer (matmul.splitk_work(C, N): room for
# two N x C slices); a model without one (the sampler's) passes None and runs the products whole.

def _fwd_split(mm, out, h_pre, h, work, x, w_1, w_2, block, stream, gelu_pass):
    """h_pre = x @ W_1, h = gelu(h_pre) (gelu_pass), out = h @ W_2, both products offered the work
    buffer (splitk decides; None: no split)."""
    N, F = h.shape
    mm(h_pre, work, x, w_1, block=block, stream=stream)
    gelu_pass(h.reshape(N * F), h_pre.reshape(N * F), stream)
    mm(out, work, h, w_2, block=block, stream=stream)


def _bwd_split(mm, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream, gelu_grad_pass,
               split_dx=True):
    """The backward, the GELU' pass given: the weight gradients offered the work buffer, and with
    split_dx (the engine's launchers) dh = dout @ W_2^T and dx too (splitk decides)."""
    N, F = h.shape
    wx = work if split_dx else None
    mm(dw_2, work, h, dout, trans_a=True, accumulate=True, block=block, stream=stream)     # dW_2 += h^T @ dout
    mm(dh_pre, wx, dout, w_2, trans_b=True, block=block, stream=stream)                    # dh = dout @ W_2^T
    gelu_grad_pass(dh_pre.reshape(N * F), h_pre.reshape(N * F), stream)                    # dh_pre = dh gelu'(h_pre)
    mm(dw_1, work, x, dh_pre, trans_a=True, accumulate=True, block=block, stream=stream)   # dW_1 += x^T @ dh_pre
    mm(dx, wx, dh_pre, w_1, trans_b=True, block=block, stream=stream)                      # dx = dh_pre @ W_1^T


def gelu_fwd(h, h_pre, stream):
    """k_gelu_fwd over the flat views: a thread an element."""
    grid, threads = elementwise_launch(h.shape[0])
    k_gelu_fwd[grid, threads, stream](h, h_pre)


def gelu_bwd(dh_pre, h_pre, stream):
    """k_gelu_bwd over the flat views: a thread an element."""
    grid, threads = elementwise_launch(dh_pre.shape[0])
    k_gelu_bwd[grid, threads, stream](dh_pre, h_pre)


# The GELU passes of the recipes' launchers take four elements a thread, one 128-bit load and store
# each (ptx.py's load4 and store4): k_gelu_fwd, a thread per float, moved 100 MB (12M: h_pre in,
# h out) in 0.040 ms, 2.5 TB/s, on an H200 that streams about 4, issuing four times the memory
# instructions. The same float32 operations on the same values: the same bits. (A view that does
# not start on a 16-byte boundary, or a length not a multiple of 4, takes the v1 kernels.)

@cuda.jit
def k_gelu_fwd_vec4(h, h_pre):
    """h[i .. i+3] = gelu(h_pre[i .. i+3]), i = 4 x (the thread's index): 128-bit loads and stores."""
    i = 4 * nonneg(cuda.grid(1))
    if i < h.shape[0]:
        z0, z1, z2, z3 = load4(h_pre, i)
        store4(h, i, gelu(z0), gelu(z1), gelu(z2), gelu(z3))


@cuda.jit
def k_gelu_bwd_vec4(dh_pre, h_pre):
    """dh_pre[i .. i+3] *= gelu'(h_pre[i .. i+3]) in place, four elements a thread."""
    i = 4 * nonneg(cuda.grid(1))
    if i < dh_pre.shape[0]:
        d0, d1, d2, d3 = load4(dh_pre, i)
        z0, z1, z2, z3 = load4(h_pre, i)
        store4(dh_pre, i, d0 * gelu_grad(z0), d1 * gelu_grad(z1), d2 * gelu_grad(z2), d3 * gelu_grad(z3))


def _vec4(*arrays) -> bool:
    """Flat float32 views of a length that 4 divides, each starting on a 16-byte boundary."""
    return all(a.shape[0] % 4 == 0 and address(a) % 16 == 0 for a in arrays)


def gelu_fwd_vec4(h, h_pre, stream):
    """k_gelu_fwd_vec4 (four elements a thread) when the views allow it, else v1."""
    if not _vec4(h, h_pre):
        return gelu_fwd(h, h_pre, stream)
    grid, threads = elementwise_launch(h.shape[0] // 4)
    k_gelu_fwd_vec4[grid, threads, stream](h, h_pre)


def gelu_bwd_vec4(dh_pre, h_pre, stream):
    """k_gelu_bwd_vec4 (four elements a thread) when the views allow it, else v1."""
    if not _vec4(dh_pre, h_pre):
        return gelu_bwd(dh_pre, h_pre, stream)
    grid, threads = elementwise_launch(dh_pre.shape[0] // 4)
    k_gelu_bwd_vec4[grid, threads, stream](dh_pre, h_pre)


@rung(12)
@blocks(**KMAJOR_TILES)
def mlp_fwd_tf32x3(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0):
    """h_pre = x @ W_1, h = gelu(h_pre), out = h @ W_2: matmul_tf32x3's products (3xTF32, as accurate
    as fp32), the GELU a pass of its own (four elements a thread), both products offered the split-K
    work buffer. out, x [N, C]; h_pre, h [N, F]: saved for backward; block: matmul_tf32x3's tile."""
    _fwd_split(matmul_tf32x3, out, h_pre, h, work, x, w_1, w_2, block, stream, gelu_fwd_vec4)


@rung(12)
@blocks(**KMAJOR_TILES)
def mlp_bwd_tf32x3(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """dW_2 += h^T @ dout, dh = dout @ W_2^T, dh_pre = dh gelu'(h_pre) (a pass of its own),
    dW_1 += x^T @ dh_pre, dx = dh_pre @ W_1^T: matmul_tf32x3's products, each offered the split-K
    work buffer. dx (written); dw_1, dw_2 (+=); dh_pre [N, F] is scratch (written, then read)."""
    _bwd_split(matmul_tf32x3, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream, gelu_bwd_vec4)


# fp16 products: the same on matmul_fp16 (fp16 inputs, fp32 sums); training with them needs loss scaling.
@rung(14)
@blocks(**KMAJOR_TILES)
def mlp_fwd_fp16(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0):
    """mlp_fwd_tf32x3 with fp16 products (matmul_fp16)."""
    _fwd_split(matmul_fp16, out, h_pre, h, work, x, w_1, w_2, block, stream, gelu_fwd_vec4)


@rung(14)
@blocks(**KMAJOR_TILES)
def mlp_bwd_fp16(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """mlp_bwd_tf32x3 with fp16 products (matmul_fp16)."""
    _bwd_split(matmul_fp16, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream, gelu_bwd_vec4)


mlp_fwd_fp16.precision = mlp_bwd_fp16.precision = "fp16"


# h saved as bf16. Every reader of the GELU output h is a bf16 product (out = h @ W_2 in the
# forward, dW_2 += h^T @ dout in the backward), and each rounds h to bf16 (ties to even) before it
# multiplies. So h can be kept rounded: the same bits reach the products, in half the memory, and
# matmul_bf16 reads the kept copy instead of rounding h again. k_gelu_fwd_bf16 computes the GELU as
# k_gelu_fwd_vec4 does (the same fp32 values) and writes each pair rounded and packed, as
# cvt.rn.bf16x2 packs an mma's operands: h_words[j] = bf16(h[2j]) | bf16(h[2j+1]) << 16 (the uint16
# buffer's bits).
@cuda.jit
def k_gelu_fwd_bf16(h_words, h_pre):
    """h = gelu(h_pre) saved as bf16 (nearest, ties to even): four elements a thread, one 128-bit load,
    two 32-bit words of bf16 pairs written (h_words: the uint16 h seen as int32)."""
    i = 4 * nonneg(cuda.grid(1))
    if i < h_pre.shape[0]:
        z0, z1, z2, z3 = load4(h_pre, i)
        h_words[i // 2] = bf16x2(gelu(z0), gelu(z1))
        h_words[i // 2 + 1] = bf16x2(gelu(z2), gelu(z3))


def gelu_fwd_bf16(h, h_pre, stream):
    """k_gelu_fwd_bf16: h (uint16, the bf16 bit patterns) = gelu(h_pre) rounded; flat views whose length 4
    divides, h_pre on a 16-byte boundary, h on an 8-byte one."""
    assert h.dtype == np.uint16 and h.shape[0] % 4 == 0 and _vec4(h_pre), \
        f"gelu_fwd_bf16 takes a uint16 h of a length 4 divides and an aligned fp32 h_pre, got {h.dtype} {h.shape}"
    grid, threads = elementwise_launch(h.shape[0] // 4)
    k_gelu_fwd_bf16[grid, threads, stream](h.view(np.int32), h_pre)


# bf16 products through matmul_bf16 (bf16 copies, cp.async ring: kernels/half_tile.py); the GELU
# passes and the split over K as above. h may be the uint16 bits of a bf16 h (the bf16 recipes save
# it so, gpu_model.py): the GELU pass then writes it rounded (k_gelu_fwd_bf16), and the products take
# it as it is.
@rung(16)
@blocks(**ASYNC_OP_TILES)
def mlp_fwd_bf16(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0):
    """mlp_fwd_tf32x3 with its products from matmul_bf16; h fp32, or uint16 (saved as bf16)."""
    gelu_pass = gelu_fwd_bf16 if h.dtype == np.uint16 else gelu_fwd_vec4
    _fwd_split(matmul_bf16, out, h_pre, h, work, x, w_1, w_2, block, stream, gelu_pass)


@rung(16)
@blocks(**ASYNC_OP_TILES)
def mlp_bwd_bf16(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """mlp_bwd_tf32x3 with its products from matmul_bf16."""
    _bwd_split(matmul_bf16, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream, gelu_bwd_vec4)


mlp_fwd_bf16.precision = mlp_bwd_bf16.precision = "bf16"


# The backward's two gradients rounded to bf16 once each for their two products (operands.HELD),
# where _bwd_split's products round them again each: dout, then dh_pre, which k_gelu_bwd_bf16 writes
# rounded: the GELU' pass reads dh (fp32, in the dh_pre buffer) and writes bf16(dh gelu'(h_pre))
# straight into the held copy, the bits the products' copy would have made of an fp32 dh_pre. The
# fp32 dh_pre buffer keeps dh.
@cuda.jit
def k_gelu_bwd_bf16(dh_words, dh, h_pre):
    """dh_pre = dh gelu'(h_pre) written as bf16 (nearest, ties to even), four elements a thread: two
    128-bit loads, two 32-bit words of bf16 pairs (dh_words: the uint16 dh_pre seen as int32)."""
    i = 4 * nonneg(cuda.grid(1))
    if i < dh.shape[0]:
        d0, d1, d2, d3 = load4(dh, i)
        z0, z1, z2, z3 = load4(h_pre, i)
        dh_words[i // 2] = bf16x2(d0 * gelu_grad(z0), d1 * gelu_grad(z1))
        dh_words[i // 2 + 1] = bf16x2(d2 * gelu_grad(z2), d3 * gelu_grad(z3))


def gelu_bwd_bf16(dh16, dh, h_pre, stream):
    """k_gelu_bwd_bf16: dh16 (uint16, flat) = bf16(dh gelu'(h_pre)); flat views whose length 4 divides,
    dh and h_pre on 16-byte boundaries, dh16 on an 8-byte one."""
    assert dh16.dtype == np.uint16 and dh16.shape[0] % 4 == 0 and _vec4(dh, h_pre) and address(dh16) % 8 == 0, \
        f"gelu_bwd_bf16 takes a uint16 dh_pre of a length 4 divides and aligned fp32 dh, h_pre, got {dh16.dtype} {dh16.shape}"
    grid, threads = elementwise_launch(dh16.shape[0] // 4)
    k_gelu_bwd_bf16[grid, threads, stream](dh16.view(np.int32), dh, h_pre)


def _bwd_held(mm, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream):
    """The backward with dout and dh_pre rounded to bf16 once each (the comment above k_gelu_bwd_bf16)."""
    N, F = h.shape
    d16 = HELD.round(dout, stream)                                                   # dout, rounded once
    mm(dw_2, work, h, d16, trans_a=True, accumulate=True, block=block, stream=stream)    # dW_2 += h^T @ dout
    mm(dh_pre, work, d16, w_2, trans_b=True, block=block, stream=stream)                 # dh = dout @ W_2^T
    dh16 = HELD.view(N, F)                                          # (dout's copy is read by no one now)
    if _vec4(dh_pre.reshape(N * F), h_pre.reshape(N * F)) and address(dh16) % 8 == 0:
        gelu_bwd_bf16(dh16.reshape(N * F), dh_pre.reshape(N * F), h_pre.reshape(N * F), stream)
    else:                                                           # dh_pre in fp32, then rounded
        gelu_bwd_vec4(dh_pre.reshape(N * F), h_pre.reshape(N * F), stream)
        dh16 = HELD.round(dh_pre, stream)
    mm(dw_1, work, x, dh16, trans_a=True, accumulate=True, block=block, stream=stream)   # dW_1 += x^T @ dh_pre
    mm(dx, work, dh16, w_1, trans_b=True, block=block, stream=stream)                    # dx = dh_pre @ W_1^T


# bf16 products on Hopper: matmul_bf16_wgmma (TMA, a producer warp, persistent blocks), each product
# at its own tile; the backward rounds its gradients once (_bwd_held).
@rung(19)
@blocks(**TMA_OP_TILES)
def mlp_fwd_bf16_wgmma(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0):
    """mlp_fwd_bf16 with its products from matmul_bf16_wgmma; h fp32, or uint16 (saved as bf16)."""
    gelu_pass = gelu_fwd_bf16 if h.dtype == np.uint16 else gelu_fwd_vec4
    _fwd_split(matmul_bf16_wgmma, out, h_pre, h, work, x, w_1, w_2, block, stream, gelu_pass)


@rung(19)
@blocks(**TMA_OP_TILES)
def mlp_bwd_bf16_wgmma(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """The backward with its products from matmul_bf16_wgmma, dout and dh_pre rounded to bf16 once
    each (_bwd_held)."""
    _bwd_held(matmul_bf16_wgmma, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream)


mlp_fwd_bf16_wgmma.precision = mlp_bwd_bf16_wgmma.precision = "bf16"


# fp32 products on Hopper: matmul_tf32x3_wgmma (3xTF32 on wgmma, kernels/split_wgmma.py), the GELU
# and its derivative in passes of their own as mlp_fwd_tf32x3's.
@rung(21)
@blocks(**SPLIT_WGMMA_TILES)
def mlp_fwd_tf32x3_wgmma(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0):
    """mlp_fwd_tf32x3 with its products from matmul_tf32x3_wgmma."""
    _fwd_split(matmul_tf32x3_wgmma, out, h_pre, h, work, x, w_1, w_2, block, stream, gelu_fwd_vec4)


@rung(21)
@blocks(**SPLIT_WGMMA_TILES)
def mlp_bwd_tf32x3_wgmma(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, block, stream=0):
    """mlp_bwd_tf32x3 with its products from matmul_tf32x3_wgmma."""
    _bwd_split(matmul_tf32x3_wgmma, dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, block, stream, gelu_bwd_vec4)

k_mlp_fwd, k_mlp_bwd = kernels(mlp_fwd.blocks[0])

