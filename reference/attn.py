"""Scaled dot-product causal self-attention: the NumPy twin of k_attn_fwd / k_attn_bwd.

Per batch b and head h (hs = C / H; q_h is the slice q[b, :, h*hs:(h+1)*hs]):
    s[t, u]   = q_h[t] . k_h[u] / sqrt(hs)         for u <= t, -inf for u > t (causal mask)
    att[t, :] = softmax(s[t, :])                   saved for backward
    y_h[t]    = sum_u att[t, u] f[t, u] v_h[u]     heads written side by side into y [B, T, C]

f is dropout on the probabilities (reference/dropout.py: keep / (1 - p), a pure function of the
key and the flat index of att[b, h, t, u]; all ones when p = 0). att is saved before dropout: the
softmax backward needs the probabilities themselves, and f is computed again.

The flash twins (attn_flash_fwd / attn_flash_bwd) run their products through precision.mm, so
that under products_in("bf16") or ("fp16") each product's inputs are rounded where the kernels
(kernels/attn_flash_lowp.py) round them; the whole model's twin runs them at those precisions.
attn_fwd / attn_bwd stay exact: attention v2 has no bf16 or fp16 version.

Backward, with dy_h the matching slice of dy:
    datt = f * (dy_h @ v_h^T)           dv_h = (att * f)^T @ dy_h
    ds   = att * (datt - sum_u(datt * att))        (softmax backward, row by row)
    dq_h = ds @ k_h / sqrt(hs)          dk_h = ds^T @ q_h / sqrt(hs)
Masked entries have att = 0, so they pass no gradient.
"""
import math

import numpy as np

from . import precision
from .dropout import dropout_factor
from .precision import mm


def _heads(x, n_head):
    """[B, T, C] -> [B, H, T, hs]"""
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def _merge(xh):
    """[B, H, T, hs] -> [B, T, C]"""
    B, H, T, hs = xh.shape
    return xh.transpose(0, 2, 1, 3).reshape(B, T, H * hs)


def _causal_scores(qh, kh, scale, product=np.matmul):
    """s[t, u] = scale q[t] . k[u] for u <= t, -inf for u > t (the future): [B, H, T, T].
    product: how q k^T is multiplied (the flash twins: mm, at the products' precision); the scale
    multiplies the sums, never a rounded input."""
    T = qh.shape[2]
    s = product(qh, kh.transpose(0, 1, 3, 2)) * scale
    future = np.triu(np.ones((T, T), dtype=bool), k=1)             # u > t
    return np.where(future, -np.inf, s)


def _dropout(p, dropout_p, dropout_key):
    """Dropout's factor f on the probabilities p [B, H, T, T] (1.0 when dropout is off)."""
    return dropout_factor(p.shape, dropout_p, dropout_key, p.dtype.type) if dropout_p else 1.0


