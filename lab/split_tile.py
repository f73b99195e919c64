"""The lab's rungs of andrea_numba/kernels/split_tile.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
"""
from andrea_numba.kernels.split_tile import *  # noqa: F401,F403  (the engine's rungs and helpers)


def split_bytes(BM: int, BN: int) -> int:
    """Shared memory of a split tile: 2 stages x 2 planes x (BM + BN) rows x 16 floats."""
    return 4 * 2 * 2 * (BM + BN) * BK_SPLIT
