"""Exercise mlp_bwd (NumPy): the backward of the MLP, GELU derivative included.

Forward (given: reference/mlp.py, imported below):
    h_pre = x @ W_1          [B, T, 4C]       x [B, T, C], W_1 [C, 4C]
    h     = gelu(h_pre)      [B, T, 4C]       both saved for you
    out   = h @ W_2          [B, T, C]        W_2 [4C, C]
with the tanh-form GELU
    gelu(z) = 0.5 z (1 + tanh(u)),    u = k (z + 0.044715 z^3),    k = sqrt(2 / pi)

Your task, in two parts.
1. gelu_grad(z), the derivative of gelu: the product rule, and the chain rule through tanh:
       gelu'(z) = 0.5 (1 + tanh(u)) + 0.5 z (1 - tanh(u)^2) du/dz,   du/dz = k (1 + 3 * 0.044715 z^2)
2. mlp_bwd, given dout [B, T, C]; walk the forward backwards:
       dW_2   = h^T @ dout          (over all B*T rows)      dh = dout @ W_2^T
       dh_pre = dh * gelu'(h_pre)   (element by element)
       dW_1   = x^T @ dh_pre        (over all B*T rows)      dx = dh_pre @ W_1^T

Check your work:  python -m andrea_numba.exercises check mlp_bwd
(the check also tests gelu_grad alone, against centred differences of gelu)
"""
import math

import numpy as np

from reference.mlp import gelu, mlp_fwd  # noqa: F401  (the forward, to experiment with)

GELU_K = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715


def gelu_grad(z):
    """d gelu(z) / dz, element by element."""
    u = GELU_K * (z + GELU_C * z ** 3)
    th = np.tanh(u)
    du_dz = GELU_K * (1.0 + 3.0 * GELU_C * z ** 2)
    return 0.5 * (1.0 + th) + 0.5 * z * (1.0 - th * th) * du_dz


def mlp_bwd(dout, x, h_pre, h, w_1, w_2):
    """dout [B, T, C] -> (dx [B, T, C], dw_1 [C, 4C], dw_2 [4C, C])."""
    C, F = x.shape[-1], h.shape[-1]
    dw_2 = h.reshape(-1, F).T @ dout.reshape(-1, C)           # [4C, C]
    dh = dout @ w_2.T                                         # [B, T, 4C]
    dh_pre = dh * gelu_grad(h_pre)                            # [B, T, 4C]
    dw_1 = x.reshape(-1, C).T @ dh_pre.reshape(-1, F)         # [C, 4C]
    dx = dh_pre @ w_1.T                                       # [B, T, C]
    return dx, dw_1, dw_2
