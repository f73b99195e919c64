"""Flash attention: causal self-attention that saves lse [B, H, T] instead of att [B, H, T, T].
NumPy twin: reference/attn.py (attn_flash_fwd, attn_flash_bwd). A checked op case beside plain
attention (attn.py). This module holds the simple pair the lessons teach (attn_flash_fwd,
attn_flash_bwd: multiply-adds, a thread a row's share of a tile); the launchers the recipes run
(andrea_numba/recipes.py) are imported here from the modules that write them out: from
attn_flash_tf32x3.py attn_flash_fwd_tf32x3 / attn_flash_bwd_tf32x3 (fp32) and attn_flash_fwd_fp16 /
attn_flash_bwd_fp16 (fp16), from attn_flash_bf16.py attn_flash_fwd_bf16 / attn_flash_bwd_bf16 and
their _out16 pair (bf16).

The op is attn.py's, with the same layout (q, k, v, y, dy, dq, dk, dv are [B, T, C], head h
owns channels h*hs .. h*hs + hs - 1) and the same dropout (dropout_factor from the key and the
flat index of [b, h, t, u] in a [B, H, T, T] array: the same key drops the same probabilities as
attn.py's kernels). Per (b, h), scale = 1 / sqrt(hs), causal (u <= t):

    s[t, u] = scale * q[t] . k[u]        lse[t] = log sum_{u<=t} exp(s[t, u])
    P[t, u] = exp(s[t, u] - lse[t])      y[t]   = sum_{u<=t} P[t, u] f[t, u] v[u]

What is different is what is stored. attn.py writes the whole probability matrix att to global
memory (it is saved for backward; at 120M that is 403 MB a layer). Here nothing of size T x T
is ever written: the forward keeps, per row, a running maximum m and a running sum l of
exp(s - m) while it walks the keys tile by tile ("online softmax"), and saves only y and
lse = m + log(l). The backward recomputes P = exp(s - lse) tile by tile, and uses
D[t] = dy[t] . y[t] for the softmax backward's row sum (sum_u P f (dy[t] . v[u]) = dy[t] . y[t]):

    datt[t, u] = f[t, u] dy[t] . v[u]        ds[t, u] = P[t, u] (datt[t, u] - D[t])
    dv[u] = sum_{t>=u} P[t, u] f[t, u] dy[t]
    dq[t] = scale sum_u ds[t, u] k[u]        dk[u] = scale sum_t ds[t, u] q[t]

Tiling (as attn.py's tiled kernels): a block is (BQ, TPR): BQ rows, TPR threads (lanes) per row; a row's
lanes split the columns of a tile of BK keys (column c belongs to lane c % TPR) and the hs
output channels (channel d to lane d % TPR). Tiles of K, V (or Q, dY) rows sit in shared memory,
copied once for all BQ rows of the block. Row maxima and sums over the lanes go through shared
memory in lane order (attn.row_max, attn.row_sum).
    forward   k_attn_flash_fwd          block (query tile, b*H + h): online softmax, y, lse
    backward  k_attn_flash_bwd_rowdot   one thread per (b, h, t): D = dy . y into d_rowdot
              k_attn_flash_bwd_dq       block (query tile, b*H + h): walks the key tiles u <= t
              k_attn_flash_bwd_dkdv     block (key tile, b*H + h): walks the query tiles t >= u
The dq and dk/dv kernels both recompute s, P and datt (the price of not storing them), so that
each output element is summed by one thread in a fixed order: no atomics, bit-identical reruns.
The tiled kernels are built per head size and block by make_flash_kernels, on first use; a head
size whose tiles do not fit the block's shared memory raises BlockDoesNotFit. The rowdot kernel
lives in attn_flash_rowdot.py, since the lab's tensor-core rungs (2 to 8) launch it too.
"""
import math

import numpy as np
from numba import cuda, float32

