"""Residual connection: k_residual_add / k_residual_add_bwd. NumPy twin: reference/residual.py.

Arrays are flat (any shape, passed as .reshape(-1)).

    out = x + f                     dx = dout, df = dout

The engine also uses k_residual_add where two gradients meet: the residual stream feeds both the
skip path and a LayerNorm, so its gradient is the sum of the two.
"""
from numba import cuda

from .common import elementwise_launch


@cuda.jit
def k_residual_add(out, x, f):
    """out[i] = x[i] + f[i], one thread per element (out may be x or f: in place is fine)."""
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] + f[i]


@cuda.jit
def k_residual_add_bwd(dx, df, dout):
    """dx[i] = dout[i], df[i] = dout[i]: the gradient of a sum reaches both terms unchanged."""
    i = cuda.grid(1)
    if i < dout.shape[0]:
        g = dout[i]
        dx[i] = g
        df[i] = g


def residual_add(out, x, f, stream=0):
    blocks, threads = elementwise_launch(out.shape[0])
    k_residual_add[blocks, threads, stream](out, x, f)


def residual_add_bwd(dx, df, dout, stream=0):
    blocks, threads = elementwise_launch(dout.shape[0])
    k_residual_add_bwd[blocks, threads, stream](dx, df, dout)
