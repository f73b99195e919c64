"""Exercise attn_qkv_bwd (NumPy): the backward of the Q, K, V projections.

Forward (given: reference/attn_qkv.py, imported below), weights stored [in, out], no biases:
    q = x @ W_Q      k = x @ W_K      v = x @ W_V          x [B, T, C], W_* [C, C]

Your task: the backward, given dq, dk, dv [B, T, C].
    For one product y = x @ W:   dx = dy @ W^T    and    dW = x^T @ dy  (summed over all B*T rows)
    x feeds three products, so its gradient is the sum of three:
        dx = dq @ W_Q^T + dk @ W_K^T + dv @ W_V^T
    dW_Q = x^T @ dq,  dW_K = x^T @ dk,  dW_V = x^T @ dv   with x, dq, ... reshaped to [B*T, C]

Check your work:  python -m andrea_numba.exercises check attn_qkv_bwd
"""
from reference.attn_qkv import attn_qkv_fwd  # noqa: F401  (the forward, to experiment with)


def attn_qkv_bwd(dq, dk, dv, x, w_q, w_k, w_v):
    """dq, dk, dv [B, T, C] -> (dx [B, T, C], dw_q, dw_k, dw_v [C, C])."""
    # TODO: dx from all three products; each weight gradient from x^T and its own upstream gradient
    raise NotImplementedError("write attn_qkv_bwd: see the docstring")
