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
import functools
import math

import numpy as np
from numba import cuda, float32
from numba.cuda import libdevice

from .common import address, block_max, block_sum, blocks, MAX_BLOCK, rung, SIMULATOR, wide_rows
from .matmul import matmul, matmul_bf16, matmul_bf16_wgmma, matmul_fp16, matmul_tf32x3, matmul_tf32x3_wgmma
from .operands import COPIES, operand_elements
from .ptx import bf16x2, load4_row, store4

MEAN_THREADS = 4 if SIMULATOR else 1024     # k_loss_mean: one block


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


@rung(1)
@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """loss [1]; losses [N]; probs [N, V] (written); x [N, C]; wte [V, C]; targets [N] int32.
    Launch: the matmul for the logits (its default tile); k_loss_fwd, N blocks of `block`
    threads; k_loss_mean, one block of MEAN_THREADS threads."""
    N, V = probs.shape
    matmul(probs, x, wte, trans_b=True, stream=stream)          # logits = x @ wte^T, into probs
    k_loss_fwd[N, block, stream](losses, probs, targets)
    k_loss_mean[1, MEAN_THREADS, stream](loss, losses)


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


@rung(1)
@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd(dx, dwte, dlogits, dloss, x, wte, probs, targets, *, block, stream=0):
    """dx [N, C] (written); dwte [V, C] (+=); dlogits [N, V] work buffer (may be probs itself);
    dloss a scalar; x [N, C]; wte [V, C]; probs [N, V]; targets [N] int32.
    Launch: k_loss_bwd, N blocks of `block` threads; then two matmuls (default tile)."""
    N, V = probs.shape
    scale = np.float32(float(dloss) / N)                    # as the twin: dloss / N, then float32
    k_loss_bwd[N, block, stream](dlogits, probs, targets, scale)
    matmul(dx, dlogits, wte, stream=stream)                                   # dx = dlogits @ wte
    matmul(dwte, dlogits, x, trans_a=True, accumulate=True, stream=stream)    # dwte += dlogits^T @ x


# ---------------------------------------------------------------------------------------------
# The same kernels with the products of a product launcher (mm: matmul_tf32x3, matmul_fp16,
# matmul_bf16, or a lab rung); dwte with split-K into work (at 12M, V x C is only 2 x 3 tiles for
# K = N rows).

def _fwd_warp(mm, loss, losses, probs, x, wte, targets, block, stream):
    N, V = probs.shape
    mm(probs, None, x, wte, trans_b=True, stream=stream)       # logits = x @ wte^T, into probs
    k_loss_fwd[N, block, stream](losses, probs, targets)
    k_loss_mean[1, MEAN_THREADS, stream](loss, losses)


def _bwd_warp(mm, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream):
    N, V = probs.shape
    scale = np.float32(float(dloss) / N)
    k_loss_bwd[N, block, stream](dlogits, probs, targets, scale)
    mm(dx, None, dlogits, wte, stream=stream)                                          # dx = dlogits @ wte
    mm(dwte, work, dlogits, x, trans_a=True, accumulate=True, stream=stream)           # dwte += dlogits^T @ x


