"""Attention output projection: k_attn_out_fwd / k_attn_out_bwd. NumPy twin: reference/attn_out.py.

Arrays are 2-D: N = B*T rows. y [N, C] is the attention output (heads side by side), w_o [C, C].

    out = y @ W_O            dy = dout @ W_O^T            dW_O += y^T @ dout

The kernels are built once per tile of matmul.py (make_tile; `block` of the launchers): the
lessons' pair runs them on matmul's shared tiles, the tf32x3 and fp16 launchers on the warp tiles
of matmul_tf32x3 and matmul_fp16 (the same kernel text on other tiles). The bf16 launchers run
whole products of matmul_bf16 or matmul_bf16_wgmma.
"""
import functools

from numba import cuda, float32

from .common import blocks, rung
from .operands import HELD
from .matmul import (ASYNC_OP_TILES, KMAJOR_TILES, SPLIT_WGMMA_TILES, TILES, TMA_OP_TILES, make_tile, matmul,
                     matmul_bf16, matmul_bf16_wgmma, matmul_fp16, matmul_tf32x3, matmul_tf32x3_wgmma, resolve)


@functools.cache
def kernels(tile):
    t = make_tile(tile)
    mma_nn, mma_nt, zero, store, TM, TN = t.mma_nn, t.mma_nt, t.zero, t.store, t.TM, t.TN

    @cuda.jit
    def k_attn_out_fwd(out, y, w_o):
        """out = y @ W_O, one BM x BN tile per block."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        mma_nn(acc, y, w_o)
        store(out, acc, False)

    @cuda.jit
    def k_attn_out_bwd(dy, dout, w_o):
        """grad_input: dy = dout @ W_O^T."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        mma_nt(acc, dout, w_o)
        store(dy, acc, False)

    return k_attn_out_fwd, k_attn_out_bwd


@rung(1)
@blocks(**TILES)
def attn_out_fwd(out, y, w_o, *, block, stream=0):
    """out, y [N, C]; w_o [C, C]; block = the tile."""
    N, C = out.shape
    t = make_tile(block)
    kernels(block)[0][t.grid(N, C), t.THREADS, stream](out, y, w_o)


@rung(1)
@blocks(**TILES)
def attn_out_bwd(dy, dw_o, dout, y, w_o, *, block, stream=0):
    """dy (written) [N, C]; dw_o (+=) [C, C]."""
    N, C = dy.shape
    t = make_tile(block)
    kernels(block)[1][t.grid(N, C), t.THREADS, stream](dy, dout, w_o)
    matmul(dw_o, y, dout, trans_a=True, accumulate=True, block=block, stream=stream)   # dW_O += y^T @ dout


# The same kernels on a product launcher's warp tiles (mm: matmul_tf32x3, matmul_fp16, or a lab
# rung's; its tile family mm.family); dW_O through mm with split-K (work: its float32 buffer).

def _fwd_warp(mm, out, y, w_o, block, stream):
    N, C = out.shape
    tile = resolve(mm.family, block, y, w_o)
    t = make_tile(tile)
    kernels(tile)[0][t.grid(N, C), t.THREADS, stream](out, y, w_o)


def _bwd_warp(mm, dy, dw_o, work, dout, y, w_o, block, stream):
    N, C = dy.shape
    tile = resolve(mm.family, block, dout, w_o)
    t = make_tile(tile)
    kernels(tile)[1][t.grid(N, C), t.THREADS, stream](dy, dout, w_o)
    mm(dw_o, work, y, dout, trans_a=True, accumulate=True, block=block, stream=stream)


@rung(7)
@blocks(**KMAJOR_TILES)
def attn_out_fwd_tf32x3(out, y, w_o, *, block, stream=0):
    """out = y @ W_O on matmul_tf32x3's tiles (3xTF32, as accurate as fp32); block: its tile."""
    _fwd_warp(matmul_tf32x3, out, y, w_o, block, stream)