from .attn import NEG_INF, _check, row_max, row_sum, tile_helpers
from .attn_flash_rowdot import k_attn_flash_bwd_rowdot
from .attn_flash_tf32x3 import attn_flash_bwd_fp16, attn_flash_bwd_tf32x3, attn_flash_fwd_fp16, attn_flash_fwd_tf32x3
from .attn_flash_bf16 import attn_flash_bwd_bf16, attn_flash_bwd_bf16_out16, attn_flash_fwd_bf16, attn_flash_fwd_bf16_out16
from .common import SIMULATOR, BlockDoesNotFit, blocks, cdiv, rung
from .dropout import dropout_factor, key_value, mask_args

# Block (BQ, TPR) choices and key tiles BK as attn.py's tiled kernels. In the simulator small tiles, so that
# the harness's T = 13 walks two key tiles and two or four query tiles (and ends inside a tile),
# with 2 or 4 lanes per row (at the tiny size's hs = 4: two channels per lane, or one).
FLASH_BLOCKS = dict(gpu=((16, 16), (8, 32), (32, 8)), sim=((8, 2), (4, 4)))
BK_CHOICES = (8,) if SIMULATOR else (64, 32, 16)
SHARED_LIMIT = 48 * 1024                        # bytes of static shared memory per block


def _shared_bytes(hs, bk, BQ, TPR):
    """Shared memory of the largest of the three tiled kernels for head size hs and key tile bk."""
    fwd = BQ * hs + bk * (hs + 1) + BQ * bk + BQ * TPR         # q rows, a K/V tile, P tile, red
    dq = 2 * BQ * hs + 2 * bk * (hs + 1) + BQ * bk             # q, dy rows, K and V tiles, ds tile
    dkdv = 2 * BQ * hs + 2 * bk * (hs + 1) + 2 * BQ * bk + 2 * bk   # k, v rows, Q, dY tiles, P f, ds, lse, D
    return 4 * max(fwd, dq, dkdv)


