"""Attention output projection W_O: the NumPy twin of k_attn_out_fwd / k_attn_out_bwd.

    out = y @ W_O                    dy = dout @ W_O^T          dW_O = y^T @ dout
"""
from .precision import mm


def attn_out_fwd(y, w_o):
    """y [B, T, C] (attention output, heads side by side), w_o [C, C] -> out [B, T, C]. Saved: y."""
    return mm(y, w_o)


def attn_out_bwd(dout, y, w_o):
    """dout [B, T, C] -> (dy [B, T, C], dw_o [C, C])."""
    C = y.shape[-1]
    dy = mm(dout, w_o.T)                           # [B, T, C]
    dw_o = mm(y.reshape(-1, C).T, dout.reshape(-1, C))   # [C, C]
    return dy, dw_o
