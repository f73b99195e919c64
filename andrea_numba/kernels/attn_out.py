"""Attention output projection: k_attn_out_fwd / k_attn_out_bwd. NumPy twin: reference/attn_out.py.

Arrays are 2-D: N = B*T rows. y [N, C] is the attention output (heads side by side), w_o [C, C].

    out = y @ W_O            dy = dout @ W_O^T            dW_O += y^T @ dout

The kernels are built once per tile shape of matmul.py (`block` of the launchers).
"""
import functools

from numba import cuda, float32

from .common import blocks
from .matmul import TILES, make_tile, matmul


@functools.cache
def kernels(tile):
    t = make_tile(tile)
    mma_nn, mma_nt, zero, store, TM, TN = t.mma_nn, t.mma_nt, t.zero, t.store, t.TM, t.TN

    @cuda.jit
    def k_attn_out_fwd_v1(out, y, w_o):
        """out = y @ W_O, one BM x BN tile per block."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        mma_nn(acc, y, w_o)
        store(out, acc, False)

    @cuda.jit
    def k_attn_out_bwd_v1(dy, dout, w_o):
        """grad_input: dy = dout @ W_O^T."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        mma_nt(acc, dout, w_o)
        store(dy, acc, False)

    return k_attn_out_fwd_v1, k_attn_out_bwd_v1


@blocks(**TILES)
def attn_out_fwd_v1(out, y, w_o, *, block, stream=0):
    """out, y [N, C]; w_o [C, C]; block = the tile."""
    N, C = out.shape
    t = make_tile(block)
    kernels(block)[0][t.grid(N, C), t.THREADS, stream](out, y, w_o)


@blocks(**TILES)
def attn_out_bwd_v1(dy, dw_o, dout, y, w_o, *, block, stream=0):
    """dy (written) [N, C]; dw_o (+=) [C, C]."""
    N, C = dy.shape
    t = make_tile(block)
    kernels(block)[1][t.grid(N, C), t.THREADS, stream](dy, dout, w_o)
    matmul(dw_o, y, dout, trans_a=True, accumulate=True, block=block, stream=stream)   # dW_O += y^T @ dout


k_attn_out_fwd_v1, k_attn_out_bwd_v1 = kernels(attn_out_fwd_v1.blocks[0])

VERSIONS = {"attn_out_fwd": {1: attn_out_fwd_v1}, "attn_out_bwd": {1: attn_out_bwd_v1}}
attn_out_fwd, attn_out_bwd = attn_out_fwd_v1, attn_out_bwd_v1          # what the engine uses
