"""One position of the model for a KV-cache decoder: the k_decode_* kernels. NumPy twin:
reference/decode.py (KVCache.step); andrea_numba/decode.py chains them into a decoder.

The whole forward computes B*T rows; a decode step computes the one row of position t, reading
the k and v rows of positions 0..t-1 from the cache (each block's K and V, [T, C], in the twin's
layout) instead of computing them again. C = d_model, H heads of hs = C / H channels, F = 4C:

    x = wte[tokens[t]] + wpe[t]                                          k_decode_embed
    per block (its K, V):
        q = LN1(x) @ W_q;  K[t] = LN1(x) @ W_k;  V[t] = LN1(x) @ W_v     k_decode_qkv
        y_h = softmax(q_h K_h[0..t]^T / sqrt(hs)) V_h[0..t], per head h  k_decode_attention
        x = x + y @ W_o                                                  k_decode_matvec_add
        h = gelu(LN2(x) @ W_1)                                           k_decode_mlp_up
        x = x + h @ W_2                                                  k_decode_matvec_add
    logits = LNf(x) @ wte^T                                              k_decode_logits
    probs = softmax(logits)                                              k_decode_softmax
    t = t + 1                                                            k_decode_advance

The position t is pos[0], an int32 on the device that every kernel reads and k_decode_advance
moves on; the token ids are tokens[0..T-1] on the device. No launch's arguments or sizes depend
on t, so the same launches serve every token: a decoder records them once as a CUDA graph and
replays it for each token (andrea_numba/decode.py).

The products of one row. A [1, K] x [K, N] product reads the K x N weights once and does two
flops per weight read: it is bound by memory, not by arithmetic, and what matters is that the
weights stream through at full width with many loads in flight. The weights are stored [in, out]
row-major, so a thread per output column n, threads side by side over n, reads a row of W
coalesced (32 columns: one 128-byte line a warp). One thread per column would leave few threads
and long chains of loads (N = 384 columns, K = 1536 rows at 12M), so a block is TX columns x KS
slices of K: thread (tx, ty) sums rows k = ty, ty + KS, ... of column n, in four running sums
(four independent loads in flight), and thread ty = 0 adds the KS partial sums of its column in
ty order. The kernels that start with a LayerNorm (qkv, mlp_up, logits) normalise the row x
themselves, into shared memory: every block does the same C-channel sums (a small part of its
share of the weights), so every block gets the same bits.

The tied classifier reads wte [V, C] by rows: a row v is one output, so there lanes of a block
(TX of them, over the C channels, coalesced) share a row and meet in a tree, RY rows a block.

Attention over t+1 keys, a block per head, in three phases on the block's NT threads:
    1. s_u = q_h . K[u, h] / sqrt(hs) for u = 0..t: LANES threads per key, each summing channels
       d = lane, lane + LANES, ... (LANES neighbouring channels of a key row: coalesced), meeting in
       a tree; NT / LANES keys at a time. The scores go to shared memory (dynamic: T floats).
    2. m = max_u s_u (block_max), e_u = exp(s_u - m) in place, se = sum_u e_u (block_sum).
    3. y_h[d] = sum_u e_u V[u, h*hs + d] / se: threads over (group g, channel d), a warp over
       neighbouring channels of a V row (coalesced); group g sums keys u = g, g + G, ...; the G
       groups' sums added in g order.

Deterministic: no atomics; every sum has an order fixed by the sizes and the launch.
"""
import math

import numpy as np
from numba import cuda, float32

from .common import MAX_BLOCK, SIMULATOR, block_max, block_sum, blocks, cdiv
from .mlp import gelu

LOGIT_BLOCKS = 4 if SIMULATOR else 1 << 20      # k_decode_logits: at most this many blocks (rows loop)


# ---------------------------------------------------------------------------------------------
# device functions: a block's sum, the LayerNorm of one row, a column's part of a product