def make_flash_kernels(HS: int, BK: int, BQ: int, TPR: int):
    """Build the three tiled kernels for head size HS, key tile BK and block (BQ, TPR) (compile-time
    constants, so shared arrays have exact sizes and the small loops over CPT / DPT unroll)."""
    NT = BQ * TPR                   # threads per block
    CPT = BK // TPR                 # tile columns per thread: c = lane + i * TPR
    DPT = cdiv(HS, TPR)             # output channels per thread: d = lane + i * TPR
    HSP = HS + 1                    # padded tile rows: lanes reading rows c, c + 1, ... hit distinct banks

    load_rows, row_dots, add_weighted_rows = tile_helpers(HS, BK, TPR, NT)   # attn.py's, shared with its tiled kernels

    @cuda.jit
    def k_attn_flash_fwd(y, lse, q, k, v, scale, dropout_key, threshold, dscale):
        """Block (query tile of BQ rows t, b*H + h); thread (r, lane) works on row t = t0 + r.
        The block walks the key tiles u0 = 0, BK, ... up to the tile's last query (later keys
        are all in the future). Per tile, with m the row's running maximum and l its running sum
        of exp(s - m) (each lane sums its own columns; the lanes' parts are added at the end):
            s      = scale q[t] . k[u]   (a K tile in shared memory)        u <= t, else masked
            m_new  = max(m, max_u s)                                        (row_max over lanes)
            alpha  = exp(m - m_new)       l *= alpha, yacc *= alpha         (0 at the first tile)
            p      = exp(s - m_new)       l += p
            yacc  += sum_u p f[t, u] v[u] (the V tile, in the same shared array)
        At the end: y[t] = yacc / l, lse[t] = m + log(l). Nothing T x T is stored."""
        key = key_value(dropout_key)             # a number, or read from the device (dropout.py)
        sq = cuda.shared.array((BQ, HS), float32)          # the tile's q rows
        skv = cuda.shared.array((BK, HSP), float32)        # a K tile, then the V tile of the same keys
        sp = cuda.shared.array((BQ, BK), float32)          # p * f of the tile
        red = cuda.shared.array((BQ, TPR), float32)
        acc = cuda.local.array(CPT, float32)
        yacc = cuda.local.array(DPT, float32)
        T = q.shape[1]
        H = lse.shape[1]
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        c0 = h * HS
        t0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * BQ   # the longest rows (largest t) first
        tid = cuda.threadIdx.x
        r, lane = tid // TPR, tid % TPR
        t = t0 + r
        live = t < T                                       # rows past T compute nothing, write nothing
        t_end = min(T, t0 + BQ)                            # keys 0 .. t_end - 1 are needed
        row = ((b * H + h) * T + t) * T                    # flat index of [b, h, t, 0] for the dropout mask
        for i in range(DPT):
            yacc[i] = 0.0
        m = NEG_INF                                        # running maximum (the same in all lanes)
        lsum = float32(0.0)                                # l: this lane's part of the running sum
        load_rows(sq, q, b, t0, c0, T)
        for u0 in range(0, t_end, BK):
            load_rows(skv, k, b, u0, c0, T)
            cuda.syncthreads()
            row_dots(acc, sq, skv, r, lane)                # q[t] . k[u] for this thread's columns
            mt = NEG_INF
            for i in range(CPT):
                u = u0 + lane + i * TPR
                if live and u <= t:
                    acc[i] *= scale
                    mt = max(mt, acc[i])
            mt = row_max(red, r, lane, mt)                 # its syncs also free skv for the V tile
            m_new = max(m, mt)                             # finite: the first tile holds key 0 <= t
            if live:
                alpha = math.exp(m - m_new)                # exp(-inf) = 0 at the first tile
                lsum *= alpha
                for i in range(DPT):
                    yacc[i] *= alpha
            for i in range(CPT):
                c = lane + i * TPR
                u = u0 + c
                p = float32(0.0)
                if live and u <= t:
                    p = math.exp(acc[i] - m_new)
                    lsum += p                              # the softmax's sum: before dropout
                    p *= dropout_factor(key, row + u, threshold, dscale)
                sp[r, c] = p
            m = m_new
            load_rows(skv, v, b, u0, c0, T)
            cuda.syncthreads()
            add_weighted_rows(yacc, sp, skv, r, lane)      # yacc += (p f)[t, tile] @ v[tile]
            cuda.syncthreads()
        lsum = row_sum(red, r, lane, lsum)                 # l: the lanes' parts, in lane order
        if live:
            for i in range(DPT):
                d = lane + i * TPR
                if d < HS:
                    y[b, t, c0 + d] = yacc[i] / lsum
            if lane == 0:
                lse[b, h, t] = m + math.log(lsum)

    @cuda.jit
    def k_attn_flash_bwd_dq(dq, dy, q, k, v, lse, d_rowdot, scale, dropout_key, threshold, dscale):
        """Block (query tile of BQ rows t, b*H + h); thread (r, lane) works on row t = t0 + r and
        walks the key tiles u0 = 0, BK, ... up to the tile's last query, with K and V tiles in
        shared memory:
            P[t, u]  = exp(scale q[t] . k[u] - lse[t])      (recomputed; u > t: 0)
            datt     = f[t, u] dy[t] . v[u]
            ds[t, u] = P (datt - D[t])                      (D from k_attn_flash_bwd_rowdot)
            dq[t]    = scale sum_u ds[t, u] k[u]            (summed by one thread, key order)"""
        key = key_value(dropout_key)             # a number, or read from the device (dropout.py)
        sq = cuda.shared.array((BQ, HS), float32)          # the tile's q rows
        sdy = cuda.shared.array((BQ, HS), float32)         # the tile's dy rows
        sk = cuda.shared.array((BK, HSP), float32)         # a K tile
        sv = cuda.shared.array((BK, HSP), float32)         # the V tile of the same keys
        sds = cuda.shared.array((BQ, BK), float32)         # ds of the tile
        sacc = cuda.local.array(CPT, float32)
        dacc = cuda.local.array(CPT, float32)
        gacc = cuda.local.array(DPT, float32)
        T = q.shape[1]
        H = lse.shape[1]
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        c0 = h * HS
        t0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * BQ
        tid = cuda.threadIdx.x
        r, lane = tid // TPR, tid % TPR
        t = t0 + r
        live = t < T
        t_end = min(T, t0 + BQ)
        row = ((b * H + h) * T + t) * T
        lse_t = lse[b, h, t] if live else float32(0.0)
        d_t = d_rowdot[b, h, t] if live else float32(0.0)
        for i in range(DPT):
            gacc[i] = 0.0
        load_rows(sq, q, b, t0, c0, T)
        load_rows(sdy, dy, b, t0, c0, T)
        for u0 in range(0, t_end, BK):
            load_rows(sk, k, b, u0, c0, T)
            load_rows(sv, v, b, u0, c0, T)
            cuda.syncthreads()
            row_dots(sacc, sq, sk, r, lane)                # q[t] . k[u]
            row_dots(dacc, sdy, sv, r, lane)               # dy[t] . v[u]
            for i in range(CPT):
                c = lane + i * TPR
                u = u0 + c
                g = float32(0.0)
                if live and u <= t:
                    p = math.exp(sacc[i] * scale - lse_t)
                    da = dacc[i] * dropout_factor(key, row + u, threshold, dscale)
                    g = p * (da - d_t)
                sds[r, c] = g
            cuda.syncthreads()
            add_weighted_rows(gacc, sds, sk, r, lane)      # dq[t] += ds[t, tile] @ k[tile]
            cuda.syncthreads()
        if live:
            for i in range(DPT):
                d = lane + i * TPR
                if d < HS:
                    dq[b, t, c0 + d] = gacc[i] * scale

    @cuda.jit
    def k_attn_flash_bwd_dkdv(dk, dv, dy, q, k, v, lse, d_rowdot, scale, dropout_key, threshold, dscale):
        """Block (key tile of BQ rows u, b*H + h); thread (r, lane) works on key u = u0 + r and
        walks the query tiles t0 = u0, u0 + BK, ... (the queries that see these keys), with Q and
        dY tiles (and their lse, D) in shared memory:
            P[t, u] = exp(scale k[u] . q[t] - lse[t])       (t < u: 0)
            datt    = f[t, u] v[u] . dy[t]                  ds = P (datt - D[t])
            dv[u]   = sum_t P f dy[t]      dk[u] = scale sum_t ds[t, u] q[t]
        each summed by one thread in query order."""
        key = key_value(dropout_key)             # a number, or read from the device (dropout.py)
        sk = cuda.shared.array((BQ, HS), float32)          # the tile's k rows
        sv = cuda.shared.array((BQ, HS), float32)          # the tile's v rows
        sq = cuda.shared.array((BK, HSP), float32)         # a Q tile
        sdy = cuda.shared.array((BK, HSP), float32)        # the dY tile of the same queries
        spf = cuda.shared.array((BQ, BK), float32)         # P f of the tile: spf[key, query]
        sds = cuda.shared.array((BQ, BK), float32)         # ds of the tile: sds[key, query]
        slse = cuda.shared.array(BK, float32)
        sd = cuda.shared.array(BK, float32)
        sacc = cuda.local.array(CPT, float32)
        dacc = cuda.local.array(CPT, float32)
        vacc = cuda.local.array(DPT, float32)
        kacc = cuda.local.array(DPT, float32)
        T = q.shape[1]
        H = lse.shape[1]
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        c0 = h * HS
        u0 = cuda.blockIdx.x * BQ                          # the longest columns (small u) first
        tid = cuda.threadIdx.x
        r, lane = tid // TPR, tid % TPR
        u = u0 + r
        live = u < T
        for i in range(DPT):
            vacc[i] = 0.0
            kacc[i] = 0.0
        load_rows(sk, k, b, u0, c0, T)
        load_rows(sv, v, b, u0, c0, T)
        for t0 in range(u0, T, BK):
            load_rows(sq, q, b, t0, c0, T)
            load_rows(sdy, dy, b, t0, c0, T)
            for j in range(tid, BK, NT):
                tt = t0 + j
                slse[j] = lse[b, h, tt] if tt < T else float32(0.0)
                sd[j] = d_rowdot[b, h, tt] if tt < T else float32(0.0)
            cuda.syncthreads()
            row_dots(sacc, sk, sq, r, lane)                # k[u] . q[t] for t = t0 + lane + i*TPR
            row_dots(dacc, sv, sdy, r, lane)               # v[u] . dy[t]
            for i in range(CPT):
                j = lane + i * TPR
                tt = t0 + j
                pf = float32(0.0)
                g = float32(0.0)
                if live and tt < T and u <= tt:
                    p = math.exp(sacc[i] * scale - slse[j])
                    f = dropout_factor(key, ((b * H + h) * T + tt) * T + u, threshold, dscale)
                    pf = p * f
                    g = p * (dacc[i] * f - sd[j])
                spf[r, j] = pf
                sds[r, j] = g
            cuda.syncthreads()
            add_weighted_rows(vacc, spf, sdy, r, lane)     # dv[u] += (P f)[tile, u] @ dy[tile]
            add_weighted_rows(kacc, sds, sq, r, lane)      # dk[u] += ds[tile, u] @ q[tile]
            cuda.syncthreads()
        if live:
            for i in range(DPT):
                d = lane + i * TPR
                if d < HS:
                    dv[b, u, c0 + d] = vacc[i]
                    dk[b, u, c0 + d] = kacc[i] * scale

    return k_attn_flash_fwd, k_attn_flash_bwd_dq, k_attn_flash_bwd_dkdv