@rung(7)
@blocks(**KMAJOR_TILES)
def attn_out_bwd_tf32x3(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """dy = dout @ W_O^T on matmul_tf32x3's tiles, dW_O += y^T @ dout by matmul_tf32x3, split over K
    into work."""
    _bwd_warp(matmul_tf32x3, dy, dw_o, work, dout, y, w_o, block, stream)


k_attn_out_fwd, k_attn_out_bwd = kernels(attn_out_fwd.blocks[0])


# fp16 products: the same on matmul_fp16's tiles (fp16 inputs, fp32 sums); training with them needs loss scaling.
@rung(10)
@blocks(**KMAJOR_TILES)
def attn_out_fwd_fp16(out, y, w_o, *, block, stream=0):
    """attn_out_fwd_tf32x3 with fp16 products (matmul_fp16's tiles)."""
    _fwd_warp(matmul_fp16, out, y, w_o, block, stream)


@rung(10)
@blocks(**KMAJOR_TILES)
def attn_out_bwd_fp16(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """attn_out_bwd_tf32x3 with fp16 products, dW_O split over K into work."""
    _bwd_warp(matmul_fp16, dy, dw_o, work, dout, y, w_o, block, stream)


attn_out_fwd_fp16.precision = attn_out_bwd_fp16.precision = "fp16"


# bf16 products through matmul_bf16 (bf16 copies, cp.async ring: kernels/half_tile.py), one launch
# of it a product (its tile functions take the copies its launcher makes).
@rung(12)
@blocks(**ASYNC_OP_TILES)
def attn_out_fwd_bf16(out, y, w_o, *, block, stream=0):
    """out = y @ W_O through matmul_bf16."""
    matmul_bf16(out, None, y, w_o, block=block, stream=stream)


@rung(12)
@blocks(**ASYNC_OP_TILES)
def attn_out_bwd_bf16(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """dy = dout @ W_O^T, dW_O += y^T @ dout (split over K into work), through matmul_bf16."""
    matmul_bf16(dy, work, dout, w_o, trans_b=True, block=block, stream=stream)
    matmul_bf16(dw_o, work, y, dout, trans_a=True, accumulate=True, block=block, stream=stream)


attn_out_fwd_bf16.precision = attn_out_bwd_bf16.precision = "bf16"


# The backward on mm with dout rounded to bf16 once for both its products (operands.HELD), where
# attn_out_bwd_bf16's products round it each.
def _bwd_held(mm, dy, dw_o, work, dout, y, w_o, block, stream):
    d16 = HELD.round(dout, stream)
    mm(dy, work, d16, w_o, trans_b=True, block=block, stream=stream)
    mm(dw_o, work, y, d16, trans_a=True, accumulate=True, block=block, stream=stream)


# bf16 products on Hopper: matmul_bf16_wgmma (TMA, a producer warp, persistent blocks), each product
# at its own tile.
@rung(15)
@blocks(**TMA_OP_TILES)
def attn_out_fwd_bf16_wgmma(out, y, w_o, *, block, stream=0):
    """out = y @ W_O through matmul_bf16_wgmma."""
    matmul_bf16_wgmma(out, None, y, w_o, block=block, stream=stream)


@rung(15)
@blocks(**TMA_OP_TILES)
def attn_out_bwd_bf16_wgmma(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """dy = dout @ W_O^T, dW_O += y^T @ dout on matmul_bf16_wgmma, dout rounded to bf16 once for both
    (_bwd_held)."""
    _bwd_held(matmul_bf16_wgmma, dy, dw_o, work, dout, y, w_o, block, stream)


attn_out_fwd_bf16_wgmma.precision = attn_out_bwd_bf16_wgmma.precision = "bf16"


# fp32 products on Hopper: matmul_tf32x3_wgmma (3xTF32 on wgmma, kernels/split_wgmma.py).
@rung(16)
@blocks(**SPLIT_WGMMA_TILES)
def attn_out_fwd_tf32x3_wgmma(out, y, w_o, *, block, stream=0):
    """out = y @ W_O through matmul_tf32x3_wgmma (3xTF32, as accurate as fp32)."""
    matmul_tf32x3_wgmma(out, None, y, w_o, block=block, stream=stream)


@rung(16)
@blocks(**SPLIT_WGMMA_TILES)
def attn_out_bwd_tf32x3_wgmma(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """dy = dout @ W_O^T, dW_O += y^T @ dout (split over K into work) on matmul_tf32x3_wgmma."""
    matmul_tf32x3_wgmma(dy, work, dout, w_o, trans_b=True, block=block, stream=stream)
    matmul_tf32x3_wgmma(dw_o, work, y, dout, trans_a=True, accumulate=True, block=block, stream=stream)

