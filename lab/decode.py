"""The KV-cache decoder's step, its rungs. Rung 1 is the engine's (andrea_numba/kernels/decode.py):
the products' sums across the threads of a block as trees in shared memory, a barrier a level;
attention's and the draw's by shuffles. The same kernels otherwise, the same launches
(Decoder.work runs any rung's; lab/bench/decode_speed.py --versions 1,9,5,8 times them in one
run), the same arguments:

    rung 2  sums across threads by shuffles: a warp's lanes meet by a butterfly (ptx.warp_sum, lane i
            adds lane i ^ m, m = 16, ..., 1), the warps' sums after one barrier, in warp order: a
            block sum costs one barrier instead of a tree's 9 or 10 (below)
    rung 3  rung 2 with attention in one block a head (decode_attention_v3, below): its warps split
            the keys, each keeps a running softmax over its own, and the warps' parts meet in
            shared memory after one barrier; no chunk's part goes through memory, no block waits
            for the last one of its head, at the cost of H blocks (6 at 12M) where rung 2 runs one a
            chunk of keys
    rung 4  the whole step in one launch, one block a multiprocessor, its phases met by grid
            barriers instead of kernel boundaries (lab/decode_step.py; decoder_class gives its decoder)
    rung 5  rung 1 with the products (qkv, the output projections, mlp_up) loading 4 columns of a
            row in one 128-bit load, four rows a round, in blocks of 4 or 8 columns: more bytes in
            flight and more blocks (below)
    rung 6  rung 5 with its sums by shuffles: the LayerNorm's two block sums and the column slices'
            sums each a butterfly within the warps and one barrier (below)
    rung 7  rung 6 with the classifier's sums by shuffles too (its LayerNorm, a row's lanes, the
            softmax's; attention's and the draw's were this rung's before the engine took them)
    rung 8  rung 5's products (trees) with rung 7's classifier (shuffles): each kernel from the
            rung where it was faster
    rung 9  the engine with attention and the draw by trees, as they were before 2026-12-08 (a key's
            lanes and the merge's maximum and sum; the draw's two maxima, one float64 log a token,
            and thread 0 adding the runs' sums one after another)

Measured on an NVIDIA H100 (2026-12-07, docs/results/2026-12-07-h100-decoder-rungs/), the GPU time
of a step with its draw at 12M, median of 5 rounds: rung 1 0.2996 ms, rung 2 0.4138, rung 3 0.4185,
rung 4 0.4401. Fewer barriers did not make the step faster there: the trees won.
On another H100 (2026-12-08, docs/results/2026-12-08-h100-decoder-rung-7/), the engine (its kernels
then taking bf16 as an argument) 0.3356 ms, rung 5 0.3143, rung 6 0.3271, rung 7 0.3200: the
products' sums by shuffles lost to their trees (W_o 4.2 us a launch against 3.6), attention's, the
classifier's and the draw's won (9.8, 9.3 and 13.6 us against 10.4, 10.0 and 17.3): the engine took
attention's and the draw's, and rung 8 takes each kernel from the rung where it was faster.

Rungs 2 to 4 decode at fp32 only (their launchers refuse bf16 = True): their attention keeps its
scores in base e, and their kernels have no bf16 twins. Rungs 5 to 9 decode at both, as the engine:
their kernels compiled again with the engine's bf16 _in (common.compiled_again).

Rungs 2, 6 and 7 and the engine: shuffles take all 32 lanes of a warp: their launchers refuse blocks
that are part of a warp on a GPU (_whole_warps; the simulator runs blocks smaller than a warp).
"""
import math
import types

import numpy as np
from numba import cuda, float32, float64, int32

from andrea_numba.kernels import decode as engine
from andrea_numba.kernels.common import (MAX_BLOCK, SIMULATOR, block_max, block_sum, blocks, cdiv, compiled_again,
                                         compiled_with, nonneg)
from andrea_numba.kernels.decode import LOGIT_BLOCKS, _block_top, _block_total, _from_l2, _in, _last_block, _warps_total
from andrea_numba.kernels.mlp import gelu
from andrea_numba.kernels.ptx import load4_row, warp_sum

# the blocks of rung 2 (whole warps: a warp's shuffles take its 32 lanes)
QKV_BLOCKS = dict(gpu=((8, 64), (8, 32), (8, 128), (16, 32), (4, 128), (32, 16)), sim=((4, 2), (2, 4), (1, 8)))
MATVEC_BLOCKS = dict(gpu=((8, 128), (8, 64), (4, 128), (16, 64), (32, 16)), sim=((4, 2), (2, 4), (1, 8)))
MLP_UP_BLOCKS = dict(gpu=((8, 64), (8, 32), (8, 128), (16, 32), (4, 128), (32, 16)), sim=((4, 2), (2, 4), (1, 8)))
ATTENTION_BLOCKS = dict(gpu=((16, 16), (8, 32), (16, 32), (32, 8), (4, 64)), sim=((1, 4), (4, 2), (2, 8)))
LOGITS_BLOCKS = dict(gpu=((32, 8), (16, 16), (32, 32)), sim=((2, 4), (4, 2)))
FP32_ONLY = "rungs 2 to 4 decode at fp32: their kernels have no bf16 twins (the engine's and rungs 5 to 9 do)"


# ---------------------------------------------------------------------------------------------
# rung 2: the sums across threads by shuffles

@cuda.jit(device=True)
def _chunk_weight(m_p, big):
    """w_p = exp(m_p - M): chunk p's exponentials, taken against its own maximum m_p, brought to
    the head's maximum M (rungs 2 and 3 keep attention's scores in base e, as the engine did before
    its bf16 decoder: kernels/decode.py takes them in base 2 against an integer maximum)."""
    return math.exp(m_p - big)


