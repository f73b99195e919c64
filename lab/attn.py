"""The lab's rungs of andrea_numba/kernels/attn.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
"""
from andrea_numba.kernels.attn import *  # noqa: F401,F403  (the engine's rungs and helpers)


VERSIONS = {"attn_fwd": {1: attn_fwd, 2: attn_fwd_tiled}, "attn_bwd": {1: attn_bwd, 2: attn_bwd_tiled}}
