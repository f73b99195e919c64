"""The KV-cache decoder's step, rung 4: the whole step in one launch (a persistent kernel), its
phases met by grid barriers instead of one launch each.

Rungs 1 to 3 (lab/decode.py, the engine's kernels/decode.py) run a step as 5 L + 2 launches. A
launch is cheap in a CUDA graph, but each one still waits for the last block of the one before to
finish, starts its blocks, and reads its inputs cold: at 12M on an H100 a step's 37 kernels take
0.31 ms where their weights (50 MB) would stream from memory in 15 us. Here one launch of NB
blocks, one per multiprocessor (all of them resident at once, so a block can wait for the others),
walks the same phases and meets at a grid barrier between each phase and the next:

    per block l:   A  LN1, q k v        x (l = 0: wte[token] + wpe[t]) -> q, K[l, t], V[l, t]
                   B  attention          per (head, chunk of CK keys): m_p, l_p, acc_p
                   C  merge, W_o         y = the chunks merged (every block, all of y); x += y @ W_o
                   D  LN2, W_1, GELU     h = gelu(LN2(x) @ W_1)
                   E  W_2                x += h @ W_2
    then           F  LNf, classifier    logits[v] = LNf(x) . wte[v]
                   G  (block 0)          probs = softmax(logits); t += 1
and the engine's k_decode_draw, a second launch, draws the token as rungs 1 to 3 do. 5 L + 1 grid
barriers a step (36 at 12M) instead of 5 L + 1 kernel boundaries.

THE PRODUCTS. A phase with a [1, K] x [K, N] product cuts its N columns into tiles of TX columns
(TX fixed per phase: 16 for the wide qkv and W_1, 4 for W_o and W_2 whose N = C; module constants,
so the sums' order does not depend on the grid). The tiles go to the blocks in turn (tile j to
block j mod NB). In a block of NT threads, thread i takes column tx = i mod TX of the tile and
rows k = ty, ty + KS, ... (ty = i div TX, KS = NT / TX), in eight running sums (eight loads in
flight), and the KS parts of a column meet as the engine's do: a butterfly of shuffles over the
lanes with the same tx, then the warps' sums in warp order after a barrier. The weights are read
from the flat parameter vector (andrea_numba/layout.py) at each layer's offset.

ATTENTION. A unit is (head h, chunk p of CK keys): the block's NW warps take the chunk's keys
w, w + NW, ..., two a round (both rows' loads in flight), each warp keeping a running softmax
(m, l and its lanes' channels of acc: lane d and d + 32, hs <= 64); the warps' parts meet in
shared memory (the chunk's m_p = max over warps, l_p and acc_p each rescaled to it, in warp order)
and go to scratch. Phase C's blocks each merge every head's chunks into the whole y (the engine's
last-block merge, done by every block that needs y: no counter, no threadfence of its own).

WHAT CROSSES BLOCKS goes through L2: a block writes (x, q, the cache's row t, the chunks' parts, h,
the logits), the barrier orders those stores before every block's next loads, and those loads
read past L1 (ld.global.cg: a multiprocessor's L1 is not kept coherent with other blocks' stores).

THE GRID BARRIER (bar: two int32, [arrivals, generation], zero when allocated): the block's
threads meet (syncthreads); thread 0 reads the generation, makes the block's stores visible to
the GPU (threadfence), and counts itself in (atomic add); the last to arrive sets the count back
to 0 and moves the generation on; the others wait until it moves; then the block's threads meet
again. It needs every block resident at once: NB = the multiprocessor count, one block each. The
simulator runs a grid one block at a time and so runs this kernel with one block (NB = 1: the
barrier is the block's barrier), the tiles and units in turn.

Deterministic: the sums' orders are fixed by the sizes, TX, NT and CK; no float atomics.

Measured on an NVIDIA H100 (2026-12-07, python lab/bench/decode_speed.py --versions 1,2,3,4): 0.44 ms
a step with its draw at 12M (blocks of 256 threads), against 0.30 for the engine's 37 launches: one launch
did not pay. Its logits agreed with the engine's to 6.7e-7 over 200 positions, bit for bit on a
second decoder. Where its time goes (the barriers, or the phases' fewer threads: 132 blocks of 256
where a launch of the engine runs up to 192 of 512) is not yet measured.
"""
import math

import numpy as np
from numba import cuda, float32

