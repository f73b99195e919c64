"""Q, K, V projections: the NumPy twin of k_attn_qkv_fwd / k_attn_qkv_bwd.

    q = x @ W_Q      k = x @ W_K      v = x @ W_V          (W stored [in, out], no biases)

Backward: x feeds three products, so its gradient is the sum of three:
    dx = dq @ W_Q^T + dk @ W_K^T + dv @ W_V^T
    dW_Q = x^T @ dq   (rows of x and dq over all B*T positions), likewise dW_K, dW_V
"""
from .precision import mm


def attn_qkv_fwd(x, w_q, w_k, w_v):
    """x [B, T, C], w_* [C, C] -> q, k, v [B, T, C]. Saved for backward: x. (mm(a, b) is a @ b,
    at the products' precision: reference/precision.py.)"""
    return mm(x, w_q), mm(x, w_k), mm(x, w_v)


def attn_qkv_bwd(dq, dk, dv, x, w_q, w_k, w_v):
    """dq, dk, dv [B, T, C] -> (dx [B, T, C], dw_q, dw_k, dw_v [C, C])."""
    C = x.shape[-1]
    x2 = x.reshape(-1, C)                                     # [B*T, C]
    dx = mm(dq, w_q.T) + mm(dk, w_k.T) + mm(dv, w_v.T)   # [B, T, C]
    dw_q = mm(x2.T, dq.reshape(-1, C))                     # [C, C]
    dw_k = mm(x2.T, dk.reshape(-1, C))
    dw_v = mm(x2.T, dv.reshape(-1, C))
    return dx, dw_q, dw_k, dw_v
