"""Kernel exercise k_residual_add_bwd (Numba CUDA, warm-up): the residual backward on the GPU.

The math (NumPy twin: reference/residual.py):
    out = x + f         =>        dx = dout,   df = dout

Arrays are flat float32 device arrays of n elements. The launch (given, below) starts one thread
per element, rounded up to whole blocks: thread i = cuda.grid(1) handles element i, and the
threads past the end (i >= n) must do nothing.

Your task: the body of k_residual_add_bwd. Every element of dx and df must be written (the checker
fills them with NaN before the launch, so a forgotten element shows).

Check your work:  python -m andrea_numba.exercises check k_residual_add_bwd
(no GPU: the kernel runs in Numba's CUDA simulator, one Python thread per CUDA thread)
"""
from numba import cuda

from andrea_numba.kernels.common import elementwise_launch


@cuda.jit
def k_residual_add_bwd(dx, df, dout):
    """dx[i] = dout[i], df[i] = dout[i] for every i < dout.shape[0]."""
    # TODO: i = cuda.grid(1); guard i < dout.shape[0]; write dx[i] and df[i]
    raise NotImplementedError("write k_residual_add_bwd: see the docstring")


def residual_add_bwd(dx, df, dout, stream=0):
    """Given: dx, df (written), dout: flat [n]. One thread per element, 256 per block on a GPU
    (32 in the simulator)."""
    blocks, threads = elementwise_launch(dout.shape[0])
    k_residual_add_bwd[blocks, threads, stream](dx, df, dout)
