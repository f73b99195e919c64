"""Layer normalisation: k_layernorm_fwd / k_layernorm_bwd. NumPy twin: reference/layernorm.py.

Arrays are 2-D: N = B*T rows of C channels (callers pass x.reshape(N, C)).

    mean = (1/C) sum_c x_c          rstd = 1 / sqrt((1/C) sum_c (x_c - mean)^2 + eps)
    out  = (x - mean) * rstd * g + b

Backward, xhat = (x - mean) * rstd, dxhat = dout * g:
    dx = rstd * (dxhat - mean_c(dxhat) - xhat * mean_c(dxhat * xhat))     per row
    dg += sum over rows of dout * xhat,  db += sum over rows of dout        per channel

Two kinds of work, tiled differently. A row's statistics and dx are sums along the row: a block
(or part of one) takes a row, its threads striding over the channels and meeting in a tree in
shared memory. dg and db are sums down the columns, over all N rows: threads take channels, and
the rows are cut among more threads (and blocks) so that enough of the GPU works on them.

    the lessons' pair (layernorm_fwd, layernorm_bwd)
        k_layernorm_fwd            a block per row; block_sum for the mean, then for the variance
        k_layernorm_bwd            dx, a block per row; two block sums (the means of dxhat and dxhat xhat)
        k_layernorm_bwd_params     dg, db: a thread per channel sums its whole column, in row order
    the engine's (the recipes of andrea_numba/recipes.py)
        k_layernorm_bwd_multirow   dx with RW rows a block of RW x TPR threads (rows_sum: one tree's
                                   barriers for all of them)
        k_layernorm_bwd_params_partial, k_layernorm_bwd_params_sum
                                   dg, db in two stages: partial sums of chunks of rows, then the
                                   chunks added in order (layernorm_bwd_params_two_stage)
    the residual add fused with the LayerNorm after it (x + f, then its LayerNorm)
        k_residual_layernorm_fwd        RW rows a block, the sum written as it is made
        k_residual_layernorm_fwd_vec4   the same with 128-bit loads and stores, out in fp32 or bf16
        k_residual_layernorm_bwd        dx = dresid + the LayerNorm's grad_input (and df = dx)
        k_residual_layernorm_bwd_partials
                                   the same dx, and each block's partial sums of dg, db, added by
                                   k_layernorm_bwd_params_sum_tree
        k_residual_layernorm_bwd_bf16   the same, also writing dx's bf16 copy for the bf16 products
    (k_layernorm_bwd_params_tree, a block of CX x RY threads over all rows, gives the lessons'
    residual_layernorm_bwd its dg, db; k_layernorm_bwd_params_sum_unroll4 is stage 2 with its loads
    ahead, for residual_layernorm_bwd_two_stage, the fallback of the fused kernels.)

No atomics: every sum has a fixed order that depends only on the shapes and the launch, so the
same inputs give bit-identical outputs. The lab (lab/layernorm.py) holds the ladder: the other
rungs, and what each one measured.
"""
import math

import numpy as np

from numba import cuda, float32

from .common import (rung, ELEMENTWISE_THREADS, MAX_BLOCK, SIMULATOR, address, block_sum, blocks, cdiv, nonneg,
                     wide_rows)
from .ptx import bf16x2, load4_row, store4


