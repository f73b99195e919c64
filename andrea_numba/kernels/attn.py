"""Causal self-attention: k_attn_fwd / k_attn_bwd (+ k_attn_bwd_dkdv). NumPy twin: reference/attn.py.

q, k, v, y, dy, dq, dk, dv are [B, T, C] with the H heads side by side (head h owns channels
h*hs .. h*hs + hs - 1, hs = C / H); att (saved by the forward) and scratch are [B, H, T, T].
Per (b, h), with q, k, v the head's [T, hs] slices and scale = 1 / sqrt(hs):

    s[t, u]   = scale * q[t] . k[u]      for u <= t    (u > t: masked, att = 0 exactly)
    att[t, :] = softmax(s[t, :])                       saved for backward
    y[t]      = sum_u att[t, u] f[t, u] v[u]

f is dropout's factor on the probabilities (dropout.dropout_factor: keep / (1 - p), drawn from
the key and the flat index of att[b, h, t, u]; exactly 1 when p = 0). att keeps the probabilities
before dropout, which the softmax backward needs; f is drawn again in the backward, never stored.

Backward:
    datt[t, u] = f[t, u] dy[t] . v[u]                dv[u] = sum_t att[t, u] f[t, u] dy[t]
    ds[t, u]   = att[t, u] (datt[t, u] - sum_u' datt[t, u'] att[t, u'])
    dq[t]      = scale * sum_u ds[t, u] k[u]         dk[u] = scale * sum_t ds[t, u] q[t]

The lessons' kernels (attn_fwd, attn_bwd): one thread per (b, h, row); plain loops, everything
from global memory. Easy to read, slow.
    forward   k_attn_fwd         thread (b, h, t): scores, softmax, y[t]
    backward  k_attn_bwd         thread (b, h, t): datt, rowdot -> ds (into scratch), dq[t]
              k_attn_bwd_dkdv    thread (b, h, u): dv[u], dk[u] (reads ds from scratch)

The tiled kernels (attn_fwd_tiled, attn_bwd_tiled: the engine's attention without flash,
GPUModel(flash=False)): a block per (b, h, tile of BQ rows), BQ x TPR threads: thread (r, lane)
works on row r of the tile, and its TPR lanes split that row's key columns (or its hs output
channels). The block walks the keys in tiles of BK rows, copying each K (or V) tile into shared
memory once for all BQ query rows. The rows of att go to global memory as they are computed (they
are needed for backward anyway) and are re-read in later passes by the very thread that wrote
them. Row maxima and sums over a row's TPR lanes go through shared memory (row_max / row_sum):
fixed order.
    forward   k_attn_fwd_tiled        query tiles: scores -> max -> exp, sum -> normalise, y = att @ v
    backward  k_attn_bwd_tiled        query tiles: datt, rowdot -> ds (into scratch), dq = ds @ k
              k_attn_bwd_dkdv_tiled   key tiles:   dv = att^T @ dy, dk = ds^T @ q (reads scratch)
The tiled kernels are built per head size and block (BQ, TPR): make_attn_kernels, on first use. A
head size whose tiles do not fit the block's shared memory (hs > 367 on a GPU) runs the lessons'
kernels instead.
No atomics anywhere: each output element is summed by one thread in a fixed order.
"""
import math

import numpy as np
from numba import cuda, float32

from .common import blocks, cdiv, rung, SIMULATOR
from .dropout import dropout_factor, key_value, mask_args

NEG_INF = float32(-np.inf)


@cuda.jit(device=True)
def _split(B, H, T, idx):
    """(b, h, t) of flat index idx over [B, H, T] (t fastest)."""
    return idx // (H * T), (idx // T) % H, idx % T


# ---------------------------------------------------------------------------------------------
# the lessons' kernels: one thread per query (or key) row of one head

