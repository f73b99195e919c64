"""One position of the model for a KV-cache decoder: the k_decode_* kernels. NumPy twin:
reference/decode.py (KVCache.step); andrea_numba/decode.py chains them into a decoder.

The whole forward computes B*T rows; a decode step computes the one row of position t, reading
the k and v rows of positions 0..t-1 from the cache (each block's K and V, [T, C], in the twin's
layout) instead of computing them again. C = d_model, H heads of hs = C / H channels, F = 4C:

    per block l (its K, V):
        (l = 0: x = wte[tokens[t]] + wpe[t], first)                      k_decode_qkv
        q = LN1(x) @ W_q;  K[t] = LN1(x) @ W_k;  V[t] = LN1(x) @ W_v     k_decode_qkv
        y_h = softmax(q_h K_h[0..t]^T / sqrt(hs)) V_h[0..t], per head h  k_decode_attention
        x = x + y @ W_o                                                  k_decode_matvec_add
        h = gelu(LN2(x) @ W_1)                                           k_decode_mlp_up
        x = x + h @ W_2                                                  k_decode_matvec_add
    logits = LNf(x) @ wte^T;  probs = softmax(logits);  t = t + 1        k_decode_logits
    tokens[t] = the token drawn from probs with the uniform number u_t   k_decode_draw

The position t is pos[0], an int32 on the device that every kernel reads and k_decode_logits
moves on at its very end; the token ids are tokens[0..T] on the device. No launch's arguments or
sizes depend on t, so the same 5 L + 2 launches serve every token: a decoder records them once as
a CUDA graph and replays it for each token (andrea_numba/decode.py). The draw writes the next
step's token id where that step reads it, so a whole sample runs on the GPU without the host
waiting for any token.

WHAT A STEP COSTS. At 12M a step reads about 50 MB of weights, some 15 us of an H100's memory
bandwidth; what costs is latency: 37 launches one after the other, each a few dependent rounds of
memory loads (a round trip to memory takes about half a microsecond) and a few block barriers. So
every kernel below is shaped for few rounds: many blocks, each thread only a handful of loads,
issued together and before their results are needed, partial sums met in registers rather than in
loops of one thread, and every launch that could be folded into its neighbour folded (the
embedding into the first qkv, the softmax and t += 1 into the classifier).

SUMS ACROSS THREADS. A tree in shared memory (at step s = n/2, n/4, ..., 1 thread i < s adds
thread i + s's value, a barrier after each step: common.block_sum, block_max, _lanes_tree, a
column's slices in _column_total) costs a barrier a level, 9 for a block of 512 threads. Shuffles
(a warp's lanes by a butterfly, ptx.warp_sum; the warps' sums after one barrier, in warp order:
_warps_total, _block_total, _block_top) cost one barrier. Which is faster was measured kernel by
kernel on an H100 (lab/decode.py's rungs): the products keep their trees (their slices by
shuffles made W_o 4.2 us a launch against the tree's 3.6, rung 6); attention (a key's lanes by
_lanes_total, its merge by _block_top and _block_total) and the draw (below) take shuffles (9.8 us
against 10.4, and 13.6 against 17.3: rung 9 keeps their trees). Either way the order is fixed.

THE PRODUCTS OF ONE ROW (qkv, the output projections, the MLP's two). A [1, K] x [K, N] product
reads the K x N weights once, two flops a weight. The weights are stored [in, out] row-major, so
threads side by side over the columns n read a row of W coalesced. A block is TX columns x KS
slices of K (block (TX, KS), both powers of two): thread (tx, ty) sums rows k = ty, ty + KS, ...
of column n = TX * blockIdx.x + tx, four rows a round in four running sums (four independent loads
in flight), then two, then one (_column_part); its first four weights are loaded at the kernel's
start (_first_rows), so that they travel while the LayerNorm below is computed. TX = 8: a row's
8 columns are one 32-byte sector,
a warp reads four rows' sectors; KS = 64 or 128 leaves each thread a handful of rows (K / KS: 6
at K = C = 384 and KS = 64) and makes N / 8 blocks (48 to 192 at 12M). The KS parts of a column
meet in a tree over ty (_column_total): a fixed order. A column past N (N not a multiple of TX)
sums nothing and is not written.

The kernels that start with a LayerNorm (qkv, mlp_up, logits) normalise the row x themselves,
every block the whole row, in shared memory ([x | g | b], all three loaded in one round; two
block sums, block_sum). Every block does the same sums in the same order, so every block gets
the same bits; it costs each block two block sums, where a LayerNorm kernel of its own would cost
a launch.

THE CLASSIFIER reads wte [V, C] by rows: a row v is one output, so TX lanes of a block (over the
C channels, coalesced) share a row and meet in a tree, RY rows a block (block (TX, RY)).

ATTENTION, SPLIT OVER THE KEYS (flash-decoding). One block a head would leave H blocks walking
t + 1 keys each; instead the keys 0..T-1 of the window come in NCH = T / CK chunks of CK keys,
and block (p, h) of the grid (NCH, H) takes chunk p of head h: keys u = p CK + r, r < CK. A chunk
past t (p CK > t) returns at once: the launch is the same for every t, and the chunks that run
are p = 0 .. na - 1, na = t // CK + 1. Block (LANES, CK), one row of LANES threads a key:
    1. s_u = log2(e) q_h . K[u, h] / sqrt(hs), the score in base 2: lane sums channels d = lane,
       lane + LANES, ... (neighbouring lanes read neighbouring channels of the key's row:
       coalesced), the lanes meet in a tree;
    2. m_p = ceil(max_u s_u) over the chunk's keys (u <= t), an integer; e_u = 2^(s_u - m_p), in
       (0, 1]; l_p = sum_u e_u;
    3. acc_p[d] = sum_u e_u V[u, h hs + d]: G = CK LANES / hs groups of hs threads, group g over
       keys r = g, g + G, ...; the G groups' sums added in g order;
    4. m_p, l_p and acc_p go to scratch (part_m, part_l [H, NCH], part_acc [H, NCH, hs]); the
       last of head h's na blocks to finish merges them, thread p taking chunk p:
           M = max_p m_p,   w_p = 2^(m_p - M),   y_h[d] = sum_p w_p acc_p[d] / sum_p w_p l_p,
       which is softmax(s) V over all t + 1 keys, because 2^(s_u - M) = w_p e_u. The maximum
       and the sum over p are block sums (block_max, block_sum); the sums over p of acc go in
       groups, as the keys in step 3.
Why base 2 and an integer maximum: w_p is then a power of two, and e_u is 2^(s_u - M) times a power
of two in every chunking; multiplying by a power of two moves no bit of a mantissa, so a bf16
decoder's rounded e_u (below) round exactly as the twin's 2^(s_u - M) do (reference/attn.py,
_low_precision_pv; the bf16 flash kernels keep their maximum the same way). At fp32 it changes
nothing but the base of the exponential.

PRECISION. A bf16 decoder (the sampler of a bf16 run: Decoder(..., precision="bf16")) launches the
same kernels compiled with BF16 = True (BF16_KERNELS, by common.compiled_again): every product
rounds both of its inputs to bf16 (_in: ptx.bf16_value, ties to even) and sums in fp32, as the
training's products and the twin's do (reference/precision.py, mm; reference/decode.py,
KVCache(precision="bf16")): the LayerNorm's output and the weights in qkv, mlp_up and the
classifier, y and h and the weights in the two output projections, q and k in the scores, e and v
in attention's sum. The LayerNorms, the GELU, the residual stream, the softmax and the cache stay
fp32. At fp32 (the kernels as written, BF16 = False) every _in is the value itself. BF16 is a
global, not an argument: Numba compiles a global as a constant, so each precision's kernels hold
only their own code, where a flag passed as an argument is a test at every load.

THE LAST BLOCK (attention's merge, the classifier's softmax). Each block writes its part, makes
it visible to the whole GPU (threadfence) and counts itself done with an integer atomic add on
an int32 counter; the block that sees the count reach the number of blocks is the last, so every
other part is in memory: it reads them from L2 (ld.global.cg: another multiprocessor wrote them,
and this one's L1 is not kept coherent), does the rest, and sets the counter back to 0 for the
next launch. Which block comes last changes from run to run; what it computes does not: it adds
the parts in a fixed order.

THE DRAW (k_decode_draw, one block of NT threads; twin: reference/decode.py draw). What the host
sampler did with the probabilities p (the softmax above), done where they are:
    l_v = log(max(p_v, 1e-30)) / max(temperature, 1e-6)      # the logits again, scaled
    keep v where l_v >= the top_k-th largest l (all of them when top_k is 0 or >= V)
    q_v = exp(l_v - max l) for the kept v, 0 for the others
    the token: the first v with q_0 + ... + q_v > u_t (q_0 + ... + q_{V-1})
which is numpy's Generator.choice(V, p=q / sum q) given its uniform number u_t (the host draws
every u_t of a sample before the first step, from the seed's generator).
  1. The top_k-th largest. log is increasing, so ranking l is ranking p, and a positive float32's
     bits, read as an int32, rank as the float does: the key of v is max(bits(p_v), bits(1e-30)).
     Up to RANK_MAX = 1024 tokens (the 12M vocabulary), by counting: the keys in shared memory,
     the thread of v counts the keys above key_v (every thread reads the same key at once: one
     broadcast read a key; V / NT tokens a thread, V keys each), v is kept when fewer than top_k
     are, and the smallest kept key is a block minimum. Above it (50304 tokens), a radix select
     finds the top_k-th largest key 8 bits at a time, high bits first: a pass counts in 256 bins
     the keys that agree with the bits found so far, by their next 8 bits (integer atomic adds in
     shared memory: counts, whatever the order), sums the bins from the top (c_b = count of bins
     b..255, a scan in 8 steps), and takes the bin b where c_b reaches the rank still wanted and
     c_{b+1} does not: its 8 bits are the key's next 8, and the keys of bins above b (c_{b+1} of
     them) are ranked. Four passes give every bit.
  2. max l: l grows with p, so it is the scaled log of the largest p (a block maximum by warps,
     _block_top; one log).
  3. The sums, in float64: thread i sums q over its own run of NT-th of the vocabulary, v in
     [i P, (i + 1) P), P = ceil(V / NT), in order; then S_i, the sum of runs 0..i-1, and the total
     S_NT: in each warp the lanes' runs added lane by lane in registers (ptx.warp_prefix, the
     order of a serial cumsum), the warps' totals after one barrier in warp order (_runs_before;
     nondecreasing: adding nonnegative terms never goes down, and each thread's S_{i+1} is the
     next one's S_i bit for bit). The thread with S_i <= u S_NT < S_{i+1} walks its run again to
     the first v where S_i + q's so far pass u S_NT. Exactly one thread writes the token: the runs'
     intervals [S_i, S_{i+1}) cut [0, S_NT) without overlap (when rounding leaves u S_NT at S_NT,
     the run that reaches S_NT takes it, with its last kept token).
The same sums as numpy's to rounding (its cumsum goes one token at a time): a draw can differ only
where u_t falls within a few 1e-16 of the boundary between two tokens.

Deterministic: no atomics on floats; every sum has an order fixed by the sizes, the launch and t.
"""
import math

