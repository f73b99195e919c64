"""The lab's rungs of andrea_numba/kernels/fp8_products.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
"""
from andrea_numba.kernels.fp8_products import *  # noqa: F401,F403  (the engine's rungs and helpers)


def matmul_versions() -> dict:
    """{24: matmul_fp8} where FP8 products run (matmul.VERSIONS), none elsewhere."""
    return {} if fp8_unavailable() else {24: matmul_fp8}
