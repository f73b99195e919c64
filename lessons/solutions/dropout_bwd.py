"""Exercise dropout_bwd (NumPy): the backward of dropout, drawing the forward's mask again.

Forward (given: reference/dropout.py, imported below). Element i of x (flat index, C order) is
kept with probability 1 - p and scaled so that the expected value is unchanged:
    out_i = x_i * keep_i / (1 - p)
The mask is never stored. keep_i is a pure function of a 32-bit key and the index i:
    u_i    = hash32((i * GOLDEN + dropout_key) mod 2^32)       (hash32, GOLDEN, M32: given)
    keep_i = u_i >= threshold(dropout_p)                         (threshold: given)
Do the integer arithmetic on uint64 arrays and mask with M32 after the multiply.

Your task: the backward, given dout (any shape). out_i depends on x_i alone, with slope
keep_i / (1 - p), so
    dx_i = dout_i * keep_i / (1 - p)
Draw the mask yourself from the key (the same key and indices as the forward), and return dx of
dout's shape. With dropout_p = 0 every element is kept: dx = dout.

Check your work:  python -m andrea_numba.exercises check dropout_bwd
"""
import numpy as np

from reference.dropout import GOLDEN, M32, dropout_fwd, hash32, threshold  # noqa: F401  (given)


def dropout_bwd(dout, dropout_p, dropout_key):
    """dout (any shape) -> dx of the same shape."""
    i = np.arange(dout.size, dtype=np.uint64)                       # flat indices, C order
    u = hash32((i * np.uint64(GOLDEN) + np.uint64(dropout_key)) & np.uint64(M32))
    keep = (u >= np.uint64(threshold(dropout_p))).reshape(dout.shape)
    return dout * keep / (1.0 - dropout_p)
