"""Residual connection: the NumPy twin of k_residual_add / k_residual_add_bwd.

    out = x + f              dx = dout, df = dout

The gradient of a sum is copied to both branches. The reverse also holds: where one tensor feeds
two branches (the residual stream feeds the skip and the LayerNorm), the two incoming gradients
add, and the model's backward uses residual_add for exactly that sum.
"""


def residual_add(x, f):
    """x, f [B, T, C] -> out [B, T, C]. Nothing is saved."""
    return x + f


def residual_add_bwd(dout):
    """dout [B, T, C] -> (dx, df), both [B, T, C] and equal to dout."""
    return dout.copy(), dout.copy()
