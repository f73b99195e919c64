"""Flash attention v2 (a lab rung): attn_flash.py's v1 with its products on tensor cores (3xTF32 mma.sync).

The math, the saved tensors (y and lse), the dropout masks and the three kernels are v1's (read
attn_flash.py first). What changes is who computes what. In v1 a row of a tile belongs to a few
lanes that each take some columns, and every product is a loop of multiply-adds. Here a block is
WARPS warps and each warp owns 16 rows of the block's tile, the rows of one mma fragment; its
products go through the step of matmul v4 (warp_tile._kstep): 8-deep slices of A @ B, each value
split into big + small TF32 parts, three mma.sync per 16 x 8 fragment, added to fp32 registers.
In the simulator the same step is plain multiply-adds (warp_tile.py).

A thread holds, of a 16-row tile product, rows g and g + 8 and the columns 2t, 2t + 1 of every
8-column fragment (lane = 4 g + t): acc[hh, j] is row 8 hh + g, column 8 (j // 2) + 2 t + j % 2.

    forward   block (query tile of BQ = 16 WARPS rows, b*H + h); per key tile of BKV keys:
                s    = scale q k^T            mma: A = q tile [t, d], B = K tile read as [u, d]
                row max of s: each thread over its columns, then the 4 lanes of the row through
                shared memory (red[row, lane], read in lane order: no warp shuffles, so the
                simulator runs it too); online softmax as in v1; p f into a shared tile
                yacc = alpha yacc + (p f) v    mma: A = p f tile [t, u], B = V tile [u, d]
    dq        block (query tile, b*H + h); per key tile:
                s = q k^T, datt' = dy v^T     two products on the K and V tiles read as [u, d]
                ds = P (f datt' - D)          P = exp(scale s - lse), into a shared tile
                dq += ds k                     mma: B = the K tile read as [u, d] rows
    dk, dv    block (key tile of BQ keys, b*H + h); per query tile of BKV queries t >= u0:
                s^T = k q^T, datt'^T = v dy^T
                dv += (P f)^T dy,  dk += ds^T q
Every output element is summed by one thread, tile after tile in a fixed order: deterministic,
no atomics. Tiles are zero-padded to a head size HS8 that is a multiple of 8 (the mma's k).

A block is (WARPS, BKV). Shared memory (static, at most 48 KiB) decides which fit: at hs = 64,
(2, 32) uses 43 KiB (44,288 bytes) in the dk/dv kernel.
"""
import math

import numpy as np
from numba import cuda, float32

from andrea_numba.kernels.attn import NEG_INF, _check
from andrea_numba.kernels.attn_flash_rowdot import k_attn_flash_bwd_rowdot
from andrea_numba.kernels.common import BlockDoesNotFit, blocks, cdiv
from andrea_numba.kernels.dropout import dropout_factor, key_value, mask_args
from andrea_numba.kernels.warp_tile import WARP, _kstep


FLASH_MMA_BLOCKS = dict(gpu=((2, 32), (1, 32), (2, 16)), sim=((1, 8), (2, 8)))


# the forward alone fits 4 warps (64 query rows share each K and V tile) in 48 KiB at hs = 64;
# declared so that the harness checks it and lab/bench/kernels.py times it (not yet measured)
FLASH_MMA_FWD_BLOCKS = dict(gpu=FLASH_MMA_BLOCKS["gpu"] + ((4, 32),), sim=FLASH_MMA_BLOCKS["sim"])


SHARED_LIMIT = 48 * 1024


def shared_bytes(hs: int, warps: int, bkv: int, forward_only: bool = False) -> int:
    """Bytes of shared memory of the largest of the three kernels (of the forward alone)."""
    HS8, BQ = cdiv(hs, 8) * 8, 16 * warps
    P, PK = HS8 + 4, bkv + 4
    fwd = BQ * P + bkv * P + BQ * PK + BQ * 4
    dq = 2 * BQ * P + 2 * bkv * P + BQ * PK
    dkdv = 2 * BQ * P + 2 * bkv * P + 2 * BQ * PK + 2 * bkv
    return 4 * (fwd if forward_only else max(fwd, dq, dkdv))