@cuda.jit
def k_attn_fwd(y, att, q, k, v, scale, dropout_key, threshold, dscale):
    """Thread (b, h, t): s[u] = scale q[t].k[u] for u <= t, att[t] = softmax(s),
    y[t] = (att[t] * f[t]) @ v, f = dropout_factor(key, flat index of att[b, h, t, u], ...)."""
    key = key_value(dropout_key)             # a number, or read from the device (dropout.py)
    B, T, C = q.shape
    H = att.shape[1]
    hs = C // H
    idx = cuda.grid(1)
    if idx >= B * H * T:
        return
    b, h, t = _split(B, H, T, idx)
    c0 = h * hs
    m = NEG_INF
    for u in range(t + 1):                      # scores, and their maximum
        s = float32(0.0)
        for d in range(hs):
            s += q[b, t, c0 + d] * k[b, u, c0 + d]
        s *= scale
        att[b, h, t, u] = s
        m = max(m, s)
    tot = float32(0.0)
    for u in range(t + 1):                      # exponentials and their sum
        e = math.exp(att[b, h, t, u] - m)
        att[b, h, t, u] = e
        tot += e
    for u in range(t + 1):                      # normalise
        att[b, h, t, u] = att[b, h, t, u] / tot
    for u in range(t + 1, T):                   # the masked future: exact zeros
        att[b, h, t, u] = 0.0
    row = idx * T                               # flat index of att[b, h, t, 0]
    for d in range(hs):                         # y[t] = sum_u att[t, u] f[t, u] v[u]
        acc = float32(0.0)
        for u in range(t + 1):
            f = dropout_factor(key, row + u, threshold, dscale)
            acc += att[b, h, t, u] * f * v[b, u, c0 + d]
        y[b, t, c0 + d] = acc


@cuda.jit
def k_attn_bwd(dq, scratch, dy, k, v, att, scale, dropout_key, threshold, dscale):
    """Thread (b, h, t): datt[u] = f[t, u] dy[t].v[u], ds = att (datt - rowdot) into
    scratch[b, h, t, u] for u <= t, dq[t] = scale * ds @ k."""
    key = key_value(dropout_key)             # a number, or read from the device (dropout.py)
    B, T, C = dy.shape
    H = att.shape[1]
    hs = C // H
    idx = cuda.grid(1)
    if idx >= B * H * T:
        return
    b, h, t = _split(B, H, T, idx)
    c0 = h * hs
    rowdot = float32(0.0)
    row = idx * T
    for u in range(t + 1):
        da = float32(0.0)
        for d in range(hs):
            da += dy[b, t, c0 + d] * v[b, u, c0 + d]
        da *= dropout_factor(key, row + u, threshold, dscale)
        scratch[b, h, t, u] = da
        rowdot += da * att[b, h, t, u]
    for u in range(t + 1):
        scratch[b, h, t, u] = att[b, h, t, u] * (scratch[b, h, t, u] - rowdot)
    for d in range(hs):
        acc = float32(0.0)
        for u in range(t + 1):
            acc += scratch[b, h, t, u] * k[b, u, c0 + d]
        dq[b, t, c0 + d] = acc * scale


@cuda.jit
def k_attn_bwd_dkdv(dk, dv, dy, q, att, scratch, scale, dropout_key, threshold, dscale):
    """Thread (b, h, u): dv[u] = sum_{t>=u} att[t, u] f[t, u] dy[t],
    dk[u] = scale sum_{t>=u} ds[t, u] q[t]."""
    key = key_value(dropout_key)             # a number, or read from the device (dropout.py)
    B, T, C = dy.shape
    H = att.shape[1]
    hs = C // H
    idx = cuda.grid(1)
    if idx >= B * H * T:
        return
    b, h, u = _split(B, H, T, idx)
    c0 = h * hs
    for d in range(hs):
        sv = float32(0.0)
        sk = float32(0.0)
        for t in range(u, T):
            f = dropout_factor(key, ((b * H + h) * T + t) * T + u, threshold, dscale)
            sv += att[b, h, t, u] * f * dy[b, t, c0 + d]
            sk += scratch[b, h, t, u] * q[b, t, c0 + d]
        dv[b, u, c0 + d] = sv
        dk[b, u, c0 + d] = sk * scale


def _check(q, n_head):
    B, T, C = q.shape
    assert C % n_head == 0, "C must be a multiple of n_head"
    return B, T, C, C // n_head


