"""Attention output projection: k_attn_out_fwd / k_attn_out_bwd. NumPy twin: reference/attn_out.py.

Arrays are 2-D: N = B*T rows. y [N, C] is the attention output (heads side by side), w_o [C, C].

    out = y @ W_O            dy = dout @ W_O^T            dW_O += y^T @ dout
"""
from numba import cuda, float32

from .matmul import THREADS, TM, TN, matmul, tile_grid, tile_mma_nn, tile_mma_nt, tile_store, tile_zero


@cuda.jit
def k_attn_out_fwd(out, y, w_o):
    """out = y @ W_O, one BM x BN tile per block."""
    acc = cuda.local.array((TM, TN), float32)
    tile_zero(acc)
    tile_mma_nn(acc, y, w_o)
    tile_store(out, acc, False)


@cuda.jit
def k_attn_out_bwd(dy, dout, w_o):
    """grad_input: dy = dout @ W_O^T."""
    acc = cuda.local.array((TM, TN), float32)
    tile_zero(acc)
    tile_mma_nt(acc, dout, w_o)
    tile_store(dy, acc, False)


def attn_out_fwd(out, y, w_o, stream=0):
    N, C = out.shape
    k_attn_out_fwd[tile_grid(N, C), THREADS, stream](out, y, w_o)


def attn_out_bwd(dy, dw_o, dout, y, w_o, stream=0):
    """dy (written) [N, C]; dw_o (+=) [C, C]."""
    N, C = dy.shape
    k_attn_out_bwd[tile_grid(N, C), THREADS, stream](dy, dout, w_o)
    matmul(dw_o, y, dout, trans_a=True, accumulate=True, stream=stream)   # dW_O += y^T @ dout
