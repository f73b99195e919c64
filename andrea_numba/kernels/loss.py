"""Tied output projection + softmax cross-entropy: k_loss_fwd / k_loss_bwd. NumPy twin:
reference/loss.py.

Arrays are 2-D: N = B*T rows (callers pass x.reshape(N, C), targets.reshape(N)).
This pair owns the output projection, which shares its weights with the token embedding:

    logits = x @ wte^T                                  [N, V]    (matmul, written into probs)
    m      = max_v logits[n, v]                         per row, for a stable exp
    se     = sum_v exp(logits[n, v] - m)
    probs[n, v] = exp(logits[n, v] - m) / se            saved for backward
    losses[n]   = (log(se) + m) - logits[n, targets[n]]          = logsumexp - picked logit
    loss        = (1/N) sum_n losses[n]

Backward from dloss (1.0 when loss is the final output):
    dlogits = (probs - onehot(targets)) * dloss / N     [N, V]    (may overwrite probs in place)
    dx      = dlogits @ wte                             [N, C]    written
    dwte   += dlogits^T @ x                             [V, C]    added to the embedding's gradient
"""
import math

import numpy as np
from numba import cuda, float32

from .common import MAX_BLOCK, block_max, block_sum, pow2_threads
from .matmul import matmul


def _row_threads(V):
    return pow2_threads(V, gpu_max=1024, sim_max=4)


# ---------------------------------------------------------------------------------------------
# forward

@cuda.jit
def k_loss_fwd(losses, probs, targets):
    """probs [N, V] holds the logits on entry and the softmax on exit, row by row.
    One block per row; its threads stride over the V entries and meet in block_max / block_sum.
    Three passes over the row: max, sum of exponentials, write probs."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    row = cuda.blockIdx.x
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    V = probs.shape[1]
    picked = probs[row, targets[row]]        # read before any thread overwrites the row (the
                                             # block_max/block_sum below synchronise the block)
    m = float32(-math.inf)
    for v in range(tid, V, nt):
        m = max(m, probs[row, v])
    m = block_max(buf, m)
    s = float32(0.0)
    for v in range(tid, V, nt):
        s += math.exp(probs[row, v] - m)
    se = block_sum(buf, s)
    for v in range(tid, V, nt):
        probs[row, v] = math.exp(probs[row, v] - m) / se
    if tid == 0:
        losses[row] = (math.log(se) + m) - picked


@cuda.jit
def k_loss_mean(loss, losses):
    """loss[0] = (1/N) sum_n losses[n]: a single block; each thread sums a stride of the rows in
    order, then block_sum's tree. Fixed order: deterministic."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    N = losses.shape[0]
    s = float32(0.0)
    for n in range(tid, N, nt):
        s += losses[n]
    total = block_sum(buf, s)
    if tid == 0:
        loss[0] = total / float32(N)


def loss_fwd(loss, losses, probs, x, wte, targets, stream=0):
    """loss [1]; losses [N]; probs [N, V] (written); x [N, C]; wte [V, C]; targets [N] int32.
    Launch: the matmul for the logits; k_loss_fwd, N blocks of up to 1024 threads (4 in the
    simulator); k_loss_mean, one block of up to 1024 threads."""
    N, V = probs.shape
    matmul(probs, x, wte, trans_b=True, stream=stream)          # logits = x @ wte^T, into probs
    k_loss_fwd[N, _row_threads(V), stream](losses, probs, targets)
    k_loss_mean[1, pow2_threads(N, gpu_max=1024, sim_max=4), stream](loss, losses)


# ---------------------------------------------------------------------------------------------
# backward

@cuda.jit
def k_loss_bwd(dlogits, probs, targets, scale):
    """dlogits[n, v] = (probs[n, v] - (v == targets[n])) * scale, scale = dloss / N.
    One block per row, threads striding over V. Each thread reads an element before writing the
    same element, so dlogits may be the same array as probs."""
    row = cuda.blockIdx.x
    target = targets[row]
    for v in range(cuda.threadIdx.x, probs.shape[1], cuda.blockDim.x):
        p = probs[row, v]
        if v == target:
            p -= float32(1.0)
        dlogits[row, v] = p * scale


def loss_bwd(dx, dwte, dlogits, probs, x, wte, targets, dloss, stream=0):
    """dx [N, C] (written); dwte [V, C] (+=); dlogits [N, V] work buffer (may be probs itself);
    probs [N, V]; x [N, C]; wte [V, C]; targets [N] int32; dloss a scalar.
    Launch: k_loss_bwd, N blocks of up to 256 threads (4 in the simulator); then two matmuls."""
    N, V = probs.shape
    scale = np.float32(float(dloss) / N)                    # as the twin: dloss / N, then float32
    k_loss_bwd[N, pow2_threads(V, gpu_max=256, sim_max=4), stream](dlogits, probs, targets, scale)
    matmul(dx, dlogits, wte, stream=stream)                                   # dx = dlogits @ wte
    matmul(dwte, dlogits, x, trans_a=True, accumulate=True, stream=stream)    # dwte += dlogits^T @ x