_KERNELS = {}       # (hs, BQ, TPR) -> (k_attn_flash_fwd, k_attn_flash_bwd_dq, k_attn_flash_bwd_dkdv)


def _kernels(hs, block):
    """The tiled kernels of head size hs and block (BQ, TPR), with the largest key tile BK of
    BK_CHOICES that the block's lanes split and shared memory holds (BlockDoesNotFit if none)."""
    key = (hs, *block)
    if key not in _KERNELS:
        fits = [bk for bk in BK_CHOICES if bk % block[1] == 0 and _shared_bytes(hs, bk, *block) <= SHARED_LIMIT]
        if not fits:
            raise BlockDoesNotFit(f"flash attention: head size {hs} does not fit the shared tiles of block {block}")
        _KERNELS[key] = make_flash_kernels(hs, fits[0], *block)
    return _KERNELS[key]


@rung(1)
@blocks(**FLASH_BLOCKS)
def attn_flash_fwd(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """y [B, T, C] and lse [B, H, T] by k_attn_flash_fwd. Grid (T/BQ query tiles, B*H), BQ*TPR
    threads; block = (BQ, TPR)."""
    B, T, C, hs = _check(q, n_head)
    BQ, TPR = block
    fwd = _kernels(hs, block)[0]
    fwd[(cdiv(T, BQ), B * n_head), BQ * TPR, stream](y, lse, q, k, v, np.float32(1.0 / math.sqrt(hs)),
                                                     *mask_args(dropout_p, dropout_key))


@rung(1)
@blocks(**FLASH_BLOCKS)
def attn_flash_bwd(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """d_rowdot [B, H, T] receives D = dy . y (k_attn_flash_bwd_rowdot, BQ*TPR threads a block),
    then k_attn_flash_bwd_dq (dq) and k_attn_flash_bwd_dkdv (dk, dv), both on grid
    (T/BQ tiles, B*H) with BQ*TPR threads; block = (BQ, TPR)."""
    B, T, C, hs = _check(q, n_head)
    BQ, TPR = block
    _, dq_kernel, dkdv_kernel = _kernels(hs, block)
    scale = np.float32(1.0 / math.sqrt(hs))
    drop = mask_args(dropout_p, dropout_key)
    NT = BQ * TPR
    k_attn_flash_bwd_rowdot[cdiv(B * n_head * T, NT), NT, stream](d_rowdot, dy, y)
    grid = (cdiv(T, BQ), B * n_head)
    dq_kernel[grid, NT, stream](dq, dy, q, k, v, lse, d_rowdot, scale, *drop)
    dkdv_kernel[grid, NT, stream](dk, dv, dy, q, k, v, lse, d_rowdot, scale, *drop)
