"""Dropout with a counter-based random number: the NumPy twin of k_dropout_fwd / k_dropout_bwd.

During training, dropout zeroes each element of an activation with probability p and scales the
survivors by 1 / (1 - p), so the expected value is unchanged:

    out_i = x_i * keep_i / (1 - p)          keep_i = 1 with probability 1 - p, else 0
    dx_i  = dout_i * keep_i / (1 - p)       (the same mask: a kept element passes its gradient)

The mask is never stored. keep_i is a pure function of a 32-bit key and the element's flat index
i, computed again by the backward (and by a resumed run):

    u_i    = hash32((i * 0x9E3779B9 + key) mod 2^32)     a well-mixed 32-bit integer
    keep_i = u_i >= threshold,   threshold = round(p * 2^32)

hash32 is "lowbias32" (C. Wellons' integer hash: xor-shift, multiply, xor-shift, multiply,
xor-shift; each step is a bijection of the 32-bit integers, so distinct indices of one call get
distinct u_i). It is not a cryptographic generator; tests/test_dropout.py checks that the kept
fraction is 1 - p and that neighbouring elements and neighbouring keys are uncorrelated.

One key per (seed, optimiser step, microbatch, site), from dropout_key and site_key: the site is
3 * layer + 0 (attention probabilities), + 1 (attention output), + 2 (MLP output). So dropout
needs no random state, the kernels and this twin draw the same mask, and resuming from a
checkpoint at step s draws exactly the masks the uninterrupted run drew.
"""
import numpy as np

M32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9           # 2^32 / golden ratio: spreads consecutive indices before the hash
SITES = 3                     # dropout sites per block: attention probabilities, attention output, MLP output


def hash32(x):
    """lowbias32 over uint64 arrays (or Python ints) holding 32-bit values."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def dropout_key(seed: int, step: int, micro: int) -> int:
    """The 32-bit key of one microbatch's forward: a hash of (seed, step, microbatch)."""
    k = hash32(seed & M32)
    k = hash32(k ^ (step & M32))
    return int(hash32(k ^ (micro & M32)))


def site_key(key: int, site: int) -> int:
    """The key of one dropout site (3 * layer + 0, 1 or 2) within a forward."""
    return int(hash32((key ^ ((site + 1) * GOLDEN)) & M32))


def block_keys(key, layer: int) -> tuple:
    """The keys of block `layer`'s three sites (attention probabilities, attention output, MLP
    output), from a forward's key; (0, 0, 0) when key is None (no dropout)."""
    if key is None:
        return 0, 0, 0
    return tuple(site_key(key, SITES * layer + s) for s in range(SITES))


def threshold(p: float) -> int:
    """keep_i = u_i >= threshold: round(p * 2^32), so P(keep) = 1 - p to within 2^-32."""
    assert 0.0 <= p < 1.0, f"dropout probability {p} must lie in [0, 1)"
    return int(round(p * 2.0 ** 32))


def keep_mask(n: int, dropout_p: float, dropout_key: int):
    """keep_i for the flat indices i = 0 .. n-1, as a bool array."""
    i = np.arange(n, dtype=np.uint64)
    u = hash32((i * np.uint64(GOLDEN) + np.uint64(dropout_key)) & np.uint64(M32))
    return u >= np.uint64(threshold(dropout_p))


def dropout_factor(shape, dropout_p: float, dropout_key: int, dtype=np.float64):
    """keep / (1 - p) for an array of `shape` (flat index in C order): 0 or 1 / (1 - p)."""
    keep = keep_mask(int(np.prod(shape)), dropout_p, dropout_key).reshape(shape)
    return keep.astype(dtype) * dtype(1.0 / (1.0 - dropout_p))


def dropout_fwd(x, dropout_p, dropout_key):
    """out = x * keep / (1 - p); p = 0 returns x unchanged."""
    if dropout_p == 0.0:
        return x.copy()
    return x * dropout_factor(x.shape, dropout_p, dropout_key, x.dtype.type)


def dropout_bwd(dout, dropout_p, dropout_key):
    """dx = dout * keep / (1 - p): the same mask as the forward."""
    if dropout_p == 0.0:
        return dout.copy()
    return dout * dropout_factor(dout.shape, dropout_p, dropout_key, dout.dtype.type)
