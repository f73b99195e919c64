"""Exercise residual_bwd (NumPy): the backward of the residual connection.

Forward (given: reference/residual.py, imported below):
    out = x + f              x: the residual stream, f: what a sublayer adds to it

Your task: the backward, given dout [B, T, C]. Each output element is x + f, and
d(x + f)/dx = 1, d(x + f)/df = 1, so
    dx = dout        df = dout
Return two separate arrays (copies), so that a later in-place update of one cannot change the other.

Check your work:  python -m andrea_numba.exercises check residual_bwd
"""
from reference.residual import residual_add  # noqa: F401  (the forward, to experiment with)


def residual_add_bwd(dout):
    """dout [B, T, C] -> (dx, df), both [B, T, C]."""
    # TODO: return the gradient of both terms of the sum
    raise NotImplementedError("write residual_add_bwd: see the docstring")