@cuda.jit
def k_layernorm_fwd(out, mean, rstd, x, g, b, eps):
    """One block per row; the block's threads stride over the C channels and meet in block_sum."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    row = cuda.blockIdx.x
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    C = x.shape[1]
    inv_c = float32(1.0) / float32(C)          # keep the arithmetic in float32
    s = float32(0.0)
    for c in range(tid, C, nt):
        s += x[row, c]
    mu = block_sum(buf, s) * inv_c
    s = float32(0.0)
    for c in range(tid, C, nt):
        d = x[row, c] - mu
        s += d * d
    r = float32(1.0) / math.sqrt(block_sum(buf, s) * inv_c + eps)
    for c in range(tid, C, nt):
        out[row, c] = (x[row, c] - mu) * r * g[c] + b[c]
    if tid == 0:
        mean[row] = mu
        rstd[row] = r


@cuda.jit
def k_layernorm_bwd(dx, dout, x, mean, rstd, g):
    """grad_input: one block per row, two block sums (mean of dxhat and of dxhat * xhat)."""
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
    m1 = block_sum(buf, s1) * inv_c
    m2 = block_sum(buf, s2) * inv_c
    for c in range(tid, C, nt):
        xhat = (x[row, c] - mu) * r
        dx[row, c] = r * (dout[row, c] * g[c] - m1 - xhat * m2)


@cuda.jit
def k_layernorm_bwd_params(dg, db, dout, x, mean, rstd):
    """dg[c] += sum_rows dout * xhat, db[c] += sum_rows dout: one thread per channel c sums its
    column over all N rows, in row order. Consecutive threads read consecutive channels."""
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


# k_layernorm_bwd_params_tree's block: PARAM_CX channels x PARAM_RY row groups (RY a power of two)
PARAM_CX, PARAM_RY = (8, 2) if SIMULATOR else (32, 32)


@cuda.jit(device=True)
def column_sums(dout, x, mean, rstd, start, end):
    """(sum of dout * xhat, sum of dout) over rows start .. end - 1 of channel c = blockIdx.x * CX
    + tx, for thread (tx, ty = 0); other threads get partial values. A block of CX x RY threads:
    thread (tx, ty) sums rows start + ty, start + ty + RY, ... in order (a warp reads 32
    consecutive channels of a row: coalesced); then the RY partial sums of a channel meet in a
    fixed tree over ty in shared memory."""
    sg = cuda.shared.array((PARAM_RY, PARAM_CX), float32)
    sb = cuda.shared.array((PARAM_RY, PARAM_CX), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    c = cuda.blockIdx.x * cuda.blockDim.x + tx
    acc_g = float32(0.0)
    acc_b = float32(0.0)
    if c < x.shape[1]:
        for row in range(start + ty, end, cuda.blockDim.y):
            d = dout[row, c]
            acc_g += d * (x[row, c] - mean[row]) * rstd[row]
            acc_b += d
    sg[ty, tx] = acc_g
    sb[ty, tx] = acc_b
    cuda.syncthreads()
    s = cuda.blockDim.y // 2
    while s > 0:
        if ty < s:
            sg[ty, tx] += sg[ty + s, tx]
            sb[ty, tx] += sb[ty + s, tx]
        cuda.syncthreads()
        s //= 2
    return sg[0, tx], sb[0, tx]


@cuda.jit
def k_layernorm_bwd_params_tree(dg, db, dout, x, mean, rstd):
    """dg[c] += sum over all rows of dout * xhat, db[c] += sum of dout: a block of CX x RY threads
    over CX channels and all the rows (column_sums: RY threads a channel, meeting in a tree)."""
    g, b = column_sums(dout, x, mean, rstd, 0, x.shape[0])
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if cuda.threadIdx.y == 0 and c < x.shape[1]:
        dg[c] += g
        db[c] += b


# ---------------------------------------------------------------------------------------------
# launchers: `block` is the threads per row block (a power of two, for block_sum)

@rung(1)
@blocks(gpu=(256, 64, 1024), sim=(4, 2))
def layernorm_fwd(out, mean, rstd, x, g, b, eps, *, block, stream=0):
    """out, x [N, C]; mean, rstd [N]; g, b [C]. Launch: N blocks of `block` threads."""
    k_layernorm_fwd[x.shape[0], block, stream](out, mean, rstd, x, g, b, float32(eps))


@rung(1)
@blocks(gpu=(256, 64, 1024), sim=(4, 2))
def layernorm_bwd(dx, dg, db, dout, x, mean, rstd, g, *, block, stream=0):
    """dx = grad_input (written); dg, db += parameter gradients. Launch: N blocks of `block`
    threads for dx; one thread per channel (128 per block, 8 in the simulator) for dg, db."""
    N, C = x.shape
    k_layernorm_bwd[N, block, stream](dx, dout, x, mean, rstd, g)
    threads = 8 if SIMULATOR else 128
    k_layernorm_bwd_params[cdiv(C, threads), threads, stream](dg, db, dout, x, mean, rstd)


# ---------------------------------------------------------------------------------------------
# Several rows a block. A row of C = 384 or 768 channels is little work for a block of 256
# threads, and every block_sum costs log2(256) = 8 barriers. Here a block is RW rows x TPR threads
# (threadIdx.y = the row, threadIdx.x = the lane, TPR a power of two): the rows share the barriers
# of one tree, each row summing in its own TPR slots of shared memory. The same sums in a fixed
# order: deterministic.

@cuda.jit(device=True)
def rows_sum(buf, val):
    """Sum `val` over the TPR = blockDim.x lanes of this thread's row (threadIdx.y), every lane
    getting the total: a tree over buf[ty * TPR + tx], s = TPR/2, TPR/4, ..., 1. Every thread of
    the block calls it (the barriers are the block's)."""
    tx, ty, tpr = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
    base = ty * tpr
    buf[base + tx] = val
    cuda.syncthreads()
    s = tpr // 2
    while s > 0:
        if tx < s:
            buf[base + tx] += buf[base + tx + s]
        cuda.syncthreads()
        s //= 2
    total = buf[base]
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def normalise_row(buf, out, mean, rstd, x, g, b, eps, row, live, mu):
    """The rest of k_layernorm_fwd for row `row` of x, given its mean mu: the variance pass
    (rows_sum), then out[row], mean[row], rstd[row], by this thread's TPR lanes. Every thread of
    the block calls it; a row past N (live False) adds zeros and writes nothing."""
    tx, nt = cuda.threadIdx.x, cuda.blockDim.x
    C = x.shape[1]
    s = float32(0.0)
    if live:
        for c in range(tx, C, nt):
            d = x[row, c] - mu
            s += d * d
    r = float32(1.0) / math.sqrt(rows_sum(buf, s) * (float32(1.0) / float32(C)) + eps)
    if live:
        for c in range(tx, C, nt):
            out[row, c] = (x[row, c] - mu) * r * g[c] + b[c]
        if tx == 0:
            mean[row] = mu
            rstd[row] = r


@cuda.jit(device=True)
def layernorm_row_grad(buf, dout, x, mean, rstd, g, row, live):
    """(mu, r, m1, m2) of row `row` for its backward, by this thread's TPR lanes: the saved mean
    and rstd, m1 = mean_c(dxhat), m2 = mean_c(dxhat * xhat), dxhat = dout * g. Then
    dx = r (dxhat - m1 - xhat m2). Every thread of the block calls it."""
    tx, nt = cuda.threadIdx.x, cuda.blockDim.x
    C = x.shape[1]
    inv_c = float32(1.0) / float32(C)
    s1 = float32(0.0)
    s2 = float32(0.0)
    mu = mean[row] if live else float32(0.0)
    r = rstd[row] if live else float32(0.0)
    if live:
        for c in range(tx, C, nt):
            dxhat = dout[row, c] * g[c]
            s1 += dxhat
            s2 += dxhat * (x[row, c] - mu) * r
    return mu, r, rows_sum(buf, s1) * inv_c, rows_sum(buf, s2) * inv_c


@cuda.jit
def k_layernorm_bwd_multirow(dx, dout, x, mean, rstd, g):
    """k_layernorm_bwd's dx with RW rows a block: row = blockIdx.x * RW + threadIdx.y, its TPR lanes
    striding over the C channels (layernorm_row_grad, then dx)."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    live = row < x.shape[0]
    mu, r, m1, m2 = layernorm_row_grad(buf, dout, x, mean, rstd, g, row, live)
    if live:
        for c in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
            xhat = (x[row, c] - mu) * r
            dx[row, c] = r * (dout[row, c] * g[c] - m1 - xhat * m2)


# block = (TPR lanes a row, RW rows a block); TPR * RW <= MAX_BLOCK
ROW_BLOCKS = dict(gpu=((32, 8), (32, 4), (64, 4), (128, 2)), sim=((4, 2), (2, 4)))


# ---------------------------------------------------------------------------------------------
# dg, db in two stages (layernorm_bwd_two_stage, residual_layernorm_bwd_two_stage). A block of CX
# channels over all the rows (k_layernorm_bwd_params_tree) makes only cdiv(C, CX) blocks: 12 at
# C = 384, 24 at C = 768. An H200 has 132 SMs and runs 264 blocks of 1024 threads at once, so 108
# of its SMs (120 at C = 384) would have nothing to do while the busy ones each walk all 8192 rows.
# More blocks need the rows cut too. The N rows are cut into R chunks of `rows` = cdiv(N, R)
# consecutive rows (the last may be shorter): a grid of cdiv(C, CX) x R blocks.
#
#     stage 1, block (bx, chunk), threads (tx, ty) as in k_layernorm_bwd_params_tree, c = bx * CX + tx:
#         thread (tx, ty) sums rows chunk*rows + ty, + ty + RY, + ty + 2 RY, ... of its chunk, in
#         order (a warp still reads CX = 32 consecutive channels of a row: coalesced); the RY sums
#         of a channel meet in column_sums' fixed tree over ty, and the block WRITES (no atomics)
#             part[0, chunk, c] = sum over the chunk's rows of dout * xhat
#             part[1, chunk, c] = sum over the chunk's rows of dout
#     stage 2, one thread per channel c:
#         dg[c] += part[0, 0, c] + part[0, 1, c] + ... + part[0, R-1, c]     (in chunk order)
#         db[c] += part[1, 0, c] + ... + part[1, R-1, c]
#
# part [2, R, C] is the front of the work buffer the launcher is given. Every sum has a fixed
# order and R depends only on the shapes and the work buffer's size (param_chunks): deterministic.
# The sums are grouped differently from k_layernorm_bwd_params_tree's: other last bits of dg, db.
#
# R: about PARAM_BLOCKS blocks in all (4 x 132 SMs: two full waves of the 264 resident blocks of
# 1024 threads; 12 x 44 = 24 x 22 = 528 at C = 384 and 768), but at least PARAM_MIN_ROWS rows a
# chunk (the RY = 32 thread rows of a block then sum 4 rows or more each, enough to pay for the
# block's tree: 8192 rows allow up to 64 chunks), and 2 R C floats within the work buffer; at
# least 1. In the simulator every thread is a Python thread and a barrier is slow: a handful of
# blocks of 8 x 2 threads (PARAM_CX, PARAM_RY), still R > 1 at the harness's tiny sizes.
PARAM_BLOCKS, PARAM_MIN_ROWS = (4, 4) if SIMULATOR else (528, 128)


def param_chunks(N: int, C: int, work_size: int) -> int:
    """R, the row chunks of k_layernorm_bwd_params_partial for N rows of C channels and a work buffer of
    work_size floats (see above): R = min(cdiv(PARAM_BLOCKS, cdiv(C, CX)), cdiv(N, PARAM_MIN_ROWS),
    work_size // 2C), at least 1; then the fewest chunks of the same length cdiv(N, R) (no empty
    chunk)."""
    if work_size < 2 * C:
        raise ValueError(f"layernorm params: a work buffer of {work_size} floats has no room for 2 x {C} partial sums")
    R = max(1, min(cdiv(PARAM_BLOCKS, cdiv(C, PARAM_CX)), cdiv(N, PARAM_MIN_ROWS), work_size // (2 * C)))
    return cdiv(N, cdiv(N, R))


@cuda.jit
def k_layernorm_bwd_params_partial(part, dout, x, mean, rstd):
    """Stage 1: part[0, chunk, c] = sum over the chunk's rows of dout * xhat, part[1, chunk, c] =
    sum of dout (written), chunk = blockIdx.y of R = part.shape[1], its rows chunk * rows up to
    (chunk + 1) * rows, rows = cdiv(N, R). Within a block as k_layernorm_bwd_params_tree: thread
    (tx, ty) of channel c = blockIdx.x * CX + tx sums every RY-th row of the chunk from ty, in order,
    then a fixed tree over ty."""
    N, C = x.shape
    chunk = cuda.blockIdx.y
    rows = (N + part.shape[1] - 1) // part.shape[1]
    start = chunk * rows
    g, b = column_sums(dout, x, mean, rstd, start, min(start + rows, N))
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if cuda.threadIdx.y == 0 and c < C:
        part[0, chunk, c] = g
        part[1, chunk, c] = b


@cuda.jit
def k_layernorm_bwd_params_sum(dg, db, part):
    """Stage 2: dg[c] += part[0, 0, c] + ... + part[0, R-1, c], db[c] += part[1, 0, c] + ... +
    part[1, R-1, c], summed in chunk order 0, 1, ..., R-1 (one thread per channel c)."""
    c = cuda.grid(1)
    if c >= part.shape[2]:
        return
    sg = part[0, 0, c]
    sb = part[1, 0, c]
    for chunk in range(1, part.shape[1]):
        sg += part[0, chunk, c]
        sb += part[1, chunk, c]
    dg[c] += sg
    db[c] += sb


def layernorm_bwd_params_two_stage(dg, db, work, dout, x, mean, rstd, stream=0, stage2=None):
    """dg, db += the parameter gradients, the two stages above: R = param_chunks(N, C, work.size),
    part = work[:2 R C] seen as [2, R, C]; cdiv(C, CX) x R blocks of (CX, RY) threads, then
    cdiv(C, ELEMENTWISE_THREADS) blocks of ELEMENTWISE_THREADS. work: float32 [n], n >= 2 C.
    stage2: the second stage's kernel (default k_layernorm_bwd_params_sum; residual_layernorm_bwd_two_stage
    passes k_layernorm_bwd_params_sum_unroll4, the same sums with its loads ahead)."""
    N, C = x.shape
    R = param_chunks(N, C, work.shape[0])
    part = work[:2 * R * C].reshape(2, R, C)
    k_layernorm_bwd_params_partial[(cdiv(C, PARAM_CX), R), (PARAM_CX, PARAM_RY), stream](part, dout, x, mean, rstd)
    (stage2 or k_layernorm_bwd_params_sum)[cdiv(C, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, stream](dg, db, part)


@rung(4)
@blocks(**ROW_BLOCKS)
def layernorm_bwd_two_stage(dx, dg, db, work, dout, x, mean, rstd, g, *, block, stream=0):
    """dx = grad_input (written); dg, db += parameter gradients. dx by k_layernorm_bwd_multirow,
    cdiv(N, RW) blocks of (TPR, RW) threads (block = (TPR, RW)); dg, db in two stages
    (layernorm_bwd_params_two_stage). work: float32 [n] scratch, at least 2 C floats (the engine
    passes its split-K buffer); its contents are overwritten."""
    N = x.shape[0]
    tpr, rw = block
    k_layernorm_bwd_multirow[cdiv(N, rw), (tpr, rw), stream](dx, dout, x, mean, rstd, g)
    layernorm_bwd_params_two_stage(dg, db, work, dout, x, mean, rstd, stream)


# ---------------------------------------------------------------------------------------------
# The residual add fused with the LayerNorm after it (twin: reference.residual_layernorm_fwd/bwd).
# In the model every LayerNorm but the first reads a residual sum just made: x_mid = x + attn
# branch, then LN2(x_mid); x[l+1] = x_mid + mlp branch, then the next LN1 (or LNf). One kernel
# does both, reading x and f once and summing the row as it writes it (then normalise_row).
# Backward, the sum's gradient is the skip path's plus the LayerNorm's: dx = dresid + LN's
# grad_input, in one pass too.

@cuda.jit
def k_residual_layernorm_fwd(resid, out, mean, rstd, x, f, g, b, eps):
    """resid = x + f, summed as it is written; then out = layernorm(resid) (normalise_row, mean
    and rstd saved), RW rows of TPR lanes a block (row = blockIdx.x * RW + threadIdx.y); each lane reads back only
    the resid elements it wrote itself."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    live = row < x.shape[0]
    s = float32(0.0)
    if live:
        for c in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
            v = x[row, c] + f[row, c]
            resid[row, c] = v
            s += v
    mu = rows_sum(buf, s) * (float32(1.0) / float32(x.shape[1]))
    normalise_row(buf, out, mean, rstd, resid, g, b, eps, row, live, mu)


