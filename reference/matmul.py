"""Matrix products: the NumPy twin of andrea_numba/kernels/matmul.py (the products inside the
linear ops, the tied output projection and their gradients).

    out = op(a) @ op(b),   op(a) = a or a^T (trans_a),   op(b) = b or b^T (trans_b)
"""
from .precision import mm


def matmul(a, b, trans_a=False, trans_b=False, precision=None):
    """a [M, K] (or [K, M] with trans_a), b [K, N] (or [N, K] with trans_b) -> out [M, N];
    precision "bf16": the inputs rounded to bf16 first, as a bf16 product kernel does (precision.mm)."""
    return mm(a.T if trans_a else a, b.T if trans_b else b, precision)
