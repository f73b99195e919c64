"""The optimiser step: k_grad_norm_partial, k_grad_norm_final, k_grad_scale, k_adamw, k_zero.
NumPy twin: reference/optim.py (grad_norm, grad_scale, adamw, zero: the same names and arguments;
adamw_zero for the engine's adamw, whose scalars come from the device).

Every vector is the flat parameter layout of andrea_numba.layout: n_params float32 elements
(params, grads, Adam's m and v), plus a uint8 decay mask (1 on the 2-D tensors).

    norm   = sqrt(sum_i g_i^2)                                   grad_norm (two kernels)
    clip   = max_norm / norm  if max_norm > 0 and norm > max_norm, else 1
    g      = g * scale * clip                                    grad_scale
    m      = beta1 m + (1 - beta1) g                             adamw
    v      = beta2 v + (1 - beta2) g^2
    m_hat  = m / (1 - beta1^t)        v_hat = v / (1 - beta2^t)
    p      = p - lr (m_hat / (sqrt(v_hat) + eps) + weight_decay * decay_i * p)
    g      = 0                                                   zero

AdamW takes the trainer's stats buffer [loss, norm] too and skips the whole update, on the device,
when either is NaN or infinite (a diverged step is not applied; the trainer then stops).

Two AdamW launchers. adamw_grid_stride (k_adamw_grid_stride) gets the learning rate and the bias
corrections from the host, as arguments of its launch. adamw (k_adamw, the trainer's) reads them
from a device array hyper = [lr, bc1, bc2] (twin: reference.adamw_zero, scalars from
reference.adamw_hyper) and clears each gradient element after its use, so the step needs no k_zero
launch of its own. A kernel's host arguments are frozen into a CUDA graph when it is captured;
values in device memory are read when the graph runs, so the trainer writes hyper before each
replay and one captured step serves them all. k_adamw takes one element a thread, all its loads
before its first store (the comment above it).

Determinism: the norm is a two-stage reduction over a FIXED grid (NORM_BLOCKS blocks of
`block` threads, whatever n is). Thread (b, t) sums its strided subset i = b*nt + t,
b*nt + t + NORM_BLOCKS*nt, ... in increasing order, block_sum combines a block's threads in a
fixed tree, and one block combines the NORM_BLOCKS partials in a fixed order. No atomics: the same
gradient gives a bit-identical norm on every run. The elementwise kernels touch each element from
exactly one thread, so they are deterministic by construction.

The clip factor is computed on the device from norm[0] (no host round trip between the norm and
the scaling); with max_norm = 0, grad_scale is a plain scaling (1 / n_microbatches).
"""
import math

import numpy as np
from numba import cuda, float32

from .common import block_sum, blocks, cdiv, MAX_BLOCK, rung, SIMULATOR

# Norm reduction: a fixed grid, so the summation order depends on n only.
NORM_BLOCKS = 4 if SIMULATOR else 1024       # blocks of k_grad_norm_partial == len(partial)
NORM_FINAL_THREADS = 4 if SIMULATOR else 256 # the one block of k_grad_norm_final

# Elementwise kernels: grid-stride loops over a capped grid (124M elements on an H200: 4096 blocks
# of 256 threads = 1M threads, ~118 elements each, plenty to fill 132 SMs and saturate HBM).
OPT_MAX_BLOCKS = 2 if SIMULATOR else 4096
STRIDE_BLOCKS = dict(gpu=(256, 128, 512), sim=(32, 8))      # threads per block of the elementwise kernels


def _stride_grid(n, threads):
    """Blocks of a grid-stride elementwise kernel over n elements, `threads` per block."""
    return max(1, min(cdiv(n, threads), OPT_MAX_BLOCKS))


# ---------------------------------------------------------------------------------------------
# Global gradient norm

@cuda.jit
def k_grad_norm_partial(partial, grads):
    """partial[b] = sum over i in block b's subset of grads_i^2.

    Launch: NORM_BLOCKS blocks (fixed, independent of n) of a power-of-two number of threads. Thread t of
    block b visits i = b*nt + t + k * (NORM_BLOCKS*nt), k = 0, 1, ... (coalesced: consecutive
    threads read consecutive elements), summing in k order; block_sum's tree adds the threads."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    start = cuda.blockIdx.x * nt + tid
    stride = cuda.gridDim.x * nt
    n = grads.shape[0]
    s = float32(0.0)
    for i in range(start, n, stride):
        g = grads[i]
        s += g * g
    total = block_sum(buf, s)
    if tid == 0:
        partial[cuda.blockIdx.x] = total


@cuda.jit
def k_grad_norm_final(norm, partial):
    """norm[0] = sqrt(sum_b partial[b]).

    Launch: 1 block x NORM_FINAL_THREADS threads. Thread t sums partial[t], partial[t + nt], ...
    in order, block_sum adds the threads in its fixed tree; thread 0 writes the float32 sqrt."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    s = float32(0.0)
    for b in range(tid, partial.shape[0], nt):
        s += partial[b]
    total = block_sum(buf, s)
    if tid == 0:
        norm[0] = math.sqrt(total)          # float32 in, float32 out (sqrt.rn.f32)


