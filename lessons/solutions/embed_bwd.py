"""Exercise embed_bwd (NumPy): the backward of the token + position embedding.

Forward (given: reference/embed.py, imported below):
    x[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]
    tokens [B, T] int,  wte [V, C] (one row per token id),  wpe [T_max, C] (one row per position)

Your task: the backward. The tokens are integers, so they get no gradient; the gradient flows into
the rows that were looked up:
    dwte[v, :] = sum of dout[b, t, :] over the positions (b, t) with tokens[b, t] == v
    dwpe[t, :] = sum over b of dout[b, t, :]         for t < T   (rows t >= T were not used: 0)

Careful: a token id usually occurs more than once. Each occurrence must add its row of dout.

Check your work:  python -m andrea_numba.exercises check embed_bwd
"""
import numpy as np

from reference.embed import embed_fwd  # noqa: F401  (the forward, to experiment with)


def embed_bwd(dout, tokens, vocab_size, context_length):
    """dout [B, T, C] -> (dwte [vocab_size, C], dwpe [context_length, C])."""
    B, T, C = dout.shape
    dwte = np.zeros((vocab_size, C))                             # [V, C]
    np.add.at(dwte, tokens.reshape(-1), dout.reshape(B * T, C))  # repeated ids add up
    dwpe = np.zeros((context_length, C))                         # [T_max, C]
    dwpe[:T] = dout.sum(axis=0)                                  # positions 0..T-1, summed over b
    return dwte, dwpe