@cuda.jit(device=True)
def _flat_sum(buf, val):
    """Sum of val over every thread of a block of any shape (its thread count a power of two):
    common.block_sum's tree on the flat thread index i = ty * TX + tx. Every thread gets the total."""
    i = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    buf[i] = val
    cuda.syncthreads()
    s = cuda.blockDim.x * cuda.blockDim.y // 2
    while s > 0:
        if i < s:
            buf[i] += buf[i + s]
        cuda.syncthreads()
        s //= 2
    total = buf[0]
    cuda.syncthreads()              # buf may be reused right after
    return total


@cuda.jit(device=True)
def _layernorm_row(a, buf, x, g, b, eps):
    """a[c] = (x[c] - mean) * rstd * g[c] + b[c] over the C channels of the row x, written into the
    shared array a by the whole block: mean = (1/C) sum_c x[c], then rstd = 1 / sqrt((1/C) sum_c
    (x[c] - mean)^2 + eps), as k_layernorm_fwd computes them."""
    i = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    n = cuda.blockDim.x * cuda.blockDim.y
    C = x.shape[0]
    inv_c = float32(1.0) / float32(C)
    s = float32(0.0)
    for c in range(i, C, n):
        s += x[c]
    mu = _flat_sum(buf, s) * inv_c
    s = float32(0.0)
    for c in range(i, C, n):
        d = x[c] - mu
        s += d * d
    r = float32(1.0) / math.sqrt(_flat_sum(buf, s) * inv_c + eps)
    for c in range(i, C, n):
        a[c] = (x[c] - mu) * r * g[c] + b[c]
    cuda.syncthreads()


@cuda.jit(device=True)
def _column_part(a, w, n):
    """Thread (tx, ty)'s part of out[n] = sum_k a[k] w[k, n] in a block of TX x KS threads: rows
    k = ty, ty + KS, ty + 2 KS, ... in four running sums (their loads independent: four in flight),
    then added. 0 for a column past the matrix."""
    ks = cuda.blockDim.y
    K = w.shape[0]
    s0 = float32(0.0)
    s1 = float32(0.0)
    s2 = float32(0.0)
    s3 = float32(0.0)
    if n < w.shape[1]:
        k = cuda.threadIdx.y
        while k + 3 * ks < K:
            s0 += a[k] * w[k, n]
            s1 += a[k + ks] * w[k + ks, n]
            s2 += a[k + 2 * ks] * w[k + 2 * ks, n]
            s3 += a[k + 3 * ks] * w[k + 3 * ks, n]
            k += 4 * ks
        while k < K:
            s0 += a[k] * w[k, n]
            k += ks
    return (s0 + s1) + (s2 + s3)


@cuda.jit(device=True)
def _column_total(buf, part):
    """The column's KS parts (one a thread ty) added in ty order; the total is right in thread ty = 0
    only. buf: shared, at least TX * KS floats."""
    tx, ty, TX = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
    buf[ty * TX + tx] = part
    cuda.syncthreads()
    total = float32(0.0)
    if ty == 0:
        for j in range(cuda.blockDim.y):
            total += buf[j * TX + tx]
    return total


# ---------------------------------------------------------------------------------------------
# the kernels, in the order of a step

@cuda.jit
def k_decode_embed(x, tokens, pos, wte, wpe):
    """x[c] = wte[tokens[t], c] + wpe[t, c], t = pos[0]: one block, its threads striding over C."""
    t = pos[0]
    tok = tokens[t]
    for c in range(cuda.threadIdx.x, x.shape[0], cuda.blockDim.x):
        x[c] = wte[tok, c] + wpe[t, c]


