"""The optimiser step in NumPy: learning-rate schedule, global-norm clipping, AdamW.

The CUDA engine runs the same arithmetic with k_grad_norm_partial, k_grad_norm_final,
k_grad_scale and the AdamW kernel over the same flat vectors.
"""
import math

import numpy as np


def lr_at(step, lr, min_lr, warmup_steps, total_steps, decay="cosine"):
    """Learning rate of optimiser step `step` (counted from 0): linear warm-up from lr/warmup to lr
    over warmup_steps, then cosine decay from lr to min_lr at total_steps ("constant": stays at lr)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if decay == "constant" or total_steps <= warmup_steps:
        return lr
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def grad_norm(grads):
    """Global L2 norm of the flat gradient: sqrt(sum_i g_i^2), in the gradient's dtype."""
    return np.sqrt(np.dot(grads, grads))


def clip_grad_norm(grads, max_norm):
    """Scale the gradient so its global norm is at most max_norm (0 = no clipping).
    Returns (clipped gradient, norm before clipping)."""
    norm = grad_norm(grads)
    if max_norm > 0 and norm > max_norm:
        return grads * (max_norm / float(norm)), norm
    return grads.copy(), norm


def adamw_step(params, grads, m, v, t, lr, beta1, beta2, eps, weight_decay, decay_mask):
    """One AdamW step (t counts from 1), with weight decay decoupled from the gradient and applied
    only where decay_mask is 1 (the 2-D weights):
        m = beta1 m + (1 - beta1) g                v = beta2 v + (1 - beta2) g^2
        m_hat = m / (1 - beta1^t)                  v_hat = v / (1 - beta2^t)
        p = p - lr (m_hat / (sqrt(v_hat) + eps) + weight_decay * mask * p)
    Returns new (params, m, v); the inputs are left alone."""
    m = beta1 * m + (1.0 - beta1) * grads
    v = beta2 * v + (1.0 - beta2) * grads * grads
    m_hat = m / (1.0 - beta1 ** t)
    v_hat = v / (1.0 - beta2 ** t)
    params = params - lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * decay_mask * params)
    return params, m, v


def zero_grads(grads):
    """Clear the accumulated gradient (in place)."""
    grads[...] = 0
