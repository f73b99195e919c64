"""MLP with GELU: the NumPy twin of k_mlp_fwd / k_mlp_bwd.

    h_pre = x @ W_1          [B, T, 4C]
    h     = gelu(h_pre)      gelu(z) = 0.5 z (1 + tanh(k (z + 0.044715 z^3))), k = sqrt(2/pi)
    out   = h @ W_2          [B, T, C]

Backward:
    dW_2 = h^T @ dout        dh = dout @ W_2^T
    dh_pre = dh * gelu'(h_pre)
    dW_1 = x^T @ dh_pre      dx = dh_pre @ W_1^T
with gelu'(z) = 0.5 (1 + tanh(u)) + 0.5 z (1 - tanh(u)^2) k (1 + 3 * 0.044715 z^2), u = k (z + 0.044715 z^3).
"""
import math

import numpy as np

from .precision import mm

GELU_K = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715


def gelu(z):
    return 0.5 * z * (1.0 + np.tanh(GELU_K * (z + GELU_C * z * z * z)))


def gelu_grad(z):
    th = np.tanh(GELU_K * (z + GELU_C * z * z * z))
    return 0.5 * (1.0 + th) + 0.5 * z * (1.0 - th * th) * GELU_K * (1.0 + 3.0 * GELU_C * z * z)


def mlp_fwd(x, w_1, w_2):
    """x [B, T, C], w_1 [C, 4C], w_2 [4C, C] -> out [B, T, C];
    saved for backward: h_pre [B, T, 4C] (before GELU) and h [B, T, 4C] (after GELU)."""
    h_pre = mm(x, w_1)
    h = gelu(h_pre)
    return mm(h, w_2), h_pre, h


def mlp_bwd(dout, x, h_pre, h, w_1, w_2):
    """dout [B, T, C] -> (dx [B, T, C], dw_1 [C, 4C], dw_2 [4C, C])."""
    C, F = x.shape[-1], h.shape[-1]
    dw_2 = mm(h.reshape(-1, F).T, dout.reshape(-1, C))     # [4C, C]
    dh_pre = mm(dout, w_2.T) * gelu_grad(h_pre)            # [B, T, 4C]
    dw_1 = mm(x.reshape(-1, C).T, dh_pre.reshape(-1, F))   # [C, 4C]
    dx = mm(dh_pre, w_1.T)                                 # [B, T, C]
    return dx, dw_1, dw_2