@rung(1)
@blocks(gpu=(256, 512), sim=(8, 4))
def grad_norm(norm, partial, grads, *, block, stream=0):
    """norm[0] = sqrt(sum_i grads_i^2). norm: float32 [1]; partial: float32 scratch [NORM_BLOCKS];
    grads: float32 [n]. Two launches: NORM_BLOCKS blocks of `block` threads (a power of two; the
    summation order depends on it and on n only), then one block. The result stays on the device."""
    assert partial.shape[0] == NORM_BLOCKS, f"partial needs {NORM_BLOCKS} elements, has {partial.shape[0]}"
    k_grad_norm_partial[NORM_BLOCKS, block, stream](partial, grads)
    k_grad_norm_final[1, NORM_FINAL_THREADS, stream](norm, partial)


# ---------------------------------------------------------------------------------------------
# Clip and scale

@cuda.jit
def k_grad_scale(grads, norm, max_norm, scale):
    """grads_i *= scale * clip, clip = max_norm / norm[0] if max_norm > 0 and norm[0] > max_norm
    else 1 (reference.grad_scale; a NaN norm does not clip, as in the twin). Every thread
    computes clip itself from norm[0], so no host round trip. Grid-stride, one thread per element."""
    nrm = norm[0]
    f = scale
    if max_norm > float32(0.0) and nrm > max_norm:
        f = scale * (max_norm / nrm)
    n = grads.shape[0]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        grads[i] *= f


@rung(1)
@blocks(**STRIDE_BLOCKS)
def grad_scale(grads, norm, max_norm, scale, *, block, stream=0):
    """grads *= scale * clip(norm[0], max_norm). max_norm = 0: plain scaling by `scale`.
    Launch: grid-stride, min(cdiv(n, block), 4096) blocks of `block` threads (simulator: <= 2 blocks)."""
    k_grad_scale[_stride_grid(grads.shape[0], block), block, stream](grads, norm, float32(max_norm),
                                                                       float32(scale))


# ---------------------------------------------------------------------------------------------
# AdamW

@cuda.jit(device=True)
def finite_step(stats):
    """False when the step's loss stats[0] or gradient norm stats[1] is NaN or infinite."""
    loss, norm = stats[0], stats[1]
    return not (math.isnan(loss) or math.isinf(loss) or math.isnan(norm) or math.isinf(norm))


@cuda.jit(device=True)
def adamw_element(params, m, v, decay, i, g, lr, beta1, beta2, one_m_beta1, one_m_beta2, bc1, bc2, eps,
                  weight_decay):
    """Element i's AdamW update with gradient g (the formulas of k_adamw_grid_stride's docstring)."""
    mi = beta1 * m[i] + one_m_beta1 * g
    vi = beta2 * v[i] + one_m_beta2 * (g * g)
    m[i] = mi
    v[i] = vi
    m_hat = mi / bc1
    v_hat = vi / bc2
    p = params[i]
    params[i] = p - lr * (m_hat / (math.sqrt(v_hat) + eps) + weight_decay * float32(decay[i]) * p)


@cuda.jit
def k_adamw_grid_stride(params, grads, m, v, decay, stats, lr, beta1, beta2, one_m_beta1, one_m_beta2,
                        bc1, bc2, eps, weight_decay):
    """One AdamW step, in place, one thread per element i (grid-stride):
        m_i = beta1 m_i + (1 - beta1) g_i          v_i = beta2 v_i + (1 - beta2) g_i^2
        m_hat = m_i / bc1, bc1 = 1 - beta1^t       v_hat = v_i / bc2, bc2 = 1 - beta2^t
        p_i  = p_i - lr (m_hat / (sqrt(v_hat) + eps) + weight_decay * decay_i * p_i)
    1 - beta and the bias corrections come from the host (float64 there, float32 here).
    Divergence guard: stats is the trainer's [loss summed over microbatches, gradient norm]. When
    either is NaN or infinite, every thread returns before touching params, m or v: the step is
    not applied, decided on the device, so the host never needs to look before the update."""
    if not finite_step(stats):
        return
    for i in range(cuda.grid(1), params.shape[0], cuda.gridsize(1)):
        adamw_element(params, m, v, decay, i, grads[i], lr, beta1, beta2, one_m_beta1, one_m_beta2, bc1, bc2,
                      eps, weight_decay)


