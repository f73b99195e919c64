"""D = dy . y: the row sums that flash attention's backward starts from (attn_flash.py's docstring).

    D[b, h, t] = sum_d dy[b, t, h hs + d] y[b, t, h hs + d]        (= sum_u P[t, u] datt[t, u])

One kernel, k_attn_flash_bwd_rowdot, a thread per (b, h, t), launched before the dq and dk/dv
kernels by the lessons' flash backward (attn_flash.py's attn_flash_bwd) and by the lab's
tensor-core rungs 2 to 8; the recipes' dq kernels work D out themselves, in the same order (the
same bits). It sits below those modules, which all import it. NumPy twin: reference/attn.py
(attn_flash_bwd).
"""
from numba import cuda, float32

from .attn import _split


@cuda.jit
def k_attn_flash_bwd_rowdot(d_rowdot, dy, y):
    """Thread (b, h, t): d_rowdot[b, h, t] = D[t] = sum_d dy[b, t, c0 + d] y[b, t, c0 + d] over
    the head's hs channels (c0 = h * hs), in channel order. The softmax backward's row sum
    sum_u P[t, u] datt[t, u], without a row of P or datt."""
    B, H, T = d_rowdot.shape
    hs = dy.shape[2] // H
    idx = cuda.grid(1)
    if idx >= B * H * T:
        return
    b, h, t = _split(B, H, T, idx)
    c0 = h * hs
    acc = float32(0.0)
    for d in range(hs):
        acc += dy[b, t, c0 + d] * y[b, t, c0 + d]
    d_rowdot[b, h, t] = acc
