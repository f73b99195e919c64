"""Dropout: k_dropout_fwd / k_dropout_bwd, and the mask as a device function. NumPy twin:
reference/dropout.py (the hash, the keys and the threshold are explained there).

Arrays are flat (any shape, passed as .reshape(-1)); element i of a call with key `key`:

    u_i    = hash32((i * 0x9E3779B9 + key) mod 2^32)          (lowbias32)
    keep_i = u_i >= threshold,  threshold = round(p * 2^32)
    out_i  = x_i * keep_i / (1 - p)          dx_i = dout_i * keep_i / (1 - p)

Nothing is stored between forward and backward: both compute keep_i again from (key, i). The
attention kernels (attn.py) call `dropout_factor` on their probabilities the same way, with i
the flat index of att[b, h, t, u]. With p = 0 the threshold is 0, every element is kept and the
factor is exactly 1.0, so the results are bit-identical to no dropout at all.

Integer arithmetic is on uint64 holding 32-bit values (masked after each multiply), the same in
a kernel, in the simulator and in NumPy: the kernels draw the twin's mask bit for bit.

Where the key lives: a launcher takes `dropout_key` as a number (the twin's argument: the harness,
the lessons) or as a one-element uint64 device array holding it (the engine). The engine's keys
change every step and microbatch; it writes them to the device before a step, so that a CUDA graph
captured once (andrea_numba/train.py) replays every step with that step's keys. Each kernel reads
its key once, with key_value, whichever of the two it got.
"""
import numpy as np
from numba import cuda, float32, uint64

import reference.dropout as twin

from .common import blocks, cdiv, rung, SIMULATOR

if not SIMULATOR:      # key_value's compiled form (below); the simulator runs its Python body
    from numba.core import types as _types
    from numba.cuda.extending import overload

M32 = np.uint64(twin.M32)
GOLDEN = np.uint64(twin.GOLDEN)
MUL1, MUL2 = np.uint64(0x7FEB352D), np.uint64(0x846CA68B)
S15, S16 = np.uint64(15), np.uint64(16)


@cuda.jit(device=True)
def hash32(x):
    """lowbias32 of a 32-bit value held in a uint64: xor-shift, multiply, xor-shift, multiply,
    xor-shift (every step a bijection of the 32-bit integers)."""
    x ^= x >> S16
    x = (x * MUL1) & M32
    x ^= x >> S15
    x = (x * MUL2) & M32
    x ^= x >> S16
    return x


def key_value(dropout_key):
    """The key itself, or dropout_key[0] when it is a one-element device array. Numba compiles a
    kernel once per argument type; the overload below gives each compilation its read (the
    simulator runs this Python body)."""
    return dropout_key if isinstance(dropout_key, (int, np.integer)) else dropout_key[0]


if not SIMULATOR:
    @overload(key_value, target="cuda")
    def _key_value(dropout_key):
        if isinstance(dropout_key, _types.Array):
            return lambda dropout_key: dropout_key[0]
        return lambda dropout_key: dropout_key


@cuda.jit(device=True)
def dropout_factor(key, i, threshold, scale):
    """keep_i / (1 - p): `scale` (= 1 / (1 - p), float32) if element i is kept, else 0.
    key, threshold: uint64 (threshold 0: p = 0, always kept)."""
    if threshold == uint64(0):
        return scale
    u = hash32((uint64(i) * GOLDEN + key) & M32)
    return scale if u >= threshold else float32(0.0)


def mask_args(dropout_p, dropout_key):
    """The kernels' (key, threshold, scale) for probability dropout_p and key dropout_key: a
    number, or a one-element uint64 device array holding it (passed on as it is)."""
    if isinstance(dropout_key, (int, np.integer)):
        key = np.uint64(int(dropout_key) & twin.M32)
    else:
        assert dropout_key.dtype == np.uint64 and dropout_key.size == 1, \
            f"dropout_key: a number or a one-element uint64 device array, got {dropout_key.dtype} {dropout_key.shape}"
        key = dropout_key
    return key, np.uint64(twin.threshold(dropout_p)), np.float32(1.0 / (1.0 - dropout_p))


@cuda.jit
def k_dropout_fwd(out, x, dropout_key, threshold, scale):
    """out[i] = x[i] * keep_i / (1 - p), one thread per element (out may be x: in place is fine)."""
    key = key_value(dropout_key)
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * dropout_factor(key, i, threshold, scale)


@cuda.jit
def k_dropout_bwd(dx, dout, dropout_key, threshold, scale):
    """dx[i] = dout[i] * keep_i / (1 - p): the forward's mask, drawn again from (key, i)."""
    key = key_value(dropout_key)
    i = cuda.grid(1)
    if i < dout.shape[0]:
        dx[i] = dout[i] * dropout_factor(key, i, threshold, scale)


@rung(1)
@blocks(gpu=(256, 128, 512), sim=(32, 8))
def dropout_fwd(out, x, dropout_p, dropout_key, *, block, stream=0):
    """out, x: float32 [n] (flat). Launch: one thread per element, `block` threads per block."""
    k_dropout_fwd[cdiv(out.shape[0], block), block, stream](out, x, *mask_args(dropout_p, dropout_key))


@rung(1)
@blocks(gpu=(256, 128, 512), sim=(32, 8))
def dropout_bwd(dx, dout, dropout_p, dropout_key, *, block, stream=0):
    """dx, dout: float32 [n] (flat). Launch: one thread per element, `block` threads per block."""
    k_dropout_bwd[cdiv(dout.shape[0], block), block, stream](dx, dout, *mask_args(dropout_p, dropout_key))