@cuda.jit
def k_residual_layernorm_bwd(dx, df, dresid, dout, x, mean, rstd, g, write_df):
    """dx = dresid + LayerNorm grad_input (as k_layernorm_bwd_multirow), and df = dx when write_df
    (the engine keeps one buffer for both). dx may be dresid itself: each element is read by the
    thread that then writes it."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    live = row < x.shape[0]
    mu, r, m1, m2 = layernorm_row_grad(buf, dout, x, mean, rstd, g, row, live)
    if live:
        for c in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
            xhat = (x[row, c] - mu) * r
            v = dresid[row, c] + r * (dout[row, c] * g[c] - m1 - xhat * m2)
            dx[row, c] = v
            if write_df:
                df[row, c] = v


@rung(1)
@blocks(**ROW_BLOCKS)
def residual_layernorm_fwd(resid, out, mean, rstd, x, f, g, b, eps, *, block, stream=0):
    """resid, out, x, f [N, C]; mean, rstd [N]; g, b [C]. cdiv(N, RW) blocks of (TPR, RW) threads."""
    tpr, rw = block
    k_residual_layernorm_fwd[cdiv(x.shape[0], rw), (tpr, rw), stream](resid, out, mean, rstd, x, f, g, b,
                                                                      float32(eps))


@rung(1)
@blocks(**ROW_BLOCKS)
def residual_layernorm_bwd(dx, df, dg, db, dresid, dout, resid, mean, rstd, g, *, block, stream=0):
    """dx = dresid + grad_input of the LayerNorm (written; may be dresid itself) and df the same
    (resid = x + f): give df = dx (the same array) to write it once; dg, db +=. Launch:
    k_residual_layernorm_bwd, cdiv(N, RW) blocks of (TPR, RW) threads; k_layernorm_bwd_params_tree,
    cdiv(C, PARAM_CX) blocks of (PARAM_CX, PARAM_RY) threads."""
    N, C = resid.shape
    tpr, rw = block
    k_residual_layernorm_bwd[cdiv(N, rw), (tpr, rw), stream](dx, df, dresid, dout, resid, mean, rstd, g,
                                                             df is not dx)
    k_layernorm_bwd_params_tree[cdiv(C, PARAM_CX), (PARAM_CX, PARAM_RY), stream](dg, db, dout, resid, mean, rstd)


# ---------------------------------------------------------------------------------------------
# dg, db's second stage with its loads ahead: a thread of k_layernorm_bwd_params_sum waits on one
# load per chunk, one after the other; here the loads of 4 chunks go out before their adds.

@cuda.jit
def k_layernorm_bwd_params_sum_unroll4(dg, db, part):
    """Stage 2 as k_layernorm_bwd_params_sum: dg[c] += part[0, 0, c] + ... + part[0, R-1, c], db[c]
    likewise, in chunk order 0, 1, ..., R-1 (its bits), one thread per channel c, with the loads of
    4 chunks issued before their adds."""
    c = cuda.grid(1)
    if c >= part.shape[2]:
        return
    R = part.shape[1]
    sg = part[0, 0, c]
    sb = part[1, 0, c]
    k = 1
    while k + 4 <= R:
        g0, g1, g2, g3 = part[0, k, c], part[0, k + 1, c], part[0, k + 2, c], part[0, k + 3, c]
        b0, b1, b2, b3 = part[1, k, c], part[1, k + 1, c], part[1, k + 2, c], part[1, k + 3, c]
        sg += g0
        sg += g1
        sg += g2
        sg += g3
        sb += b0
        sb += b1
        sb += b2
        sb += b3
        k += 4
    while k < R:
        sg += part[0, k, c]
        sb += part[1, k, c]
        k += 1
    dg[c] += sg
    db[c] += sb


@rung(4)
@blocks(**ROW_BLOCKS)
def residual_layernorm_bwd_two_stage(dx, df, dg, db, work, dresid, dout, resid, mean, rstd, g, *, block, stream=0):
    """residual_layernorm_bwd's dx and df (k_residual_layernorm_bwd, cdiv(N, RW) blocks of (TPR, RW)
    threads), then dg, db in two stages (layernorm_bwd_params_two_stage), the second
    k_layernorm_bwd_params_sum_unroll4. work: float32 [n] scratch, at least 2 C floats. The fallback
    of residual_layernorm_bwd_partials where work has no room for its partials."""
    N = resid.shape[0]
    tpr, rw = block
    k_residual_layernorm_bwd[cdiv(N, rw), (tpr, rw), stream](dx, df, dresid, dout, resid, mean, rstd, g,
                                                             df is not dx)
    layernorm_bwd_params_two_stage(dg, db, work, dout, resid, mean, rstd, stream, stage2=k_layernorm_bwd_params_sum_unroll4)


# The fused forward four channels at a time (residual_layernorm_fwd_vec4, the bf16 recipes'). Lane
# tx of a row keeps its channels in registers, 4 (tx + i TPR) .. + 3 for i < NQ = cdiv(C, 4 TPR):
# x and f are read once as float4 and resid written as float4 (128-bit loads and stores: a warp
# moves 512 bytes of a row at once), the mean and the variance come from the registers (resid is
# never read back), and out is written as float4 or, for a uint16 out (bf16 bit patterns, rounded
# to nearest, ties to even, as the products' operand copy rounds), as two words of bf16 pairs: the
# bf16 LayerNorm output the products read, with no fp32 scratch and copy in between. Each lane
# adds its four channels, then the next four: other sums than k_residual_layernorm_fwd's (other
# last bits, the same math). It needs C % 4 == 0 and rows on 16-byte boundaries; otherwise the
# launcher runs residual_layernorm_fwd (fp32 out only). One kernel is built per NQ (the size of
# the register array).
def _row4_kernel(NQ):
    NV = 4 * NQ                                     # a lane's values (a constant for the local array)

    def k_residual_layernorm_fwd_vec4(resid, out, out_words, mean, rstd, x, f, g, b, eps, half):
        """resid = x + f, out = layernorm(resid) (fp32 into out, or when half bf16 into out_words: the
        uint16 out seen as int32 [N, C/2]), mean and rstd saved; lane tx of row threadIdx.y holds
        resid[row, 4 (tx + i TPR) + j] in v[4 i + j]."""
        buf = cuda.shared.array(MAX_BLOCK, float32)
        v = cuda.local.array(NV, float32)
        row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
        tx, tpr = cuda.threadIdx.x, cuda.blockDim.x
        C = x.shape[1]
        live = row < x.shape[0]
        s = float32(0.0)
        for i in range(NQ):                         # resid = x + f: the row's only loads
            c = 4 * (tx + i * tpr)
            for j in range(4):
                v[4 * i + j] = float32(0.0)
            if live and c < C:
                x0, x1, x2, x3 = load4_row(x, row, c)
                f0, f1, f2, f3 = load4_row(f, row, c)
                v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3] = x0 + f0, x1 + f1, x2 + f2, x3 + f3
                store4(resid, row * C + c, v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3])
                for j in range(4):
                    s += v[4 * i + j]
        mu = rows_sum(buf, s) * (float32(1.0) / float32(C))
        s = float32(0.0)
        for i in range(NQ):                         # the variance, from the registers
            if live and 4 * (tx + i * tpr) < C:
                for j in range(4):
                    d = v[4 * i + j] - mu
                    s += d * d
        r = float32(1.0) / math.sqrt(rows_sum(buf, s) * (float32(1.0) / float32(C)) + eps)
        if live:
            for i in range(NQ):
                c = 4 * (tx + i * tpr)
                if c < C:
                    y0 = (v[4 * i] - mu) * r * g[c] + b[c]
                    y1 = (v[4 * i + 1] - mu) * r * g[c + 1] + b[c + 1]
                    y2 = (v[4 * i + 2] - mu) * r * g[c + 2] + b[c + 2]
                    y3 = (v[4 * i + 3] - mu) * r * g[c + 3] + b[c + 3]
                    if half:
                        out_words[row, c // 2] = bf16x2(y0, y1)
                        out_words[row, c // 2 + 1] = bf16x2(y2, y3)
                    else:
                        store4(out, row * C + c, y0, y1, y2, y3)
            if tx == 0:
                mean[row] = mu
                rstd[row] = r
    return cuda.jit(k_residual_layernorm_fwd_vec4)


_ROW4_KERNELS = {}      # NQ -> k_residual_layernorm_fwd_vec4


def fits_vec4(resid, out, x, f) -> bool:
    """Whether k_residual_layernorm_fwd_vec4 can take these arrays: rows of whole 16-byte chunks (an fp32
    out too), a uint16 out C-contiguous on an 8-byte boundary."""
    if out.dtype == np.uint16:
        return wide_rows(resid, x, f) and out.shape[1] % 4 == 0 and address(out) % 8 == 0 and \
            out.strides == (2 * out.shape[1], 2)
    return wide_rows(resid, out, x, f)


@rung(3)
@blocks(**ROW_BLOCKS)
def residual_layernorm_fwd_vec4(resid, out, mean, rstd, x, f, g, b, eps, *, block, stream=0):
    """resid = x + f, out = layernorm(resid), mean, rstd saved, four channels a load and store
    (k_residual_layernorm_fwd_vec4); out float32, or uint16 (the bf16 bit patterns, ties to even).
    cdiv(N, RW) blocks of (TPR, RW) threads. Rows that are not whole 16-byte chunks:
    residual_layernorm_fwd (fp32 out only)."""
    N, C = x.shape
    tpr, rw = block
    half = out.dtype == np.uint16
    if not fits_vec4(resid, out, x, f):
        assert not half, "residual_layernorm_fwd_vec4 writes a bf16 out only for rows of whole 16-byte chunks"
        return residual_layernorm_fwd(resid, out, mean, rstd, x, f, g, b, eps, block=block, stream=stream)
    nq = cdiv(C, 4 * tpr)
    if nq not in _ROW4_KERNELS:
        _ROW4_KERNELS[nq] = _row4_kernel(nq)
    # the kernel is typed for both outputs (a float32 out, int32 words): the one it does not write is a stand-in
    out32, words = (resid, out.reshape(N * C).view(np.int32).reshape(N, C // 2)) if half else (out, out.view(np.int32))
    _ROW4_KERNELS[nq][cdiv(N, rw), (tpr, rw), stream](resid, out32, words, mean, rstd, x, f, g, b, float32(eps), half)


# ---------------------------------------------------------------------------------------------
# The fused backward with stage 1 of the parameter sums inside the dx kernel
# (residual_layernorm_bwd_partials, the engine's). The two-stage sums read dout and x again (50 MB
# at 120M) right after the dx kernel read them; here the dx kernel's block, RW rows of TPR lanes,
# sums its own rows too:
#
#     part[0, blk, c] = sum over the block's rows of dout * xhat    (xhat = (x - mean) rstd)
#     part[1, blk, c] = sum over the block's rows of dout           blk = blockIdx.x, R = cdiv(N, RW)
#
# The channels go in windows of W = TPR * RW (the block's threads; 256 at (32, 8)). In a window the
# lanes of row ty compute dx as k_residual_layernorm_bwd does (the same float32 expression: its dx
# and df, bit for bit) and leave dout * xhat and dout of each of their channels in shared memory,
# [RW, W] a sum; after a barrier thread t = ty * TPR + tx adds channel c0 + t over the block's live
# rows in row order and writes part; a second barrier frees the buffers for the next window (3
# windows, 6 barriers at C = 768). dout and x are read as often as in k_residual_layernorm_bwd (the
# row sums, then dx); stage 1's second reading of them is gone. Shared memory: 2 x 8 KB for the
# windows (PARTIALS_WINDOW floats each, sized for the largest RW x W of ROW_BLOCKS) besides
# rows_sum's 4 KB. The indices go through nonneg (common.py): without them the loop of windows
# around the loop of channels needs more than twice the registers (lab/layernorm.py).
#
# Stage 2 then adds R = cdiv(N, RW) partials a channel (1024 at 120M: 8192 rows / 8), too many for a
# thread a channel. k_layernorm_bwd_params_sum_tree gives a channel RY threads: thread (tx, ty) adds
# chunks ty, ty + RY, ... in order (four loads ahead of their adds), the RY sums meet in
# column_sums' fixed tree over ty; blockIdx.y picks dg or db (cdiv(C, CX) x 2 blocks of CX x RY =
# 32 x 32 threads: 48 at C = 768, 32 chunks a thread).
# Every sum in a fixed order, no atomics: deterministic. dg, db are summed in another grouping
# than the two-stage sums' (rows by blocks of RW, then a tree): other last bits, the same sums.
# The partials need 2 R C floats of the work buffer (1.6 M at 120M; the split-K buffer holds
# 18.9 M); with less, or a block larger than the window buffers, the launcher runs
# residual_layernorm_bwd_two_stage.
PARTIALS_WINDOW = max(tpr * rw * rw for tpr, rw in ROW_BLOCKS["sim" if SIMULATOR else "gpu"])   # RW x W floats


@cuda.jit(device=True)
def residual_layernorm_bwd_rows(dx, df, part, d16, dresid, dout, x, mean, rstd, g, write_df, write_d16):
    """The body of k_residual_layernorm_bwd_partials (its docstring) and k_residual_layernorm_bwd_bf16:
    the same statements, and when write_d16 (a constant of each kernel) the bf16 bits of each dx
    value into d16 as it is written. k_residual_layernorm_bwd_partials passes False (and dx for
    d16): the store compiles away."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    pg = cuda.shared.array(PARTIALS_WINDOW, float32)       # [RW, W]: dout * xhat of the window, a row a line
    pb = cuda.shared.array(PARTIALS_WINDOW, float32)       # [RW, W]: dout
    tx, ty = nonneg(cuda.threadIdx.x), nonneg(cuda.threadIdx.y)
    tpr, rw, blk = nonneg(cuda.blockDim.x), nonneg(cuda.blockDim.y), nonneg(cuda.blockIdx.x)
    N, C = x.shape
    W = tpr * rw
    t = ty * tpr + tx                                # this thread's channel in a window's sums
    row = blk * rw + ty
    live = row < N
    rows = min(rw, N - blk * rw)                     # the block's live rows (the last block may have fewer)
    mu, r, m1, m2 = layernorm_row_grad(buf, dout, x, mean, rstd, g, row, live)
    steps = (C + tpr - 1) // tpr
    c0 = 0                                           # the window's first channel
    s = 0                                            # the step's slot in the window
    for j in range(steps):
        c = nonneg(c0 + s * tpr + tx)                # = tx + j TPR
        if live and c < C:
            d = dout[row, c]
            xhat = (x[row, c] - mu) * r
            v = dresid[row, c] + r * (d * g[c] - m1 - xhat * m2)        # k_residual_layernorm_bwd's dx
            dx[row, c] = v
            if write_df:
                df[row, c] = v
            if write_d16:
                d16[row, c] = bf16x2(v, float32(0.0)) & 0xFFFF   # the low half: bf16(v), ties to even
            pg[nonneg(ty * W + s * tpr + tx)] = d * xhat
            pb[nonneg(ty * W + s * tpr + tx)] = d
        s += 1
        if s == rw or j + 1 == steps:                # the window is full (or the row ends): sum it
            cuda.syncthreads()
            c = nonneg(c0 + t)
            if c < C:                                # channel c over the block's rows, in row order
                sg = pg[t]
                sb = pb[t]
                for k in range(1, rows):
                    sg += pg[nonneg(k * W + t)]
                    sb += pb[nonneg(k * W + t)]
                part[0, blk, c] = sg
                part[1, blk, c] = sb
            cuda.syncthreads()                       # the sums read: the buffers are free
            c0 += W
            s = 0


