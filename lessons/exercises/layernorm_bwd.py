"""Exercise layernorm_bwd (NumPy): the backward of layer normalisation over the last axis.

Forward (given: reference/layernorm.py, imported below), per row of C channels:
    mean = (1/C) sum_c x_c          rstd = 1 / sqrt((1/C) sum_c (x_c - mean)^2 + eps)
    xhat = (x - mean) * rstd        out  = xhat * g + b
The forward saves mean [B, T] and rstd [B, T] for you.

Your task: the backward, given dout [B, T, C].
    dg = sum over all B*T rows of dout * xhat        db = sum over all B*T rows of dout
    with dxhat = dout * g, per row:
    dx = rstd * (dxhat - mean_c(dxhat) - xhat * mean_c(dxhat * xhat))

Why two means: every x_c moves the row's mean (first term) and its variance (second term), and
every output of the row depends on both.

Check your work:  python -m andrea_numba.exercises check layernorm_bwd
"""
from reference.layernorm import layernorm_fwd  # noqa: F401  (the forward, to experiment with)


def layernorm_bwd(dout, x, mean, rstd, g):
    """dout [B, T, C] -> (dx [B, T, C], dg [C], db [C])."""
    # TODO: rebuild xhat from x, mean, rstd; then dg, db and dx as in the docstring
    raise NotImplementedError("write layernorm_bwd: see the docstring")
