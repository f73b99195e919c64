"""Exercise loss_bwd (NumPy): the backward of the tied output projection + cross-entropy.

Forward (given: reference/loss.py, imported below), x [B, T, C], wte [V, C], targets [B, T] int:
    logits = x @ wte^T                                        [B, T, V]
    probs  = softmax(logits) over V                           saved for you
    losses[b, t] = -log probs[b, t, targets[b, t]]
    loss   = mean of losses over the B*T positions

Your task: the backward, from dloss (the upstream gradient of the scalar loss; 1.0 when the loss
is the final output).
    dlogits = (probs - onehot(targets)) * dloss / (B*T)      the mean divides by B*T
    dx      = dlogits @ wte                                   [B, T, C]
    dwte    = dlogits^T @ x  over all B*T positions           [V, C]
(onehot(targets)[b, t, v] = 1 where v == targets[b, t], else 0; dloss may be a 0-d array.)

Check your work:  python -m andrea_numba.exercises check loss_bwd
"""
import numpy as np

from reference.loss import loss_fwd  # noqa: F401  (the forward, to experiment with)


def loss_bwd(dloss, x, wte, probs, targets):
    """dloss (scalar) -> (dx [B, T, C], dwte [V, C])."""
    # TODO: dlogits from probs and the targets, then the two products
    raise NotImplementedError("write loss_bwd: see the docstring")