@cuda.jit
def k_residual_layernorm_bwd_partials(dx, df, part, dresid, dout, x, mean, rstd, g, write_df):
    """k_residual_layernorm_bwd's dx (and df when write_df; dx may be dresid itself) and the
    block's partial parameter sums part[0, blockIdx.x, c] (dout * xhat) and part[1, blockIdx.x, c]
    (dout) over its RW rows, by windows of W = TPR * RW channels (the comment above). Lane tx of
    row ty takes channel c = tx + j TPR at step j, as k_residual_layernorm_bwd; a window is RW
    steps (the last may be shorter), its slot s = j mod RW. The steps are the same for every lane
    (cdiv(C, TPR)): the barriers meet."""
    residual_layernorm_bwd_rows(dx, df, part, dx, dresid, dout, x, mean, rstd, g, write_df, False)


@cuda.jit
def k_layernorm_bwd_params_sum_tree(dg, db, part):
    """Stage 2 for many chunks: dg[c] += sum over k of part[0, k, c] (blockIdx.y = 0), db[c] += sum
    of part[1, k, c] (blockIdx.y = 1). Thread (tx, ty) of channel c = blockIdx.x * CX + tx adds
    chunks ty, ty + RY, ty + 2 RY, ... in order, four loads ahead of their adds; then the RY sums
    of a channel meet in a fixed tree over ty (as column_sums)."""
    s = cuda.shared.array((PARAM_RY, PARAM_CX), float32)
    tx, ty, ry = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.y
    c = cuda.blockIdx.x * cuda.blockDim.x + tx
    w = cuda.blockIdx.y
    R = part.shape[1]
    acc = float32(0.0)
    if c < part.shape[2]:
        k = ty
        while k + 3 * ry < R:
            a0, a1, a2, a3 = part[w, k, c], part[w, k + ry, c], part[w, k + 2 * ry, c], part[w, k + 3 * ry, c]
            acc += a0
            acc += a1
            acc += a2
            acc += a3
            k += 4 * ry
        while k < R:
            acc += part[w, k, c]
            k += ry
    s[ty, tx] = acc
    cuda.syncthreads()
    h = ry // 2
    while h > 0:
        if ty < h:
            s[ty, tx] += s[ty + h, tx]
        cuda.syncthreads()
        h //= 2
    if ty == 0 and c < part.shape[2]:
        if w == 0:
            dg[c] += s[0, tx]
        else:
            db[c] += s[0, tx]


