"""FP8 products on the GPU: each operand quantized per tensor by kernels/fp8.py, the
product by cuBLASLt's FP8 kernels with the two descales, fp32 sums, an fp32 output:

    out (+)= op(a) @ op(b)  ~  (descale_a descale_b) (A_q @ B_q^T)
        A_q [M, K] = bytes of op(a) * scale_a        scale = max / amax, descale = amax / max
        B_q [N, K] = bytes of op(b)^T * scale_b      (per tensor, amax of the tensor itself)

NumPy twin: reference.precision.fp8_mm (the same bytes: reference.fp8.quantize_gpu), so the
harness checks these products against the twin at the same scope (python -m andrea_numba.fp8 check).

Where FP8 runs. Hopper (compute capability 9.0) and Ada (8.9) have FP8 tensor cores; cuBLASLt offers
them with both operands K-major ("TN"), every row 16-byte aligned (kernels/fp8.py's layouts). On
any other GPU, and in the simulator, fp8_unavailable() says why in one line.

The scopes of training (reference/precision.py's FP8_SCOPES), for the linear layers' products (Q, K,
V, W_O, W_1, W_2; attention's products and the classifier's stay bf16):
    fp8-fwd    the forward's products in E4M3, the backward's in bf16 (cuBLASLt's, kernels/cublaslt.py)
    fp8-e5m2   the forward's in E4M3; the backward's E4M3 x E5M2, the gradient operand in E5M2
    fp8-all    every operand in E4M3
The scale is the "current" one: the tensor's own amax, taken just before it is cast (a pass over
it), so nothing saturates; what is lost is what falls below the format's smallest value relative to
the tensor's largest (underflow, counted) and the digits past the mantissa. The record of every
quantized tensor of a step (amax, scale, descale, underflow count) stays on the GPU in
FP8Workspace.stats / counts, one slot a quantization in launch order, for the trainer's history.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from reference.fp8 import E4M3, E5M2
from reference.precision import FP8_SCOPES

from . import cublaslt
from . import fp8 as Q
from .common import address, rung, SIMULATOR
from .mlp import gelu_bwd_vec4, gelu_fwd_vec4

MIN_CC = (8, 9)                 # FP8 tensor cores: Ada (8.9) and Hopper (9.0) on
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}


def fp8_unavailable() -> str | None:
    """Why FP8 products cannot run in this process (None: they can)."""
    if SIMULATOR:
        return "FP8 products need a GPU with FP8 tensor cores: the CUDA simulator cannot run cuBLASLt"
    reason = cublaslt.unavailable()
    if reason:
        return reason.replace("cuBLASLt products", "FP8 products (through cuBLASLt)")
    try:
        cc = tuple(cuda.get_current_device().compute_capability)
    except Exception:
        return "FP8 products need an NVIDIA GPU, and none is visible here"
    if cc < MIN_CC:
        return (f"FP8 is not supported on this GPU (compute capability {cc[0]}.{cc[1]}): FP8 products need "
                f"an Ada or Hopper GPU (8.9 or newer); use --precision bf16")
    return None


def require_fp8():
    reason = fp8_unavailable()
    if reason:
        raise cublaslt.LibraryUnavailable(reason)


@dataclass
class Quant:
    """A quantized operand as the product reads it: codes [rows, ld] (K-major, rows padded to
    16 bytes), its format name, k (the values a row holds), the device address of its descale,
    and its record's slot in FP8Workspace.stats."""
    codes: object
    fmt: str
    k: int
    descale: int
    slot: int