@cuda.jit
def k_decode_qkv(q, k_cache, v_cache, pos, x, g, b, eps, w_q, w_k, w_v):
    """a = LN1(x); q = a @ W_q, k_cache[t] = a @ W_k, v_cache[t] = a @ W_v, t = pos[0]. The 3C
    columns of [W_q | W_k | W_v] in blocks of TX (a block may straddle two matrices: each thread
    takes its column's), KS slices of K = C a column (_column_part)."""
    a = cuda.shared.array(0, float32)              # LN1(x): C floats of dynamic shared memory
    buf = cuda.shared.array(MAX_BLOCK, float32)
    _layernorm_row(a, buf, x, g, b, eps)
    C = x.shape[0]
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x      # column of [W_q | W_k | W_v]
    which = min(n // C, 2)
    j = n - which * C                              # its column in that matrix (>= C past the last)
    w = w_q if which == 0 else (w_k if which == 1 else w_v)
    total = _column_total(buf, _column_part(a, w, j))
    if cuda.threadIdx.y == 0 and j < C:
        if which == 0:
            q[j] = total
        elif which == 1:
            k_cache[pos[0], j] = total
        else:
            v_cache[pos[0], j] = total


@cuda.jit
def k_decode_attention(y, q, k_cache, v_cache, pos, lanes):
    """y[h*hs + d] = sum_{u<=t} e_u v_cache[u, h*hs + d] / sum_u e_u, e_u = exp(s_u - max s),
    s_u = q_h . k_cache[u, h] / sqrt(hs), t = pos[0]: block h is head h, the three phases of the
    module's docstring. sc: the t+1 scores, then their exponentials (dynamic shared, T floats)."""
    sc = cuda.shared.array(0, float32)
    red = cuda.shared.array(MAX_BLOCK, float32)
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    C = q.shape[0]
    hs = C // cuda.gridDim.x
    base = cuda.blockIdx.x * hs
    t = pos[0]
    scale = float32(1.0) / math.sqrt(float32(hs))
    # 1. scores: `lanes` threads a key, nt / lanes keys at a time, each key's lanes meeting in a tree
    lane, row = tid % lanes, tid // lanes
    for u0 in range(0, t + 1, nt // lanes):
        u = u0 + row
        s = float32(0.0)
        if u <= t:
            for d in range(lane, hs, lanes):
                s += q[base + d] * k_cache[u, base + d]
        red[tid] = s
        cuda.syncthreads()
        step = lanes // 2
        while step > 0:
            if lane < step:
                red[tid] += red[tid + step]
            cuda.syncthreads()
            step //= 2
        if lane == 0 and u <= t:
            sc[u] = red[tid] * scale
    cuda.syncthreads()
    # 2. the softmax's max and sum; the exponentials replace the scores
    m = float32(-math.inf)
    for u in range(tid, t + 1, nt):
        m = max(m, sc[u])
    m = block_max(red, m)
    s = float32(0.0)
    for u in range(tid, t + 1, nt):
        e = math.exp(sc[u] - m)
        sc[u] = e
        s += e
    se = block_sum(red, s)                         # (its barriers also publish every e_u)
    # 3. y_h = sum_u e_u V[u, h] / se: G groups of `cols` threads, group g over keys g, g + G, ...
    cols = min(hs, nt)
    G = nt // cols
    g = tid // cols
    for d in range(tid % cols, hs, cols):
        a0 = float32(0.0)
        a1 = float32(0.0)
        if g < G:
            u = g
            while u + G <= t:                      # two keys a round: two loads in flight
                a0 += sc[u] * v_cache[u, base + d]
                a1 += sc[u + G] * v_cache[u + G, base + d]
                u += 2 * G
            if u <= t:
                a0 += sc[u] * v_cache[u, base + d]
        if G == 1:
            if g == 0:                             # (threads past the first hs have no channel)
                y[base + d] = (a0 + a1) / se
        else:                                      # (G > 1: cols = hs, one channel a thread)
            red[tid] = a0 + a1                     # red[g * hs + d]
    if G > 1:
        cuda.syncthreads()
        if tid < hs:
            total = float32(0.0)
            for j in range(G):
                total += red[j * hs + tid]
            y[base + tid] = total / se


@cuda.jit
def k_decode_matvec_add(x, a, w):
    """x[n] = x[n] + sum_k a[k] w[k, n]: a residual branch's output projection (W_o after attention,
    W_2 after the GELU) added into the residual stream in place. Columns in blocks of TX, KS slices
    of K a column; x[n] is read and written by its column's thread ty = 0 only."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    total = _column_total(buf, _column_part(a, w, n))
    if cuda.threadIdx.y == 0 and n < x.shape[0]:
        x[n] = x[n] + total


@cuda.jit
def k_decode_mlp_up(h, x, g, b, eps, w_1):
    """h[n] = gelu(sum_k LN2(x)[k] w_1[k, n]) for the F = 4C hidden units: the GELU of the engine
    (kernels/mlp.py, tanh form). Columns in blocks of TX, KS slices of K = C a column."""
    a = cuda.shared.array(0, float32)              # LN2(x): C floats of dynamic shared memory
    buf = cuda.shared.array(MAX_BLOCK, float32)
    _layernorm_row(a, buf, x, g, b, eps)
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    total = _column_total(buf, _column_part(a, w_1, n))
    if cuda.threadIdx.y == 0 and n < h.shape[0]:
        h[n] = gelu(total)


@cuda.jit
def k_decode_logits(logits, x, g, b, eps, wte):
    """logits[v] = sum_c LNf(x)[c] wte[v, c]: the tied classifier, wte read by rows. A block of
    TX lanes x RY rows: lane tx sums channels c = tx, tx + TX, ... of row v (a warp's lanes read
    neighbouring channels), the row's lanes meet in a tree; blocks stride over the V rows."""
    a = cuda.shared.array(0, float32)              # LNf(x): C floats of dynamic shared memory
    buf = cuda.shared.array(MAX_BLOCK, float32)
    _layernorm_row(a, buf, x, g, b, eps)
    tx, ty, TX, RY = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x, cuda.blockDim.y
    i = ty * TX + tx
    V, C = wte.shape
    for v0 in range(cuda.blockIdx.x * RY, V, cuda.gridDim.x * RY):     # the same trips for the whole block
        v = v0 + ty
        s0 = float32(0.0)
        s1 = float32(0.0)
        if v < V:
            c = tx
            while c + TX < C:                      # two channels a round: two loads in flight
                s0 += a[c] * wte[v, c]
                s1 += a[c + TX] * wte[v, c + TX]
                c += 2 * TX
            if c < C:
                s0 += a[c] * wte[v, c]
        buf[i] = s0 + s1
        cuda.syncthreads()
        step = TX // 2
        while step > 0:
            if tx < step:
                buf[i] += buf[i + step]
            cuda.syncthreads()
            step //= 2
        if tx == 0 and v < V:
            logits[v] = buf[i]
        cuda.syncthreads()                         # buf is written again by the next rows


@cuda.jit
def k_decode_softmax(probs, logits):
    """probs[v] = exp(logits[v] - m) / se, m = max_v logits[v], se = sum_v exp(logits[v] - m), as
    k_loss_fwd's softmax: one block, its threads striding over the V entries (block_max, block_sum)."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    V = logits.shape[0]
    m = float32(-math.inf)
    for v in range(tid, V, nt):
        m = max(m, logits[v])
    m = block_max(buf, m)
    s = float32(0.0)
    for v in range(tid, V, nt):
        s += math.exp(logits[v] - m)
    se = block_sum(buf, s)
    for v in range(tid, V, nt):
        probs[v] = math.exp(logits[v] - m) / se


@cuda.jit
def k_decode_advance(pos):
    """t = t + 1: the next step computes the next position (one thread)."""
    pos[0] += 1


@cuda.jit
def k_decode_start(pos):
    """t = 0: a new sequence (one thread)."""
    pos[0] = 0


# ---------------------------------------------------------------------------------------------
# launchers: block = (TX, KS) for the products (columns, slices of K), (TX, RY) for the logits
# (lanes, rows), (NT, LANES) for attention (threads, lanes a key), NT for the rest. The defaults
# (the first of each `blocks`) are at most 512 threads where a kernel holds more than a few values
# a thread: Numba sets no register bound, and 1024 threads leave 64 registers a thread. None of
# these sizes has been timed on a GPU yet; the later ones of each list are the alternatives to try.

PRODUCT_BLOCKS = dict(gpu=((32, 16), (32, 32), (32, 8)), sim=((4, 2), (2, 4)))


@blocks(gpu=(256, 128), sim=(4,))
def decode_embed(x, tokens, pos, wte, wpe, *, block, stream=0):
    """x [C]; tokens [T] int32; pos [1] int32; wte [V, C]; wpe [T_max, C]. Launch: one block."""
    k_decode_embed[1, block, stream](x, tokens, pos, wte, wpe)


@blocks(**PRODUCT_BLOCKS)
def decode_qkv(q, k_cache, v_cache, pos, x, g, b, eps, w_q, w_k, w_v, *, block, stream=0):
    """q [C]; k_cache, v_cache [T, C] (row pos[0] written); pos [1] int32; x, g, b [C]; w_q, w_k,
    w_v [C, C]. Launch: 3C / TX blocks of TX x KS threads, C floats of dynamic shared memory."""
    C = x.shape[0]
    k_decode_qkv[cdiv(3 * C, block[0]), block, stream, 4 * C](q, k_cache, v_cache, pos, x, g, b, float32(eps),
                                                              w_q, w_k, w_v)


@blocks(gpu=((512, 8), (1024, 8), (256, 8), (512, 4)), sim=((8, 2), (4, 4)))
def decode_attention(y, q, k_cache, v_cache, pos, n_head, *, block, stream=0):
    """y, q [C]; k_cache, v_cache [T, C] (rows 0..pos[0] read); pos [1] int32. Launch: n_head blocks
    of NT threads (a power of two), LANES (a power of two, at most NT) a key; T floats of dynamic
    shared memory for the scores."""
    nt, lanes = block
    assert lanes <= nt and nt & (nt - 1) == 0 and lanes & (lanes - 1) == 0, f"block {block}: powers of two"
    k_decode_attention[n_head, nt, stream, 4 * k_cache.shape[0]](y, q, k_cache, v_cache, pos, np.int32(lanes))


@blocks(**PRODUCT_BLOCKS)
def decode_matvec_add(x, a, w, *, block, stream=0):
    """x [N] (+= a @ w, in place); a [K]; w [K, N]. Launch: N / TX blocks of TX x KS threads."""
    k_decode_matvec_add[cdiv(w.shape[1], block[0]), block, stream](x, a, w)


@blocks(**PRODUCT_BLOCKS)
def decode_mlp_up(h, x, g, b, eps, w_1, *, block, stream=0):
    """h [F]; x, g, b [C]; w_1 [C, F]. Launch: F / TX blocks of TX x KS threads, C floats of dynamic
    shared memory."""
    C = x.shape[0]
    k_decode_mlp_up[cdiv(w_1.shape[1], block[0]), block, stream, 4 * C](h, x, g, b, float32(eps), w_1)


@blocks(gpu=((32, 8), (32, 32), (32, 4)), sim=((2, 4), (4, 2)))
def decode_logits(logits, x, g, b, eps, wte, *, block, stream=0):
    """logits [V]; x, g, b [C]; wte [V, C]. Launch: V / RY blocks (at most LOGIT_BLOCKS: the rows
    loop) of TX x RY threads (TX a power of two), C floats of dynamic shared memory."""
    V, C = wte.shape
    k_decode_logits[min(cdiv(V, block[1]), LOGIT_BLOCKS), block, stream, 4 * C](logits, x, g, b, float32(eps), wte)


@blocks(gpu=(1024, 256), sim=(8,))
def decode_softmax(probs, logits, *, block, stream=0):
    """probs, logits [V]. Launch: one block of `block` threads (a power of two)."""
    k_decode_softmax[1, block, stream](probs, logits)


def decode_advance(pos, *, stream=0):
    """pos [1] int32, += 1. Launch: one thread."""
    k_decode_advance[1, 1, stream](pos)


def decode_start(pos, *, stream=0):
    """pos [1] int32, = 0. Launch: one thread."""
    k_decode_start[1, 1, stream](pos)
