"""Tied output projection + softmax cross-entropy: the NumPy twin of k_loss_fwd / k_loss_bwd.

This pair owns the output projection, which shares its weights with the token embedding:
    logits[b, t, :] = x[b, t, :] @ wte^T                      [B, T, V]
    probs           = softmax(logits)                          saved for backward
    losses[b, t]    = logsumexp(logits[b, t]) - logits[b, t, targets[b, t]]
    loss            = mean over the B*T positions of losses

Backward from dloss (1.0 when loss is the final output):
    dlogits = (probs - onehot(targets)) * dloss / (B*T)
    dx      = dlogits @ wte                                   [B, T, C]
    dwte    = dlogits^T @ x   (over all B*T positions)        [V, C], to be added to the
                                                              embedding's gradient of wte
"""
import numpy as np

from .precision import mm


def loss_fwd(x, wte, targets):
    """x [B, T, C] (final LayerNorm output), wte [V, C], targets [B, T] int
    -> loss (0-d array); saved for backward: losses [B, T], probs [B, T, V]."""
    logits = mm(x, wte.T)                          # [B, T, V]
    mx = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - mx)
    se = e.sum(axis=-1, keepdims=True)
    probs = e / se                                            # [B, T, V]
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]   # [B, T]
    losses = (np.log(se[..., 0]) + mx[..., 0]) - picked       # [B, T]
    return losses.mean(), losses, probs


def loss_bwd(dloss, x, wte, probs, targets):
    """dloss (scalar) -> (dx [B, T, C], dwte [V, C]). Leading axes may also be one axis N = B*T."""
    V, C = probs.shape[-1], x.shape[-1]
    n_pos = probs.size // V                                   # B*T positions
    dlogits = probs.copy()
    np.put_along_axis(dlogits, targets[..., None],
                      np.take_along_axis(probs, targets[..., None], axis=-1) - 1, axis=-1)
    dlogits *= float(dloss) / n_pos                           # a Python float keeps the dtype
    dx = mm(dlogits, wte)                          # [B, T, C]
    dwte = mm(dlogits.reshape(-1, V).T, x.reshape(-1, C))   # [V, C]
    return dx, dwte
