"""Token + position embedding: the NumPy twin of k_embed_fwd / k_embed_bwd.

    x[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]

Backward: tokens are integers, so there is no grad_input; the gradient flows into the rows that
were looked up. A token id that occurs n times gets the sum of its n rows of dout.
"""
import numpy as np


def embed_fwd(tokens, wte, wpe):
    """tokens [B, T] int, wte [V, C], wpe [T_max, C] -> x [B, T, C]. Saved for backward: tokens."""
    T = tokens.shape[1]
    x = wte[tokens] + wpe[:T]                  # [B, T, C]
    return x


def embed_bwd(dout, tokens, vocab_size, context_length):
    """dout [B, T, C] -> (dwte [vocab_size, C], dwpe [context_length, C])."""
    B, T, C = dout.shape
    dwte = np.zeros((vocab_size, C), dout.dtype)             # [V, C]
    np.add.at(dwte, tokens.reshape(-1), dout.reshape(B * T, C))   # repeated ids add up
    dwpe = np.zeros((context_length, C), dout.dtype)         # [T_max, C]
    dwpe[:T] = dout.sum(axis=0)                # every sequence uses positions 0..T-1
    return dwte, dwpe
