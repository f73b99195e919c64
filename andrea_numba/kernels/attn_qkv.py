"""Q, K, V projections: k_attn_qkv_fwd / k_attn_qkv_bwd. NumPy twin: reference/attn_qkv.py.

Arrays are 2-D: N = B*T rows. x [N, C] is LN1's output; w_q, w_k, w_v [C, C] (stored [in, out]).

    q = x @ W_Q      k = x @ W_K      v = x @ W_V
    dx = dq @ W_Q^T + dk @ W_K^T + dv @ W_V^T
    dW_Q += x^T @ dq      dW_K += x^T @ dk      dW_V += x^T @ dv

All products run through the shared-memory tile of matmul.py (tile_mma_*); blockIdx.z picks which
of the three projections a block works on, so each direction is one launch.
"""
from numba import cuda, float32

from .matmul import (THREADS, TM, TN, tile_grid, tile_mma_nn, tile_mma_nt, tile_mma_tn,
                     tile_store, tile_zero)


@cuda.jit
def k_attn_qkv_fwd(q, k, v, x, w_q, w_k, w_v):
    """blockIdx.z = 0, 1, 2: q = x @ W_Q, k = x @ W_K, v = x @ W_V (one BM x BN tile per block)."""
    acc = cuda.local.array((TM, TN), float32)
    tile_zero(acc)
    z = cuda.blockIdx.z
    if z == 0:
        tile_mma_nn(acc, x, w_q)
        tile_store(q, acc, False)
    elif z == 1:
        tile_mma_nn(acc, x, w_k)
        tile_store(k, acc, False)
    else:
        tile_mma_nn(acc, x, w_v)
        tile_store(v, acc, False)


@cuda.jit
def k_attn_qkv_bwd(dx, dq, dk, dv, w_q, w_k, w_v):
    """dx = dq @ W_Q^T + dk @ W_K^T + dv @ W_V^T: the three products summed in registers, in this
    order, by the thread that owns each output (no atomics)."""
    acc = cuda.local.array((TM, TN), float32)
    tile_zero(acc)
    tile_mma_nt(acc, dq, w_q)
    tile_mma_nt(acc, dk, w_k)
    tile_mma_nt(acc, dv, w_v)
    tile_store(dx, acc, False)


@cuda.jit
def k_attn_qkv_bwd_dw(dw_q, dw_k, dw_v, x, dq, dk, dv):
    """blockIdx.z = 0, 1, 2: dW_Q += x^T @ dq, dW_K += x^T @ dk, dW_V += x^T @ dv (sum over N rows)."""
    acc = cuda.local.array((TM, TN), float32)
    tile_zero(acc)
    z = cuda.blockIdx.z
    if z == 0:
        tile_mma_tn(acc, x, dq)
        tile_store(dw_q, acc, True)
    elif z == 1:
        tile_mma_tn(acc, x, dk)
        tile_store(dw_k, acc, True)
    else:
        tile_mma_tn(acc, x, dv)
        tile_store(dw_v, acc, True)


def attn_qkv_fwd(q, k, v, x, w_q, w_k, w_v, stream=0):
    """q, k, v, x [N, C]; w_* [C, C]. Launch: N x C tiles, times 3 along z."""
    N, C = q.shape
    k_attn_qkv_fwd[tile_grid(N, C, 3), THREADS, stream](q, k, v, x, w_q, w_k, w_v)


def attn_qkv_bwd(dx, dw_q, dw_k, dw_v, dq, dk, dv, x, w_q, w_k, w_v, stream=0):
    """dx (written) [N, C]; dw_q, dw_k, dw_v (+=) [C, C]."""
    N, C = dx.shape
    k_attn_qkv_bwd[tile_grid(N, C), THREADS, stream](dx, dq, dk, dv, w_q, w_k, w_v)
    k_attn_qkv_bwd_dw[tile_grid(C, C, 3), THREADS, stream](dw_q, dw_k, dw_v, x, dq, dk, dv)
