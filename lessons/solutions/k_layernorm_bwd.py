"""Kernel exercise k_layernorm_bwd (Numba CUDA): the layernorm grad_input, one row per block.

The math (NumPy twin: reference/layernorm.py), per row of C channels, with
xhat = (x - mean) * rstd and dxhat = dout * g:
    dx = rstd * (dxhat - mean_c(dxhat) - xhat * mean_c(dxhat * xhat))

Arrays are 2-D float32: N = B*T rows of C channels; mean [N], rstd [N] come from the forward.
The launch (given, below) starts one block per row (blockIdx.x = the row) of nt threads, nt a
power of two, usually fewer than C: thread tid handles channels c = tid, tid + nt, tid + 2 nt, ...

The two means need the whole row, but each thread sees only its own channels. So:
  1. each thread sums its channels' dxhat and dxhat * xhat into two partial sums;
  2. block_sum(buf, partial) (from andrea_numba.kernels.common) adds the partial sums of all the
     threads of the block, in a fixed order, and returns the total to every thread;
     buf = cuda.shared.array(MAX_BLOCK, float32) is its shared-memory scratch;
     multiply the totals by float32(1.0) / float32(C) to get the means (stay in float32);
  3. each thread writes dx for its channels.
Every thread of the block must call block_sum (it waits for all of them at syncthreads).

dg and db (sums over the rows, one thread per channel) come from the given kernel below,
k_layernorm_bwd_params.

Check your work:  python -m andrea_numba.exercises check k_layernorm_bwd
"""
from numba import cuda, float32

from andrea_numba.kernels.common import MAX_BLOCK, SIMULATOR, block_sum, cdiv, pow2_threads


@cuda.jit
def k_layernorm_bwd(dx, dout, x, mean, rstd, g):
    """dx[row, :] for row = blockIdx.x; threads stride over the C channels."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    row = cuda.blockIdx.x
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    C = x.shape[1]
    inv_c = float32(1.0) / float32(C)
    mu, r = mean[row], rstd[row]
    s1 = float32(0.0)
    s2 = float32(0.0)
    for c in range(tid, C, nt):
        dxhat = dout[row, c] * g[c]
        s1 += dxhat
        s2 += dxhat * (x[row, c] - mu) * r
    m1 = block_sum(buf, s1) * inv_c                 # mean_c(dxhat)
    m2 = block_sum(buf, s2) * inv_c                 # mean_c(dxhat * xhat)
    for c in range(tid, C, nt):
        xhat = (x[row, c] - mu) * r
        dx[row, c] = r * (dout[row, c] * g[c] - m1 - xhat * m2)


@cuda.jit
def k_layernorm_bwd_params(dg, db, dout, x, mean, rstd):
    """Given: dg[c] += sum over rows of dout * xhat, db[c] += sum over rows of dout. One thread
    per channel c sums its column over all N rows, in row order (deterministic)."""
    c = cuda.grid(1)
    if c >= x.shape[1]:
        return
    sg = float32(0.0)
    sb = float32(0.0)
    for row in range(x.shape[0]):
        d = dout[row, c]
        sg += d * (x[row, c] - mean[row]) * rstd[row]
        sb += d
    dg[c] += sg
    db[c] += sb


def layernorm_bwd(dx, dg, db, dout, x, mean, rstd, g, stream=0):
    """Given: dx [N, C] (written); dg, db [C] (+=). Your kernel: N blocks of up to 256 threads
    (4 in the simulator); then the given k_layernorm_bwd_params, one thread per channel."""
    N, C = x.shape
    k_layernorm_bwd[N, pow2_threads(C, gpu_max=256, sim_max=4), stream](dx, dout, x, mean, rstd, g)
    threads = 32 if SIMULATOR else 128
    k_layernorm_bwd_params[cdiv(C, threads), threads, stream](dg, db, dout, x, mean, rstd)