@rung(1)
@blocks(gpu=(128, 64), sim=(32, 8))
def attn_fwd(y, att, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """y [B, T, C]; att [B, H, T, T] (saved for the backward). Launch: one thread per (b, h, t),
    `block` threads per block."""
    B, T, C, hs = _check(q, n_head)
    k_attn_fwd[cdiv(B * n_head * T, block), block, stream](y, att, q, k, v, np.float32(1.0 / math.sqrt(hs)),
                                                           *mask_args(dropout_p, dropout_key))


@rung(1)
@blocks(gpu=(128, 64), sim=(32, 8))
def attn_bwd(dq, dk, dv, scratch, dy, q, k, v, att, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """scratch [B, H, T, T] receives ds. Launch: k_attn_bwd (dq, ds), then k_attn_bwd_dkdv (dk, dv),
    one thread per (b, h, t) or (b, h, u), `block` threads per block."""
    B, T, C, hs = _check(q, n_head)
    scale = np.float32(1.0 / math.sqrt(hs))
    grid = cdiv(B * n_head * T, block)
    drop = mask_args(dropout_p, dropout_key)
    k_attn_bwd[grid, block, stream](dq, scratch, dy, k, v, att, scale, *drop)
    k_attn_bwd_dkdv[grid, block, stream](dk, dv, dy, q, att, scratch, scale, *drop)


# ---------------------------------------------------------------------------------------------
# the tiled kernels: query tiles (and key tiles) in shared memory

# A tiled kernel's block is (BQ, TPR): BQ rows per block, TPR threads per row (a power of two); BK rows per
# key (or query) tile, a multiple of TPR so column c of a tile always belongs to lane c % TPR.
# The simulator pays for every thread and every syncthreads, so there: small tiles, 2 lanes per
# row (T = 13 still walks two query tiles and two key tiles).
TILED_BLOCKS = dict(gpu=((16, 16), (8, 32), (32, 8)), sim=((8, 2), (4, 2)))
BK_CHOICES = (8,) if SIMULATOR else (64, 32, 16)
SHARED_LIMIT = 48 * 1024                        # bytes of static shared memory per block


def _shared_bytes(hs, bk, BQ, TPR):
    """Shared memory of the larger of the tiled kernels for head size hs and key tile bk."""
    rows = BQ * hs + bk * (hs + 1) + BQ * bk + BQ * TPR       # k_attn_fwd_tiled, k_attn_bwd_tiled
    cols = 2 * bk * hs + 2 * BQ * (bk + 1)                    # k_attn_bwd_dkdv_tiled
    return 4 * max(rows, cols)


@cuda.jit(device=True)
def row_max(red, r, lane, val):
    """Maximum of val over the TPR lanes of row r (red: shared [BQ, TPR]); all threads call it.
    Every thread of the row reads the TPR partials in lane order: a fixed order, two syncs."""
    red[r, lane] = val
    cuda.syncthreads()
    out = red[r, 0]
    for j in range(1, red.shape[1]):
        out = max(out, red[r, j])
    cuda.syncthreads()              # red may be reused right after
    return out


@cuda.jit(device=True)
def row_sum(red, r, lane, val):
    """Sum of val over the TPR lanes of row r: red[r, 0] + red[r, 1] + ... in lane order."""
    red[r, lane] = val
    cuda.syncthreads()
    out = red[r, 0]
    for j in range(1, red.shape[1]):
        out += red[r, j]
    cuda.syncthreads()
    return out


def tile_helpers(HS: int, BK: int, TPR: int, NT: int):
    """The tile device functions of the tiled attention kernels (here, and attn_flash.py's), for
    head size HS, key tile BK, TPR lanes per row and NT threads per block (compile-time constants).
    A row's lanes split the columns of a tile (column c belongs to lane c % TPR, CPT = BK / TPR of
    them each) and the HS channels of an output row (channel d to lane d % TPR, DPT of them)."""
    CPT = BK // TPR                 # tile columns per thread
    DPT = cdiv(HS, TPR)             # output channels per thread

    @cuda.jit(device=True)
    def load_rows(dst, src, b, row0, c0, T):
        """dst[i, d] = src[b, row0 + i, c0 + d] for the rows i of dst and d < HS (0 past row T):
        one head's slice of rows, copied by all NT threads (consecutive threads: consecutive d)."""
        for e in range(cuda.threadIdx.x, dst.shape[0] * HS, NT):
            i, d = e // HS, e % HS
            dst[i, d] = src[b, row0 + i, c0 + d] if row0 + i < T else float32(0.0)

    @cuda.jit(device=True)
    def row_dots(acc, rows, tile, r, lane):
        """acc[i] = rows[r] . tile[lane + i*TPR] over the HS channels: this thread's CPT entries
        of one row of (rows @ tile^T), e.g. scores q k^T or datt = dy v^T."""
        for i in range(CPT):
            acc[i] = 0.0
        for d in range(HS):
            x = rows[r, d]
            for i in range(CPT):
                acc[i] += x * tile[lane + i * TPR, d]

    @cuda.jit(device=True)
    def add_weighted_rows(acc, w, tile, r, lane):
        """acc[i] += sum_c w[r, c] tile[c, d] for d = lane + i*TPR < HS: row r of (w @ tile),
        e.g. y += att v or dq += ds k."""
        for c in range(BK):
            p = w[r, c]
            for i in range(DPT):
                d = lane + i * TPR
                if d < HS:
                    acc[i] += p * tile[c, d]

    return load_rows, row_dots, add_weighted_rows


def make_attn_kernels(HS: int, BK: int, BQ: int, TPR: int):
    """Build the three tiled kernels for head size HS, key tile BK and block (BQ, TPR) (compile-time
    constants, so shared arrays have exact sizes and the small loops over CPT / DPT unroll)."""
    NT = BQ * TPR                   # threads per block
    CPT = BK // TPR                 # tile columns per thread
    DPT = cdiv(HS, TPR)             # output channels per thread: d = lane + i * TPR
    HSP, BKP = HS + 1, BK + 1       # padded rows: a column of the tile spans all 32 banks

    load_rows, row_dots, add_weighted_rows = tile_helpers(HS, BK, TPR, NT)

    @cuda.jit
    def k_attn_fwd_tiled(y, att, q, k, v, scale, dropout_key, threshold, dscale):
        """Block (query tile, b*H + h). Pass 1: s = scale q k^T into att, row max. Pass 2:
        att = exp(s - max) (masked: 0), row sum. Pass 3: att /= sum, y = (att * f) @ v
        (f: dropout's factor)."""
        key = key_value(dropout_key)             # a number, or read from the device (dropout.py)
        sq = cuda.shared.array((BQ, HS), float32)          # the tile's q rows
        skv = cuda.shared.array((BK, HSP), float32)     # a K or V tile (+1: no bank conflicts)
        sp = cuda.shared.array((BQ, BK), float32)          # a tile of att
        red = cuda.shared.array((BQ, TPR), float32)
        acc = cuda.local.array(CPT, float32)
        yacc = cuda.local.array(DPT, float32)
        T = q.shape[1]
        H = att.shape[1]
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        c0 = h * HS
        t0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * BQ   # the longest rows (largest t) first
        tid = cuda.threadIdx.x
        r, lane = tid // TPR, tid % TPR
        t = t0 + r
        t_end = min(T, t0 + BQ)                            # keys 0 .. t_end - 1 are needed
        load_rows(sq, q, b, t0, c0, T)
        # pass 1: scores
        m = NEG_INF
        for u0 in range(0, t_end, BK):
            load_rows(skv, k, b, u0, c0, T)
            cuda.syncthreads()
            row_dots(acc, sq, skv, r, lane)                # scores of row t against this K tile
            for i in range(CPT):
                u = u0 + lane + i * TPR
                if t < T and u <= t:
                    s = acc[i] * scale
                    att[b, h, t, u] = s
                    m = max(m, s)
            cuda.syncthreads()
        m = row_max(red, r, lane, m)
        # pass 2: exponentials, the whole row (u > t: exact zeros)
        tot = float32(0.0)
        if t < T:
            for u in range(lane, T, TPR):
                if u <= t:
                    e = math.exp(att[b, h, t, u] - m)
                    att[b, h, t, u] = e
                    tot += e
                else:
                    att[b, h, t, u] = 0.0
        tot = row_sum(red, r, lane, tot)
        # pass 3: normalise, y[t] = sum_u att[t, u] f[t, u] v[u]
        for i in range(DPT):
            yacc[i] = 0.0
        row = ((b * H + h) * T + t) * T                    # flat index of att[b, h, t, 0]
        for u0 in range(0, t_end, BK):
            load_rows(skv, v, b, u0, c0, T)
            for i in range(CPT):
                c = lane + i * TPR
                u = u0 + c
                p = float32(0.0)
                if t < T and u <= t:
                    p = att[b, h, t, u] / tot
                    att[b, h, t, u] = p                    # saved before dropout
                    p *= dropout_factor(key, row + u, threshold, dscale)
                sp[r, c] = p
            cuda.syncthreads()
            add_weighted_rows(yacc, sp, skv, r, lane)      # y[t] += att[t, tile] @ v[tile]
            cuda.syncthreads()
        if t < T:
            for i in range(DPT):
                d = lane + i * TPR
                if d < HS:
                    y[b, t, c0 + d] = yacc[i]

    @cuda.jit
    def k_attn_bwd_tiled(dq, scratch, dy, k, v, att, scale, dropout_key, threshold, dscale):
        """Block (query tile, b*H + h). Pass 1: datt = f * (dy v^T) into scratch, rowdot = sum_u datt att.
        Pass 2: ds = att (datt - rowdot) into scratch (u <= t only), dq = scale ds @ k."""
        key = key_value(dropout_key)             # a number, or read from the device (dropout.py)
        sdy = cuda.shared.array((BQ, HS), float32)         # the tile's dy rows
        skv = cuda.shared.array((BK, HSP), float32)     # a V or K tile
        sp = cuda.shared.array((BQ, BK), float32)          # a tile of ds
        red = cuda.shared.array((BQ, TPR), float32)
        acc = cuda.local.array(CPT, float32)
        dacc = cuda.local.array(DPT, float32)
        T = dy.shape[1]
        H = att.shape[1]
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        c0 = h * HS
        t0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * BQ
        tid = cuda.threadIdx.x
        r, lane = tid // TPR, tid % TPR
        t = t0 + r
        t_end = min(T, t0 + BQ)
        load_rows(sdy, dy, b, t0, c0, T)
        # pass 1: datt and the row dot product
        rowdot = float32(0.0)
        row = ((b * H + h) * T + t) * T                    # flat index of att[b, h, t, 0]
        for u0 in range(0, t_end, BK):
            load_rows(skv, v, b, u0, c0, T)
            cuda.syncthreads()
            row_dots(acc, sdy, skv, r, lane)               # dy v^T of row t against this V tile
            for i in range(CPT):
                u = u0 + lane + i * TPR
                if t < T and u <= t:
                    da = acc[i] * dropout_factor(key, row + u, threshold, dscale)
                    scratch[b, h, t, u] = da
                    rowdot += da * att[b, h, t, u]
            cuda.syncthreads()
        rowdot = row_sum(red, r, lane, rowdot)
        # pass 2: ds, and dq = scale * ds @ k
        for i in range(DPT):
            dacc[i] = 0.0
        for u0 in range(0, t_end, BK):
            load_rows(skv, k, b, u0, c0, T)
            for i in range(CPT):
                c = lane + i * TPR
                u = u0 + c
                g = float32(0.0)
                if t < T and u <= t:
                    g = att[b, h, t, u] * (scratch[b, h, t, u] - rowdot)
                    scratch[b, h, t, u] = g
                sp[r, c] = g
            cuda.syncthreads()
            add_weighted_rows(dacc, sp, skv, r, lane)      # dq[t] += ds[t, tile] @ k[tile]
            cuda.syncthreads()
        if t < T:
            for i in range(DPT):
                d = lane + i * TPR
                if d < HS:
                    dq[b, t, c0 + d] = dacc[i] * scale

    @cuda.jit
    def k_attn_bwd_dkdv_tiled(dk, dv, dy, q, att, scratch, scale, dropout_key, threshold, dscale):
        """Block (key tile of BQ rows u, b*H + h); walks the queries t >= u in tiles of BK:
        dv[u] = sum_t att[t, u] f[t, u] dy[t], dk[u] = scale sum_t ds[t, u] q[t] (ds from scratch)."""
        key = key_value(dropout_key)             # a number, or read from the device (dropout.py)
        sdy = cuda.shared.array((BK, HS), float32)         # a tile of dy rows
        sq = cuda.shared.array((BK, HS), float32)          # the same tile of q rows
        sa = cuda.shared.array((BQ, BKP), float32)      # (att * f)^T tile: sa[key, query]
        sds = cuda.shared.array((BQ, BKP), float32)     # ds^T tile
        vacc = cuda.local.array(DPT, float32)
        kacc = cuda.local.array(DPT, float32)
        T = dy.shape[1]
        H = att.shape[1]
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        c0 = h * HS
        u0 = cuda.blockIdx.x * BQ                          # the longest columns (small u) first
        tid = cuda.threadIdx.x
        r, lane = tid // TPR, tid % TPR
        u = u0 + r
        for i in range(DPT):
            vacc[i] = 0.0
            kacc[i] = 0.0
        for t0 in range(u0, T, BK):
            load_rows(sdy, dy, b, t0, c0, T)
            load_rows(sq, q, b, t0, c0, T)
            for e in range(tid, BK * BQ, NT):              # consecutive threads: consecutive u
                j, i = e // BQ, e % BQ
                tt, uu = t0 + j, u0 + i
                if tt < T and uu <= tt:                    # scratch holds ds only where u <= t
                    f = dropout_factor(key, ((b * H + h) * T + tt) * T + uu, threshold, dscale)
                    sa[i, j] = att[b, h, tt, uu] * f
                    sds[i, j] = scratch[b, h, tt, uu]
                else:
                    sa[i, j] = 0.0
                    sds[i, j] = 0.0
            cuda.syncthreads()
            for j in range(BK):
                a = sa[r, j]
                g = sds[r, j]
                for i in range(DPT):
                    d = lane + i * TPR
                    if d < HS:
                        vacc[i] += a * sdy[j, d]
                        kacc[i] += g * sq[j, d]
            cuda.syncthreads()
        if u < T:
            for i in range(DPT):
                d = lane + i * TPR
                if d < HS:
                    dv[b, u, c0 + d] = vacc[i]
                    dk[b, u, c0 + d] = kacc[i] * scale

    return k_attn_fwd_tiled, k_attn_bwd_tiled, k_attn_bwd_dkdv_tiled


_TILED = {}     # (hs, BQ, TPR) -> (k_attn_fwd_tiled, k_attn_bwd_tiled, k_attn_bwd_dkdv_tiled), or None: too large


def _tiled_kernels(hs, block):
    """The tiled kernels of head size hs and block (BQ, TPR), with the largest key tile BK of
    BK_CHOICES that the block's lanes split and shared memory holds; None where none fits."""
    key = (hs, *block)
    if key not in _TILED:
        fits = [bk for bk in BK_CHOICES if bk % block[1] == 0 and _shared_bytes(hs, bk, *block) <= SHARED_LIMIT]
        _TILED[key] = make_attn_kernels(hs, fits[0], *block) if fits else None
    return _TILED[key]


@rung(2)
@blocks(**TILED_BLOCKS)
def attn_fwd_tiled(y, att, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """attn_fwd's y and att by k_attn_fwd_tiled: grid (T/BQ query tiles, B*H), BQ*TPR threads;
    block = (BQ, TPR). Head sizes too big for the shared tiles (hs > 367 on a GPU) run attn_fwd."""
    B, T, C, hs = _check(q, n_head)
    kern = _tiled_kernels(hs, block)
    if kern is None:
        return attn_fwd(y, att, q, k, v, n_head, dropout_p, dropout_key, stream=stream)
    BQ, TPR = block
    kern[0][(cdiv(T, BQ), B * n_head), BQ * TPR, stream](y, att, q, k, v, np.float32(1.0 / math.sqrt(hs)),
                                                         *mask_args(dropout_p, dropout_key))


@rung(2)
@blocks(**TILED_BLOCKS)
def attn_bwd_tiled(dq, dk, dv, scratch, dy, q, k, v, att, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """k_attn_bwd_tiled (writes ds into scratch, and dq), then k_attn_bwd_dkdv_tiled (dk, dv); both
    on grid (T/BQ tiles, B*H) with BQ*TPR threads; block = (BQ, TPR). Head sizes too big for the
    shared tiles run attn_bwd."""
    B, T, C, hs = _check(q, n_head)
    kern = _tiled_kernels(hs, block)
    if kern is None:
        return attn_bwd(dq, dk, dv, scratch, dy, q, k, v, att, n_head, dropout_p, dropout_key, stream=stream)
    BQ, TPR = block
    scale = np.float32(1.0 / math.sqrt(hs))
    grid = (cdiv(T, BQ), B * n_head)
    drop = mask_args(dropout_p, dropout_key)
    kern[1][grid, BQ * TPR, stream](dq, scratch, dy, k, v, att, scale, *drop)
    kern[2][grid, BQ * TPR, stream](dk, dv, dy, q, att, scratch, scale, *drop)


