"""Exercise attn_bwd (NumPy): the backward of causal scaled dot-product self-attention.

Forward (given: reference/attn.py, imported below), per batch b and head h, hs = C / n_head,
q_h = the columns h*hs:(h+1)*hs of q (likewise k_h, v_h, y_h):
    s[t, u]   = q_h[t] . k_h[u] / sqrt(hs)     for u <= t;  -inf for u > t (the causal mask)
    att[t, :] = softmax(s[t, :])               saved for you: att [B, H, T, T]
    y_h[t]    = sum_u att[t, u] f[t, u] v_h[u]

f is dropout on the probabilities during training: f = dropout_factor(att.shape, dropout_p,
dropout_key) (given, imported below) is 0 where a probability is dropped and 1 / (1 - p) where it
is kept; all ones when dropout_p = 0. att is saved BEFORE dropout.

Your task: the backward, given dy [B, T, C]. Per head, with dy_h the matching slice of dy:
    datt = f * (dy_h @ v_h^T)                  dv_h = (att * f)^T @ dy_h
    ds   = att * (datt - sum_u(datt * att))    the softmax backward, row by row (sum over u)
    dq_h = ds @ k_h / sqrt(hs)                 dk_h = ds^T @ q_h / sqrt(hs)
Masked entries (u > t) have att = 0, so they get no gradient: use att, not the raw scores.

Hint: reshape [B, T, C] -> [B, T, H, hs] -> transpose to [B, H, T, hs], and back at the end;
NumPy's @ then works on all batches and heads at once.

Check your work:  python -m andrea_numba.exercises check attn_bwd
"""
import math

from reference.attn import attn_fwd  # noqa: F401  (the forward, to experiment with)
from reference.dropout import dropout_factor  # noqa: F401  (the dropout mask, given)


def split_heads(a, n_head):
    """[B, T, C] -> [B, H, T, hs] (given)."""
    B, T, C = a.shape
    return a.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def merge_heads(ah):
    """[B, H, T, hs] -> [B, T, C] (given)."""
    B, H, T, hs = ah.shape
    return ah.transpose(0, 2, 1, 3).reshape(B, T, H * hs)


def attn_bwd(dy, q, k, v, att, n_head, dropout_p=0.0, dropout_key=0):
    """dy [B, T, C] -> (dq, dk, dv), each [B, T, C]."""
    scale = 1.0 / math.sqrt(q.shape[-1] // n_head)
    qh, kh, vh, dyh = (split_heads(a, n_head) for a in (q, k, v, dy))
    f = dropout_factor(att.shape, dropout_p, dropout_key)          # 0 or 1/(1-p), [B, H, T, T]
    datt = f * (dyh @ vh.transpose(0, 1, 3, 2))                    # [B, H, T, T]
    dvh = (att * f).transpose(0, 1, 3, 2) @ dyh                    # [B, H, T, hs]
    ds = att * (datt - (datt * att).sum(axis=-1, keepdims=True))   # softmax backward
    dqh = (ds @ kh) * scale                                        # [B, H, T, hs]
    dkh = (ds.transpose(0, 1, 3, 2) @ qh) * scale
    return merge_heads(dqh), merge_heads(dkh), merge_heads(dvh)