from andrea_numba.decode import Decoder
from andrea_numba.kernels import decode as kd
from andrea_numba.kernels import matmul
from andrea_numba.kernels.common import MAX_BLOCK, SIMULATOR, blocks, cdiv
from andrea_numba.kernels.decode import _from_l2
from andrea_numba.kernels.mlp import gelu
from andrea_numba.kernels.ptx import warp_sum
from andrea_numba.layout import param_layout
from lab.decode import _block_top, _block_total, _layernorm_shared     # rung 2's, by shuffles (as measured)

TX_QKV, TX_O, TX_UP, TX_DOWN = 16, 4, 16, 4     # columns a tile, by phase (A, C, D, E)
CK = 4 if SIMULATOR else 16                     # keys a unit of attention
NEG = float32(-3.0e38)                          # below any score


@cuda.jit(device=True)
def _grid_sync(bar):
    """Every block of the grid waits here until all have arrived (module docstring)."""
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        gen = cuda.atomic.add(bar, 1, 0)            # the generation before this barrier
        cuda.threadfence()                          # the block's stores, before it counts itself in
        if cuda.atomic.add(bar, 0, 1) == cuda.gridDim.x - 1:
            cuda.atomic.exch(bar, 0, 0)             # the last: the count back to 0 for the next barrier
            cuda.threadfence()
            cuda.atomic.add(bar, 1, 1)              # and the others go
        else:
            while cuda.atomic.add(bar, 1, 0) == gen:
                pass
        cuda.threadfence()
    cuda.syncthreads()


