"""The lab's rungs of andrea_numba/kernels/dropout.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
"""
from andrea_numba.kernels.dropout import *  # noqa: F401,F403  (the engine's rungs and helpers)


VERSIONS = {"dropout_fwd": {1: dropout_fwd}, "dropout_bwd": {1: dropout_bwd}}