class FP8Workspace:
    """The scratch of the FP8 products: two slots of operand bytes (a and b of one product: an op
    may hold a's bytes for several products while b's change), the reduction's partials, and the
    record of each quantization: stats [S, 4] (descale, scale, amax, 0) and counts [S] (underflowed
    values), slot s the s-th quantization since begin(). labels[s] and sizes[s] name it on the host.
    Reserved before the first step (reserve); nothing is allocated after."""

    def __init__(self):
        self.codes = [None, None]
        self.stats = self.counts = self.partial = None
        self.slots = 0
        self.next = 0
        self.labels, self.sizes = {}, {}

    def reserve(self, a_bytes: int, b_bytes: int, slots: int):
        for i, n in enumerate((a_bytes, b_bytes)):
            if self.codes[i] is None or self.codes[i].size < n:
                self.codes[i] = cuda.device_array(max(n, 16), dtype=np.uint8)
        if self.slots < slots:
            self.stats = cuda.to_device(np.zeros((slots, Q.STATS), np.float32))
            self.counts = cuda.to_device(np.zeros(slots, np.int32))
            self.slots = slots
        if self.partial is None:
            self.partial = cuda.device_array(Q.AMAX_BLOCKS, dtype=np.float32)

    def begin(self):
        """A new step's records start at slot 0 (GPUModel.forward calls it)."""
        self.next = 0

    def quantize(self, x, fmt: str, kmajor_t: bool, which: int, label: str, stream=0) -> Quant:
        """x [R, C] (float32) quantized into slot `which` (0: a's, 1: b's): as it lies (k along its
        rows) or, kmajor_t, transposed (k down its columns); recorded in the next stats slot."""
        R, C = x.shape
        rows, k = (C, R) if kmajor_t else (R, C)
        need = rows * Q.padded(k)
        self.reserve(need if which == 0 else 0, need if which == 1 else 0, 64)    # (grows only: the harness)
        s = self.next % self.slots
        self.next += 1
        self.labels.setdefault(s, label)
        self.sizes.setdefault(s, R * C)
        stats, count = self.stats[s], self.counts[s:s + 1]
        codes = Q.quantize(self.codes[which], stats, count, self.partial, x, FORMATS[fmt], kmajor_t, stream=stream)
        return Quant(codes, fmt, k, address(self.stats) + s * Q.STATS * 4, s)     # (16-byte aligned)

    def record(self, n_layer: int = 1) -> list[dict]:
        """The last step's record, slot by slot: label, layer, elements, amax, underflow fraction
        (copies from the GPU: for the trainer's history, between steps). The layer is the label's
        occurrence: the forward's k-th is layer k, the backward's k-th layer n_layer - 1 - k. Every
        labelled slot is read: a training step's are all of them (a step replayed from its CUDA graph
        runs no Python, so `next` may hold a later forward-only count: an evaluation's, the sampler's)."""
        n = min(len(self.labels), self.slots)
        stats, counts = self.stats.copy_to_host()[:n], self.counts.copy_to_host()[:n]
        seen, out = {}, []
        for s in range(n):
            label = self.labels[s]
            k = seen[label] = seen.get(label, -1) + 1
            layer = k if ".fwd." in label else n_layer - 1 - k
            out.append(dict(label=label, layer=layer, elements=self.sizes[s], amax=float(stats[s, 2]),
                            underflow=float(counts[s]) / max(1, self.sizes[s])))
        return out


FP8 = FP8Workspace()            # the process's one FP8 scratch (launches run in stream order)


def mm(out, qa: Quant, qb: Quant, accumulate=False, stream=0):
    """out (+)= A_q @ B_q^T descaled: one cuBLASLt FP8 product (cublaslt.Library.matmul_fp8);
    skipped while andrea_numba.precompile records a step's launches (cublaslt.RECORDING)."""
    if not cublaslt.RECORDING:
        cublaslt.library().matmul_fp8(out, qa, qb, accumulate, stream)


def fp8_matmul(out, a, b, trans_a=False, trans_b=False, accumulate=False, fmt_a="e4m3", fmt_b="e4m3",
               label="matmul", stream=0):
    """out (+)= op(a) @ op(b) with both operands quantized per tensor (a in slot 0, b in slot 1)."""
    qa = FP8.quantize(a, fmt_a, trans_a, 0, label + ".a", stream)
    qb = FP8.quantize(b, fmt_b, not trans_b, 1, label + ".b", stream)
    mm(out, qa, qb, accumulate, stream)