def make_kernels(HS: int, WARPS: int, BKV: int):
    """The three kernels for head size HS and block (WARPS, BKV) (compile-time constants)."""
    HS8 = cdiv(HS, 8) * 8         # head size rounded up to the mma's k step (tiles zero-padded)
    BQ = 16 * WARPS               # rows of the block's tile: 16 per warp
    NT = WARP * WARPS
    P = HS8 + 4                   # pitch of the q, k, v, dy tiles: conflict-free fragment reads
    PK = BKV + 4                  # pitch of the p f and ds tiles
    NQ, NH = BKV // 8, HS8 // 8   # 8-column fragments of a BKV-wide and of an HS8-wide product
    SQ, SH = 2 * NQ, 2 * NH       # a thread's columns of such a product (two per fragment)
    assert BKV % 8 == 0, f"BKV = {BKV} must be a multiple of 8"
    # acc (2, 2 NQ) += A[16 rows, 8] @ B^T with B stored [n, k] (K or V rows read as [u, d])
    step_nt = _kstep(False, True, 1, NQ, True)
    # acc (2, 2 NH) += A[16 rows, 8] @ B with B stored [k, n] (rows of V, K, Q or dY)
    step_nn = _kstep(False, False, 1, NH, True)

    @cuda.jit(device=True)
    def load_rows(s, x, b, r0, c0, T, R):
        """s[r, d] = x[b, r0 + r, c0 + d] for the R rows and the head's HS channels (0 past T
        and in the padding up to HS8); consecutive threads read consecutive channels."""
        for e in range(cuda.threadIdx.x, R * HS8, NT):
            r, d = e // HS8, e % HS8
            s[r, d] = x[b, r0 + r, c0 + d] if r0 + r < T and d < HS else float32(0.0)

    @cuda.jit(device=True)
    def zero(acc):
        for i in range(acc.shape[0]):
            for j in range(acc.shape[1]):
                acc[i, j] = 0.0

    @cuda.jit(device=True)
    def col(j, tq):
        """Column (within a fragment row of 8 j-pairs) of acc[:, j] for lane t = tq."""
        return (j // 2) * 8 + 2 * tq + j % 2

    @cuda.jit
    def k_attn_flash_fwd_v2(y, lse, q, k, v, scale, dropout_key, threshold, dscale):
        """Block (query tile of BQ rows, b*H + h); warp w owns rows 16 w .. 16 w + 15 (module
        docstring). Online softmax over the key tiles, as k_attn_flash_fwd."""
        key = key_value(dropout_key)
        sq = cuda.shared.array((BQ, P), float32)           # the tile's q rows
        skv = cuda.shared.array((BKV, P), float32)         # a K tile, then the V tile of the same keys
        sp = cuda.shared.array((BQ, PK), float32)          # p f of the tile
        red = cuda.shared.array((BQ, 4), float32)          # a row's 4 lanes' partial max (or sum)
        s = cuda.local.array((2, SQ), float32)         # s of rows g, g + 8 (this thread's columns)
        o = cuda.local.array((2, SH), float32)         # yacc of rows g, g + 8
        m = cuda.local.array(2, float32)                   # running maximum of the two rows
        lsum = cuda.local.array(2, float32)                # this lane's part of their running sums
        T = q.shape[1]
        H = lse.shape[1]
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        c0 = h * HS
        t0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * BQ  # the longest rows first
        lane = cuda.threadIdx.x % WARP
        wm0 = (cuda.threadIdx.x // WARP) * 16
        g, tq = lane >> 2, lane & 3
        zero(o)
        for hh in range(2):
            m[hh] = NEG_INF
            lsum[hh] = 0.0
        load_rows(sq, q, b, t0, c0, T, BQ)
        for u0 in range(0, min(T, t0 + BQ), BKV):
            load_rows(skv, k, b, u0, c0, T, BKV)
            cuda.syncthreads()
            zero(s)
            for kk in range(0, HS8, 8):                     # s = q k^T over the head's channels
                step_nt(s, sq, skv, kk, wm0, 0, g, tq)
            for hh in range(2):
                t = t0 + wm0 + 8 * hh + g
                mt = NEG_INF
                for j in range(SQ):
                    if u0 + col(j, tq) <= t:                # causal: keys u <= t
                        s[hh, j] *= scale
                        mt = max(mt, s[hh, j])
                red[wm0 + 8 * hh + g, tq] = mt
            cuda.syncthreads()
            for hh in range(2):
                rr = wm0 + 8 * hh + g
                t = t0 + rr
                m_new = max(max(m[hh], max(red[rr, 0], red[rr, 1])), max(red[rr, 2], red[rr, 3]))
                alpha = math.exp(m[hh] - m_new)             # 0 at the first tile (m = -inf)
                lsum[hh] *= alpha
                for j in range(SH):
                    o[hh, j] *= alpha
                for j in range(SQ):
                    c = col(j, tq)
                    p = float32(0.0)
                    if u0 + c <= t:
                        p = math.exp(s[hh, j] - m_new)
                        lsum[hh] += p                       # the softmax's sum: before dropout
                        p *= dropout_factor(key, ((b * H + h) * T + t) * T + u0 + c, threshold, dscale)
                    sp[rr, c] = p
                m[hh] = m_new
            cuda.syncthreads()                              # the K tile and red are read: reload
            load_rows(skv, v, b, u0, c0, T, BKV)
            cuda.syncthreads()
            for kk in range(0, BKV, 8):                     # yacc += (p f) @ v
                step_nn(o, sp, skv, kk, wm0, 0, g, tq)
            cuda.syncthreads()
        for hh in range(2):
            red[wm0 + 8 * hh + g, tq] = lsum[hh]
        cuda.syncthreads()
        for hh in range(2):
            rr = wm0 + 8 * hh + g
            t = t0 + rr
            lt = ((red[rr, 0] + red[rr, 1]) + red[rr, 2]) + red[rr, 3]     # l: the lanes' parts in order
            if t < T:
                for j in range(SH):
                    d = col(j, tq)
                    if d < HS:
                        y[b, t, c0 + d] = o[hh, j] / lt
                if tq == 0:
                    lse[b, h, t] = m[hh] + math.log(lt)

    @cuda.jit
    def k_attn_flash_bwd_dq_v2(dq, dy, q, k, v, lse, d_rowdot, scale, dropout_key, threshold, dscale):
        """Block (query tile of BQ rows, b*H + h); per key tile u0 <= the tile's last query:
            s = q k^T, datt' = dy v^T (two products), ds = P (f datt' - D) into a shared tile,
            dq += ds k (one product); at the end dq *= scale. As k_attn_flash_bwd_dq."""
        key = key_value(dropout_key)
        sq = cuda.shared.array((BQ, P), float32)
        sdy = cuda.shared.array((BQ, P), float32)
        sk = cuda.shared.array((BKV, P), float32)
        sv = cuda.shared.array((BKV, P), float32)
        sds = cuda.shared.array((BQ, PK), float32)
        s = cuda.local.array((2, SQ), float32)
        da = cuda.local.array((2, SQ), float32)
        acc = cuda.local.array((2, SH), float32)
        lse_t = cuda.local.array(2, float32)
        d_t = cuda.local.array(2, float32)
        T = q.shape[1]
        H = lse.shape[1]
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        c0 = h * HS
        t0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * BQ
        lane = cuda.threadIdx.x % WARP
        wm0 = (cuda.threadIdx.x // WARP) * 16
        g, tq = lane >> 2, lane & 3
        zero(acc)
        for hh in range(2):
            t = t0 + wm0 + 8 * hh + g
            lse_t[hh] = lse[b, h, t] if t < T else float32(0.0)
            d_t[hh] = d_rowdot[b, h, t] if t < T else float32(0.0)
        load_rows(sq, q, b, t0, c0, T, BQ)
        load_rows(sdy, dy, b, t0, c0, T, BQ)
        for u0 in range(0, min(T, t0 + BQ), BKV):
            load_rows(sk, k, b, u0, c0, T, BKV)
            load_rows(sv, v, b, u0, c0, T, BKV)
            cuda.syncthreads()
            zero(s)
            zero(da)
            for kk in range(0, HS8, 8):
                step_nt(s, sq, sk, kk, wm0, 0, g, tq)      # q k^T
                step_nt(da, sdy, sv, kk, wm0, 0, g, tq)    # dy v^T
            for hh in range(2):
                rr = wm0 + 8 * hh + g
                t = t0 + rr
                for j in range(SQ):
                    c = col(j, tq)
                    u = u0 + c
                    gr = float32(0.0)
                    if u <= t and t < T:
                        p = math.exp(s[hh, j] * scale - lse_t[hh])
                        f = dropout_factor(key, ((b * H + h) * T + t) * T + u, threshold, dscale)
                        gr = p * (da[hh, j] * f - d_t[hh])
                    sds[rr, c] = gr
            cuda.syncthreads()
            for kk in range(0, BKV, 8):                     # dq += ds @ k (the K tile as [u, d] rows)
                step_nn(acc, sds, sk, kk, wm0, 0, g, tq)
            cuda.syncthreads()
        for hh in range(2):
            t = t0 + wm0 + 8 * hh + g
            if t < T:
                for j in range(SH):
                    d = col(j, tq)
                    if d < HS:
                        dq[b, t, c0 + d] = acc[hh, j] * scale

    @cuda.jit
    def k_attn_flash_bwd_dkdv_v2(dk, dv, dy, q, k, v, lse, d_rowdot, scale, dropout_key, threshold, dscale):
        """Block (key tile of BQ keys u, b*H + h); per query tile of BKV queries t >= u0:
            s^T = k q^T, datt'^T = v dy^T (two products), P^T = exp(scale s^T - lse[t]),
            dv += (P f)^T dy and dk += ds^T q (two products); at the end dk *= scale."""
        key = key_value(dropout_key)
        sk = cuda.shared.array((BQ, P), float32)            # the tile's k rows
        sv = cuda.shared.array((BQ, P), float32)            # the tile's v rows
        sq = cuda.shared.array((BKV, P), float32)           # a Q tile
        sdy = cuda.shared.array((BKV, P), float32)          # the dY tile of the same queries
        spf = cuda.shared.array((BQ, PK), float32)          # (P f)^T: spf[key, query]
        sds = cuda.shared.array((BQ, PK), float32)          # ds^T: sds[key, query]
        slse = cuda.shared.array(BKV, float32)
        sd = cuda.shared.array(BKV, float32)
        st = cuda.local.array((2, SQ), float32)
        dat = cuda.local.array((2, SQ), float32)
        vacc = cuda.local.array((2, SH), float32)
        kacc = cuda.local.array((2, SH), float32)
        T = q.shape[1]
        H = lse.shape[1]
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        c0 = h * HS
        u0 = cuda.blockIdx.x * BQ                           # the longest columns (small u) first
        tid = cuda.threadIdx.x
        lane = tid % WARP
        wm0 = (tid // WARP) * 16
        g, tq = lane >> 2, lane & 3
        zero(vacc)
        zero(kacc)
        load_rows(sk, k, b, u0, c0, T, BQ)
        load_rows(sv, v, b, u0, c0, T, BQ)
        for t0 in range(u0, T, BKV):
            load_rows(sq, q, b, t0, c0, T, BKV)
            load_rows(sdy, dy, b, t0, c0, T, BKV)
            for j in range(tid, BKV, NT):
                tt = t0 + j
                slse[j] = lse[b, h, tt] if tt < T else float32(0.0)
                sd[j] = d_rowdot[b, h, tt] if tt < T else float32(0.0)
            cuda.syncthreads()
            zero(st)
            zero(dat)
            for kk in range(0, HS8, 8):
                step_nt(st, sk, sq, kk, wm0, 0, g, tq)      # k q^T
                step_nt(dat, sv, sdy, kk, wm0, 0, g, tq)    # v dy^T
            for hh in range(2):
                rr = wm0 + 8 * hh + g
                u = u0 + rr
                for j in range(SQ):
                    c = col(j, tq)
                    tt = t0 + c
                    pf = float32(0.0)
                    gr = float32(0.0)
                    if tt < T and u <= tt:
                        p = math.exp(st[hh, j] * scale - slse[c])
                        f = dropout_factor(key, ((b * H + h) * T + tt) * T + u, threshold, dscale)
                        pf = p * f
                        gr = p * (dat[hh, j] * f - sd[c])
                    spf[rr, c] = pf
                    sds[rr, c] = gr
            cuda.syncthreads()
            for kk in range(0, BKV, 8):
                step_nn(vacc, spf, sdy, kk, wm0, 0, g, tq)  # dv += (P f)^T @ dy
                step_nn(kacc, sds, sq, kk, wm0, 0, g, tq)   # dk += ds^T @ q
            cuda.syncthreads()
        for hh in range(2):
            u = u0 + wm0 + 8 * hh + g
            if u < T:
                for j in range(SH):
                    d = col(j, tq)
                    if d < HS:
                        dv[b, u, c0 + d] = vacc[hh, j]
                        dk[b, u, c0 + d] = kacc[hh, j] * scale

    return k_attn_flash_fwd_v2, k_attn_flash_bwd_dq_v2, k_attn_flash_bwd_dkdv_v2


_KERNELS = {}       # (hs, WARPS, BKV) -> the three kernels


def kernels(hs, block, forward_only=False):
    key = (hs, *block)
    need = shared_bytes(hs, *block, forward_only=forward_only)
    if need > SHARED_LIMIT:
        raise BlockDoesNotFit(f"flash attention v2: head size {hs} needs {need} bytes of shared memory with "
                         f"block {block}, more than {SHARED_LIMIT}")
    if key not in _KERNELS:
        _KERNELS[key] = make_kernels(hs, *block)     # numba compiles each kernel on its first launch
    return _KERNELS[key]


@blocks(**FLASH_MMA_FWD_BLOCKS)
def attn_flash_fwd_v2(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """y [B, T, C] and lse [B, H, T]. Grid (T / (16 WARPS) query tiles, B*H), 32 WARPS threads;
    block = (WARPS, BKV)."""
    B, T, C, hs = _check(q, n_head)
    warps = block[0]
    kernels(hs, block, forward_only=True)[0][(cdiv(T, 16 * warps), B * n_head), WARP * warps, stream](
        y, lse, q, k, v, np.float32(1.0 / math.sqrt(hs)), *mask_args(dropout_p, dropout_key))


@blocks(**FLASH_MMA_BLOCKS)
def attn_flash_bwd_v2(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """d_rowdot [B, H, T] receives D = dy . y (k_attn_flash_bwd_rowdot), then the dq and
    the dk/dv kernels on grid (T / (16 WARPS) tiles, B*H), 32 WARPS threads; block = (WARPS, BKV)."""
    B, T, C, hs = _check(q, n_head)
    warps = block[0]
    _, dq_kernel, dkdv_kernel = kernels(hs, block)
    scale = np.float32(1.0 / math.sqrt(hs))
    drop = mask_args(dropout_p, dropout_key)
    NT = WARP * warps
    k_attn_flash_bwd_rowdot[cdiv(B * n_head * T, NT), NT, stream](d_rowdot, dy, y)
    grid = (cdiv(T, 16 * warps), B * n_head)
    dq_kernel[grid, NT, stream](dq, dy, q, k, v, lse, d_rowdot, scale, *drop)
    dkdv_kernel[grid, NT, stream](dk, dv, dy, q, k, v, lse, d_rowdot, scale, *drop)