def attn_fwd(q, k, v, n_head, dropout_p=0.0, dropout_key=0):
    """q, k, v [B, T, C] -> y [B, T, C]; saved for backward: att [B, H, T, T] (softmax probabilities,
    before dropout)."""
    C = q.shape[2]
    scale = 1.0 / math.sqrt(C // n_head)
    qh, kh, vh = _heads(q, n_head), _heads(k, n_head), _heads(v, n_head)
    s = _causal_scores(qh, kh, scale)                              # [B, H, T, T]
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    att = e / e.sum(axis=-1, keepdims=True)                        # [B, H, T, T]
    f = _dropout(att, dropout_p, dropout_key)
    y = _merge((att * f) @ vh)                                     # [B, T, C]
    return y, att


def attn_bwd(dy, q, k, v, att, n_head, dropout_p=0.0, dropout_key=0):
    """dy [B, T, C] -> (dq, dk, dv), each [B, T, C]."""
    C = q.shape[2]
    scale = 1.0 / math.sqrt(C // n_head)
    qh, kh, vh, dyh = (_heads(a, n_head) for a in (q, k, v, dy))
    f = _dropout(att, dropout_p, dropout_key)
    datt = f * (dyh @ vh.transpose(0, 1, 3, 2))                    # [B, H, T, T]
    dvh = (att * f).transpose(0, 1, 3, 2) @ dyh                    # [B, H, T, hs]
    ds = att * (datt - (datt * att).sum(axis=-1, keepdims=True))   # [B, H, T, T]
    dqh = (ds @ kh) * scale                                        # [B, H, T, hs]
    dkh = (ds.transpose(0, 1, 3, 2) @ qh) * scale
    return _merge(dqh), _merge(dkh), _merge(dvh)


# ---------------------------------------------------------------------------------------------
# flash attention: the same op, saving lse [B, H, T] instead of att [B, H, T, T]

def attn_flash_fwd(q, k, v, n_head, dropout_p=0.0, dropout_key=0):
    """q, k, v [B, T, C] -> (y [B, T, C], lse [B, H, T]): attn_fwd's y, and instead of att the
    log-sum-exp of each row of scores,

        lse[t] = log sum_{u <= t} exp(s[t, u]),   so that   att[t, u] = exp(s[t, u] - lse[t]).

    What is saved for backward is y and lse: one number per row instead of a row of T
    probabilities. At 120M (B = 8, H = 12, T = 1024, 12 layers) att is 4.8 GB of float32 (403 MB
    a layer); lse is 4.7 MB. The backward recomputes the probabilities from q, k and lse, which costs a second
    score product but no [B, H, T, T] buffer. This twin still forms the whole score matrix (in
    NumPy that is the readable way); the kernels (kernels/attn_flash.py) never store it: they walk
    the keys in tiles with an online softmax. Dropout (f, drawn from the key and the flat index of
    [b, h, t, u] in a [B, H, T, T] array) is exactly attn_fwd's, so the same key drops the same
    probabilities."""
    C = q.shape[2]
    scale = 1.0 / math.sqrt(C // n_head)
    qh, kh, vh = _heads(q, n_head), _heads(k, n_head), _heads(v, n_head)
    s = _causal_scores(qh, kh, scale, mm)                          # [B, H, T, T]
    m = s.max(axis=-1, keepdims=True)                              # row maximum: exp cannot overflow
    lse = m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True))    # [B, H, T, 1]
    p = np.exp(s - lse)                                            # att; 0 in the future
    f = _dropout(p, dropout_p, dropout_key)
    if precision.current() is None:           # exact products (fp32; the precision products_in set, precision.py)
        y = _merge((p * f) @ vh)                                   # [B, T, C]
    else:
        y = _merge(_low_precision_pv(s, f, vh))
    return y, lse[..., 0]


def _low_precision_pv(s, f, vh):
    """(P f) @ v with the products' inputs rounded (products_in) where the kernels round them.

    A flash kernel never holds P = exp(s - lse): it holds p~ = exp(s - m_j), with m_j the running
    maximum after key tile j, rounds p~ f, multiplies, and divides by l = sum p~ at the end. With
    an m_j of any real value the rounded values would depend on the tiling. The bf16 and fp16
    kernels keep the maximum in base 2 and round it up to an integer (m_j = ceil(max s log2 e)),
    so p~ = 2^(s log2 e - m_j) is the same number times a power of two in every tiling, and
    multiplying by a power of two moves no bit of a mantissa: p~ f rounds to the same bf16 (or
    fp16, above its subnormals) times that power. This twin rounds the value of the last tile's
    maximum, M = ceil(max_u s log2 e):  y = mm(2^(s log2 e - M) f, v) / sum_u 2^(s log2 e - M)."""
    s2 = s * (1.0 / math.log(2.0))                                 # scores in base 2
    M = np.ceil(s2.max(axis=-1, keepdims=True))                    # an integer maximum
    p2 = np.exp2(s2 - M)                                           # in (0, 1]; 0 in the future
    return mm(p2 * f, vh) / p2.sum(axis=-1, keepdims=True)


def attn_flash_bwd(dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0):
    """dy [B, T, C] -> (dq, dk, dv), each [B, T, C], from the saved y and lse only.

    The probabilities are recomputed, P = exp(s - lse), and the softmax backward's row sum
    sum_u datt[t, u] att[t, u] is D[t] = dy[t] . y[t]: with datt = f * (dy v^T),
        sum_u P[t, u] f[t, u] (dy[t] . v[u]) = dy[t] . (sum_u P[t, u] f[t, u] v[u]) = dy[t] . y[t],
    so the backward needs neither att nor a pass over a row of datt before ds. Then, as attn_bwd:
        dv = (P * f)^T @ dy      ds = P * (datt - D)      dq = ds @ k * scale     dk = ds^T @ q * scale
    Under products_in("bf16") / ("fp16") the five products round their inputs (mm): q and k,
    dy and v, P f and dy, ds and k, ds and q; P, D, ds and every sum stay exact, and the scale
    multiplies the sums (the bf16 and fp16 kernels do the same: kernels/attn_flash_lowp.py)."""
    C = q.shape[2]
    scale = 1.0 / math.sqrt(C // n_head)
    qh, kh, vh, dyh, yh = (_heads(a, n_head) for a in (q, k, v, dy, y))
    s = _causal_scores(qh, kh, scale, mm)                          # the forward's scores, again
    p = np.exp(s - lse[..., None])                                 # att, recomputed; 0 in the future
    f = _dropout(p, dropout_p, dropout_key)
    datt = f * mm(dyh, vh.transpose(0, 1, 3, 2))                   # [B, H, T, T]
    dvh = mm((p * f).transpose(0, 1, 3, 2), dyh)                   # [B, H, T, hs]
    d_rowdot = (dyh * yh).sum(axis=-1)                             # D [B, H, T]: a statistic, never rounded
    ds = p * (datt - d_rowdot[..., None])                          # [B, H, T, T]
    dqh = mm(ds, kh) * scale
    dkh = mm(ds.transpose(0, 1, 3, 2), qh) * scale
    return _merge(dqh), _merge(dkh), _merge(dvh)