@rung(24)
def matmul_fp8(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block=None, stream=0):
    """out (+)= op(a) @ op(b) in FP8 E4M3 through cuBLASLt: each operand's amax, scale and bytes by
    kernels/fp8.py (k_amax_partial, k_amax_final, k_quantize or k_quantize_t), then the
    FP8 product with fp32 sums (work and block unused)."""
    fp8_matmul(out, a, b, trans_a, trans_b, accumulate, stream=stream)


matmul_fp8.blocks = ("cublasLt",)
matmul_fp8.precision = "fp8-all"


def operand_bytes(N: int, C: int) -> int:
    """The most bytes one FP8 operand of the linear layers' products takes, for N = B*T rows and
    width C: the largest of [N, 4C] as it lies and its transpose [4C, N], rows padded to 16 bytes."""
    return max(N * Q.padded(4 * C), 4 * C * Q.padded(N), 4 * C * Q.padded(C))


def slots_for(n_layer: int) -> int:
    """Records a step makes: 10 quantizations a layer forward and 22 backward (fp8-fwd: none backward)
    fit in 36 a layer, and room for the harness's calls beside them."""
    return 36 * n_layer + 64


def scratch_bytes(N: int, C: int, n_layer: int) -> int:
    """Bytes of FP8Workspace that a model of these sizes reserves."""
    return 2 * operand_bytes(N, C) + slots_for(n_layer) * (4 * Q.STATS + 4) + 4 * Q.AMAX_BLOCKS


