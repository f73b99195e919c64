"""The lab's rungs of andrea_numba/kernels/optim.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.

AdamW's ladder:
v1 (adamw_grid_stride, the engine's: k_adamw_grid_stride) the learning rate and the bias
    corrections from the host, a grid-stride loop over a capped grid.
v2 (adamw_v2: k_adamw_v2) the same step with [lr, bc1, bc2] read from the device (hyper) and the
    gradient cleared after its use, for a step captured once in a CUDA graph.
v3 (adamw, the engine's: k_adamw) v2's arithmetic with every load of an element before any store,
    one element a thread. On the H200 (12M, 12.7M parameters) v2 took 0.69 ms, about 0.6 TB/s,
    where k_grad_scale moves the same vectors at 3 TB/s. In v2's PTX the loads of p and the decay
    flag come after the stores of g, m and v (the compiler may not move a load above a store to an
    array that might be the same memory), so each element waits for memory twice, and a capped
    grid-stride loop of 12 elements a thread puts those waits one after the other. v3 reads g, m,
    v, p and the flag first, then computes and stores, and launches a thread for every element (no
    cap): one wait an element, all of a block's in flight together. The same float32 operations:
    v2's bits. Measured on the H200 (lab/bench/kernels.py adamw_zero, block 256): 12M 0.68 -> 0.29
    ms (0.54 -> 1.29 TB/s); 120M 6.31 -> 2.76 ms (2026-12-01, docs/kernels.md).
"""
from numba import cuda, float32
from andrea_numba.kernels.optim import *  # noqa: F401,F403  (the engine's rungs and helpers)
from andrea_numba.kernels.optim import _launch_hyper, _stride_grid  # noqa: F401


@cuda.jit
def k_adamw_v2(params, grads, m, v, decay, hyper, stats, beta1, beta2, one_m_beta1, one_m_beta2, eps,
               weight_decay):
    """k_adamw_grid_stride's step with lr = hyper[0], bc1 = hyper[1], bc2 = hyper[2] read from the device,
    then g_i = 0 (the next step accumulates from zero):
        m_i = beta1 m_i + (1 - beta1) g_i          v_i = beta2 v_i + (1 - beta2) g_i^2
        p_i = p_i - lr (m_i / bc1 / (sqrt(v_i / bc2) + eps) + weight_decay * decay_i * p_i)
    The same float32 operations in the same order as v1 (k_adamw_grid_stride): given the same values
    it is bit-identical. Divergence guard as v1's, except that the gradient is cleared on either path."""
    apply = finite_step(stats)
    lr, bc1, bc2 = hyper[0], hyper[1], hyper[2]
    for i in range(cuda.grid(1), params.shape[0], cuda.gridsize(1)):
        g = grads[i]
        grads[i] = float32(0.0)
        if apply:
            adamw_element(params, m, v, decay, i, g, lr, beta1, beta2, one_m_beta1, one_m_beta2, bc1, bc2,
                          eps, weight_decay)


@blocks(**STRIDE_BLOCKS)
def adamw_v2(params, grads, m, v, decay, hyper, beta1, beta2, eps, weight_decay, stats, *, block, stream=0):
    """AdamW step over the flat vectors params, m, v (updated in place), then grads = 0. hyper:
    float32 [3] on the device, [lr, bc1, bc2] of this step (reference.adamw_hyper); stats: float32
    [2] on the device, [loss, gradient norm]. The constants beta1, beta2, eps and weight_decay come
    from the host. Launch: grid-stride, min(cdiv(n, block), 4096) blocks of `block` threads."""
    _launch_hyper(k_adamw_v2, _stride_grid(params.shape[0], block), block, stream, params, grads, m, v, decay,
                  hyper, beta1, beta2, eps, weight_decay, stats)


VERSIONS = {"grad_norm": {1: grad_norm}, "grad_scale": {1: grad_scale},
            "adamw": {1: adamw_grid_stride, 2: adamw_v2, 3: adamw}, "zero": {1: zero}}