@rung(5)
@blocks(**ROW_BLOCKS)
def residual_layernorm_bwd_partials(dx, df, dg, db, work, dresid, dout, resid, mean, rstd, g, *, block, stream=0):
    """residual_layernorm_bwd's dx and df, bit for bit (k_residual_layernorm_bwd_partials, cdiv(N, RW)
    blocks of (TPR, RW) threads, also writing each block's partial sums), then dg, db += the
    partials' sums (sum_partials). work: float32 [n] scratch, 2 cdiv(N, RW) C floats; with less
    (or a block too large for the window buffers), residual_layernorm_bwd_two_stage."""
    part = fused_partials(work, resid.shape, block)
    if part is None:
        return residual_layernorm_bwd_two_stage(dx, df, dg, db, work, dresid, dout, resid, mean, rstd, g, block=block,
                                                stream=stream)
    k_residual_layernorm_bwd_partials[part.shape[1], block, stream](dx, df, part, dresid, dout, resid, mean, rstd, g,
                                                                    df is not dx)
    sum_partials(dg, db, part, stream)


def fused_partials(work, shape, block):
    """part [2, R, C] (R = cdiv(N, RW)) at the front of work for the fused kernels
    (k_residual_layernorm_bwd_partials, _bf16), or None where work has no room for a partial sum per
    row block or the window buffers are too small for this block: then residual_layernorm_bwd_two_stage
    runs, whose two-stage params need only 2 C floats of work."""
    (N, C), (tpr, rw) = shape, block
    R = cdiv(N, rw)
    if work.shape[0] < 2 * R * C or tpr * rw * rw > PARTIALS_WINDOW:
        return None
    return work[:2 * R * C].reshape(2, R, C)


