"""The lab's rungs of andrea_numba/kernels/wgmma_tile.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
"""
from andrea_numba.kernels.wgmma_tile import *  # noqa: F401,F403  (the engine's rungs and helpers)


def wgmma_resolve(block, a16, b16):
    """The full tile of a v14 launch: ("v14", BM, BN, BK, WM, WN, vec, STAGES); vec when both
    K-major copies' rows are whole 16-byte chunks (half_tile.async_resolve's rule)."""
    return ("v14", *async_resolve(block, a16, b16)[1:])
