"""The lab's rungs of andrea_numba/kernels/attn.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.

v1 (attn_fwd, attn_bwd, the lessons'): one thread per (b, h, row), everything from global memory.
v2 (attn_fwd_tiled, attn_bwd_tiled, the engine's without flash): query and key tiles in shared
    memory, a block of BQ rows x TPR lanes (docs/kernels.md has both timed on the H200).
Both are in the engine; flash attention (lab/attn_flash.py) is the ladder that trains.
"""
from andrea_numba.kernels.attn import *  # noqa: F401,F403  (the engine's rungs and helpers)


VERSIONS = {"attn_fwd": {1: attn_fwd, 2: attn_fwd_tiled}, "attn_bwd": {1: attn_bwd, 2: attn_bwd_tiled}}