def sum_partials(dg, db, part, stream):
    """Stage 2 of the fused kernels: dg, db += the sums of the R partials (k_layernorm_bwd_params_sum_tree,
    cdiv(C, PARAM_CX) x 2 blocks of (PARAM_CX, PARAM_RY) threads)."""
    k_layernorm_bwd_params_sum_tree[(cdiv(part.shape[2], PARAM_CX), 2), (PARAM_CX, PARAM_RY), stream](dg, db, part)


# ---------------------------------------------------------------------------------------------
# The fused backward writing dx's bf16 copy too (residual_layernorm_bwd_bf16, the bf16-hopper
# recipe's). In the engine dx is the residual stream's gradient d_resid, which two bf16 products
# read next (the block below's attn_out or MLP backward: dW = a^T @ d_resid and da = d_resid @ W^T);
# their operand copy (cublaslt.round_into) would read it back and round it, a pass of [N, C] fp32
# in and bf16 out. Given d16 (uint16 [N, C]) the kernel stores bf16(dx) there as it stores dx: one
# cvt.rn.bf16x2.f32 (ties to even, as the copy rounds; ptx.bf16x2, its low half) and a 16-bit store
# a value, consecutive lanes on consecutive channels (a warp's 64 bytes of a row: coalesced). The
# same statements as k_residual_layernorm_bwd_partials otherwise (residual_layernorm_bwd_rows): dx,
# df, dg, db are its bits. The store is chosen when the kernel is compiled (a kernel argument
# switching it would cost registers, and so resident blocks: lab/layernorm.py):
# k_residual_layernorm_bwd_bf16 always writes d16, and without d16 the launcher runs
# residual_layernorm_bwd_partials, whose kernel is the same statements with the store compiled out.
# With no room in work for the partials (the two-stage fallback) it takes no d16.

