"""Layer normalisation over the last axis: the NumPy twin of k_layernorm_fwd / k_layernorm_bwd.

    mean = (1/C) sum_c x_c          rstd = 1 / sqrt((1/C) sum_c (x_c - mean)^2 + eps)
    xhat = (x - mean) * rstd        out  = xhat * g + b

Backward, with dxhat = dout * g:
    dg = sum over rows of dout * xhat          db = sum over rows of dout
    dx = rstd * (dxhat - mean_c(dxhat) - xhat * mean_c(dxhat * xhat))
"""
import numpy as np


def layernorm_fwd(x, g, b, eps=1e-5):
    """x [B, T, C], g [C], b [C] -> out [B, T, C]; saved for backward: mean [B, T], rstd [B, T]."""
    mean = x.mean(axis=-1)                                    # [B, T]
    xc = x - mean[..., None]                                  # [B, T, C]
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1) + eps)       # [B, T]
    out = xc * rstd[..., None] * g + b                        # [B, T, C]
    return out, mean, rstd


def layernorm_bwd(dout, x, mean, rstd, g):
    """dout [B, T, C] -> (dx [B, T, C], dg [C], db [C])."""
    C = x.shape[-1]
    xhat = (x - mean[..., None]) * rstd[..., None]            # [B, T, C]
    dg = (dout * xhat).reshape(-1, C).sum(axis=0)             # [C]
    db = dout.reshape(-1, C).sum(axis=0)                      # [C]
    dxhat = dout * g                                          # [B, T, C]
    dx = rstd[..., None] * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                            - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dg, db


def residual_layernorm_fwd(x, f, g, b, eps=1e-5):
    """The residual add and the LayerNorm after it, fused: resid = x + f, out = layernorm(resid).
    -> (resid, out, mean, rstd); resid is the residual stream, saved (the next add reads it)."""
    resid = x + f
    out, mean, rstd = layernorm_fwd(resid, g, b, eps)
    return resid, out, mean, rstd


def residual_layernorm_bwd(dresid, dout, resid, mean, rstd, g):
    """dresid: the gradient reaching resid from the skip path; dout: from the LayerNorm's output.
    -> (dx, df, dg, db): dx = dresid + the LayerNorm's grad_input, and df the same (resid = x + f:
    both inputs get the sum's gradient; the engine keeps one buffer for both)."""
    dln, dg, db = layernorm_bwd(dout, resid, mean, rstd, g)
    dx = dresid + dln
    return dx, dx.copy(), dg, db
