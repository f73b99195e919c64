"""Matrix products: the NumPy twin of andrea_numba/kernels/matmul.py (the products inside the
linear ops, the tied output projection and their gradients).

    out = op(a) @ op(b),   op(a) = a or a^T (trans_a),   op(b) = b or b^T (trans_b)
"""
from .precision import mm


def matmul(a, b, trans_a=False, trans_b=False):
    """a [M, K] (or [K, M] with trans_a), b [K, N] (or [N, K] with trans_b) -> out [M, N]
    (mm: a @ b, at the products' precision: reference/precision.py)."""
    return mm(a.T if trans_a else a, b.T if trans_b else b)