@rung(1)
@blocks(**STRIDE_BLOCKS)
def adamw_grid_stride(params, grads, m, v, decay, t, lr, beta1, beta2, eps, weight_decay, stats, *, block, stream=0):
    """AdamW step t (counted from 1) over the flat vectors params, m, v (updated in place) with
    gradient grads and uint8 weight-decay mask decay (layout.decay_mask). stats: float32 [2] on the
    device, [loss, gradient norm]: a NaN or infinite value in it leaves params, m and v untouched.
    Launch: grid-stride, min(cdiv(n, block), 4096) blocks of `block` threads (simulator: <= 2 blocks)."""
    assert t >= 1, "AdamW's step t counts from 1"
    bc1 = 1.0 - float(beta1) ** int(t)       # float64 on the host, then float32
    bc2 = 1.0 - float(beta2) ** int(t)
    f = np.float32
    k_adamw_grid_stride[_stride_grid(params.shape[0], block), block, stream](params, grads, m, v, decay, stats, f(lr),
                                     f(beta1), f(beta2), f(1.0 - float(beta1)), f(1.0 - float(beta2)),
                                     f(bc1), f(bc2), f(eps), f(weight_decay))


def _launch_hyper(kernel, grid, block, stream, params, grads, m, v, decay, hyper, beta1, beta2, eps, weight_decay,
                  stats):
    """Launch an AdamW kernel that reads [lr, bc1, bc2] from the device (k_adamw, and the lab's
    rung 2), the host's constants as float32."""
    assert hyper.dtype == np.float32 and hyper.shape[0] >= 3, "hyper: float32 [lr, bc1, bc2] on the device"
    f = np.float32
    kernel[grid, block, stream](params, grads, m, v, decay, hyper, stats, f(beta1), f(beta2), f(1.0 - float(beta1)),
                                f(1.0 - float(beta2)), f(eps), f(weight_decay))


# k_adamw: one element a thread, every load of the element before any store. The compiler may not
# move a load above a store to an array that might be the same memory, so an update written in the
# order of the formulas (store g, m, v, then load p and the decay flag) waits for memory twice an
# element, and a grid-stride loop of several elements a thread puts those waits one after the other.
# Here g, m, v, p and the flag are read first, then computed and stored, and a thread is launched
# for every element (no capped grid): one wait an element, all of a block's in flight together.
@cuda.jit
def k_adamw(params, grads, m, v, decay, hyper, stats, beta1, beta2, one_m_beta1, one_m_beta2, eps,
            weight_decay):
    """One AdamW step for element i = the thread's index (one element a thread), with lr = hyper[0],
    bc1 = hyper[1], bc2 = hyper[2] read from the device, then the gradient cleared:
        m_i = beta1 m_i + (1 - beta1) g_i          v_i = beta2 v_i + (1 - beta2) g_i^2
        p_i = p_i - lr (m_i / bc1 / (sqrt(v_i / bc2) + eps) + weight_decay * decay_i * p_i)
        g_i = 0
    with every load (stats, hyper, g, m, v, p, decay) before the first store. Divergence guard as
    k_adamw_grid_stride's, except that the gradient is cleared on either path."""
    i = cuda.grid(1)
    if i >= params.shape[0]:
        return
    apply = finite_step(stats)
    lr, bc1, bc2 = hyper[0], hyper[1], hyper[2]
    g, mi, vi, p, dk = grads[i], m[i], v[i], params[i], decay[i]
    grads[i] = float32(0.0)
    if not apply:
        return
    mi = beta1 * mi + one_m_beta1 * g
    vi = beta2 * vi + one_m_beta2 * (g * g)
    m[i] = mi
    v[i] = vi
    params[i] = p - lr * (mi / bc1 / (math.sqrt(vi / bc2) + eps) + weight_decay * float32(dk) * p)


@rung(3)
@blocks(**STRIDE_BLOCKS)
def adamw(params, grads, m, v, decay, hyper, beta1, beta2, eps, weight_decay, stats, *, block, stream=0):
    """AdamW step over the flat vectors params, m, v (updated in place), then grads = 0. hyper:
    float32 [3] on the device, [lr, bc1, bc2] of this step (reference.adamw_hyper); stats: float32
    [2] on the device, [loss, gradient norm]; beta1, beta2, eps and weight_decay from the host.
    Launch: k_adamw, cdiv(n, block) blocks of `block` threads, one element a thread."""
    _launch_hyper(k_adamw, cdiv(params.shape[0], block), block, stream, params, grads, m, v, decay, hyper,
                  beta1, beta2, eps, weight_decay, stats)


# ---------------------------------------------------------------------------------------------
# Zero

@cuda.jit
def k_zero(arr):
    """arr_i = 0 (the twin's zero), grid-stride, one thread per element."""
    n = arr.shape[0]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        arr[i] = float32(0.0)


@rung(1)
@blocks(**STRIDE_BLOCKS)
def zero(arr, *, block, stream=0):
    """arr[:] = 0 for a 1-D float32 device array. Launch: grid-stride, min(cdiv(n, block), 4096)
    blocks of `block` threads (simulator: <= 2 blocks)."""
    k_zero[_stride_grid(arr.shape[0], block), block, stream](arr)