def linear_ops(scope: str, N: int, C: int, V: int, n_layer: int = 1):
    """GPUModel's five linear-op launchers with the linear layers' products in FP8 at `scope` and
    the classifier's (and fp8-fwd's backward) in bf16 through cuBLASLt (cublaslt.linear_ops), for
    N = B*T rows, width C, vocabulary V; the scratch reserved here, before any step. Same arguments
    and meaning as the engine's launchers; the GELU passes are the library route's (mlp v12's)."""
    assert scope in FP8_SCOPES, scope
    require_fp8()
    bf = cublaslt.linear_ops("bf16", N, C, V)            # the bf16 products: the classifier, fp8-fwd's backward
    FP8.reserve(operand_bytes(N, C), operand_bytes(N, C), slots_for(n_layer))
    g = "e5m2" if scope == "fp8-e5m2" else "e4m3"      # the backward's gradient operands
    W = "e4m3"                                         # weights and activations

    quant = FP8.quantize        # quant(x, format, transposed, slot, label, stream)

    def attn_qkv_fwd(q, k, v, x, w_q, w_k, w_v, *, stream=0):
        """q, k, v = x @ W_q, x @ W_k, x @ W_v (x quantized once for the three)"""
        qx = quant(x, W, False, 0, "attn_qkv.fwd.x", stream)
        for out, w, n in ((q, w_q, "w_q"), (k, w_k, "w_k"), (v, w_v, "w_v")):
            mm(out, qx, quant(w, W, True, 1, "attn_qkv.fwd." + n, stream), stream=stream)

    def attn_qkv_bwd(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, stream=0):
        """dx = dq W_q^T + dk W_k^T + dv W_v^T; dW_* += x^T d* (x^T quantized once for the three)"""
        for i, (d, w, n) in enumerate(((dq, w_q, "q"), (dk, w_k, "k"), (dv, w_v, "v"))):
            mm(dx, quant(d, g, False, 0, f"attn_qkv.bwd.d{n}", stream),
               quant(w, W, False, 1, f"attn_qkv.bwd.w_{n}", stream), accumulate=i > 0, stream=stream)
        qxt = quant(x, W, True, 0, "attn_qkv.bwd.x", stream)
        for dw, d, n in ((dw_q, dq, "q"), (dw_k, dk, "k"), (dw_v, dv, "v")):
            mm(dw, qxt, quant(d, g, True, 1, f"attn_qkv.bwd.d{n}_t", stream), accumulate=True, stream=stream)

    def attn_out_fwd(out, y, w_o, *, stream=0):
        """out = y @ W_O"""
        mm(out, quant(y, W, False, 0, "attn_out.fwd.y", stream), quant(w_o, W, True, 1, "attn_out.fwd.w_o", stream),
           stream=stream)

    def attn_out_bwd(dy, dw_o, work, dout, y, w_o, *, stream=0):
        """dy = dout W_O^T; dW_O += y^T dout"""
        mm(dy, quant(dout, g, False, 0, "attn_out.bwd.dout", stream),
           quant(w_o, W, False, 1, "attn_out.bwd.w_o", stream), stream=stream)
        mm(dw_o, quant(y, W, True, 0, "attn_out.bwd.y", stream),
           quant(dout, g, True, 1, "attn_out.bwd.dout_t", stream), accumulate=True, stream=stream)

    def mlp_fwd(out, h_pre, h, work, x, w_1, w_2, *, stream=0):
        """h_pre = x W_1, h = gelu(h_pre), out = h W_2"""
        Nr, F = h.shape
        mm(h_pre, quant(x, W, False, 0, "mlp.fwd.x", stream), quant(w_1, W, True, 1, "mlp.fwd.w_1", stream),
           stream=stream)
        gelu_fwd_vec4(h.reshape(Nr * F), h_pre.reshape(Nr * F), stream)
        mm(out, quant(h, W, False, 0, "mlp.fwd.h", stream), quant(w_2, W, True, 1, "mlp.fwd.w_2", stream),
           stream=stream)

    def mlp_bwd(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, stream=0):
        """dW_2 += h^T dout; dh = dout W_2^T; dh_pre = dh gelu'(h_pre); dW_1 += x^T dh_pre; dx = dh_pre W_1^T"""
        Nr, F = h.shape
        mm(dw_2, quant(h, W, True, 0, "mlp.bwd.h", stream), quant(dout, g, True, 1, "mlp.bwd.dout_t", stream),
           accumulate=True, stream=stream)
        mm(dh_pre, quant(dout, g, False, 0, "mlp.bwd.dout", stream), quant(w_2, W, False, 1, "mlp.bwd.w_2", stream),
           stream=stream)
        gelu_bwd_vec4(dh_pre.reshape(Nr * F), h_pre.reshape(Nr * F), stream)
        mm(dw_1, quant(x, W, True, 0, "mlp.bwd.x", stream), quant(dh_pre, g, True, 1, "mlp.bwd.dh_pre_t", stream),
           accumulate=True, stream=stream)
        mm(dx, quant(dh_pre, g, False, 0, "mlp.bwd.dh_pre", stream), quant(w_1, W, False, 1, "mlp.bwd.w_1", stream),
           stream=stream)

    ops = dict(attn_qkv_fwd=attn_qkv_fwd, attn_qkv_bwd=attn_qkv_bwd, attn_out_fwd=attn_out_fwd,
               attn_out_bwd=attn_out_bwd, mlp_fwd=mlp_fwd, mlp_bwd=mlp_bwd,
               loss_fwd=bf["loss_fwd"], loss_bwd=bf["loss_bwd"])
    if scope == "fp8-fwd":                               # the backward in bf16
        ops.update(attn_qkv_bwd=bf["attn_qkv_bwd"], attn_out_bwd=bf["attn_out_bwd"], mlp_bwd=bf["mlp_bwd"])
    for name, f in ops.items():
        if not name.startswith("loss"):
            f.precision = scope                      # (fp8-fwd's backward: cuBLASLt's bf16 closures, made here)
    return ops