@rung(7)
@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_tf32x3(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """loss_bwd with its products from matmul_tf32x3 (3xTF32, as accurate as fp32), dwte split over K
    into work."""
    _bwd_warp(matmul_tf32x3, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


# v9: v7 with the softmax's block no wider than its row needs. k_loss_fwd runs a block per row
# and v7 launches 1024 threads, the width that a 50,304-entry row of the 120M vocabulary needs. At
# 12M a row has 256 entries: three of every four threads had nothing to load, and every one of
# them took part in the two 1024-wide block reductions (ten barriers each): 0.174 ms a call on the
# H200 for 8 MB of logits. v9 launches the smallest power of two of threads with at most four
# entries each (at least a warp, at most the block): 64 at 12M, 1024 at 120M (v7's launch: its bits).
def row_threads(V: int, block: int) -> int:
    """Threads of a softmax row: the smallest power of two >= V / 4, at least 32, at most block."""
    t = 32
    while t < block and 4 * t < V:
        t *= 2
    return min(t, block)


@rung(9)
@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_tf32x3(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v7 with the softmax rows on as few threads as four entries a thread allow (at most block)."""
    _fwd_warp(matmul_tf32x3, loss, losses, probs, x, wte, targets, row_threads(probs.shape[1], block), stream)


# fp16 products: the same on matmul_fp16 (fp16 inputs, fp32 sums); training with them needs loss scaling.
@rung(11)
@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_fp16(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """loss_fwd_tf32x3 with the logits from fp16 products (matmul_fp16); the softmax and the loss in fp32."""
    _fwd_warp(matmul_fp16, loss, losses, probs, x, wte, targets, row_threads(probs.shape[1], block), stream)


@rung(10)
@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_fp16(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """loss_bwd_tf32x3 with fp16 products (matmul_fp16), dwte split over K into work."""
    _bwd_warp(matmul_fp16, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


loss_fwd_fp16.precision = loss_bwd_fp16.precision = "fp16"


# bf16 products through matmul_bf16 (bf16 copies, cp.async ring: kernels/half_tile.py)
@rung(13)
@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_bf16(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """loss_fwd_tf32x3 with the logits from matmul_bf16; the softmax and the loss in fp32."""
    _fwd_warp(matmul_bf16, loss, losses, probs, x, wte, targets, row_threads(probs.shape[1], block), stream)


@rung(12)
@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_bf16(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """loss_bwd_tf32x3 with its products from matmul_bf16, dwte split over K into work."""
    _bwd_warp(matmul_bf16, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


loss_fwd_bf16.precision = loss_bwd_bf16.precision = "bf16"


# v14 forward, v13 backward (bf16, the lab's: the products of its matmul v16): the two passes over
# the [N, V] logits that cost most besides the products. At 120M (8 x 1024 rows, V = 50,304: 1.65 GB of fp32 logits) on an H200, v13's
# k_loss_fwd took 2.18 ms, k_loss_bwd 1.16 ms, and the two bf16 copies of dlogits that its
# products made 1.19 ms.
#
# k_loss_fwd_online reads a row twice where v1 read it three times. Pass 1 keeps, per thread, the
# maximum m of the values seen so far and the sum s of exp(x - m) over them ("online softmax"): a
# new maximum x > m rescales what was summed, s = s exp(m - x) + 1, m = x; otherwise s += exp(x - m).
# The block then takes the row's maximum M (block_max) and adds the threads' sums brought to it,
# se = sum_threads s exp(m - M) (block_sum: a fixed tree, deterministic). Pass 2 writes
# probs = exp(x - M) / se. Each thread reads and writes four values at once (a 128-bit load and
# store) where a row's length is a multiple of 4 and its rows are 16-byte aligned.
#
# k_loss_bwd_bf16 writes dlogits = (probs - onehot) dloss / N straight as bf16 (nearest, ties to
# even: the bits the products' copy kernel would have made of the fp32 values), into the slot of
# the 16-bit operand scratch (operands.COPIES) where a product's first operand goes; both products
# take that uint16 array as it is (a bf16 operand is not copied again). The fp32 dlogits buffer is
# not written: probs stays the softmax.

@cuda.jit(device=True, inline=True)
def online_add(m, s, x):
    """(m, s) after value x: m = the maximum so far, s = sum of exp(value - m) so far. A value of
    -inf adds nothing (and leaves an empty (m, s) = (-inf, 0) as it is)."""
    if x > m:
        return x, s * math.exp(m - x) + float32(1.0)
    if x > float32(-math.inf):
        return m, s + math.exp(x - m)
    return m, s


@cuda.jit
def k_loss_fwd_online(losses, probs, targets, wide):
    """probs [N, V] holds the logits on entry and the softmax on exit, as k_loss_fwd, one block a
    row. Two passes: an online maximum and sum of exponentials, then probs = exp(x - M) / se.
    wide: V % 4 == 0 and 16-byte aligned rows (four values a thread at a time)."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    row = cuda.blockIdx.x
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    V = probs.shape[1]
    picked = probs[row, targets[row]]        # read before any thread overwrites the row
    m, s = float32(-math.inf), float32(0.0)
    if wide:
        for j in range(4 * tid, V, 4 * nt):
            x0, x1, x2, x3 = load4_row(probs, row, j)
            m, s = online_add(m, s, x0)
            m, s = online_add(m, s, x1)
            m, s = online_add(m, s, x2)
            m, s = online_add(m, s, x3)
    else:
        for v in range(tid, V, nt):
            m, s = online_add(m, s, probs[row, v])
    M = block_max(buf, m)
    se = block_sum(buf, s * math.exp(m - M) if m > float32(-math.inf) else float32(0.0))
    if wide:
        for j in range(4 * tid, V, 4 * nt):
            x0, x1, x2, x3 = load4_row(probs, row, j)
            store4(probs, row * V + j, math.exp(x0 - M) / se, math.exp(x1 - M) / se,
                   math.exp(x2 - M) / se, math.exp(x3 - M) / se)
    else:
        for v in range(tid, V, nt):
            probs[row, v] = math.exp(probs[row, v] - M) / se
    if tid == 0:
        losses[row] = (math.log(se) + M) - picked


@cuda.jit(device=True, inline="always")
def dlogits4(d_words, row, j, target, scale, p0, p1, p2, p3):
    """dlogits[row, j .. j + 3] from the probabilities p0 .. p3 there: 1 taken off at the target,
    times scale, rounded to bf16 and stored as two words of pairs (d_words: int32 [N, V/2])."""
    p0 -= float32(1.0) if j == target else float32(0.0)
    p1 -= float32(1.0) if j + 1 == target else float32(0.0)
    p2 -= float32(1.0) if j + 2 == target else float32(0.0)
    p3 -= float32(1.0) if j + 3 == target else float32(0.0)
    d_words[row, j // 2] = bf16x2(p0 * scale, p1 * scale)
    d_words[row, j // 2 + 1] = bf16x2(p2 * scale, p3 * scale)


@cuda.jit(device=True, inline="always")
def dlogit1(d16, row, v, target, scale, p):
    """dlogits[row, v] from its probability p, as bf16 bits into d16 (uint16 [N, V])."""
    if v == target:
        p -= float32(1.0)
    d16[row, v] = bf16x2(p * scale, float32(0.0)) & 0xFFFF


@cuda.jit
def k_loss_bwd_bf16(d16, d_words, probs, targets, scale, wide):
    """dlogits[n, v] = (probs[n, v] - (v == targets[n])) * scale written as bf16 bits into d16 [N, V]
    (uint16; d_words: the same memory as int32 [N, V/2], for V even). One block a row. wide: four
    values a thread (one 128-bit load, two words of bf16 pairs), as k_loss_fwd_online."""
    row = cuda.blockIdx.x
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    target = targets[row]
    V = probs.shape[1]
    if wide:
        for j in range(4 * tid, V, 4 * nt):
            p0, p1, p2, p3 = load4_row(probs, row, j)
            dlogits4(d_words, row, j, target, scale, p0, p1, p2, p3)
    else:
        for v in range(tid, V, nt):
            dlogit1(d16, row, v, target, scale, probs[row, v])


def _bwd_bf16(mm, dx, dwte, work, dloss, x, wte, probs, targets, block, stream, stats=None):
    """stats None: dlogits from the softmax in probs (k_loss_bwd_bf16); else from the logits in probs
    and each row's (M, se) in stats [2, N] (k_loss_bwd_from_stats, loss_bwd v16)."""
    N, V = probs.shape
    C = x.shape[1]
    scale = np.float32(float(dloss) / N)
    COPIES.reserve(*operand_elements(N, C, V))                   # no-op in a model: reserved at its start
    d16 = COPIES.first(N, V)                                     # the first operand's slot
    wide = wide_rows(probs) and address(d16) % 8 == 0          # (the scratch starts 256-byte aligned)
    d_words = d16.reshape(N * V).view(np.int32).reshape(N, V // 2) if wide else d16   # (unused when not wide)
    if stats is None:
        k_loss_bwd_bf16[N, block, stream](d16, d_words, probs, targets, scale, wide)
    else:
        k_loss_bwd_from_stats[N, block, stream](d16, d_words, probs, stats, targets, scale, wide)
    mm(dx, None, d16, wte, stream=stream)                                       # dx = dlogits @ wte
    mm(dwte, work, d16, x, trans_a=True, accumulate=True, stream=stream)        # dwte += dlogits^T @ x


# The sum of a softmax row: k_loss_fwd_rows adds each e = exp(x - M) with _add, k_loss_fwd_stats with
# _add_rn, so that both round e before adding it (loss_stats_rows says why).
@cuda.jit(device=True, inline="always")
def _add(a, b):
    """a + b: NVVM may fuse it with the product that made b into one fma (it does where b has no
    other use)."""
    return a + b


if SIMULATOR:
    _add_rn = _add
else:
    @cuda.jit(device=True, inline="always")
    def _add_rn(a, b):
        """a + b, b rounded first: add.rn.f32, which neither NVVM nor ptxas fuses with the product
        that made b (the PTX ISA: an add with an explicit rounding modifier is left as it is)."""
        return libdevice.fadd_rn(a, b)


# k_loss_fwd_rows: v2's softmax with the row held in registers, so the logits are read once. At 120M
# (V = 50304) k_loss_fwd_online took 1.55 ms of the bf16 step (on matmul v18) on the H200, more than the
# logits' own product (1.20 ms): it reads each 201 KB row twice and writes it once, 5 GB, and the 264 rows in
# flight (53 MB) spill out of the 50 MB L2 between the two reads. Here thread tid of the row's T
# holds its values x[4 (tid + q T) .. + 3], q < NQ = cdiv(V, 4 T) (NQ float4 loads, all in flight at
# once; 100 registers at T = 512), then:
#     M = max over the row (block_max)          e = exp(x - M), kept in the registers
#     se = sum of e (each thread's NQ x 4 in order, then block_sum's fixed tree)
#     probs = e / se (written in place, float4)        loss = log(se) + M - x[target]
# 3.3 GB moved instead of 5. Another order of the sum than v2's (v2: an online sum of exp(x - m)
# rescaled to M): other bits, the same at every run.
@functools.cache
def _row_softmax(V: int, T: int, add=_add):
    """The part of k_loss_fwd_rows that k_loss_fwd_stats shares, for rows of V logits on T threads: (NX,
    row_sums), NX the values a thread holds; row_sums(buf, xs, probs, row, tid) -> (M, se) loads
    thread tid's values of the row into xs [NX] (local), takes M (block_max), turns xs into
    e = exp(x - M) and sums them with `add` (each thread's NX in order, then block_sum's tree)."""
    NQ = (V + 4 * T - 1) // (4 * T)
    NX = 4 * NQ                                      # a constant: Numba sizes local arrays at compile time
    NEG = float32(-math.inf)

    @cuda.jit(device=True, inline="always")
    def row_sums(buf, xs, probs, row, tid):
        m = NEG
        for q in range(NQ):
            j = 4 * (tid + q * T)
            if j < V:
                xs[4 * q], xs[4 * q + 1], xs[4 * q + 2], xs[4 * q + 3] = load4_row(probs, row, j)
            else:
                xs[4 * q] = xs[4 * q + 1] = xs[4 * q + 2] = xs[4 * q + 3] = NEG
            m = max(m, max(max(xs[4 * q], xs[4 * q + 1]), max(xs[4 * q + 2], xs[4 * q + 3])))
        M = block_max(buf, m)
        s = float32(0.0)
        for i in range(NX):
            e = math.exp(xs[i] - M)                 # exp(-inf) = 0 past the row's end
            xs[i] = e
            s = add(s, e)
        return M, block_sum(buf, s)

    return NX, row_sums


def _row_kernel(kernel, T: int):
    """kernel compiled for blocks of T threads: .maxntid T on a GPU, where ptxas keeps to the
    registers one block of T threads may have (128 at T = 512; the 100 values of a 120M row and the
    rest fit without spilling, sm_90)."""
    return cuda.jit(kernel) if SIMULATOR else cuda.jit(kernel, launch_bounds=(T, 1))


@functools.cache
def loss_fwd_rows(V: int, T: int):
    """The k_loss_fwd_rows kernel for rows of V logits on T threads (V % 4 == 0, rows 16-byte aligned)."""
    NQ = (V + 4 * T - 1) // (4 * T)
    NX, row_sums = _row_softmax(V, T)

    def k_loss_fwd_rows(losses, probs, targets):
        """probs [N, V]: the logits on entry, the softmax on exit; losses[row] = log(sum exp) - logit
        of the target. One block of T threads a row, the row in registers (comment above)."""
        buf = cuda.shared.array(MAX_BLOCK, float32)
        row, tid = cuda.blockIdx.x, cuda.threadIdx.x
        xs = cuda.local.array(NX, float32)
        picked = probs[row, targets[row]]            # read before the barrier after which rows are written
        M, se = row_sums(buf, xs, probs, row, tid)
        for q in range(NQ):
            j = 4 * (tid + q * T)
            if j < V:
                store4(probs, row * V + j, xs[4 * q] / se, xs[4 * q + 1] / se, xs[4 * q + 2] / se, xs[4 * q + 3] / se)
        if tid == 0:
            losses[row] = (math.log(se) + M) - picked

    return _row_kernel(k_loss_fwd_rows, T)


# v17 forward: v16 (the logits from matmul_bf16_wgmma) with the softmax in one read of the logits
# (k_loss_fwd_rows); v2's two passes where the rows are not whole 16-byte chunks. block = threads a row.
@rung(17)
@blocks(gpu=(512, 1024), sim=(4, 8))
def loss_fwd_bf16_wgmma_probs(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """The logits from matmul_bf16_wgmma; the softmax with the row in registers (k_loss_fwd_rows), the loss
    in fp32."""
    N, V = probs.shape
    matmul_bf16_wgmma(probs, None, x, wte, trans_b=True, stream=stream)       # logits = x @ wte^T, into probs
    if wide_rows(probs):
        loss_fwd_rows(V, block)[N, block, stream](losses, probs, targets)
    else:
        k_loss_fwd_online[N, row_threads(V, block), stream](losses, probs, targets, False)
    k_loss_mean[1, MEAN_THREADS, stream](loss, losses)


loss_fwd_bf16_wgmma_probs.precision = "bf16"


# v18 forward, v16 backward (bf16): the fp32 softmax is never written. v17's k_loss_fwd_rows reads the
# logits once and writes probs = e / se over them, which v15's k_loss_bwd_bf16 reads back for dlogits:
# at 120M (N = 8192 rows, V = 50304) 1.65 GB written and 1.65 GB read again, 0.89 + 0.59 ms on the
# H200, both at memory bandwidth. Here the forward keeps the logits in probs and saves two numbers a
# row in stats [2, N] (k_loss_fwd_stats):
#     M = max_v x[v]            se = sum_v exp(x[v] - M)            losses[row] = log(se) + M - x[target]
# and the backward (k_loss_bwd_from_stats) computes, as it reads the logits,
#     p = exp(x - M) / se       dlogits = (p - onehot(target)) * dloss / N, in bf16 as k_loss_bwd_bf16
# M and se are v3's own: the same register-held row and order of the sum (_row_softmax, which v3 is
# built from too); p takes the fp32 operations v3 stores (math.exp, then a division; no fastmath) on
# the same values, so it is the value v3 would have written, and losses, loss, the bf16 dlogits, dx
# and dwte are bit for bit v17 + v15's (the packing is v2's: dlogits4, dlogit1; the same products).
# Saved: one 1.65 GB write a step at 120M (stats: 2 x 4 bytes a row, 64 KB); the backward does the
# exp and the division a logit that v3 did. After the forward probs holds the logits, not the
# softmax: a caller that reads probabilities back computes exp(x - M) / se itself.
# Without stats both launchers are v17 / v15 (how the harness calls them). Where probs' rows are not
# whole 16-byte chunks (wide_rows false: V % 4 != 0, or unaligned) both fall back to v17 / v15 as
# well, stats neither written nor read: each decides from probs alone, so the pair always agrees.
@functools.cache
def loss_stats_rows(V: int, T: int):
    """The k_loss_fwd_stats kernel for rows of V logits on T threads (V % 4 == 0, rows 16-byte aligned).
    Its sum adds each e with _add_rn: v3 keeps e for its division, so e is rounded before it is
    added (mul.f32, add.f32); here e has no other use and NVVM would fuse the two into an fma, which
    rounds once (other bits where e is subnormal)."""
    NX, row_sums = _row_softmax(V, T, _add_rn)

    def k_loss_fwd_stats(losses, stats, probs, targets):
        """k_loss_fwd_rows with probs left as it is (the logits): stats[0, row] = M, the row's maximum,
        stats[1, row] = se = sum exp(x - M), and losses[row] = log(se) + M - the target's logit."""
        buf = cuda.shared.array(MAX_BLOCK, float32)
        row, tid = cuda.blockIdx.x, cuda.threadIdx.x
        xs = cuda.local.array(NX, float32)
        M, se = row_sums(buf, xs, probs, row, tid)
        if tid == 0:
            losses[row] = (math.log(se) + M) - probs[row, targets[row]]
            stats[0, row] = M
            stats[1, row] = se

    return _row_kernel(k_loss_fwd_stats, T)


@cuda.jit
def k_loss_bwd_from_stats(d16, d_words, logits, stats, targets, scale, wide):
    """k_loss_bwd_bf16 from the logits: p = exp(x - M) / se with (M, se) = stats[:, row] (k_loss_fwd_stats),
    the value k_loss_fwd_rows would have stored; then dlogits = (p - onehot) * scale in bf16 as v2."""
    row = cuda.blockIdx.x
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    target = targets[row]
    M, se = stats[0, row], stats[1, row]
    V = logits.shape[1]
    if wide:
        for j in range(4 * tid, V, 4 * nt):
            x0, x1, x2, x3 = load4_row(logits, row, j)
            dlogits4(d_words, row, j, target, scale, math.exp(x0 - M) / se, math.exp(x1 - M) / se,
                     math.exp(x2 - M) / se, math.exp(x3 - M) / se)
    else:
        for v in range(tid, V, nt):
            dlogit1(d16, row, v, target, scale, math.exp(logits[row, v] - M) / se)


def _stats_for(probs, stats):
    """stats where v18 / v16 use it (rows of whole 16-byte chunks), else None; checks its shape."""
    if stats is None or not wide_rows(probs):
        return None
    if stats.shape != (2, probs.shape[0]) or stats.dtype != np.float32:
        raise ValueError(f"stats must be float32 [2, {probs.shape[0]}] (M and se a row), not {stats.dtype} {stats.shape}")
    return stats


@rung(18)
@blocks(gpu=(512, 1024), sim=(4, 8))
def loss_fwd_bf16_wgmma(loss, losses, probs, x, wte, targets, *, stats=None, block, stream=0):
    """v17, or with stats (float32 [2, N]): the logits left in probs, each row's maximum M and sum
    se = sum exp(x - M) in stats (k_loss_fwd_stats), for loss_bwd v16; losses and loss as v17's."""
    stats = _stats_for(probs, stats)
    if stats is None:
        return loss_fwd_bf16_wgmma_probs(loss, losses, probs, x, wte, targets, block=block, stream=stream)
    N, V = probs.shape
    matmul_bf16_wgmma(probs, None, x, wte, trans_b=True, stream=stream)       # logits = x @ wte^T, into probs
    loss_stats_rows(V, block)[N, block, stream](losses, stats, probs, targets)
    k_loss_mean[1, MEAN_THREADS, stream](loss, losses)


@rung(16)
@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_bf16_wgmma(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, stats=None, block, stream=0):
    """v15, or with stats (loss_fwd v18's): the softmax recomputed from the logits in probs as dlogits
    are written (k_loss_bwd_from_stats); the same two products on matmul_bf16_wgmma."""
    _bwd_bf16(matmul_bf16_wgmma, dx, dwte, work, dloss, x, wte, probs, targets, block, stream, _stats_for(probs, stats))


loss_fwd_bf16_wgmma.precision = loss_bwd_bf16_wgmma.precision = "bf16"


# fp32 products on Hopper: the logits, dx and dwte from matmul_tf32x3_wgmma (3xTF32 on wgmma).
@rung(19)
@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_tf32x3_wgmma(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """loss_fwd_tf32x3 with the logits from matmul_tf32x3_wgmma."""
    _fwd_warp(matmul_tf32x3_wgmma, loss, losses, probs, x, wte, targets, row_threads(probs.shape[1], block), stream)


@rung(17)
@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_tf32x3_wgmma(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """loss_bwd_tf32x3 with its products from matmul_tf32x3_wgmma, dwte split over K into work."""
    _bwd_warp(matmul_tf32x3_wgmma, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


