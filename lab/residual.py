"""The lab's rungs of andrea_numba/kernels/residual.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
"""
from andrea_numba.kernels.residual import *  # noqa: F401,F403  (the engine's rungs and helpers)


VERSIONS = {"residual_add": {1: residual_add}, "residual_add_bwd": {1: residual_add_bwd}}
