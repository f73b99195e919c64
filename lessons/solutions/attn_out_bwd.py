"""Exercise attn_out_bwd (NumPy): the backward of the attention output projection W_O.

Forward (given: reference/attn_out.py, imported below):
    out = y @ W_O          y [B, T, C] (attention output, heads side by side), W_O [C, C]

Your task: the backward, given dout [B, T, C].
    dy   = dout @ W_O^T                               [B, T, C]
    dW_O = y^T @ dout, summed over all B*T rows       [C, C]   (reshape y and dout to [B*T, C])

Check the shapes: dW_O[i, j] = sum over rows of y[row, i] * dout[row, j].

Check your work:  python -m andrea_numba.exercises check attn_out_bwd
"""
from reference.attn_out import attn_out_fwd  # noqa: F401  (the forward, to experiment with)


def attn_out_bwd(dout, y, w_o):
    """dout [B, T, C] -> (dy [B, T, C], dw_o [C, C])."""
    C = y.shape[-1]
    dy = dout @ w_o.T                                         # [B, T, C]
    dw_o = y.reshape(-1, C).T @ dout.reshape(-1, C)           # [C, C]
    return dy, dw_o
