"""Kernel exercise k_embed_bwd_wpe (Numba CUDA): the position-embedding gradient.

The math (NumPy twin: reference/embed.py). The forward added wpe[t, :] to every sequence b at
position t, so the gradient of wpe sums over the batch:
    dwpe[t, c] += sum over b of dout[b, t, c]         for t < T   (rows t >= T are left alone)

dwpe is a gradient buffer that ACCUMULATES (+=): it may already hold gradient from earlier
microbatches (the checker pre-fills it with random values and checks what you added).
Sums must have a fixed order (no atomics): each thread sums over b in a loop, in order.

The launch (given, below) starts one thread per element (t, c) of dwpe[:T]: i = cuda.grid(1),
t = i // C, c = i % C; threads with i >= T*C do nothing.

Your task: the body of k_embed_bwd_wpe.

Check your work:  python -m andrea_numba.exercises check k_embed_bwd_wpe
"""
from numba import cuda, float32

from andrea_numba.kernels.common import elementwise_launch


@cuda.jit
def k_embed_bwd_wpe(dwpe, dout):
    """dwpe[t, c] += sum_b dout[b, t, c]; dout [B, T, C], dwpe [T_max, C]."""
    # TODO: i = cuda.grid(1); guard i < T*C; sum dout[b, t, c] over b in float32; add into dwpe
    raise NotImplementedError("write k_embed_bwd_wpe: see the docstring")


def embed_bwd_wpe(dwpe, dout, stream=0):
    """Given: dwpe [T_max, C] (+=), dout [B, T, C]. One thread per element of dwpe[:T], 256 per
    block on a GPU (32 in the simulator)."""
    B, T, C = dout.shape
    blocks, threads = elementwise_launch(T * C)
    k_embed_bwd_wpe[blocks, threads, stream](dwpe, dout)
