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


def grad_scale(grads, norm, max_norm, scale):
    """grads * scale * clip, clip = max_norm / norm if max_norm > 0 and norm > max_norm, else 1
    (max_norm = 0: a plain scaling, e.g. by 1 / n_microbatches). norm is a number or, as the engine
    keeps it on the device, a 1-element array. Returns a new array."""
    norm = float(np.asarray(norm).reshape(-1)[0])
    clip = max_norm / norm if max_norm > 0 and norm > max_norm else 1.0
    return grads * (scale * clip)


def clip_grad_norm(grads, max_norm):
    """Scale the gradient so its global norm is at most max_norm (0 = no clipping): grad_norm, then
    grad_scale, as the engine does. Returns (clipped gradient, norm before clipping)."""
    norm = grad_norm(grads)
    return grad_scale(grads, norm, max_norm, 1.0), norm


def adamw(params, grads, m, v, decay, t, lr, beta1, beta2, eps, weight_decay, stats=None):
    """One AdamW step (t counts from 1), with weight decay decoupled from the gradient and applied
    only where decay is 1 (the 2-D weights):
        m = beta1 m + (1 - beta1) g                v = beta2 v + (1 - beta2) g^2
        m_hat = m / (1 - beta1^t)                  v_hat = v / (1 - beta2^t)
        p = p - lr (m_hat / (sqrt(v_hat) + eps) + weight_decay * decay * p)
    stats: the trainer's [loss summed over microbatches, gradient norm]; when either is NaN or
    infinite the step is not applied and params, m, v come back unchanged (the kernel's guard).
    None, for a loop without those numbers (tests/test_reference.py), always steps.
    Returns new (params, m, v); the inputs are left alone (the kernel updates them in place)."""
    if stats is not None and not np.all(np.isfinite(np.asarray(stats, dtype=np.float64))):
        return params.copy(), m.copy(), v.copy()
    m = beta1 * m + (1.0 - beta1) * grads
    v = beta2 * v + (1.0 - beta2) * grads * grads
    m_hat = m / (1.0 - beta1 ** t)
    v_hat = v / (1.0 - beta2 ** t)
    params = params - lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * decay * params)
    return params, m, v


def adamw_hyper(t, lr, beta1, beta2):
    """AdamW's scalars that change from step to step, as the engine keeps them on the device:
    [lr, bc1, bc2] with the bias corrections bc1 = 1 - beta1^t, bc2 = 1 - beta2^t (float64 here;
    the trainer writes them as float32 before each step)."""
    return np.array([lr, 1.0 - beta1 ** t, 1.0 - beta2 ** t])


def adamw_zero(params, grads, m, v, decay, hyper, beta1, beta2, eps, weight_decay, stats=None):
    """The engine's AdamW step (its kernel, k_adamw, is the optimiser's last launch of a step):
    adamw with the learning rate and the bias corrections read from hyper = [lr, bc1, bc2]
    (adamw_hyper), then the gradient cleared for the next step's accumulation:
        m = beta1 m + (1 - beta1) g                v = beta2 v + (1 - beta2) g^2
        p = p - lr (m / bc1 / (sqrt(v / bc2) + eps) + weight_decay * decay * p)
        g = 0
    stats as in adamw: a NaN or infinite loss or norm leaves params, m and v unchanged (the
    gradient is cleared all the same). Returns new (params, grads, m, v)."""
    lr, bc1, bc2 = (float(h) for h in np.asarray(hyper).reshape(-1)[:3])
    if stats is not None and not np.all(np.isfinite(np.asarray(stats, dtype=np.float64))):
        return params.copy(), np.zeros_like(grads), m.copy(), v.copy()
    m = beta1 * m + (1.0 - beta1) * grads
    v = beta2 * v + (1.0 - beta2) * grads * grads
    params = params - lr * (m / bc1 / (np.sqrt(v / bc2) + eps) + weight_decay * decay * params)
    return params, np.zeros_like(grads), m, v


def zero(arr):
    """Clear the accumulated gradient: a new array of zeros (the kernel clears in place)."""
    return np.zeros_like(arr)
