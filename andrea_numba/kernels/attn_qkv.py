"""Q, K, V projections: k_attn_qkv_fwd / k_attn_qkv_bwd. NumPy twin: reference/attn_qkv.py.

Arrays are 2-D: N = B*T rows. x [N, C] is LN1's output; w_q, w_k, w_v [C, C] (stored [in, out]).

    q = x @ W_Q      k = x @ W_K      v = x @ W_V
    dx = dq @ W_Q^T + dk @ W_K^T + dv @ W_V^T
    dW_Q += x^T @ dq      dW_K += x^T @ dk      dW_V += x^T @ dv

The kernels run on a tile of matmul.py (make_tile); blockIdx.z picks which of the three
projections a block works on, so each direction is one launch. They are built once per tile
(`block` of the launchers); the module-level names are the default tile's. The lessons' pair runs
them on matmul's shared tiles, the tf32x3 and fp16 launchers on the warp tiles of matmul_tf32x3
and matmul_fp16 (the same kernel text on other tiles). The bf16 launchers chain whole products of
matmul_bf16 or matmul_bf16_wgmma, whose tiles take the bf16 copies only their launchers make.
"""
import functools

from numba import cuda, float32

from .common import blocks, rung
from .operands import HELD
from .matmul import (ASYNC_OP_TILES, KMAJOR_TILES, SPLIT_WGMMA_TILES, TILES, TMA_OP_TILES, make_tile, matmul_bf16,
                     matmul_bf16_wgmma, matmul_fp16, matmul_tf32x3, matmul_tf32x3_wgmma, resolve)