@cuda.jit(device=True)
def _tile_column(a, P, w0, stride, n_ok, K, ty, KS):
    """Thread (tx, ty)'s part of one column: sum over rows k = ty, ty + KS, ... < K of a[k] *
    P[w0 + k * stride], eight running sums (eight loads in flight a round), then one for the rest;
    ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)). 0 for a column past the matrix (n_ok false)."""
    s0 = float32(0.0)
    s1 = float32(0.0)
    s2 = float32(0.0)
    s3 = float32(0.0)
    s4 = float32(0.0)
    s5 = float32(0.0)
    s6 = float32(0.0)
    s7 = float32(0.0)
    if n_ok:
        k = ty
        while k + 7 * KS < K:
            s0 += a[k] * P[w0 + k * stride]
            s1 += a[k + KS] * P[w0 + (k + KS) * stride]
            s2 += a[k + 2 * KS] * P[w0 + (k + 2 * KS) * stride]
            s3 += a[k + 3 * KS] * P[w0 + (k + 3 * KS) * stride]
            s4 += a[k + 4 * KS] * P[w0 + (k + 4 * KS) * stride]
            s5 += a[k + 5 * KS] * P[w0 + (k + 5 * KS) * stride]
            s6 += a[k + 6 * KS] * P[w0 + (k + 6 * KS) * stride]
            s7 += a[k + 7 * KS] * P[w0 + (k + 7 * KS) * stride]
            k += 8 * KS
        while k < K:
            s0 += a[k] * P[w0 + k * stride]
            k += KS
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@cuda.jit(device=True)
def _tile_total(buf, part, TX):
    """The KS parts of each of the tile's TX columns added (engine: kernels/decode.py _column_total,
    in a flat block): lanes with the same tx (i mod TX) by a butterfly of shuffles, then the warps'
    sums in warp order after a barrier. Every thread gets its column's total; buf is free again
    after the caller's next barrier."""
    i = cuda.threadIdx.x
    tx, ty = i % TX, i // TX
    g = 32 // TX                                    # slices a warp
    s = warp_sum(part, TX, 16)
    if ty % g == 0:
        buf[(ty // g) * TX + tx] = s
    cuda.syncthreads()
    total = buf[tx]
    for j in range(1, cuda.blockDim.x // 32):
        total += buf[j * TX + tx]
    return total


@cuda.jit(device=True)
def _load_ln(a, P, x, g0, C, embed, tok, t, wpe0, write_x):
    """a = [x | g | b] for a LayerNorm of the residual row (g at P[g0], b after it): x read from L2,
    or, embed, wte[tok] + wpe[t] (then written into x when write_x)."""
    for c in range(cuda.threadIdx.x, C, cuda.blockDim.x):
        if embed:
            v = P[tok * C + c] + P[wpe0 + t * C + c]
            if write_x:
                x[c] = v
        else:
            v = _from_l2(x, c)
        a[c] = v
        a[C + c] = P[g0 + c]
        a[2 * C + c] = P[g0 + C + c]


@cuda.jit(**({} if SIMULATOR else {"max_registers": 128}))     # 128: a block of 512 threads fits (ptxas: no spill)
def k_decode_step_v4(P, x, q, h, logits, probs, k_cache, v_cache, tokens, pos, part_m, part_l, part_acc, bar,
                     eps, wpe0, layer0, stride, L, H, V):
    """One whole step (module docstring). P: the flat parameters; k_cache, v_cache: [L, T, C]
    flattened; part_m, part_l: [H, NCH] flattened, part_acc [H, NCH, hs] flattened; layer0: the
    first block's offset in P, stride: a block's parameters; wpe0: wpe's offset."""
    a = cuda.shared.array(0, float32)               # 4C floats: a LayerNorm's [x | g | b], or y, or h
    buf = cuda.shared.array(MAX_BLOCK, float32)
    sm = cuda.shared.array(32, float32)             # attention: each warp's m
    sl = cuda.shared.array(32, float32)             # its l
    sacc = cuda.shared.array((32, 64), float32)     # its acc
    i, NT = cuda.threadIdx.x, cuda.blockDim.x
    blk, NB = cuda.blockIdx.x, cuda.gridDim.x
    lane, w, NW = i % 32, i // 32, NT // 32
    C = x.shape[0]
    F = 4 * C
    T = k_cache.shape[0] // (L * C)
    hs = C // H
    NCH = part_m.shape[0] // H
    t = pos[0]
    tok = tokens[t]
    scale = float32(1.0) / math.sqrt(float32(hs))
    for l in range(L):
        base = layer0 + l * stride
        kv0 = (l * T + t) * C                       # row t of block l's K and V
        # A: a = LN1(x); q, K[l, t], V[l, t] = a @ [W_q | W_k | W_v], tiles of TX_QKV columns
        _load_ln(a, P, x, base, C, l == 0, tok, t, wpe0, blk == 0)
        _layernorm_shared(a, buf, C, eps)
        tx, ty, KS = i % TX_QKV, i // TX_QKV, NT // TX_QKV
        for tile in range(blk, (3 * C + TX_QKV - 1) // TX_QKV, NB):
            n = tile * TX_QKV + tx
            j, c = n // C, n % C                    # matrix j of the three (0: W_q), its column c
            part = _tile_column(a, P, base + 2 * C + j * C * C + c, C, n < 3 * C, C, ty, KS)
            total = _tile_total(buf, part, TX_QKV)
            if ty == 0 and n < 3 * C:
                if j == 0:
                    q[c] = total
                elif j == 1:
                    k_cache[kv0 + c] = total
                else:
                    v_cache[kv0 + c] = total
            cuda.syncthreads()
        _grid_sync(bar)
        # B: attention, a unit (head hh, chunk p) of CK keys u = p CK + r <= t
        for unit in range(blk, H * NCH, NB):
            hh, p = unit // NCH, unit % NCH
            if p * CK <= t:                         # the same for the whole block
                d0, d1 = hh * hs + lane, hh * hs + lane + 32
                q0 = _from_l2(q, d0) if lane < hs else float32(0.0)
                q1 = _from_l2(q, d1) if lane + 32 < hs else float32(0.0)
                m = NEG
                lsum = float32(0.0)
                acc0 = float32(0.0)
                acc1 = float32(0.0)
                r = w
                while r < CK and p * CK + r <= t:   # the same for the whole warp
                    u = p * CK + r
                    two = r + NW < CK and u + NW <= t
                    r0 = (l * T + u) * C            # key u's row, and key u + NW's
                    r1 = r0 + NW * C
                    k0 = _from_l2(k_cache, r0 + d0) if lane < hs else float32(0.0)
                    k1 = _from_l2(k_cache, r0 + d1) if lane + 32 < hs else float32(0.0)
                    v0 = _from_l2(v_cache, r0 + d0) if lane < hs else float32(0.0)
                    v1 = _from_l2(v_cache, r0 + d1) if lane + 32 < hs else float32(0.0)
                    kb0 = _from_l2(k_cache, r1 + d0) if two and lane < hs else float32(0.0)
                    kb1 = _from_l2(k_cache, r1 + d1) if two and lane + 32 < hs else float32(0.0)
                    vb0 = _from_l2(v_cache, r1 + d0) if two and lane < hs else float32(0.0)
                    vb1 = _from_l2(v_cache, r1 + d1) if two and lane + 32 < hs else float32(0.0)
                    s = warp_sum(q0 * k0 + q1 * k1, 1, 16) * scale
                    sb = warp_sum(q0 * kb0 + q1 * kb1, 1, 16) * scale
                    if not two:
                        sb = NEG
                    mn = max(m, max(s, sb))
                    corr = math.exp(m - mn)
                    e = math.exp(s - mn)
                    eb = math.exp(sb - mn) if two else float32(0.0)
                    lsum = lsum * corr + e + eb
                    acc0 = acc0 * corr + e * v0 + eb * vb0
                    acc1 = acc1 * corr + e * v1 + eb * vb1
                    m = mn
                    r += 2 * NW
                if lane == 0:
                    sm[w] = m
                    sl[w] = lsum
                sacc[w, lane] = acc0
                sacc[w, lane + 32] = acc1
                cuda.syncthreads()
                if i < hs:                          # the warps met, in warp order, against their maximum
                    big = sm[0]
                    for v in range(1, NW):
                        big = max(big, sm[v])
                    acc = float32(0.0)
                    den = float32(0.0)
                    for v in range(NW):
                        if sm[v] > NEG:             # a warp with no key adds nothing
                            f = math.exp(sm[v] - big)
                            acc += f * sacc[v, i]
                            den += f * sl[v]
                    part_acc[(hh * NCH + p) * hs + i] = acc
                    if i == 0:
                        part_m[hh * NCH + p] = big
                        part_l[hh * NCH + p] = den
                cuda.syncthreads()
        _grid_sync(bar)
        # C: y = every head's chunks merged (into a); x += y @ W_o, tiles of TX_O columns
        na = t // CK + 1                            # the chunks with keys
        for c in range(i, C, NT):
            hh, d = c // hs, c % hs
            big = _from_l2(part_m, hh * NCH)
            for p in range(1, na):
                big = max(big, _from_l2(part_m, hh * NCH + p))
            num = float32(0.0)
            den = float32(0.0)
            for p in range(na):
                f = math.exp(_from_l2(part_m, hh * NCH + p) - big)
                num += f * _from_l2(part_acc, (hh * NCH + p) * hs + d)
                den += f * _from_l2(part_l, hh * NCH + p)
            a[c] = num / den
        cuda.syncthreads()
        tx, ty, KS = i % TX_O, i // TX_O, NT // TX_O
        for tile in range(blk, (C + TX_O - 1) // TX_O, NB):
            n = tile * TX_O + tx
            part = _tile_column(a, P, base + 2 * C + 3 * C * C + n, C, n < C, C, ty, KS)
            total = _tile_total(buf, part, TX_O)
            if ty == 0 and n < C:
                x[n] = _from_l2(x, n) + total
            cuda.syncthreads()
        _grid_sync(bar)
        # D: h = gelu(LN2(x) @ W_1), tiles of TX_UP columns
        g2 = base + 2 * C + 4 * C * C
        _load_ln(a, P, x, g2, C, False, tok, t, wpe0, False)
        _layernorm_shared(a, buf, C, eps)
        tx, ty, KS = i % TX_UP, i // TX_UP, NT // TX_UP
        for tile in range(blk, (F + TX_UP - 1) // TX_UP, NB):
            n = tile * TX_UP + tx
            part = _tile_column(a, P, g2 + 2 * C + n, F, n < F, C, ty, KS)
            total = _tile_total(buf, part, TX_UP)
            if ty == 0 and n < F:
                h[n] = gelu(total)
            cuda.syncthreads()
        _grid_sync(bar)
        # E: x += h @ W_2, tiles of TX_DOWN columns over K = 4C rows
        for c in range(i, F, NT):
            a[c] = _from_l2(h, c)
        cuda.syncthreads()
        tx, ty, KS = i % TX_DOWN, i // TX_DOWN, NT // TX_DOWN
        for tile in range(blk, (C + TX_DOWN - 1) // TX_DOWN, NB):
            n = tile * TX_DOWN + tx
            part = _tile_column(a, P, g2 + 2 * C + C * F + n, C, n < C, F, ty, KS)
            total = _tile_total(buf, part, TX_DOWN)
            if ty == 0 and n < C:
                x[n] = _from_l2(x, n) + total
            cuda.syncthreads()
        _grid_sync(bar)
    # F: logits[v] = LNf(x) . wte[v]: a warp a row, its lanes over the channels
    _load_ln(a, P, x, layer0 + L * stride, C, False, tok, t, wpe0, False)
    _layernorm_shared(a, buf, C, eps)
    for v in range(blk * NW + w, V, NB * NW):      # the same trips for the whole warp
        s = float32(0.0)
        for c in range(lane, C, 32):
            s += a[c] * P[v * C + c]
        s = warp_sum(s, 1, 16)
        if lane == 0:
            logits[v] = s
    _grid_sync(bar)
    # G: block 0: probs = softmax(logits); t += 1
    if blk == 0:
        big = NEG
        for v in range(i, V, NT):
            big = max(big, _from_l2(logits, v))
        big = _block_top(buf, big)
        s = float32(0.0)
        for v in range(i, V, NT):
            s += math.exp(_from_l2(logits, v) - big)
        inv = float32(1.0) / _block_total(buf, s)
        for v in range(i, V, NT):
            probs[v] = math.exp(_from_l2(logits, v) - big) * inv
        cuda.syncthreads()
        if i == 0:
            pos[0] = t + 1


def grid_blocks() -> int:
    """NB: one block a multiprocessor (every block resident at once); 1 in the simulator."""
    return 1 if SIMULATOR else matmul.sm_count()


@blocks(gpu=(256, 512), sim=(32, 64))
def decode_step_v4(P, x, q, h, logits, probs, k_cache, v_cache, tokens, pos, part_m, part_l, part_acc, bar, eps,
                   wpe0, layer0, stride, L, H, V, *, block, stream=0):
    """The launch of one step (k_decode_step_v4) on grid_blocks() blocks of `block` threads (whole
    warps; the tiles' slices KS = block / TX at least one warp's worth)."""
    C = x.shape[0]
    assert block % 32 == 0 and block <= MAX_BLOCK and C // H <= 64, \
        f"block {block}: whole warps, at most {MAX_BLOCK}; a head of at most 64 channels"
    k_decode_step_v4[grid_blocks(), block, stream, 4 * 4 * C](
        P, x, q, h, logits, probs, k_cache, v_cache, tokens, pos, part_m, part_l, part_acc, bar, eps, wpe0,
        layer0, stride, L, H, V)


class PersistentDecoder(Decoder):
    """andrea_numba.decode.Decoder with its step as rung 4: one launch of the whole step, then the
    engine's draw. Its own scratch: the chunks' parts at CK keys a chunk, the grid barrier's two
    counters. The same buffers otherwise (tokens, pos, the cache, x, q, h, logits, probs)."""

    def __init__(self, m, params, T=None, stream=None, capture=None, log=None):
        super().__init__(m, params, T, stream, capture, log)
        H, C = m.n_head, m.d_model
        nch = cdiv(self.T, CK)
        z = lambda n, dtype=np.float32: cuda.to_device(np.zeros(n, dtype), stream=self.stream)
        self.part_m, self.part_l, self.part_acc = z(H * nch), z(H * nch), z(H * nch * (C // H))
        self.bar = z(2, np.int32)
        self.flat = params
        spec = {s.name: s.offset for s in param_layout(m)}
        self.wpe0, self.layer0 = spec["wpe"], spec["h0.ln1.g"]
        self.stride = spec["h1.ln1.g"] - spec["h0.ln1.g"] if m.n_layer > 1 else spec["lnf.g"] - spec["h0.ln1.g"]

    def work(self, stream):
        b, m = self.buf, self.m
        k_flat, v_flat = b["k_cache"].reshape(b["k_cache"].size), b["v_cache"].reshape(b["v_cache"].size)
        decode_step_v4(self.flat, b["x"], b["q"], b["h"], b["logits"], b["probs"], k_flat, v_flat, b["tokens"],
                       b["pos"], self.part_m, self.part_l, self.part_acc, self.bar, np.float32(m.ln_eps), self.wpe0, self.layer0, self.stride, m.n_layer, m.n_head,
                       m.vocab_size, stream=stream)
        kd.decode_draw(b["tokens"], b["pos"], b["probs"], b["uniform"], b["draw"], b["temperature"], stream=stream)