@cuda.jit(device=True)
def _column_total(buf, part):
    """The KS parts of each of the block's TX columns (part: thread (tx, ty)'s, slice ty) added:
    a warp holds G = 32 / TX slices of each of its columns (1 when TX >= 32), which meet by a
    butterfly of shuffles over the lane bits of ty (ptx.warp_sum from TX up); the warp's lanes of
    its first slice leave the sums in buf[group * TX + tx], and after one barrier every thread adds
    its column's KS / G sums in group order. buf: shared, at least TX * KS floats, not free again
    before another barrier."""
    tx, ty, TX = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
    g = max(1, 32 // TX)                           # slices a warp
    s = warp_sum(part, TX, 16)
    if ty % g == 0:
        buf[(ty // g) * TX + tx] = s
    cuda.syncthreads()
    total = buf[tx]
    for j in range(1, (cuda.blockDim.y + g - 1) // g):
        total += buf[j * TX + tx]
    return total


# the engine's LayerNorm (a = [the row | g | b] normalised in place) with its two block sums by warps
_layernorm_shared = compiled_with(engine._layernorm_shared, "_layernorm_shared_v2", block_sum=_block_total)


def _with_rung_2_sums(kernel):
    """The engine's kernel (its Python code, as written in kernels/decode.py) compiled anew with this
    rung's sums in place of the engine's: its LayerNorm's block sums and its column's slices by
    shuffles (_layernorm_shared, _column_total above). The products' kernels differ in nothing else."""
    fn = getattr(kernel, "py_func", None) or kernel.fn
    return compiled_with(kernel, fn.__name__ + "_v2", _layernorm_shared=_layernorm_shared,
                         _column_total=_column_total)


k_decode_qkv_v2 = _with_rung_2_sums(engine.k_decode_qkv)
k_decode_matvec_add_v2 = _with_rung_2_sums(engine.k_decode_matvec_add)
k_decode_mlp_up_v2 = _with_rung_2_sums(engine.k_decode_mlp_up)


@cuda.jit
def k_decode_attention_v2(y, part_m, part_l, part_acc, done, q, k_cache, v_cache, pos):
    """y[h*hs + d] = sum_{u<=t} e_u v_cache[u, h*hs + d] / sum_u e_u, e_u = exp(s_u - max s),
    s_u = q_h . k_cache[u, h] / sqrt(hs), t = pos[0]: block (p, h) takes the CK keys of chunk p of
    head h (the four steps of the module's docstring); the last of head h's blocks merges the
    chunks into y_h. done[h]: head h's counter of finished blocks (0 between launches)."""
    red = cuda.shared.array(MAX_BLOCK, float32)    # the lanes' (then the groups') sums
    ex = cuda.shared.array(MAX_BLOCK, float32)     # the chunk's scores' exponentials, then the chunks' weights
    flag = cuda.shared.array(1, int32)
    lane, r = cuda.threadIdx.x, cuda.threadIdx.y
    LANES, CK = cuda.blockDim.x, cuda.blockDim.y
    tid, nt = r * LANES + lane, LANES * CK
    p, h = nonneg(cuda.blockIdx.x), nonneg(cuda.blockIdx.y)     # (int64s: _from_l2's indices are one type)
    hs = q.shape[0] // cuda.gridDim.y
    base = h * hs
    t = pos[0]
    u0 = p * CK                                    # the chunk's first key
    if u0 > t:
        return                                     # a chunk past t: nothing to do (and not counted)
    nk = min(CK, t + 1 - u0)                       # its keys up to t
    na = t // CK + 1                               # the chunks that run: 0 .. na - 1
    # 1. the scores: thread (lane, r) sums channels d = lane, lane + LANES, ... of key u0 + r
    s0 = float32(0.0)
    s1 = float32(0.0)
    if r < nk:
        u = u0 + r
        d = lane
        while d + LANES < hs:                      # two channels a round: two loads in flight
            s0 += q[base + d] * k_cache[u, base + d]
            s1 += q[base + d + LANES] * k_cache[u, base + d + LANES]
            d += 2 * LANES
        if d < hs:
            s0 += q[base + d] * k_cache[u, base + d]
    score = warp_sum(s0 + s1, 1, LANES // 2)      # the LANES lanes of each key meet: shuffles
    if lane == 0:
        red[r] = score
    cuda.syncthreads()
    # 2. the chunk's maximum (every thread, in key order), its exponentials and their sum
    scale = float32(1.0) / math.sqrt(float32(hs))
    m = float32(-math.inf)
    for j in range(nk):
        m = max(m, red[j] * scale)
    if lane == 0 and r < nk:
        ex[r] = math.exp(score * scale - m)
    cuda.syncthreads()
    # 3. acc[d] = sum_r ex[r] V[u0 + r, base + d]: group g of `cols` threads over keys r = g, g + G, ...
    cols = min(hs, nt)
    G = nt // cols
    g = tid // cols
    for d in range(tid % cols, hs, cols):
        a0 = float32(0.0)
        a1 = float32(0.0)
        if g < G:
            k = g
            while k + G < nk:                      # two keys a round: two loads in flight
                a0 += ex[k] * v_cache[u0 + k, base + d]
                a1 += ex[k + G] * v_cache[u0 + k + G, base + d]
                k += 2 * G
            if k < nk:
                a0 += ex[k] * v_cache[u0 + k, base + d]
        if G == 1:
            if g == 0:                             # (threads past the first hs have no channel)
                part_acc[h, p, d] = a0 + a1
        else:                                      # (G > 1: cols = hs, one channel a thread)
            red[tid] = a0 + a1                     # red[g * hs + d]
    if G > 1:
        cuda.syncthreads()
        if tid < hs:
            total = float32(0.0)
            for j in range(G):
                total += red[j * hs + tid]
            part_acc[h, p, tid] = total
    if tid == 0:
        l_p = float32(0.0)
        for j in range(nk):
            l_p += ex[j]
        part_m[h, p] = m
        part_l[h, p] = l_p
    # 4. the last of the na blocks of head h merges the chunks, in chunk order
    if not _last_block(flag, done, h, na):
        return
    mj = float32(-math.inf)                        # thread j < na takes chunk j (the launcher checked NCH <= threads)
    lj = float32(0.0)
    if tid < na:
        mj = _from_l2(part_m, (h, tid))            # (both loads in one round)
        lj = _from_l2(part_l, (h, tid))
    big = _block_top(red, mj)                      # M = max_p m_p
    wj = float32(0.0)
    if tid < na:
        wj = _chunk_weight(mj, big)
        ex[tid] = wj
    lw = _block_total(red, wj * lj)                # sum_p w_p l_p (its barriers also publish every w_p)
    for d in range(tid % cols, hs, cols):
        a0 = float32(0.0)
        a1 = float32(0.0)
        if g < G:
            k = g
            while k + G < na:
                a0 += ex[k] * _from_l2(part_acc, (h, k, d))
                a1 += ex[k + G] * _from_l2(part_acc, (h, k + G, d))
                k += 2 * G
            if k < na:
                a0 += ex[k] * _from_l2(part_acc, (h, k, d))
        if G == 1:
            if g == 0:
                y[base + d] = (a0 + a1) / lw
        else:
            red[tid] = a0 + a1
    if G > 1:
        cuda.syncthreads()
        if tid < hs:
            total = float32(0.0)
            for j in range(G):
                total += red[j * hs + tid]
            y[base + tid] = total / lw


@cuda.jit
def k_decode_logits_v2(probs, logits, done, pos, x, g, b, eps, wte):
    """logits[v] = sum_c LNf(x)[c] wte[v, c]: the tied classifier, wte read by rows. A block of
    TX lanes x RY rows: lane tx sums channels c = tx, tx + TX, ... of row v (four a round: four
    loads in flight), the row's lanes meet in a tree; blocks stride over the V rows. The last block
    to finish (done[0] counts them) then computes probs[v] = exp(logits[v] - m) / se over the whole
    row, m = max_v logits[v], se = sum_v exp(logits[v] - m), as k_loss_fwd's softmax, and moves the
    position on: pos[0] += 1 (no kernel of this step reads pos after it)."""
    a = cuda.shared.array(0, float32)              # [x (then LNf(x)) | g | b]: 3C floats of dynamic shared memory
    buf = cuda.shared.array(MAX_BLOCK, float32)
    flag = cuda.shared.array(1, int32)
    tx, ty, TX, RY = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x, cuda.blockDim.y
    i, nt = ty * TX + tx, TX * RY
    V, C = wte.shape
    engine._row_g_b(a, x, g, b)
    _layernorm_shared(a, buf, C, eps)
    for v0 in range(cuda.blockIdx.x * RY, V, cuda.gridDim.x * RY):     # the same trips for the whole block
        v = v0 + ty
        s0 = float32(0.0)
        s1 = float32(0.0)
        s2 = float32(0.0)
        s3 = float32(0.0)
        if v < V:
            c = tx
            while c + 3 * TX < C:
                s0 += a[c] * wte[v, c]
                s1 += a[c + TX] * wte[v, c + TX]
                s2 += a[c + 2 * TX] * wte[v, c + 2 * TX]
                s3 += a[c + 3 * TX] * wte[v, c + 3 * TX]
                c += 4 * TX
            while c < C:
                s0 += a[c] * wte[v, c]
                c += TX
        total = warp_sum((s0 + s1) + (s2 + s3), 1, TX // 2)   # the TX lanes of the row meet: shuffles
        if tx == 0 and v < V:
            logits[v] = total
    # the last block: the softmax of the whole row, then t += 1
    if not _last_block(flag, done, 0, cuda.gridDim.x):
        return
    m = float32(-math.inf)
    for v in range(i, V, nt):
        m = max(m, _from_l2(logits, v))
    m = _block_top(buf, m)
    s = float32(0.0)
    for v in range(i, V, nt):
        s += math.exp(_from_l2(logits, v) - m)
    se = _block_total(buf, s)
    for v in range(i, V, nt):
        probs[v] = math.exp(_from_l2(logits, v) - m) / se
    if i == 0:
        pos[0] += 1


def _whole_warps(*sizes) -> bool:
    """Every size a power of two, and on a GPU whole warps: a shuffle (ptx.warp_sum) takes all 32
    lanes of a warp (the simulator runs blocks smaller than a warp)."""
    whole = SIMULATOR or math.prod(sizes) % 32 == 0
    return whole and all(s > 0 and s & (s - 1) == 0 for s in sizes)


def _attention_grid(block, part_m, part_acc, done, q, k_cache):
    """The grid (T / CK, H) of rungs 2 and 7's attention, its block (LANES, CK) and scratch checked:
    whole warps, a key's lanes in one warp, a thread a chunk in the merge."""
    lanes, ck = block
    T = k_cache.shape[0]
    H, nch = part_m.shape
    assert _whole_warps(lanes, ck) and lanes <= 32 and lanes * ck <= MAX_BLOCK, \
        f"block {block}: powers of two, whole warps, at most 32 lanes (a key's in one warp) and {MAX_BLOCK} threads"
    assert cdiv(T, ck) <= min(nch, lanes * ck) and part_acc.shape == (H, nch, q.shape[0] // H) and done.shape == (H,)
    return cdiv(T, ck), H


@blocks(**QKV_BLOCKS)
def decode_qkv_v2(q, k_cache, v_cache, pos, x, g, b, eps, w_q, w_k, w_v, tokens, wte, wpe, embed, *, block,
                  stream=0, bf16=False):
    """q [C]; k_cache, v_cache [T, C] (row pos[0] written); pos [1] int32; x, g, b [C]; w_q, w_k,
    w_v [C, C]; tokens [T] int32, wte [V, C], wpe [T_max, C], embed: x = wte[tokens[t]] + wpe[t]
    first (the model's first block; x written). Launch: 3C / TX blocks of TX x KS threads, 3C floats
    of dynamic shared memory."""
    assert _whole_warps(*block), f"block {block}: powers of two, whole warps"
    assert not bf16, FP32_ONLY
    C = x.shape[0]
    k_decode_qkv_v2[cdiv(3 * C, block[0]), block, stream, 12 * C](q, k_cache, v_cache, pos, x, g, b, float32(eps),
                                                              w_q, w_k, w_v, tokens, wte, wpe, bool(embed))


@blocks(**ATTENTION_BLOCKS)
def decode_attention_v2(y, part_m, part_l, part_acc, done, q, k_cache, v_cache, pos, *, block, stream=0, bf16=False):
    """y, q [C]; part_m, part_l [H, NCH], part_acc [H, NCH, hs] (scratch, NCH >= T / CK); done [H]
    int32 (zeros between launches); k_cache, v_cache [T, C] (rows 0..pos[0] read); pos [1] int32.
    Launch: (T / CK, H) blocks of LANES x CK threads (at least NCH: a thread a chunk in the merge)."""
    assert not bf16, FP32_ONLY
    grid = _attention_grid(block, part_m, part_acc, done, q, k_cache)
    k_decode_attention_v2[grid, block, stream](y, part_m, part_l, part_acc, done, q, k_cache, v_cache, pos)


@blocks(**MATVEC_BLOCKS)
def decode_matvec_add_v2(x, a, w, *, block, stream=0, bf16=False):
    """x [N] (+= a @ w, in place); a [K]; w [K, N]. Launch: N / TX blocks of TX x KS threads."""
    assert _whole_warps(*block), f"block {block}: powers of two, whole warps"
    assert not bf16, FP32_ONLY
    k_decode_matvec_add_v2[cdiv(w.shape[1], block[0]), block, stream](x, a, w)


@blocks(**MLP_UP_BLOCKS)
def decode_mlp_up_v2(h, x, g, b, eps, w_1, *, block, stream=0, bf16=False):
    """h [F]; x, g, b [C]; w_1 [C, F]. Launch: F / TX blocks of TX x KS threads, 3C floats of dynamic
    shared memory."""
    assert _whole_warps(*block), f"block {block}: powers of two, whole warps"
    C = x.shape[0]
    assert not bf16, FP32_ONLY
    k_decode_mlp_up_v2[cdiv(w_1.shape[1], block[0]), block, stream, 12 * C](h, x, g, b, float32(eps), w_1)


@blocks(**LOGITS_BLOCKS)
def decode_logits_v2(probs, logits, done, pos, x, g, b, eps, wte, *, block, stream=0, bf16=False):
    """probs, logits [V]; done [1] int32 (zero between launches); pos [1] int32 (+= 1); x, g, b [C];
    wte [V, C]. Launch: V / RY blocks (at most LOGIT_BLOCKS: the rows loop) of TX x RY threads, 3C
    floats of dynamic shared memory."""
    assert not bf16, FP32_ONLY
    assert _whole_warps(*block) and block[0] <= 32, \
        f"block {block}: powers of two, whole warps, at most 32 lanes (a row's in one warp)"
    V, C = wte.shape
    k_decode_logits_v2[min(cdiv(V, block[1]), LOGIT_BLOCKS), block, stream, 12 * C](probs, logits, done, pos, x, g, b,
                                                                                 float32(eps), wte)


# ---------------------------------------------------------------------------------------------
# rung 3: attention in one block a head

@cuda.jit(device=True)
def _key_row(k_cache, v_cache, u, base, lane, hs):
    """Lane `lane`'s channels (base + lane, base + lane + 32) of key u's k and v rows, 0 past the
    head's hs channels: four loads, issued together."""
    k0 = k_cache[u, base + lane] if lane < hs else float32(0.0)
    k1 = k_cache[u, base + lane + 32] if lane + 32 < hs else float32(0.0)
    v0 = v_cache[u, base + lane] if lane < hs else float32(0.0)
    v1 = v_cache[u, base + lane + 32] if lane + 32 < hs else float32(0.0)
    return k0, k1, v0, v1


@cuda.jit
def k_decode_attention_v3(y, part_m, part_l, part_acc, done, q, k_cache, v_cache, pos):
    """y_h = softmax(q_h K_h[0..t]^T / sqrt(hs)) V_h[0..t], t = pos[0], for head h = blockIdx.x:
    one block a head, W = blockDim.x / 32 warps. Lane j holds channels d = j and j + 32 of the
    head (hs <= 64) and warp w takes keys u = w, w + W, ... <= t, two a round: the score
    s_u = q_h . K[u, h] / sqrt(hs) (the lanes' products met by shuffles, ptx.warp_sum), then the
    warp's running softmax over its keys so far, m (their largest score), l = sum exp(s - m) and
    acc[d] = sum exp(s - m) V[u, h hs + d], each brought to a new maximum by exp(m_old - m_new).
    Then the W warps' (m, l, acc) in shared memory, one barrier, and thread d adds them for channel
    d (and d + blockDim.x, when the block has fewer threads than channels) in warp order:
    M = max_w m_w, y[d] = sum_w exp(m_w - M) acc_w[d] / sum_w exp(m_w - M) l_w (a warp without keys
    has m = -inf: weight 0). part_m, part_l, part_acc and done are rung 2's scratch, unused: the
    same arguments, so the decoder launches either."""
    sm = cuda.shared.array(32, float32)                 # each warp's m
    sl = cuda.shared.array(32, float32)                 # its l
    sacc = cuda.shared.array((32, 64), float32)         # its acc, channel by channel
    h = cuda.blockIdx.x
    hs = q.shape[0] // cuda.gridDim.x
    base = h * hs
    lane, w, nw = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32, cuda.blockDim.x // 32
    t = pos[0]
    scale = float32(1.0) / math.sqrt(float32(hs))
    q0 = q[base + lane] if lane < hs else float32(0.0)
    q1 = q[base + lane + 32] if lane + 32 < hs else float32(0.0)
    m = float32(-math.inf)
    l_run = float32(0.0)
    a0 = float32(0.0)
    a1 = float32(0.0)
    u = w
    while u <= t:                                       # the same trips for the warp's 32 lanes
        two = u + nw <= t                               # two keys a round: their eight loads in flight together
        k0, k1, v0, v1 = _key_row(k_cache, v_cache, u, base, lane, hs)
        kb0, kb1, vb0, vb1 = _key_row(k_cache, v_cache, u + nw if two else u, base, lane, hs)
        s = warp_sum(q0 * k0 + q1 * k1, 1, 16) * scale
        sb = warp_sum(q0 * kb0 + q1 * kb1, 1, 16) * scale
        m_new = max(m, max(s, sb) if two else s)
        c = math.exp(m - m_new)                         # the running sums to the new maximum (0 at the first key)
        e = math.exp(s - m_new)
        eb = math.exp(sb - m_new) if two else float32(0.0)
        l_run = (l_run * c + e) + eb
        a0 = (a0 * c + e * v0) + eb * vb0
        a1 = (a1 * c + e * v1) + eb * vb1
        m = m_new
        u += 2 * nw if two else nw
    if lane == 0:
        sm[w] = m
        sl[w] = l_run
    if lane < hs:
        sacc[w, lane] = a0
    if lane + 32 < hs:
        sacc[w, lane + 32] = a1
    cuda.syncthreads()
    big = sm[0]                                         # (warp 0 always has key 0)
    for j in range(1, nw):
        big = max(big, sm[j])
    for d in range(cuda.threadIdx.x, hs, cuda.blockDim.x):
        num = float32(0.0)
        den = float32(0.0)
        for j in range(nw):
            wt = _chunk_weight(sm[j], big)
            num += wt * sacc[j, d]
            den += wt * sl[j]
        y[base + d] = num / den


@blocks(gpu=(1024, 512, 256), sim=(64, 32))
def decode_attention_v3(y, part_m, part_l, part_acc, done, q, k_cache, v_cache, pos, *, block, stream=0, bf16=False):
    """The arguments of decode_attention (rung 2's scratch unused). Launch: H blocks of `block`
    threads, whole warps, at most 32 of them; hs <= 64."""
    H = part_m.shape[0]
    assert block % 32 == 0 and block <= MAX_BLOCK and q.shape[0] // H <= 64, \
        f"block {block}: whole warps, at most {MAX_BLOCK} threads; a head of at most 64 channels"
    assert not bf16, FP32_ONLY
    k_decode_attention_v3[H, block, stream](y, part_m, part_l, part_acc, done, q, k_cache, v_cache, pos)


# ---------------------------------------------------------------------------------------------
# rung 5: the products with 128-bit loads, a thread's rows issued four at a time
#
# Under Nsight Compute (docs/results/2026-12-07-h100-decoder-draw/first_ncu_step.csv, 12M, caches
# flushed) the engine's products take 5.5 us for W_o's 0.6 MB and 8.9 us for W_2's 2.4 MB: some
# 0.5 TB/s, a sixth of the memory's, because too few bytes are in flight at once. A thread loads
# one float a row (4 bytes), four rows before it waits, and W_o's and W_2's 48 blocks of 1024
# threads (block (8, 128)) use 48 of the 132 multiprocessors. Here a thread owns 4 columns: each
# of its rows is one 128-bit load (ptx.load4_row, 16 bytes), four rows a round (64 bytes in flight a
# thread), and blocks of 4 TX columns (TX = 1 or 2) make N / 4 TX blocks: 96 to 384 at 12M.
# qkv loads its first four rows before its LayerNorm, as the engine's does. The KS slices of each
# of the 4 columns meet in a tree over ty in shared memory, as the engine's one column does.
# Attention, the classifier and the draw are the engine's. Needs N a multiple of 4 (the model's
# C, 3C and 4C are when C is) and 16-byte aligned weights (layout.py's views are).

@cuda.jit(device=True)
def _row4(w, k, n):
    """w[k, n .. n + 3] by one 128-bit load, each as the product takes it (_in); zeros past K."""
    if k < w.shape[0]:
        v0, v1, v2, v3 = load4_row(w, k, n)
        return _in(v0), _in(v1), _in(v2), _in(v3)
    z = float32(0.0)
    return z, z, z, z


@cuda.jit(device=True)
def _first_rows4(w, n):
    """The first four rows of thread (tx, ty)'s part: ty, ty + KS, ty + 2 KS, ty + 3 KS."""
    k, ks = cuda.threadIdx.y, cuda.blockDim.y
    return _row4(w, k, n), _row4(w, k + ks, n), _row4(w, k + 2 * ks, n), _row4(w, k + 3 * ks, n)


@cuda.jit(device=True)
def _add_row(s, a, k, K, r):
    """s + a[k] r for the 4 sums s and the row r of 4 weights; nothing added past row K - 1 (the
    row a shared a holds there is not the product's)."""
    if k >= K:
        return s
    ak = _in(a[k])
    return s[0] + ak * r[0], s[1] + ak * r[1], s[2] + ak * r[2], s[3] + ak * r[3]


@cuda.jit(device=True)
def _column4_part(a, w, n, first):
    """Thread (tx, ty)'s part of out[n .. n + 3] = sum_k a[k] w[k, n .. n + 3]: rows k = ty, ty +
    KS, ... in order, the first four given (_first_rows4), then four a round, all four loads of a
    round issued before they are used. Returns the 4 sums."""
    ks, K = cuda.blockDim.y, w.shape[0]
    k = cuda.threadIdx.y
    z = float32(0.0)
    s = (z, z, z, z)
    r0, r1, r2, r3 = first
    while True:
        s = _add_row(s, a, k, K, r0)
        s = _add_row(s, a, k + ks, K, r1)
        s = _add_row(s, a, k + 2 * ks, K, r2)
        s = _add_row(s, a, k + 3 * ks, K, r3)
        k += 4 * ks
        if k >= K:
            return s
        r0, r1, r2, r3 = _row4(w, k, n), _row4(w, k + ks, n), _row4(w, k + 2 * ks, n), \
            _row4(w, k + 3 * ks, n)


@cuda.jit(device=True)
def _column4_total(buf, s):
    """The KS parts of each of the block's 4 TX columns met by a tree over ty in shared memory (buf
    [4, TX KS]), as the engine's _column_total does for one: every thread gets its 4 totals."""
    tx, ty, TX = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
    i = ty * TX + tx
    for c in range(4):
        buf[c, i] = s[c]
    cuda.syncthreads()
    st = cuda.blockDim.y // 2
    while st > 0:
        if ty < st:
            for c in range(4):
                buf[c, i] += buf[c, i + st * TX]
        cuda.syncthreads()
        st //= 2
    return buf[0, tx], buf[1, tx], buf[2, tx], buf[3, tx]


@cuda.jit
def k_decode_qkv_v5(q, k_cache, v_cache, pos, x, g, b, eps, w_q, w_k, w_v, tokens, wte, wpe, embed):
    """k_decode_qkv with 4 columns a thread (rung 5, above): columns n .. n + 3 of [W_q | W_k | W_v],
    n = 4 (TX blockIdx + tx), in one matrix (C is a multiple of 4)."""
    a = cuda.shared.array(0, float32)              # [x (then LN1(x)) | g | b]
    red = cuda.shared.array(MAX_BLOCK, float32)    # the LayerNorm's block sums
    buf = cuda.shared.array((4, MAX_BLOCK), float32)
    C = x.shape[0]
    n = 4 * (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    which = min(n // C, 2)
    j = n - which * C
    w = w_q if which == 0 else (w_k if which == 1 else w_v)
    live = j < C
    first = _first_rows4(w, j if live else 0)
    t = pos[0]
    if embed:
        engine._embedding_g_b(a, x, g, b, tokens, wte, wpe, t)
    else:
        engine._row_g_b(a, x, g, b)
    engine._layernorm_shared(a, red, C, eps)
    t0, t1, t2, t3 = _column4_total(buf, _column4_part(a, w, j if live else 0, first))
    if cuda.threadIdx.y == 0 and live:
        if which == 0:
            q[j], q[j + 1], q[j + 2], q[j + 3] = t0, t1, t2, t3
        elif which == 1:
            k_cache[t, j], k_cache[t, j + 1], k_cache[t, j + 2], k_cache[t, j + 3] = t0, t1, t2, t3
        else:
            v_cache[t, j], v_cache[t, j + 1], v_cache[t, j + 2], v_cache[t, j + 3] = t0, t1, t2, t3


@cuda.jit
def k_decode_matvec_add_v5(x, a, w):
    """k_decode_matvec_add with 4 columns a thread (rung 5, above): x[n .. n + 3] += their sums."""
    buf = cuda.shared.array((4, MAX_BLOCK), float32)
    n = 4 * (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    live = n < x.shape[0]
    t0, t1, t2, t3 = _column4_total(buf, _column4_part(a, w, n if live else 0,
                                                       _first_rows4(w, n if live else 0)))
    if cuda.threadIdx.y == 0 and live:
        x[n] = x[n] + t0
        x[n + 1] = x[n + 1] + t1
        x[n + 2] = x[n + 2] + t2
        x[n + 3] = x[n + 3] + t3


@cuda.jit
def k_decode_mlp_up_v5(h, x, g, b, eps, w_1):
    """k_decode_mlp_up with 4 columns a thread (rung 5, above): h[n .. n + 3] = gelu of their sums."""
    a = cuda.shared.array(0, float32)              # [x (then LN2(x)) | g | b]
    red = cuda.shared.array(MAX_BLOCK, float32)    # the LayerNorm's block sums
    buf = cuda.shared.array((4, MAX_BLOCK), float32)
    C = x.shape[0]
    n = 4 * (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    live = n < h.shape[0]
    first = _first_rows4(w_1, n if live else 0)
    engine._row_g_b(a, x, g, b)
    engine._layernorm_shared(a, red, C, eps)
    t0, t1, t2, t3 = _column4_total(buf, _column4_part(a, w_1, n if live else 0, first))
    if cuda.threadIdx.y == 0 and live:
        h[n] = gelu(t0)
        h[n + 1] = gelu(t1)
        h[n + 2] = gelu(t2)
        h[n + 3] = gelu(t3)


# blocks (TX, KS): 4 TX columns, KS slices of K; the first is the default
QKV_BLOCKS_5 = dict(gpu=((1, 128), (2, 64), (1, 64), (2, 128)), sim=((1, 4), (2, 2), (1, 8)))
MATVEC_BLOCKS_5 = dict(gpu=((1, 256), (1, 128), (2, 128), (1, 512)), sim=((1, 4), (2, 2), (1, 8)))
MLP_UP_BLOCKS_5 = dict(gpu=((1, 128), (2, 64), (1, 64), (2, 128)), sim=((1, 4), (2, 2), (1, 8)))


def _four_columns(block, *widths) -> bool:
    """Powers of two, at most MAX_BLOCK threads, and every width a multiple of 4."""
    return engine._pow2(*block) and block[0] * block[1] <= MAX_BLOCK and all(w % 4 == 0 for w in widths)


def _four_column_launchers(kernels, qkv_blocks, matvec_blocks, mlp_up_blocks, fits, what):
    """The launchers of rungs 5 and 6 (their kernels and blocks given): decode_qkv's,
    decode_matvec_add's and decode_mlp_up's arguments, a block (TX, KS) for 4 TX columns and KS
    slices, checked by fits(block, width) (what: the rule, said when a block breaks it). kernels:
    {bf16: (qkv, matvec_add, mlp_up)}, the fp32 kernels (False) and their bf16 twins (True)."""
    @blocks(**qkv_blocks)
    def qkv(q, k_cache, v_cache, pos, x, g, b, eps, w_q, w_k, w_v, tokens, wte, wpe, embed, *, block, stream=0,
            bf16=False):
        """Launch: 3C / 4 TX blocks of TX x KS threads, 3C floats of dynamic shared memory."""
        C = x.shape[0]
        assert fits(block, C), f"block {block}: {what}; C = {C} a multiple of 4"
        kernels[bool(bf16)][0][cdiv(3 * C, 4 * block[0]), block, stream, 12 * C](
            q, k_cache, v_cache, pos, x, g, b, float32(eps), w_q, w_k, w_v, tokens, wte, wpe, bool(embed))

    @blocks(**matvec_blocks)
    def matvec_add(x, a, w, *, block, stream=0, bf16=False):
        """Launch: N / 4 TX blocks of TX x KS threads."""
        assert fits(block, w.shape[1]), f"block {block}: {what}; N = {w.shape[1]} a multiple of 4"
        kernels[bool(bf16)][1][cdiv(w.shape[1], 4 * block[0]), block, stream](x, a, w)

    @blocks(**mlp_up_blocks)
    def mlp_up(h, x, g, b, eps, w_1, *, block, stream=0, bf16=False):
        """Launch: F / 4 TX blocks of TX x KS threads, 3C floats of dynamic shared memory."""
        assert fits(block, w_1.shape[1]), f"block {block}: {what}; F = {w_1.shape[1]} a multiple of 4"
        C = x.shape[0]
        kernels[bool(bf16)][2][cdiv(w_1.shape[1], 4 * block[0]), block, stream, 12 * C](h, x, g, b, float32(eps), w_1)
    return qkv, matvec_add, mlp_up


# every kernel and device function of this module so far compiled again with the engine's bf16 _in
# (common.compiled_again; the engine's BF16_KERNELS): rung 5's kernels with bf16 products
_BF16 = compiled_again(globals(), "_bf16", _in=engine.BF16_KERNELS["_in"])
_RUNG_5 = {False: (k_decode_qkv_v5, k_decode_matvec_add_v5, k_decode_mlp_up_v5),
           True: (_BF16["k_decode_qkv_v5"], _BF16["k_decode_matvec_add_v5"], _BF16["k_decode_mlp_up_v5"])}

decode_qkv_v5, decode_matvec_add_v5, decode_mlp_up_v5 = _four_column_launchers(
    _RUNG_5, QKV_BLOCKS_5, MATVEC_BLOCKS_5, MLP_UP_BLOCKS_5, _four_columns,
    f"powers of two, at most {MAX_BLOCK} threads")


# ---------------------------------------------------------------------------------------------
# rung 6: rung 5 with its sums by shuffles
#
# lab/bench/decode_parts.py on an H100 (2026-12-07, docs/results/2026-12-07-h100-decoder-parts/)
# took one product apart: with the weights in L2, C x C (W_o) 4.0 us a launch in the engine, 3.6 in
# rung 5, 2.2 with the same 128-bit loads and the slices met by shuffles; 4C x C (W_2) 5.7, 5.0 and
# 3.4-3.6. The LayerNorm qkv and mlp_up start with costs 4.7-7.8 us alone, an empty kernel 1.1. The
# trees are the cost: each level a barrier for the whole block (7 to 10 levels a sum). Here the
# slices of a column meet by a butterfly of shuffles within each warp and one barrier
# (_column4_by_shuffles), and the LayerNorm's mean and variance each take one barrier
# (_layernorm_by_shuffles). The kernels are rung 5's, compiled anew with these two in place.

@cuda.jit(device=True)
def _layernorm_by_shuffles(a, red, C, eps):
    """engine._layernorm_shared's LayerNorm with three barriers: the channels' sum by _warps_total
    in red[0 ..] (one barrier): the mean; the squares of the deviations the same way in red[32 ..]
    (apart from the first: no barrier before it is written); then the channels normalised in place
    and a barrier. red: shared, at least 64 floats. Whole warps only."""
    i = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    n = cuda.blockDim.x * cuda.blockDim.y
    inv_c = float32(1.0) / float32(C)
    s = float32(0.0)
    for c in range(i, C, n):
        s += a[c]
    mu = _warps_total(red, s, 0) * inv_c
    s = float32(0.0)
    for c in range(i, C, n):
        d = a[c] - mu
        s += d * d
    total = _warps_total(red, s, 32)
    r = float32(1.0) / math.sqrt(total * inv_c + eps)
    for c in range(i, C, n):
        a[c] = (a[c] - mu) * r * a[C + c] + a[2 * C + c]
    cuda.syncthreads()


@cuda.jit(device=True)
def _column4_by_shuffles(buf, s):
    """The KS parts of each of the block's 4 TX columns added, as rung 2's _column_total adds one:
    a warp holds G = 32 / TX slices of each of its columns, which meet by a butterfly over the lane
    bits of ty (ptx.warp_sum from TX up); the lanes of the warp's first slice leave the 4 sums in
    buf[c, group TX + tx], one barrier, and every thread adds its columns' KS / G sums in group order.
    buf: shared [4, MAX_BLOCK]."""
    tx, ty, TX = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
    g = max(1, 32 // TX)                           # slices a warp
    s0 = warp_sum(s[0], TX, 16)
    s1 = warp_sum(s[1], TX, 16)
    s2 = warp_sum(s[2], TX, 16)
    s3 = warp_sum(s[3], TX, 16)
    if ty % g == 0:
        j = (ty // g) * TX + tx
        buf[0, j] = s0
        buf[1, j] = s1
        buf[2, j] = s2
        buf[3, j] = s3
    cuda.syncthreads()
    t0, t1, t2, t3 = buf[0, tx], buf[1, tx], buf[2, tx], buf[3, tx]
    for j in range(1, (cuda.blockDim.y + g - 1) // g):
        t0 += buf[0, j * TX + tx]
        t1 += buf[1, j * TX + tx]
        t2 += buf[2, j * TX + tx]
        t3 += buf[3, j * TX + tx]
    return t0, t1, t2, t3


# what rung 5's kernels call as engine.X, with this rung's LayerNorm (a module: Numba resolves its
# attributes when it compiles)
_RUNG_6_ENGINE = types.ModuleType("rung_6_engine")
_RUNG_6_ENGINE._row_g_b, _RUNG_6_ENGINE._embedding_g_b = engine._row_g_b, engine._embedding_g_b
_RUNG_6_ENGINE._layernorm_shared = _layernorm_by_shuffles


def _with_rung_6_sums(kernel):
    """Rung 5's kernel (its Python code above) compiled anew with this rung's sums in place: the
    slices by _column4_by_shuffles, the LayerNorm by _layernorm_by_shuffles."""
    fn = getattr(kernel, "py_func", None) or kernel.fn
    return compiled_with(kernel, fn.__name__.replace("_v5", "_v6"), _column4_total=_column4_by_shuffles,
                         engine=_RUNG_6_ENGINE)


_RUNG_6 = {bf16: tuple(_with_rung_6_sums(k) for k in kernels) for bf16, kernels in _RUNG_5.items()}
k_decode_qkv_v6, k_decode_matvec_add_v6, k_decode_mlp_up_v6 = _RUNG_6[False]

# blocks (TX, KS), whole warps (TX * KS a multiple of 32, TX <= 32): 4 TX columns, KS slices a block
QKV_BLOCKS_6 = dict(gpu=((1, 128), (2, 128), (1, 256), (2, 64)), sim=((1, 4), (2, 2), (1, 8)))
MATVEC_BLOCKS_6 = dict(gpu=((1, 256), (1, 128), (2, 128), (1, 512)), sim=((1, 4), (2, 2), (1, 8)))
MLP_UP_BLOCKS_6 = dict(gpu=((1, 128), (2, 128), (1, 256), (2, 64)), sim=((1, 4), (2, 2), (1, 8)))


def _six(block, *widths) -> bool:
    """Rung 5's blocks (_four_columns), of whole warps on a GPU with at most 32 columns' groups."""
    return _four_columns(block, *widths) and _whole_warps(*block) and block[0] <= 32


decode_qkv_v6, decode_matvec_add_v6, decode_mlp_up_v6 = _four_column_launchers(
    _RUNG_6, QKV_BLOCKS_6, MATVEC_BLOCKS_6, MLP_UP_BLOCKS_6,
    _six, f"powers of two, whole warps, at most {MAX_BLOCK} threads and 32 groups of columns")


# ---------------------------------------------------------------------------------------------
# rung 7: rung 6 with the classifier's sums by shuffles too
#
# After rung 6 the step's kernels with trees were attention (10.4 us a launch, 7 a step, at 12M on
# an H100, 2026-12-08, lab/bench/decode_speed.py --kernels), the classifier (10.0) and the draw
# (17.3, the largest). Rung 7 took each one's sums across threads by shuffles, and each got faster
# (attention 9.8, the classifier 9.3, the draw 13.6; docs/results/2026-12-08-h100-decoder-rung-7/):
# attention's and the draw's are the engine's since (kernels/decode.py), their trees are rung 9's.
# What stays here is the classifier's: its LayerNorm by rung 6's _layernorm_by_shuffles, a row's TX
# lanes by a butterfly with no barrier in the rows' loop (_row_total_v7), the softmax's maximum and
# sum by _block_top and _block_total. The engine's kernel compiled with these in place.

@cuda.jit(device=True)
def _row_total_v7(buf, s):
    """engine._row_total by shuffles: a row's TX lanes (adjacent lanes of one warp) meet by a
    butterfly (ptx.warp_sum); every lane gets the row's total. No barrier, buf unused."""
    return warp_sum(s, 1, cuda.blockDim.x // 2)


def _both_precisions(kernel, name, **names):
    """The engine's kernel compiled with another rung's device functions in place (names), at fp32
    and from its bf16 twin: {bf16: kernel}."""
    return {False: compiled_with(kernel, name, **names),
            True: compiled_with(engine.BF16_KERNELS[kernel.__name__], name + "_bf16", **names)}


_LOGITS_7 = _both_precisions(engine.k_decode_logits, "k_decode_logits_v7", _row_total=_row_total_v7,
                             _layernorm_shared=_layernorm_by_shuffles, block_max=_block_top, block_sum=_block_total)


@blocks(gpu=((32, 8), (16, 16), (32, 32)), sim=((2, 4), (4, 2)))
def decode_logits_v7(probs, logits, done, pos, x, g, b, eps, wte, *, block, stream=0, bf16=False):
    """engine.decode_logits' arguments and grid; TX at most 32 (a row's lanes in one warp)."""
    assert _whole_warps(*block) and block[0] <= 32, f"block {block}: powers of two, whole warps, at most 32 lanes"
    V, C = wte.shape
    _LOGITS_7[bool(bf16)][min(cdiv(V, block[1]), LOGIT_BLOCKS), block, stream, 12 * C](probs, logits, done, pos, x, g,
                                                                                       b, float32(eps), wte)


# ---------------------------------------------------------------------------------------------
# rung 9: the engine with attention and the draw by trees, as they were before 2026-12-08
#
# Attention's keys met their lanes in a tree (_lanes_tree) and its merge took a block maximum and
# sum as trees (common.block_max, block_sum); the draw found the kept keys' smallest and the largest
# scaled log by trees (one float64 log a token) and its thread 0 added the runs' sums one after
# another (_runs_before_serial). The engine's kernels compiled with these in place.

@cuda.jit(device=True)
def _largest_log_tree(red, probs, tau):
    """max_v l_v over the V tokens: each thread's tokens' scaled logs (engine._scaled_log, a float64
    log each), then a block maximum (a tree in red, float64 [NT], shared)."""
    i, nt = cuda.threadIdx.x, cuda.blockDim.x
    lmax = -math.inf
    for v in range(i, probs.shape[0], nt):
        lmax = max(lmax, engine._scaled_log(probs[v], tau))
    return block_max(red, lmax)


@cuda.jit(device=True)
def _runs_before_serial(runs, s):
    """(S_i, S_{i+1}, S_NT) for thread i whose run sums to s: S_i the sum of the runs before its own,
    S_NT all of them, added one after another by thread 0 (the loads do not wait for the adds).
    runs: float64 [NT + 1], shared."""
    i, nt = cuda.threadIdx.x, cuda.blockDim.x
    runs[i] = s
    cuda.syncthreads()
    if i == 0:
        acc = float64(0.0)
        for j in range(nt):
            r = runs[j]
            runs[j] = acc
            acc += r
        runs[nt] = acc
    cuda.syncthreads()
    return runs[i], runs[i + 1], runs[nt]


_ATTENTION_9 = _both_precisions(engine.k_decode_attention, "k_decode_attention_v9", _lanes_total=engine._lanes_tree,
                                _block_top=block_max, _block_total=block_sum)
k_decode_draw_v9 = compiled_with(
    engine.k_decode_draw, "k_decode_draw_v9", _largest_log=_largest_log_tree, _runs_before=_runs_before_serial,
    _kth_by_counting=compiled_with(engine._kth_by_counting, "_kth_by_counting_v9",
                                   _block_top=block_max))


@blocks(gpu=((16, 16), (8, 32), (16, 32), (32, 8), (4, 64), (64, 16)), sim=((1, 4), (4, 2), (2, 8)))
def decode_attention_v9(y, part_m, part_l, part_acc, done, q, k_cache, v_cache, pos, *, block, stream=0, bf16=False):
    """engine.decode_attention's arguments and grid; powers of two (the trees halve their steps)."""
    lanes, ck = block
    T = k_cache.shape[0]
    H, nch = part_m.shape
    assert engine._pow2(lanes, ck) and lanes * ck <= MAX_BLOCK, f"block {block}: powers of two, at most {MAX_BLOCK}"
    assert cdiv(T, ck) <= min(nch, lanes * ck) and part_acc.shape == (H, nch, q.shape[0] // H) and done.shape == (H,)
    _ATTENTION_9[bool(bf16)][(cdiv(T, ck), H), block, stream](y, part_m, part_l, part_acc, done, q, k_cache, v_cache,
                                                              pos)


@blocks(gpu=(256, 512, 1024, 128), sim=(8, 4, 16))
def decode_draw_v9(tokens, pos, probs, uniform, draw, temperature, *, block, stream=0):
    """engine.decode_draw's arguments. Launch: one block of `block` threads, a power of two, at most
    MAX_BLOCK."""
    assert engine._pow2(block) and block <= MAX_BLOCK, f"block {block}: a power of two, at most {MAX_BLOCK} threads"
    k_decode_draw_v9[1, block, stream](tokens, pos, probs, probs.view(np.int32), uniform, draw, temperature)


# the decoder's step, rung by rung: launcher name -> {rung: launcher}; rung 1 is the engine's, rung 3
# rung 2 with attention in one block a head; rung 4 replaces the whole step (decoder_class), so its
# entries are the engine's (its draw is)
LAUNCHERS = ("decode_qkv", "decode_attention", "decode_matvec_add", "decode_mlp_up", "decode_logits",
             "decode_draw")
def _launchers_of(name: str) -> dict:
    """Launcher `name` at each rung: a rung's own where it has one (name_v2, ...), else the rung it
    builds on's (rung 3 on 2, 6 on 5, 7 on 6; 2, 5 and 9 on the engine's). Rung 8 takes each kernel
    from the rung where it was fastest on an H100 (2026-12-08): the products of rung 5 (their
    slices by trees), the classifier of rung 7 (its sums by shuffles), attention and the draw of the
    engine (theirs by shuffles since)."""
    own = lambda v, under: globals().get(f"{name}_v{v}", under)
    e = getattr(engine, name)
    two, five = own(2, e), own(5, e)
    six = own(6, five)
    seven = own(7, six)
    return {1: e, 2: two, 3: two, 4: e, 5: five, 6: six, 7: seven, 8: five if five is not e else seven,
            9: own(9, e)}


VERSIONS = {name: _launchers_of(name) for name in LAUNCHERS}
VERSIONS["decode_attention"][3] = decode_attention_v3


def decoder_class(version: int):
    """The decoder that runs rung `version`'s step: andrea_numba.decode.Decoder with the rung's
    launchers in place (rungs 1 to 3, 5 and 6), or lab/decode_step.py's PersistentDecoder (rung 4: the whole
    step in one launch)."""
    if version == 4:
        from lab.decode_step import PersistentDecoder
        return PersistentDecoder
    from andrea_numba.decode import Decoder
    return Decoder