@functools.cache
def kernels(tile):
    t = make_tile(tile)
    mma_nn, mma_nt, mma_tn, zero, store, TM, TN = t.mma_nn, t.mma_nt, t.mma_tn, t.zero, t.store, t.TM, t.TN

    @cuda.jit
    def k_attn_qkv_fwd(q, k, v, x, w_q, w_k, w_v):
        """blockIdx.z = 0, 1, 2: q = x @ W_Q, k = x @ W_K, v = x @ W_V (one BM x BN tile per block)."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        z = cuda.blockIdx.z
        if z == 0:
            mma_nn(acc, x, w_q)
            store(q, acc, False)
        elif z == 1:
            mma_nn(acc, x, w_k)
            store(k, acc, False)
        else:
            mma_nn(acc, x, w_v)
            store(v, acc, False)

    @cuda.jit
    def k_attn_qkv_bwd(dx, dq, dk, dv, w_q, w_k, w_v):
        """dx = dq @ W_Q^T + dk @ W_K^T + dv @ W_V^T: the three products summed in registers, in
        this order, by the thread that owns each output (no atomics)."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        mma_nt(acc, dq, w_q)
        mma_nt(acc, dk, w_k)
        mma_nt(acc, dv, w_v)
        store(dx, acc, False)

    @cuda.jit
    def k_attn_qkv_bwd_dw(dw_q, dw_k, dw_v, x, dq, dk, dv):
        """blockIdx.z = 0, 1, 2: dW_Q += x^T @ dq, dW_K += x^T @ dk, dW_V += x^T @ dv (sum over N rows)."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        z = cuda.blockIdx.z
        if z == 0:
            mma_tn(acc, x, dq)
            store(dw_q, acc, True)
        elif z == 1:
            mma_tn(acc, x, dk)
            store(dw_k, acc, True)
        else:
            mma_tn(acc, x, dv)
            store(dw_v, acc, True)

    return k_attn_qkv_fwd, k_attn_qkv_bwd, k_attn_qkv_bwd_dw


@rung(1)
@blocks(**TILES)
def attn_qkv_fwd(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """q, k, v, x [N, C]; w_* [C, C]. Launch: N x C tiles, times 3 along z; block = the tile."""
    N, C = q.shape
    t = make_tile(block)
    kernels(block)[0][t.grid(N, C, 3), t.THREADS, stream](q, k, v, x, w_q, w_k, w_v)


@rung(1)
@blocks(**TILES)
def attn_qkv_bwd(dx, dw_q, dw_k, dw_v, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """dx (written) [N, C]; dw_q, dw_k, dw_v (+=) [C, C]."""
    N, C = dx.shape
    t = make_tile(block)
    _, k_bwd, k_bwd_dw = kernels(block)
    k_bwd[t.grid(N, C), t.THREADS, stream](dx, dq, dk, dv, w_q, w_k, w_v)
    k_bwd_dw[t.grid(C, C, 3), t.THREADS, stream](dw_q, dw_k, dw_v, x, dq, dk, dv)


# The same kernels on a product launcher's warp tiles (mm: matmul_tf32x3, matmul_fp16, or a lab
# rung's; its tile family mm.family). The weight gradients go through mm, one projection at a time,
# with split-K (work: its float32 buffer): with K = N rows and only C x C outputs, split-K is what
# fills the GPU.


def _fwd_warp(mm, q, k, v, x, w_q, w_k, w_v, block, stream):
    N, C = q.shape
    tile = resolve(mm.family, block, x, w_q, w_k, w_v)
    t = make_tile(tile)
    kernels(tile)[0][t.grid(N, C, 3), t.THREADS, stream](q, k, v, x, w_q, w_k, w_v)


def _bwd_warp(mm, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream):
    N, C = dx.shape
    tile = resolve(mm.family, block, dq, dk, dv, w_q, w_k, w_v)
    t = make_tile(tile)
    kernels(tile)[1][t.grid(N, C), t.THREADS, stream](dx, dq, dk, dv, w_q, w_k, w_v)
    for dw, d in ((dw_q, dq), (dw_k, dk), (dw_v, dv)):                      # dW += x^T @ d
        mm(dw, work, x, d, trans_a=True, accumulate=True, block=block, stream=stream)


@rung(7)
@blocks(**KMAJOR_TILES)
def attn_qkv_fwd_tf32x3(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """q = x @ W_Q, k = x @ W_K, v = x @ W_V in one launch (three z-slices) on matmul_tf32x3's tiles
    (3xTF32, as accurate as fp32); block: its tile."""
    _fwd_warp(matmul_tf32x3, q, k, v, x, w_q, w_k, w_v, block, stream)


@rung(7)
@blocks(**KMAJOR_TILES)
def attn_qkv_bwd_tf32x3(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """dx = dq @ W_Q^T + dk @ W_K^T + dv @ W_V^T summed in registers on matmul_tf32x3's tiles, then
    dW_* += x^T @ d* by matmul_tf32x3, split over K into work."""
    _bwd_warp(matmul_tf32x3, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


# fp16 products: the same on matmul_fp16's tiles (fp16 inputs, fp32 sums); training with them needs loss scaling.
@rung(10)
@blocks(**KMAJOR_TILES)
def attn_qkv_fwd_fp16(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """attn_qkv_fwd_tf32x3 with fp16 products (matmul_fp16's tiles)."""
    _fwd_warp(matmul_fp16, q, k, v, x, w_q, w_k, w_v, block, stream)


@rung(10)
@blocks(**KMAJOR_TILES)
def attn_qkv_bwd_fp16(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """attn_qkv_bwd_tf32x3 with fp16 products, the weight gradients split over K into work."""
    _bwd_warp(matmul_fp16, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


attn_qkv_fwd_fp16.precision = attn_qkv_bwd_fp16.precision = "fp16"


# bf16 products through matmul_bf16 (kernels/half_tile.py): each operand rounded once into a bf16
# copy, copied to shared memory by cp.async through a ring of stages. Its tile functions take those
# copies, which only its launcher makes, so the three projections are three launches of matmul_bf16
# (not one of three z-slices); dx sums its three products in the output, in the order q, k, v
# (accumulate), not in registers.
@rung(12)
@blocks(**ASYNC_OP_TILES)
def attn_qkv_fwd_bf16(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """q = x @ W_Q, k = x @ W_K, v = x @ W_V: three products of matmul_bf16."""
    for out, w in ((q, w_q), (k, w_k), (v, w_v)):
        matmul_bf16(out, None, x, w, block=block, stream=stream)


@rung(12)
@blocks(**ASYNC_OP_TILES)
def attn_qkv_bwd_bf16(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """dx = dq @ W_Q^T + dk @ W_K^T + dv @ W_V^T (the second and third added into dx), dW_* += x^T @ d*
    (split over K into work): six products of matmul_bf16."""
    for i, (d, w) in enumerate(((dq, w_q), (dk, w_k), (dv, w_v))):
        matmul_bf16(dx, work, d, w, trans_b=True, accumulate=i > 0, block=block, stream=stream)
    for dw, d in ((dw_q, dq), (dw_k, dk), (dw_v, dv)):
        matmul_bf16(dw, work, x, d, trans_a=True, accumulate=True, block=block, stream=stream)


attn_qkv_fwd_bf16.precision = attn_qkv_bwd_bf16.precision = "bf16"


# The three projections as three products of mm, and the backward with each of dq, dk, dv rounded to
# bf16 once (operands.HELD) for its two products (attn_qkv_bwd_bf16's products round it each). The
# products run in the order (dx, dW_Q), (dx, dW_K), (dx, dW_V): dx still sums q, k, v.
def _fwd_chain(mm, q, k, v, x, w_q, w_k, w_v, block, stream):
    for out, w in ((q, w_q), (k, w_k), (v, w_v)):
        mm(out, None, x, w, block=block, stream=stream)


def _bwd_held(mm, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream):
    for i, (d, w, dw) in enumerate(((dq, w_q, dw_q), (dk, w_k, dw_k), (dv, w_v, dw_v))):
        d16 = HELD.round(d, stream)
        mm(dx, work, d16, w, trans_b=True, accumulate=i > 0, block=block, stream=stream)   # dx (+)= d @ W^T
        mm(dw, work, x, d16, trans_a=True, accumulate=True, block=block, stream=stream)    # dW += x^T @ d


# bf16 products on Hopper: matmul_bf16_wgmma (TMA, a producer warp, persistent blocks), each product
# at its own tile.
@rung(15)
@blocks(**TMA_OP_TILES)
def attn_qkv_fwd_bf16_wgmma(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """q, k, v: three products of matmul_bf16_wgmma."""
    _fwd_chain(matmul_bf16_wgmma, q, k, v, x, w_q, w_k, w_v, block, stream)


@rung(15)
@blocks(**TMA_OP_TILES)
def attn_qkv_bwd_bf16_wgmma(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """dx (+)= d* @ W_*^T and dW_* += x^T @ d*, the six products on matmul_bf16_wgmma, each of dq, dk,
    dv rounded to bf16 once for its two (_bwd_held)."""
    _bwd_held(matmul_bf16_wgmma, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


attn_qkv_fwd_bf16_wgmma.precision = attn_qkv_bwd_bf16_wgmma.precision = "bf16"


# fp32 products on Hopper: matmul_tf32x3_wgmma (3xTF32 on wgmma, kernels/split_wgmma.py), each
# projection a product of its own; dx sums q's, k's and v's products in that order (accumulate).
@rung(16)
@blocks(**SPLIT_WGMMA_TILES)
def attn_qkv_fwd_tf32x3_wgmma(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """q, k, v: three products of matmul_tf32x3_wgmma (3xTF32, as accurate as fp32)."""
    _fwd_chain(matmul_tf32x3_wgmma, q, k, v, x, w_q, w_k, w_v, block, stream)


@rung(16)
@blocks(**SPLIT_WGMMA_TILES)
def attn_qkv_bwd_tf32x3_wgmma(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """dx (+)= d* @ W_*^T and dW_* += x^T @ d* (split over K into work): six products of
    matmul_tf32x3_wgmma."""
    for i, (d, w, dw) in enumerate(((dq, w_q, dw_q), (dk, w_k, dw_k), (dv, w_v, dw_v))):
        matmul_tf32x3_wgmma(dx, work, d, w, trans_b=True, accumulate=i > 0, block=block, stream=stream)
        matmul_tf32x3_wgmma(dw, work, x, d, trans_a=True, accumulate=True, block=block, stream=stream)

k_attn_qkv_fwd, k_attn_qkv_bwd, k_attn_qkv_bwd_dw = kernels(attn_qkv_fwd.blocks[0])

