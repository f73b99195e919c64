"""The lab's rungs of andrea_numba/kernels/wgmma.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
"""
from andrea_numba.kernels.wgmma import *  # noqa: F401,F403  (the engine's rungs and helpers)


def kmajor_step_offset(step, rows, swizzle, lbo=128):
    """Byte offset of the k16 step `step` (k = 16 step ..) of a tile laid out by kmajor_offset:
    the start address of that step's descriptor, relative to the tile's start."""
    if swizzle == SWIZZLE_NONE:
        return step * 2 * lbo                            # two core matrices along K a step
    w = SWIZZLE_BYTES[swizzle]
    k0 = 16 * step
    return (k0 // (w // 2)) * (rows * w) + (k0 % (w // 2)) * 2   # unswizzled: the hardware XORs