import numpy as np
from numba import cuda, float32, float64, int32, int64

from .common import MAX_BLOCK, SIMULATOR, block_max, block_sum, blocks, cdiv, compiled_again, nonneg
from .mlp import gelu
from .ptx import bf16_value, warp_max, warp_prefix, warp_sum

LOGIT_BLOCKS = 4 if SIMULATOR else 1 << 20      # k_decode_logits: at most this many blocks (rows loop)
DRAW_BINS = 256                                  # k_decode_draw's radix select: 8 bits of a key a pass
TINY_BITS = int(np.float32(1e-30).view(np.int32))   # the key of a probability at or below 1e-30
RANK_MAX = 1024                                  # k_decode_draw: the top_k-th largest by counting up to this V
LOG2_E = float32(1.0 / math.log(2.0))             # attention's scores in base 2: 2^(s log2 e) = e^s
NEVER = 1 << 30                                  # draw[0] of a sequence that draws nothing: past any position
RUNS = MAX_BLOCK + 1                             # k_decode_draw: S_0 .. S_NT, NT <= MAX_BLOCK
BF16 = False                                     # the kernels as written: fp32 products (PRECISION)


# ---------------------------------------------------------------------------------------------
# device functions: sums across a block's threads (by warps, and over the lanes of each row), the
# LayerNorm of one row, a column's part of a product, the last block, a load from L2

