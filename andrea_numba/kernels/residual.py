"""Residual connection: k_residual_add / k_residual_add_bwd. NumPy twin: reference/residual.py.

Arrays are flat (any shape, passed as .reshape(-1)).

    out = x + f                     dx = dout, df = dout

The lessons' pair: the engine fuses each residual add into the LayerNorm after it
(layernorm.residual_layernorm_fwd / _bwd), whose backward adds the skip path's gradient to the
LayerNorm's in the same pass. residual_add also adds two gradients where they meet.
"""
from numba import cuda

from .common import blocks, cdiv, rung


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


@rung(1)
@blocks(gpu=(256, 128, 512), sim=(32, 8))
def residual_add(out, x, f, *, block, stream=0):
    """out, x, f: float32 [n] (flat). Launch: one thread per element, `block` threads per block."""
    k_residual_add[cdiv(out.shape[0], block), block, stream](out, x, f)


@rung(1)
@blocks(gpu=(256, 128, 512), sim=(32, 8))
def residual_add_bwd(dx, df, dout, *, block, stream=0):
    """dx, df, dout: float32 [n] (flat). Launch: one thread per element, `block` threads per block."""
    k_residual_add_bwd[cdiv(dout.shape[0], block), block, stream](dx, df, dout)