@cuda.jit
def k_residual_layernorm_bwd_bf16(dx, df, part, d16, dresid, dout, x, mean, rstd, g, write_df):
    """k_residual_layernorm_bwd_partials (its math: xhat = (x - mean) rstd, dxhat = dout g,
        dx = dresid + rstd (dxhat - mean_c(dxhat) - xhat mean_c(dxhat xhat)),
    df = dx when write_df, part[0, blk, c] = sum over the block's rows of dout xhat and part[1, blk, c]
    of dout), and d16[row, c] = the bf16 bit pattern of dx[row, c], rounded to nearest, ties to even
    (cvt.rn.bf16x2.f32: what the products' copy kernel k_round_bf16 gives for every value but
    NaN), stored as each dx value is."""
    residual_layernorm_bwd_rows(dx, df, part, d16, dresid, dout, x, mean, rstd, g, write_df, True)


@rung(6)
@blocks(**ROW_BLOCKS)
def residual_layernorm_bwd_bf16(dx, df, dg, db, work, dresid, dout, resid, mean, rstd, g, *, d16=None, block, stream=0):
    """residual_layernorm_bwd_partials (dx, df, dg, db: its bits, its launch); d16: None (then
    residual_layernorm_bwd_partials itself runs), or uint16 [N, C] receiving bf16(dx) (ties to even)
    from k_residual_layernorm_bwd_bf16. d16 needs the partials' room in work: 2 cdiv(N, RW) C."""
    if d16 is None:
        return residual_layernorm_bwd_partials(dx, df, dg, db, work, dresid, dout, resid, mean, rstd, g, block=block,
                                               stream=stream)
    part = fused_partials(work, resid.shape, block)
    assert part is not None, "residual_layernorm_bwd_bf16 writes d16 only with work for its partials (2 cdiv(N, RW) C)"
    assert d16.dtype == np.uint16 and d16.shape == resid.shape, "d16: uint16 [N, C]"
    k_residual_layernorm_bwd_bf16[part.shape[1], block, stream](dx, df, part, d16, dresid, dout, resid, mean, rstd, g,
                                                                df is not dx)
    sum_partials(dg, db, part, stream)