if SIMULATOR:
    def _from_l2(arr, i):
        """arr[i] (the simulator has one memory, no caches)."""
        return arr[i]
else:
    @cuda.jit(device=True, inline="always")
    def _from_l2(arr, i):
        """arr[i] read past this multiprocessor's L1 (which other multiprocessors' stores do not
        update): for parts another block of the same launch wrote.   PTX: ld.global.cg"""
        return cuda.ldcg(arr, i)


@cuda.jit(device=True)
def _warps_total(buf, val, at):
    """val summed over the block's threads (flat index i = threadIdx.y * blockDim.x + threadIdx.x):
    each warp's 32 by a butterfly of shuffles (ptx.warp_sum), lane 0 of warp w leaves it in
    buf[at + w], and after one barrier every thread adds the warps' sums in warp order. buf: shared,
    at + a float a warp, not free again before another barrier. Fixed order: deterministic."""
    i = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    nw = (cuda.blockDim.x * cuda.blockDim.y + 31) // 32
    s = warp_sum(val, 1, 16)
    if i % 32 == 0:
        buf[at + i // 32] = s
    cuda.syncthreads()
    total = buf[at]
    for w in range(1, nw):
        total += buf[at + w]
    return total


@cuda.jit(device=True)
def _block_total(buf, val):
    """_warps_total at buf[0 ..], and a second barrier: buf is free again on return."""
    total = _warps_total(buf, val, 0)
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def _block_top(buf, val):
    """The maximum of val over the block's threads, as _block_total sums it."""
    i = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    nw = (cuda.blockDim.x * cuda.blockDim.y + 31) // 32
    s = warp_max(val, 1, 16)
    if i % 32 == 0:
        buf[i // 32] = s
    cuda.syncthreads()
    top = buf[0]
    for w in range(1, nw):
        top = max(top, buf[w])
    cuda.syncthreads()
    return top


@cuda.jit(device=True)
def _lanes_tree(buf, s):
    """The parts s of the blockDim.x lanes of each row ty of the block met in a tree over lane =
    threadIdx.x (a barrier a level): row ty's total in buf[ty * blockDim.x], which every thread may
    read on return. buf: float32 [NT], shared. (Attention's keys, the classifier's rows.)"""
    lane, LANES = cuda.threadIdx.x, cuda.blockDim.x
    i = cuda.threadIdx.y * LANES + lane
    buf[i] = s
    cuda.syncthreads()
    step = LANES // 2
    while step > 0:
        if lane < step:
            buf[i] += buf[i + step]
        cuda.syncthreads()
        step //= 2


@cuda.jit(device=True)
def _lanes_total(buf, s):
    """_lanes_tree by shuffles: the lanes of each row (attention's LANES lanes of a key: adjacent
    lanes of one warp, LANES <= 32) meet by a butterfly (ptx.warp_sum), lane 0 leaves the row's total
    in buf[ty * blockDim.x], one barrier."""
    s = warp_sum(s, 1, cuda.blockDim.x // 2)
    if cuda.threadIdx.x == 0:
        buf[cuda.threadIdx.y * cuda.blockDim.x] = s
    cuda.syncthreads()


@cuda.jit(device=True)
def _row_g_b(a, x, g, b):
    """The shared a = [x | g | b] (3C floats) that _layernorm_shared normalises in place: flat
    thread i copies channels c = i, i + n, ... (n threads), its three loads in one loop so that
    they travel together."""
    C = x.shape[0]
    n = cuda.blockDim.x * cuda.blockDim.y
    for c in range(cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x, C, n):
        a[c] = x[c]
        a[C + c] = g[c]
        a[2 * C + c] = b[c]


@cuda.jit(device=True)
def _embedding_g_b(a, x, g, b, tokens, wte, wpe, t):
    """_row_g_b for the model's first block: the row is the embedding of position t, wte[tokens[t]] +
    wpe[t], which block 0 also writes into x (the residual stream)."""
    C = x.shape[0]
    n = cuda.blockDim.x * cuda.blockDim.y
    tok = tokens[t]
    for c in range(cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x, C, n):
        a[c] = wte[tok, c] + wpe[t, c]
        a[C + c] = g[c]
        a[2 * C + c] = b[c]
        if cuda.blockIdx.x == 0:
            x[c] = a[c]


@cuda.jit(device=True)
def _layernorm_shared(a, buf, C, eps):
    """a[c] = (a[c] - mean) * rstd * g[c] + b[c] in place over the C channels of a row, with the
    shared array a = [the row | g | b] (3C floats): mean = (1/C) sum_c a[c], rstd = 1 / sqrt((1/C)
    sum_c (a[c] - mean)^2 + eps), as k_layernorm_fwd computes them. Flat thread i owns channels
    c = i, i + n, ... (n threads): the caller wrote those of a, g and b (_row_g_b, _embedding_g_b:
    the same threads, so no barrier is needed before); every a[c] is ready on return."""
    i = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    n = cuda.blockDim.x * cuda.blockDim.y
    inv_c = float32(1.0) / float32(C)
    s = float32(0.0)
    for c in range(i, C, n):
        s += a[c]
    mu = block_sum(buf, s) * inv_c
    s = float32(0.0)
    for c in range(i, C, n):
        d = a[c] - mu
        s += d * d
    r = float32(1.0) / math.sqrt(block_sum(buf, s) * inv_c + eps)
    for c in range(i, C, n):
        a[c] = (a[c] - mu) * r * a[C + c] + a[2 * C + c]
    cuda.syncthreads()


@cuda.jit(device=True)
def _in(v):
    """A product's input as the product multiplies it: v itself, or in the bf16 kernels v rounded to
    bf16 (ties to even; ptx.bf16_value), as the twin's products and the training's round theirs
    (reference/precision.py, mm). The product and its sums stay in fp32. BF16 is a global: Numba
    compiles it as a constant, so the fp32 kernels have no trace of the rounding (PRECISION)."""
    if BF16:
        return bf16_value(v)
    return v


@cuda.jit(device=True)
def _row(w, k, n):
    """w[k, n] (a product's input: _in), or 0 past the matrix."""
    if k < w.shape[0] and n < w.shape[1]:
        return _in(w[k, n])
    return float32(0.0)


@cuda.jit(device=True)
def _term(a, w, k, n):
    """a[k] w[k, n], each input as the product takes it (_in)."""
    return _in(a[k]) * _in(w[k, n])


@cuda.jit(device=True)
def _first_rows(w, n):
    """The first four weights of thread (tx, ty)'s part of column n (_column_part): rows ty,
    ty + KS, ty + 2 KS, ty + 3 KS (0 past the matrix). A kernel loads them before its LayerNorm, so
    that they travel while it computes: its first round of loads costs no wait of its own."""
    k, ks = cuda.threadIdx.y, cuda.blockDim.y
    return _row(w, k, n), _row(w, k + ks, n), _row(w, k + 2 * ks, n), _row(w, k + 3 * ks, n)


@cuda.jit(device=True)
def _column_part(a, w, n, w0, w1, w2, w3):
    """Thread (tx, ty)'s part of out[n] = sum_k a[k] w[k, n] in a block of TX x KS threads: rows
    k = ty, ty + KS, ty + 2 KS, ... in four running sums, the first four rows' weights w0..w3 given
    (_first_rows), then four a round (four independent loads in flight), then two, then one;
    returns (s0 + s1) + (s2 + s3). 0 for a column past the matrix. Each product's two inputs as
    the product takes them (_in, _term)."""
    ks = cuda.blockDim.y
    K = w.shape[0]
    s0 = float32(0.0)
    s1 = float32(0.0)
    s2 = float32(0.0)
    s3 = float32(0.0)
    if n < w.shape[1]:
        k = cuda.threadIdx.y
        if k < K:
            s0 = _in(a[k]) * w0
        if k + ks < K:
            s1 = _in(a[k + ks]) * w1
        if k + 2 * ks < K:
            s2 = _in(a[k + 2 * ks]) * w2
        if k + 3 * ks < K:
            s3 = _in(a[k + 3 * ks]) * w3
        k += 4 * ks
        while k + 3 * ks < K:
            s0 += _term(a, w, k, n)
            s1 += _term(a, w, k + ks, n)
            s2 += _term(a, w, k + 2 * ks, n)
            s3 += _term(a, w, k + 3 * ks, n)
            k += 4 * ks
        if k + ks < K:                             # two or three rows left
            s0 += _term(a, w, k, n)
            s1 += _term(a, w, k + ks, n)
            k += 2 * ks
        if k < K:                                  # one left
            s2 += _term(a, w, k, n)
    return (s0 + s1) + (s2 + s3)


@cuda.jit(device=True)
def _column_total(buf, part):
    """The KS parts of each of the block's TX columns (part: thread (tx, ty)'s, slice ty) added by
    a tree over ty in shared memory: at step s = KS/2, KS/4, ..., 1, slice ty < s adds slice ty + s.
    Every thread gets its column's total. buf: shared, at least TX * KS floats."""
    tx, ty, TX = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
    i = ty * TX + tx
    buf[i] = part
    cuda.syncthreads()
    s = cuda.blockDim.y // 2
    while s > 0:
        if ty < s:
            buf[i] += buf[i + s * TX]
        cuda.syncthreads()
        s //= 2
    return buf[tx]


@cuda.jit(device=True)
def _chunk_weight(m_p, big):
    """w_p = 2^(m_p - M): what brings chunk p's powers, taken against its own (integer) maximum m_p
    (e_u = 2^(s_u - m_p)), to the head's maximum M = max_p m_p (2^(s_u - M) = w_p e_u): a power of
    two, since both are integers."""
    return math.exp2(m_p - big)


@cuda.jit(device=True)
def _last_block(flag, done, j, blocks):
    """Whether this block is the last of `blocks` blocks to get here (module docstring, THE LAST
    BLOCK): every thread's stores so far made visible to the whole GPU, then thread 0 adds 1 to the
    counter done[j] (an integer atomic) and the block that sees blocks - 1 before its add is the
    last. That block sets done[j] back to 0 and may then read every block's stores (with _from_l2).
    Every thread of the block gets the same answer. flag: shared, one int32."""
    cuda.threadfence()                             # this thread's parts, before the count says so
    cuda.syncthreads()
    if cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0:
        last = cuda.atomic.add(done, j, 1) == blocks - 1
        flag[0] = 1 if last else 0
        if last:
            done[j] = 0                            # for the next launch
    cuda.syncthreads()
    cuda.threadfence()
    return flag[0] == 1


# ---------------------------------------------------------------------------------------------
# the kernels, in the order of a step

@cuda.jit
def k_decode_qkv(q, k_cache, v_cache, pos, x, g, b, eps, w_q, w_k, w_v, tokens, wte, wpe, embed):
    """a = LN1(x); q = a @ W_q, k_cache[t] = a @ W_k, v_cache[t] = a @ W_v, t = pos[0]. With embed
    (the first block of the model) x = wte[tokens[t]] + wpe[t] first: every block computes it for
    its LayerNorm, block 0 writes it into x (the residual stream). The 3C columns of
    [W_q | W_k | W_v] in blocks of TX (a block may straddle two matrices: each thread takes its
    column's), KS slices of K = C a column (_column_part, _column_total); the products' inputs as
    _in gives them."""
    a = cuda.shared.array(0, float32)              # [x (then LN1(x)) | g | b]: 3C floats of dynamic shared memory
    buf = cuda.shared.array(MAX_BLOCK, float32)
    C = x.shape[0]
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x      # column of [W_q | W_k | W_v]
    which = min(n // C, 2)
    j = n - which * C                              # its column in that matrix (>= C past the last)
    w = w_q if which == 0 else (w_k if which == 1 else w_v)
    w0, w1, w2, w3 = _first_rows(w, j)
    t = pos[0]
    if embed:
        _embedding_g_b(a, x, g, b, tokens, wte, wpe, t)
    else:
        _row_g_b(a, x, g, b)
    _layernorm_shared(a, buf, C, eps)
    total = _column_total(buf, _column_part(a, w, j, w0, w1, w2, w3))
    if cuda.threadIdx.y == 0 and j < C:
        if which == 0:
            q[j] = total
        elif which == 1:
            k_cache[t, j] = total
        else:
            v_cache[t, j] = total


@cuda.jit
def k_decode_attention(y, part_m, part_l, part_acc, done, q, k_cache, v_cache, pos):
    """y[h*hs + d] = sum_{u<=t} e_u v_cache[u, h*hs + d] / sum_u e_u, e_u = 2^(s_u - m), the scores
    s_u = log2(e) q_h . k_cache[u, h] / sqrt(hs) in base 2 and m an integer at least max s, t = pos[0]:
    block (p, h) takes the CK keys of chunk p of head h (the four steps of the module's docstring);
    the last of head h's blocks merges the chunks into y_h. done[h]: head h's counter of finished
    blocks (0 between launches). The products' inputs (q, k; e, v) as _in gives them."""
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
            s0 += _in(q[base + d]) * _in(k_cache[u, base + d])
            s1 += _in(q[base + d + LANES]) * _in(k_cache[u, base + d + LANES])
            d += 2 * LANES
        if d < hs:
            s0 += _in(q[base + d]) * _in(k_cache[u, base + d])
    _lanes_total(red, s0 + s1)                     # key r's q . k in red[r * LANES]
    # 2. the chunk's maximum (every thread, in key order) rounded up to an integer, its powers and
    #    their sum
    scale = float32(1.0) / math.sqrt(float32(hs)) * LOG2_E
    m = float32(-math.inf)
    for j in range(nk):
        m = max(m, red[j * LANES] * scale)
    m = float32(math.ceil(m))
    if lane == 0 and r < nk:
        ex[r] = math.exp2(red[tid] * scale - m)
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
                a0 += _in(ex[k]) * _in(v_cache[u0 + k, base + d])
                a1 += _in(ex[k + G]) * _in(v_cache[u0 + k + G, base + d])
                k += 2 * G
            if k < nk:
                a0 += _in(ex[k]) * _in(v_cache[u0 + k, base + d])
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
def k_decode_matvec_add(x, a, w):
    """x[n] = x[n] + sum_k a[k] w[k, n]: a residual branch's output projection (W_o after attention,
    W_2 after the GELU) added into the residual stream in place. Columns in blocks of TX, KS slices
    of K a column; x[n] is read and written by its column's thread ty = 0 only. The products'
    inputs as _in gives them."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    w0, w1, w2, w3 = _first_rows(w, n)
    total = _column_total(buf, _column_part(a, w, n, w0, w1, w2, w3))
    if cuda.threadIdx.y == 0 and n < x.shape[0]:
        x[n] = x[n] + total


@cuda.jit
def k_decode_mlp_up(h, x, g, b, eps, w_1):
    """h[n] = gelu(sum_k LN2(x)[k] w_1[k, n]) for the F = 4C hidden units: the GELU of the engine
    (kernels/mlp.py, tanh form). Columns in blocks of TX, KS slices of K = C a column. The
    products' inputs as _in gives them."""
    a = cuda.shared.array(0, float32)              # [x (then LN2(x)) | g | b]: 3C floats of dynamic shared memory
    buf = cuda.shared.array(MAX_BLOCK, float32)
    C = x.shape[0]
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    w0, w1, w2, w3 = _first_rows(w_1, n)
    _row_g_b(a, x, g, b)
    _layernorm_shared(a, buf, C, eps)
    total = _column_total(buf, _column_part(a, w_1, n, w0, w1, w2, w3))
    if cuda.threadIdx.y == 0 and n < h.shape[0]:
        h[n] = gelu(total)


@cuda.jit(device=True)
def _row_total(buf, s):
    """Row ty's total of its TX lanes' parts s (_lanes_tree), in every thread of the row; buf free
    again on return (the next rows write it)."""
    _lanes_tree(buf, s)
    total = buf[cuda.threadIdx.y * cuda.blockDim.x]
    cuda.syncthreads()
    return total


@cuda.jit
def k_decode_logits(probs, logits, done, pos, x, g, b, eps, wte):
    """logits[v] = sum_c LNf(x)[c] wte[v, c]: the tied classifier, wte read by rows. A block of
    TX lanes x RY rows: lane tx sums channels c = tx, tx + TX, ... of row v (four a round: four
    loads in flight), the row's lanes meet in a tree; blocks stride over the V rows. The last block
    to finish (done[0] counts them) then computes probs[v] = exp(logits[v] - m) / se over the whole
    row, m = max_v logits[v], se = sum_v exp(logits[v] - m), as k_loss_fwd's softmax, and moves the
    position on: pos[0] += 1 (no kernel of this step reads pos after it). The products' inputs as
    _in gives them."""
    a = cuda.shared.array(0, float32)              # [x (then LNf(x)) | g | b]: 3C floats of dynamic shared memory
    buf = cuda.shared.array(MAX_BLOCK, float32)
    flag = cuda.shared.array(1, int32)
    tx, ty, TX, RY = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x, cuda.blockDim.y
    i, nt = ty * TX + tx, TX * RY
    V, C = wte.shape
    _row_g_b(a, x, g, b)
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
                s0 += _in(a[c]) * _in(wte[v, c])
                s1 += _in(a[c + TX]) * _in(wte[v, c + TX])
                s2 += _in(a[c + 2 * TX]) * _in(wte[v, c + 2 * TX])
                s3 += _in(a[c + 3 * TX]) * _in(wte[v, c + 3 * TX])
                c += 4 * TX
            while c < C:
                s0 += _in(a[c]) * _in(wte[v, c])
                c += TX
        total = _row_total(buf, (s0 + s1) + (s2 + s3))
        if tx == 0 and v < V:
            logits[v] = total
    # the last block: the softmax of the whole row, then t += 1
    if not _last_block(flag, done, 0, cuda.gridDim.x):
        return
    m = float32(-math.inf)
    for v in range(i, V, nt):
        m = max(m, _from_l2(logits, v))
    m = block_max(buf, m)
    s = float32(0.0)
    for v in range(i, V, nt):
        s += math.exp(_from_l2(logits, v) - m)
    se = block_sum(buf, s)
    for v in range(i, V, nt):
        probs[v] = math.exp(_from_l2(logits, v) - m) / se
    if i == 0:
        pos[0] += 1


@cuda.jit(device=True)
def _scaled_log(p, tau):
    """l = log(max(p, 1e-30)) / tau in float64: the draw's logit of a probability p."""
    return math.log(max(float64(p), 1e-30)) / tau


@cuda.jit(device=True)
def _key(bits, v):
    """Token v's key: its probability's bits as an int (positive floats rank as their bits do), at
    least 1e-30's (THE DRAW, 1)."""
    return max(int64(bits[v]), TINY_BITS)


@cuda.jit(device=True)
def _weight(probs, v, tau, lmax):
    """q_v = exp(l_v - max l), the kept token v's weight in the draw (THE DRAW)."""
    return math.exp(_scaled_log(probs[v], tau) - lmax)


@cuda.jit(device=True)
def _kth_by_counting(keys, red, bits, top_k):
    """The top_k-th largest key (_key) of the V <= RANK_MAX tokens, by counting (THE DRAW, 1):
    keys and red are shared (RANK_MAX and NT int32)."""
    i, nt = cuda.threadIdx.x, cuda.blockDim.x
    V = bits.shape[0]
    for v in range(i, V, nt):
        keys[v] = _key(bits, v)
    cuda.syncthreads()
    smallest = int32(0x7FFFFFFF)                       # this thread's smallest kept key
    for v in range(i, V, nt):
        key = keys[v]
        above = 0
        for w in range(V):
            above += keys[w] > key
        if above < top_k:
            smallest = min(smallest, key)
    return -_block_top(red, -smallest)


@cuda.jit(device=True)
def _kth_by_radix(hist, sel, bits, top_k):
    """The top_k-th largest key (_key) of the tokens, 8 bits a pass (THE DRAW, 1):
    hist [2, 256] int32 and sel [2] int64, shared."""
    i, nt = cuda.threadIdx.x, cuda.blockDim.x
    V = bits.shape[0]
    key_min = int64(0)                                 # the bits found so far
    want = int64(top_k)                                # its rank among the keys that agree with them
    for shift in range(24, -1, -8):
        for b in range(i, DRAW_BINS, nt):
            hist[0, b] = 0
        cuda.syncthreads()
        for v in range(i, V, nt):
            key = _key(bits, v)
            if key >> (shift + 8) == key_min >> (shift + 8):
                cuda.atomic.add(hist, (0, (key >> shift) & (DRAW_BINS - 1)), 1)
        cuda.syncthreads()
        step, src = 1, 0                               # c_b = sum of bins b..255, a step reading one row and
        while step < DRAW_BINS:                        # writing the other: after 8 steps (an even number)
            for b in range(i, DRAW_BINS, nt):          # the sums are back in row 0
                c = hist[src, b]
                if b + step < DRAW_BINS:
                    c += hist[src, b + step]
                hist[1 - src, b] = c
            step, src = 2 * step, 1 - src
            cuda.syncthreads()
        for b in range(i, DRAW_BINS, nt):
            above = hist[0, b + 1] if b + 1 < DRAW_BINS else 0
            if hist[0, b] >= want and above < want:    # one bin: c_b never grows with b
                sel[0] = key_min | (int64(b) << shift)
                sel[1] = want - above
        cuda.syncthreads()
        key_min = sel[0]
        want = sel[1]                                  # (sel is written again only after the next pass's barriers)
    return key_min


@cuda.jit(device=True)
def _largest_log(red, probs, tau):
    """max_v l_v = log(max(p_v, 1e-30)) / tau over the V tokens (THE DRAW, 2): l grows with p, so it
    is the scaled log of the largest probability, each thread's tokens' then the block's by warps
    (_block_top in red, shared): one log in all."""
    i, nt = cuda.threadIdx.x, cuda.blockDim.x
    top = float32(0.0)
    for v in range(i, probs.shape[0], nt):
        top = max(top, probs[v])
    return _scaled_log(_block_top(red, top), tau)


@cuda.jit(device=True)
def _runs_before(runs, s):
    """(S_i, S_{i+1}, S_NT) for thread i whose run sums to s (THE DRAW, 3). In warp w the runs of
    the lanes below lane j add up lane by lane (ptx.warp_prefix: P_j, and P_j + s_j is lane j + 1's
    P bit for bit); the warp's last thread leaves P + s in runs[w]; after one barrier each thread
    adds the warps' totals in warp order, B_w for those before its own and S_NT for all, so S_i =
    B_w + P_j and S_{i+1} = B_w + (P_j + s_j): the next thread's S_i, also across warps (B_{w+1} =
    B_w + runs[w]), and the last thread's S_{i+1} is S_NT. runs: float64, shared."""
    i, nt = cuda.threadIdx.x, cuda.blockDim.x
    w = i // 32
    below = warp_prefix(s)
    upto = below + s
    if i % 32 == 31 or i == nt - 1:
        runs[w] = upto
    cuda.syncthreads()
    base = float64(0.0)
    for j in range(w):
        base += runs[j]
    total = base
    for j in range(w, (nt + 31) // 32):
        total += runs[j]
    return base + below, base + upto, total


@cuda.jit
def k_decode_draw(tokens, pos, probs, bits, uniform, draw, temperature):
    """tokens[t] = the token drawn from probs [V] with the uniform number uniform[t] (module
    docstring, THE DRAW), t = pos[0] (the position k_decode_logits moved on to: the next step
    embeds tokens[t]), when draw[0] <= t < len(tokens): draw[0] is the first position the sample
    draws (the prompt's end; past the window, or never, on a step that only reads), draw[1] the
    top_k (0: every token), temperature[0] the temperature. bits: probs' int32 view."""
    keys = cuda.shared.array(RANK_MAX, int32)          # the keys, counting
    hist = cuda.shared.array((2, DRAW_BINS), int32)    # a pass's counts, then their sums from the top (rows in turn)
    sel = cuda.shared.array(2, int64)                  # a pass's answer: the key's bits so far, the rank left
    red_i = cuda.shared.array(MAX_BLOCK, int32)        # block trees
    red = cuda.shared.array(MAX_BLOCK, float64)
    runs = cuda.shared.array(RUNS, float64)            # the runs' sums, then S_i: the sum of runs before run i
    t = pos[0]
    if t < draw[0] or t >= tokens.shape[0]:
        return                                         # a position of the prompt (or none): nothing to draw
    i, nt = cuda.threadIdx.x, cuda.blockDim.x
    V = probs.shape[0]
    top_k = draw[1]
    # 1. the top_k-th largest key: the smallest kept (0: every key, when every token is kept)
    key_min = int64(0)
    if 0 < top_k < V:
        if V <= RANK_MAX:
            key_min = int64(_kth_by_counting(keys, red_i, bits, top_k))
        else:
            key_min = _kth_by_radix(hist, sel, bits, top_k)
    # 2. the largest scaled log-probability: the kept q_v = exp(l_v - lmax)
    tau = max(temperature[0], 1e-6)
    lmax = _largest_log(red, probs, tau)
    # 3. thread i's run v in [lo, hi), its sum; the sums of the runs before it, its own, all of them
    run = (V + nt - 1) // nt
    lo = min(i * run, V)
    hi = min(lo + run, V)
    s = float64(0.0)
    for v in range(lo, hi):
        if _key(bits, v) >= key_min:
            s += _weight(probs, v, tau, lmax)
    before, upto, total = _runs_before(runs, s)
    target = uniform[t] * total
    if (before <= target < upto) or (target >= total and before < upto == total):
        acc = before
        last = lo
        for v in range(lo, hi):                        # the first v whose running sum passes the target
            if _key(bits, v) >= key_min:
                acc += _weight(probs, v, tau, lmax)
                last = v
                if acc > target:
                    break
        tokens[t] = last                               # (rounding past the run's end: its last kept token)


@cuda.jit
def k_decode_start(pos, draw):
    """t = 0: a new sequence, which draws nothing until told (draw[0]: past any position). One thread."""
    pos[0] = 0
    draw[0] = NEVER


# the kernels with bf16 products: every kernel and device function above compiled again with BF16 = True
BF16_KERNELS = compiled_again(globals(), "_bf16", BF16=True)


def _at(kernel, bf16: bool):
    """The kernel as written (fp32 products), or its bf16 twin (BF16_KERNELS)."""
    return BF16_KERNELS[kernel.__name__] if bf16 else kernel


# ---------------------------------------------------------------------------------------------
# launchers: block = (TX, KS) for the products (columns, slices of K), (LANES, CK) for attention
# (lanes a key, keys a chunk), (TX, RY) for the logits (lanes, rows); all powers of two, at most
# 1024 threads. The first of each `blocks` is the default (module docstring: few rows a thread,
# many blocks); the others are there for lab/bench/decode_speed.py to time. In the simulator every
# thread is a Python thread: its defaults keep a step's threads few (the tests run the others).

QKV_BLOCKS = dict(gpu=((8, 64), (8, 32), (8, 128), (16, 32), (4, 128), (32, 16)), sim=((4, 2), (2, 4), (1, 8)))
MATVEC_BLOCKS = dict(gpu=((8, 128), (8, 64), (4, 128), (16, 64), (32, 16)), sim=((4, 2), (2, 4), (1, 8)))
MLP_UP_BLOCKS = dict(gpu=((8, 64), (8, 32), (8, 128), (16, 32), (4, 128), (32, 16)), sim=((4, 2), (2, 4), (1, 8)))
ATTENTION_BLOCKS = dict(gpu=((16, 16), (8, 32), (16, 32), (32, 8), (4, 64)), sim=((1, 4), (4, 2), (2, 8)))
LOGITS_BLOCKS = dict(gpu=((32, 8), (64, 4), (16, 16), (32, 32)), sim=((2, 4), (4, 2)))
DRAW_BLOCKS = dict(gpu=(256, 512, 1024, 128), sim=(8, 4, 64))


def _whole_warps(threads: int) -> bool:
    """Whole warps on a GPU (a shuffle takes all 32 lanes of one); the simulator runs blocks smaller
    than a warp."""
    return SIMULATOR or threads % 32 == 0


def _pow2(*sizes) -> bool:
    """Every size a power of two (the trees halve their steps)."""
    return all(s > 0 and s & (s - 1) == 0 for s in sizes)


@blocks(**QKV_BLOCKS)
def decode_qkv(q, k_cache, v_cache, pos, x, g, b, eps, w_q, w_k, w_v, tokens, wte, wpe, embed, *, block,
               stream=0, bf16=False):
    """q [C]; k_cache, v_cache [T, C] (row pos[0] written); pos [1] int32; x, g, b [C]; w_q, w_k,
    w_v [C, C]; tokens [T] int32, wte [V, C], wpe [T_max, C], embed: x = wte[tokens[t]] + wpe[t]
    first (the model's first block; x written); bf16: the products' inputs rounded to bf16. Launch:
    3C / TX blocks of TX x KS threads, 3C floats of dynamic shared memory."""
    assert _pow2(*block), f"block {block}: powers of two"
    C = x.shape[0]
    kernel = _at(k_decode_qkv, bf16)
    kernel[cdiv(3 * C, block[0]), block, stream, 12 * C](q, k_cache, v_cache, pos, x, g, b, float32(eps), w_q, w_k, w_v,
                                                         tokens, wte, wpe, bool(embed))


def attention_chunks(T: int) -> int:
    """The chunks of keys the scratch of decode_attention holds a head, for a window of T keys: the
    most that any of its blocks asks for (the fewest keys a chunk)."""
    return max(cdiv(T, ck) for _, ck in ATTENTION_BLOCKS["sim" if SIMULATOR else "gpu"])


@blocks(**ATTENTION_BLOCKS)
def decode_attention(y, part_m, part_l, part_acc, done, q, k_cache, v_cache, pos, *, block, stream=0, bf16=False):
    """y, q [C]; part_m, part_l [H, NCH], part_acc [H, NCH, hs] (scratch, NCH >= T / CK); done [H]
    int32 (zeros between launches); k_cache, v_cache [T, C] (rows 0..pos[0] read); pos [1] int32;
    bf16: the products' inputs rounded to bf16. Launch: (T / CK, H) blocks of LANES x CK threads (at
    least NCH: a thread a chunk in the merge)."""
    lanes, ck = block
    T = k_cache.shape[0]
    H, nch = part_m.shape
    assert _pow2(lanes, ck) and lanes <= 32 and lanes * ck <= MAX_BLOCK and _whole_warps(lanes * ck), \
        f"block {block}: powers of two, whole warps, at most 32 lanes (a key's in one warp) and {MAX_BLOCK} threads"
    assert cdiv(T, ck) <= min(nch, lanes * ck) and part_acc.shape == (H, nch, q.shape[0] // H) and done.shape == (H,)
    kernel = _at(k_decode_attention, bf16)
    kernel[(cdiv(T, ck), H), block, stream](y, part_m, part_l, part_acc, done, q, k_cache, v_cache, pos)


@blocks(**MATVEC_BLOCKS)
def decode_matvec_add(x, a, w, *, block, stream=0, bf16=False):
    """x [N] (+= a @ w, in place); a [K]; w [K, N]; bf16: the products' inputs rounded to bf16.
    Launch: N / TX blocks of TX x KS threads."""
    assert _pow2(*block), f"block {block}: powers of two"
    _at(k_decode_matvec_add, bf16)[cdiv(w.shape[1], block[0]), block, stream](x, a, w)


@blocks(**MLP_UP_BLOCKS)
def decode_mlp_up(h, x, g, b, eps, w_1, *, block, stream=0, bf16=False):
    """h [F]; x, g, b [C]; w_1 [C, F]; bf16: the products' inputs rounded to bf16. Launch: F / TX
    blocks of TX x KS threads, 3C floats of dynamic shared memory."""
    assert _pow2(*block), f"block {block}: powers of two"
    C = x.shape[0]
    _at(k_decode_mlp_up, bf16)[cdiv(w_1.shape[1], block[0]), block, stream, 12 * C](h, x, g, b, float32(eps),
                                                                                     w_1)


@blocks(**LOGITS_BLOCKS)
def decode_logits(probs, logits, done, pos, x, g, b, eps, wte, *, block, stream=0, bf16=False):
    """probs, logits [V]; done [1] int32 (zero between launches); pos [1] int32 (+= 1); x, g, b [C];
    wte [V, C]; bf16: the products' inputs rounded to bf16. Launch: V / RY blocks (at most
    LOGIT_BLOCKS: the rows loop) of TX x RY threads, 3C floats of dynamic shared memory."""
    assert _pow2(*block), f"block {block}: powers of two"
    V, C = wte.shape
    kernel = _at(k_decode_logits, bf16)
    kernel[min(cdiv(V, block[1]), LOGIT_BLOCKS), block, stream, 12 * C](probs, logits, done, pos, x, g, b, float32(eps),
                                                                        wte)


@blocks(**DRAW_BLOCKS)
def decode_draw(tokens, pos, probs, uniform, draw, temperature, *, block, stream=0):
    """tokens [T + 1] int32 (tokens[pos[0]] drawn); pos [1] int32; probs [V]; uniform [T + 1] float64
    (uniform[t] draws position t's token); draw [2] int32 (the first position drawn, top_k);
    temperature [1] float64. Launch: one block of `block` threads (a power of two, at most 1024)."""
    assert _pow2(block) and block <= MAX_BLOCK and _whole_warps(block), \
        f"block {block}: a power of two, whole warps, at most {MAX_BLOCK}"
    k_decode_draw[1, block, stream](tokens, pos, probs, probs.view(np.int32), uniform, draw, temperature)


def decode_start(pos, draw, *, stream=0):
    """pos [1] int32, = 0; draw [2] int32 (draw[0]: past any position). Launch: one thread."""
    k_decode_start[1, 1, stream](pos, draw)
