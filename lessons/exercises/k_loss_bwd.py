"""Kernel exercise k_loss_bwd (Numba CUDA): the gradient of the logits, one row per block.

The math (NumPy twin: reference/loss.py). The forward computed, for N = B*T rows,
    logits = x @ wte^T [N, V],   probs = softmax(logits) [N, V],   loss = mean_n -log probs[n, targets[n]]
Backward from dloss:
    dlogits[n, v] = (probs[n, v] - (1 if v == targets[n] else 0)) * scale,   scale = dloss / N
then (given, below) dx = dlogits @ wte and dwte += dlogits^T @ x with the tiled matmul.

The launch starts one block per row (blockIdx.x = the row n); the block's threads stride over
the V entries of the row: v = threadIdx.x, threadIdx.x + blockDim.x, ... while v < V.
scale arrives as a float32: multiply by it, do not recompute it.

Your task: the body of k_loss_bwd (it writes every element of dlogits).

Check your work:  python -m andrea_numba.exercises check k_loss_bwd
"""
import numpy as np
from numba import cuda, float32

from andrea_numba.kernels.common import pow2_threads
from andrea_numba.kernels.matmul import matmul


@cuda.jit
def k_loss_bwd(dlogits, probs, targets, scale):
    """dlogits[n, v] = (probs[n, v] - (v == targets[n])) * scale for row n = blockIdx.x."""
    # TODO: row = cuda.blockIdx.x; loop v over the row with a block stride; subtract 1 at the target
    raise NotImplementedError("write k_loss_bwd: see the docstring")


def loss_bwd(dx, dwte, dlogits, dloss, x, wte, probs, targets, stream=0):
    """Given: dx [N, C] (written); dwte [V, C] (+=); dlogits [N, V] work buffer; dloss a scalar;
    x [N, C]; wte [V, C]; probs [N, V]; targets [N] int32. Your kernel: N blocks of up to 256
    threads (4 in the simulator); then the two products."""
    N, V = probs.shape
    scale = np.float32(float(dloss) / N)
    k_loss_bwd[N, pow2_threads(V, gpu_max=256, sim_max=4), stream](dlogits, probs, targets, scale)
    matmul(dx, dlogits, wte, stream=stream)                                   # dx = dlogits @ wte
    matmul(dwte, dlogits, x, trans_a=True, accumulate=True, stream=stream)    # dwte += dlogits^T @ x
