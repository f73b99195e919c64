"""The library route: the linear ops' products through cuBLASLt, NVIDIA's matrix-product library.

Every product of the ladder in matmul.py is a kernel of ours. This module runs the same products
through the library that frameworks call (PyTorch's matmuls are cuBLAS/cuBLASLt), on the engine's
own device buffers, so that one harness checks both and one table times both: the reference that
our kernels are measured against, and the route the original engine took for its products.

    out (+)= op(a) @ op(b)        a, b, out: float32 device arrays, row major (the engine's buffers)

Precision:
    fp32   the operands as they are, CUBLAS_COMPUTE_32F: fp32 products and sums (no TF32), an SGEMM
    bf16   each operand first rounded to bf16 (ties to even) into a scratch copy by k_round_bf16
           (operands.round_into), then a bf16 x bf16 product with fp32 sums and an fp32 output: the
           products of matmul v10 (the twin at "bf16" rounds the same inputs the same way)
    fp16   the same with fp16 copies (k_round_fp16; matmul v11)
so the harness checks the bf16 and fp16 forms against the twin at that precision, as it checks
our own bf16 kernels (check.py, low_precision_reference). Why not hand cuBLAS the fp32 operands
with CUBLAS_COMPUTE_32F_FAST_16BF ("down-convert to bf16 as you go")? On the H200 (cuBLASLt 13.1,
2026-12-02) that ran TF32 kernels instead: errors 3e-4 of the output's scale where bf16 inputs
give 2.4e-3, the same kernels for FAST_16F, and 310-390 TFLOP/s where bf16 products run 580-790.
The library may pick any precision at least as good; the harness then compares unlike with like.

Row major against column major. cuBLAS stores matrices column by column (Fortran's order); our
buffers are row major. A row-major [R, C] array with row stride ld is, read column-major, the
matrix's transpose: [C, R] with leading dimension ld. So out = op(a) @ op(b) (row major, [M, N])
is, column-major, out^T = op(b)^T @ op(a)^T ([N, M]): cuBLAS is asked for D = op(A') op(B') with
A' = b and B' = a, swapped, each transposed by cuBLAS exactly when we did not transpose it
(lt_operands below; a test replays it with NumPy).

Determinism. A cuBLASLt product is bit-identical from run to run when the same algorithm runs
with the same workspace on the same GPU and library version. The first call of each shape asks
the library's heuristic for its best algorithm once, with a fixed workspace and with the
"in place" split-K reduction excluded (it adds the slices' partial sums into the output, with
counters in the workspace ordering them); algorithms that reduce slices in a workspace and then
in a separate kernel stay allowed. That plan is kept for the process: every later call of the
shape runs that algorithm. The library version goes into the trainer's run state.

Needs nvmath-python (NVIDIA's Python bindings of the CUDA math libraries: `pip install -e
".[cublas]"`) and a GPU; the simulator cannot run it (unavailable() says why, in one line).
"""
from __future__ import annotations

import functools
import importlib.util

import numpy as np
from numba import cuda

from ..config import ConfigError
from . import loss as L
from . import operands
from .common import SIMULATOR, address
from .mlp import gelu_bwd_vec4, gelu_fwd_vec4
# The 16-bit copies of the operands (operands.py, below every product that takes them), also by
# these names here: the model, the memory plan and the tests reach them through the library route.
from .operands import (ALIGN, COPIES, HELD, ROUND_GRID_THREADS, ROUND_THREADS, HeldCopies,  # noqa: F401
                       OperandCopies, bf16_bits, held_elements, k_round_bf16, k_round_fp16, operand_elements,
                       round_into, round_wide, scratch_bytes)

WORKSPACE_BYTES = 32 << 20          # cuBLASLt's scratch for every product (NVIDIA suggests 32 MiB on Hopper)
PRECISIONS = ("fp32", "bf16", "fp16")
OPERAND_TYPE = {"fp32": "CUDA_R_32F", "bf16": "CUDA_R_16BF", "fp16": "CUDA_R_16F",   # of A and B (C, D: fp32)
                "e4m3": "CUDA_R_8F_E4M3", "e5m2": "CUDA_R_8F_E5M2"}                # (FP8: kernels/fp8_products.py)
VERSION_OF = {"fp32": 20, "bf16": 21, "fp16": 22}   # matmul's version numbers of the library route


class LibraryUnavailable(ConfigError):
    """cuBLASLt cannot run here; str(err) is one line: why, and what to do."""


def unavailable() -> str | None:
    """Why the cuBLASLt route cannot run in this process (None: it can)."""
    if SIMULATOR:
        return "cuBLASLt products need a GPU: the CUDA simulator cannot run a library (use --products numba)"
    if importlib.util.find_spec("nvmath") is None:
        return 'cuBLASLt products need nvmath-python: pip install -e ".[cublas]" (or use --products numba)'
    return None


def require():
    reason = unavailable()
    if reason:
        raise LibraryUnavailable(reason)


def lt_operands(M: int, N: int, K: int, trans_a: bool, trans_b: bool, lda: int, ldb: int, ldc: int) -> dict:
    """The column-major call that computes row-major out[M, N] = op(a) @ op(b) (module docstring).
    lda, ldb, ldc: the row strides of a, b and out in elements. Returns cuBLAS's view:
    D[m, n] = op_A(A)[m, k] op_B(B)[k, n], A = b's memory, B = a's, each (rows, cols, ld) as stored."""
    return {"m": N, "n": M, "k": K,
            "trans_A": trans_b, "A": (K, N, ldb) if trans_b else (N, K, ldb),    # b stored [N, K] or [K, N]
            "trans_B": trans_a, "B": (M, K, lda) if trans_a else (K, M, lda),    # a stored [K, M] or [M, K]
            "D": (N, M, ldc)}


def _alignment(ptr: int) -> int:
    """The largest power of two (at most 256) that divides a device address: what the plan may assume."""
    a = 256
    while ptr % a:
        a //= 2
    return a


def _stream_pointer(stream) -> int:
    """A CUstream address from a numba stream, a cuda.core GraphBuilder (the trainer's graph capture:
    cuBLASLt is then recorded into the graph like our kernels) or 0 (the default stream)."""
    if not stream:
        return 0
    stream = getattr(stream, "stream", stream)          # a GraphBuilder: the stream it captures
    handle = stream.handle
    return int(getattr(handle, "value", handle) or 0)   # ctypes c_void_p or a cuda.bindings CUstream


def _row_stride(arr, name) -> int:
    """The row stride of a 2-D float32 array whose rows are contiguous, in elements."""
    if arr.ndim != 2 or arr.dtype != np.float32 or (arr.shape[1] > 1 and arr.strides[1] != 4):
        raise ValueError(f"cuBLASLt products take 2-D float32 arrays with contiguous rows: {name} "
                         f"is {arr.dtype} {arr.shape} with strides {arr.strides}")
    return max(arr.strides[0] // 4, arr.shape[1], 1)


class Library:
    """One cuBLASLt handle, its workspace (allocated here, before any step) and the plans of the
    shapes seen so far: (precision, shape, transposes, strides, alignments) -> (descriptors,
    algorithm). The bf16 and fp16 products round their operands into COPIES (operands.py) first."""

    def __init__(self):
        require()
        from nvmath.bindings import cublas, cublasLt        # optional (nvmath-python): require() checked it
        self.lt, self.cublas = cublasLt, cublas
        self.handle = cublasLt.create()
        self.version = int(cublasLt.get_version())
        self.workspace = cuda.device_array(WORKSPACE_BYTES, dtype=np.uint8)
        self.plans = {}
        self.one, self.zero = np.ones(1, np.float32), np.zeros(1, np.float32)    # alpha, beta (host)

    def _set(self, setter, obj, attr, value, dtype_of):
        buf = np.array([value], dtype=dtype_of(attr))
        setter(obj, attr, buf.ctypes.data, buf.nbytes)

    def plan(self, precision, op: dict, aligns: tuple, types=None, scales=None) -> tuple:
        """(descriptor, layouts, algorithm) of a product: operands of `precision` (OPERAND_TYPE), or of
        the two types (A's, B's: cuBLAS's A is our b) that `types` names (FP8: "e4m3", "e5m2"), with
        `scales` (FP8: the device addresses of A's and B's descales) set before the heuristic picks
        an algorithm, so that it picks one that scales."""
        import nvmath                                        # optional, as above
        lt, D, P = self.lt, self.lt.MatmulDescAttribute, self.lt.MatmulPreferenceAttribute
        cdt = nvmath.CudaDataType
        f32 = int(cdt.CUDA_R_32F)
        type_a, type_b = (int(getattr(cdt, OPERAND_TYPE[t])) for t in (types or (precision, precision)))
        desc = lt.matmul_desc_create(int(self.cublas.ComputeType.COMPUTE_32F), f32)     # fp32 sums, fp32 alpha/beta
        op_of = {False: int(self.cublas.Operation.N), True: int(self.cublas.Operation.T)}
        self._set(lt.matmul_desc_set_attribute, desc, D.TRANSA, op_of[op["trans_A"]], lt.get_matmul_desc_attribute_dtype)
        self._set(lt.matmul_desc_set_attribute, desc, D.TRANSB, op_of[op["trans_B"]], lt.get_matmul_desc_attribute_dtype)
        if scales:
            for attr, ptr in zip((D.A_SCALE_POINTER, D.B_SCALE_POINTER), scales):
                self._set(lt.matmul_desc_set_attribute, desc, attr, ptr, lt.get_matmul_desc_attribute_dtype)
        layouts = [lt.matrix_layout_create(type_a, *op["A"]), lt.matrix_layout_create(type_b, *op["B"]),
                   lt.matrix_layout_create(f32, *op["D"])]
        pref = lt.matmul_preference_create()
        dt = lt.get_matmul_preference_attribute_dtype
        self._set(lt.matmul_preference_set_attribute, pref, P.MAX_WORKSPACE_BYTES, WORKSPACE_BYTES, dt)
        allowed = int(lt.ReductionScheme.COMPUTE_TYPE) | int(lt.ReductionScheme.OUTPUT_TYPE)   # not INPLACE
        self._set(lt.matmul_preference_set_attribute, pref, P.REDUCTION_SCHEME_MASK, allowed, dt)
        for attr, align in zip((P.MIN_ALIGNMENT_A_BYTES, P.MIN_ALIGNMENT_B_BYTES, P.MIN_ALIGNMENT_C_BYTES,
                                P.MIN_ALIGNMENT_D_BYTES), aligns):
            self._set(lt.matmul_preference_set_attribute, pref, attr, align, dt)
        found = lt.MatmulHeuristicResult(1)
        count = np.zeros(1, np.int32)
        lt.matmul_algo_get_heuristic(self.handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref, 1,
                                     found.ptr, count.ctypes.data)
        lt.matmul_preference_destroy(pref)
        if count[0] < 1:
            raise LibraryUnavailable(f"cuBLASLt {self.version} has no algorithm for a {precision} product of "
                                     f"shape {op}: use --products numba")
        return desc, layouts, found               # found.ptr: its first member is the algorithm

    def matmul(self, out, a, b, trans_a, trans_b, accumulate, precision, stream):
        M, N = out.shape
        K = a.shape[0] if trans_a else a.shape[1]
        assert (b.shape[1] if trans_b else b.shape[0]) == K and (a.shape[1] if trans_a else a.shape[0]) == M \
            and (b.shape[0] if trans_b else b.shape[1]) == N, f"shapes {a.shape} {b.shape} -> {out.shape}"
        lda, ldb = _row_stride(a, "a"), _row_stride(b, "b")
        if precision != "fp32":                   # the operands' 16-bit copies, rows packed
            lda, ldb = a.shape[1], b.shape[1]
            a, b = COPIES.round(a, b, precision, stream)
        op = lt_operands(M, N, K, bool(trans_a), bool(trans_b), lda, ldb, _row_stride(out, "out"))
        ptr_a, ptr_b, ptr_out = address(a), address(b), address(out)
        aligns = (_alignment(ptr_b), _alignment(ptr_a), _alignment(ptr_out), _alignment(ptr_out))
        key = (precision, tuple(sorted((k, v) for k, v in op.items())), aligns)
        if key not in self.plans:
            self.plans[key] = self.plan(precision, op, aligns)
        desc, (la, lb, ld), found = self.plans[key]
        beta = self.one if accumulate else self.zero
        self.lt.matmul(self.handle, desc, self.one.ctypes.data, ptr_b, la, ptr_a, lb, beta.ctypes.data,
                       ptr_out, ld, ptr_out, ld, found.ptr, address(self.workspace), WORKSPACE_BYTES,
                       _stream_pointer(stream))


    def matmul_fp8(self, out, qa, qb, accumulate, stream):
        """out (+)= (qa's values) @ (qb's values)^T: qa [M, lda] and qb [N, ldb] FP8 operands, both
        K-major (kernels/fp8_products.py's Quant: codes, format, K, the device address of its
        descale), an fp32 product D = descale_a descale_b (A_q B_q) with fp32 sums: cuBLASLt's "TN"
        FP8 form (column-major D^T = B'^T A' with A' = qb transposed, B' = qa), the only one Hopper
        has. Each call points the plan's A and B scale pointers at the operands' descales."""
        M, N = out.shape
        K = qa.codes.shape[1]                     # padded to 16 bytes with zeros, which add nothing
        assert qb.k == qa.k and qb.codes.shape[1] == K and qa.codes.shape[0] == M and qb.codes.shape[0] == N, \
            f"FP8 operands {qa.codes.shape} {qb.codes.shape} (K = {qa.k}, {qb.k}) -> {out.shape}"
        op = lt_operands(M, N, K, False, True, K, K, _row_stride(out, "out"))
        ptr_a, ptr_b, ptr_out = address(qa.codes), address(qb.codes), address(out)
        aligns = (_alignment(ptr_b), _alignment(ptr_a), _alignment(ptr_out), _alignment(ptr_out))
        types = (qb.fmt, qa.fmt)                  # cuBLAS's A is our b
        key = ("fp8", types, tuple(sorted((k, v) for k, v in op.items())), aligns)
        if key not in self.plans:
            self.plans[key] = self.plan("fp8", op, aligns, types, (qb.descale, qa.descale))
        desc, (la, lb, ld), found = self.plans[key]
        D, dt = self.lt.MatmulDescAttribute, self.lt.get_matmul_desc_attribute_dtype
        self._set(self.lt.matmul_desc_set_attribute, desc, D.A_SCALE_POINTER, qb.descale, dt)
        self._set(self.lt.matmul_desc_set_attribute, desc, D.B_SCALE_POINTER, qa.descale, dt)
        beta = self.one if accumulate else self.zero
        self.lt.matmul(self.handle, desc, self.one.ctypes.data, ptr_b, la, ptr_a, lb, beta.ctypes.data,
                       ptr_out, ld, ptr_out, ld, found.ptr, address(self.workspace), WORKSPACE_BYTES,
                       _stream_pointer(stream))


@functools.cache
def library() -> Library:
    """The process's cuBLASLt handle and workspace (made at the first call: GPUModel makes it at setup)."""
    return Library()


def version() -> int:
    """cuBLASLt's version number (e.g. 130100 for 13.1.0), for run states and tables."""
    return library().version


# While andrea_numba.precompile records a step's launches (nothing may run), a product is skipped.
RECORDING = False


def _make_matmul(precision):
    def launch(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block=None, stream=0):
        if not RECORDING:
            library().matmul(out, a, b, trans_a, trans_b, accumulate, precision, stream)
    launch.__name__ = launch.__qualname__ = f"matmul_v{VERSION_OF[precision]}"
    launch.__doc__ = (f"out (+)= op(a) @ op(b) through cuBLASLt, {OPERAND_TYPE[precision]} operands, fp32 sums "
                      f"(work and block unused: the library picks its own tiles and split).")
    launch.blocks = ("cublasLt",)
    if precision != "fp32":
        launch.precision = precision
    return launch


MATMUL = {p: _make_matmul(p) for p in PRECISIONS}


def linear_ops(precision: str, N: int, C: int, V: int):
    """GPUModel's five linear-op launchers with every product through cuBLASLt at `precision`, for
    N = B*T rows, width C and vocabulary V (the 16-bit scratch reserved here, before any step); the
    GELU passes, the softmax and the loss are the engine's own kernels (mlp v12's, loss v9's). Same
    arguments and meaning as the engine's launchers (kernels/attn_qkv.py, attn_out.py, mlp.py,
    loss.py); the work buffers go unused (the library splits K itself, in its workspace)."""
    require()
    library()                                    # the handle and workspace, before the first step
    if precision != "fp32":                      # and the copies' scratch
        COPIES.reserve(*operand_elements(N, C, V))
    mm = MATMUL[precision]

    def attn_qkv_fwd(q, k, v, x, w_q, w_k, w_v, *, stream=0):
        """q, k, v = x @ W_q, x @ W_k, x @ W_v"""
        for out, w in ((q, w_q), (k, w_k), (v, w_v)):
            mm(out, None, x, w, stream=stream)

    def attn_qkv_bwd(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, stream=0):
        """dx = dq W_q^T + dk W_k^T + dv W_v^T (three products into one buffer); dW_* += x^T d*"""
        for i, (d, w) in enumerate(((dq, w_q), (dk, w_k), (dv, w_v))):
            mm(dx, None, d, w, trans_b=True, accumulate=i > 0, stream=stream)
        for dw, d in ((dw_q, dq), (dw_k, dk), (dw_v, dv)):
            mm(dw, None, x, d, trans_a=True, accumulate=True, stream=stream)

    def attn_out_fwd(out, y, w_o, *, stream=0):
        mm(out, None, y, w_o, stream=stream)

    def attn_out_bwd(dy, dw_o, work, dout, y, w_o, *, stream=0):
        mm(dy, None, dout, w_o, trans_b=True, stream=stream)                      # dy = dout W_O^T
        mm(dw_o, None, y, dout, trans_a=True, accumulate=True, stream=stream)     # dW_O += y^T dout

    def mlp_fwd(out, h_pre, h, work, x, w_1, w_2, *, stream=0):
        N, F = h.shape
        mm(h_pre, None, x, w_1, stream=stream)                                    # h_pre = x W_1
        gelu_fwd_vec4(h.reshape(N * F), h_pre.reshape(N * F), stream)               # h = gelu(h_pre)
        mm(out, None, h, w_2, stream=stream)                                      # out = h W_2

    def mlp_bwd(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, stream=0):
        N, F = h.shape
        mm(dw_2, None, h, dout, trans_a=True, accumulate=True, stream=stream)     # dW_2 += h^T dout
        mm(dh_pre, None, dout, w_2, trans_b=True, stream=stream)                  # dh = dout W_2^T
        gelu_bwd_vec4(dh_pre.reshape(N * F), h_pre.reshape(N * F), stream)          # dh_pre = dh gelu'(h_pre)
        mm(dw_1, None, x, dh_pre, trans_a=True, accumulate=True, stream=stream)   # dW_1 += x^T dh_pre
        mm(dx, None, dh_pre, w_1, trans_b=True, stream=stream)                    # dx = dh_pre W_1^T

    def loss_fwd(loss, losses, probs, x, wte, targets, *, stream=0):
        N, V = probs.shape
        mm(probs, None, x, wte, trans_b=True, stream=stream)                      # logits = x wte^T, into probs
        L.k_loss_fwd[N, L.row_threads(V, 1024), stream](losses, probs, targets)
        L.k_loss_mean[1, L.MEAN_THREADS, stream](loss, losses)

    def loss_bwd(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, stream=0):
        N, V = probs.shape
        L.k_loss_bwd[N, 256, stream](dlogits, probs, targets, np.float32(float(dloss) / N))
        mm(dx, None, dlogits, wte, stream=stream)                                 # dx = dlogits wte
        mm(dwte, None, dlogits, x, trans_a=True, accumulate=True, stream=stream)  # dwte += dlogits^T x

    ops = dict(attn_qkv_fwd=attn_qkv_fwd, attn_qkv_bwd=attn_qkv_bwd, attn_out_fwd=attn_out_fwd,
               attn_out_bwd=attn_out_bwd, mlp_fwd=mlp_fwd, mlp_bwd=mlp_bwd, loss_fwd=loss_fwd, loss_bwd=loss_bwd)
    for f in ops.values():
        if precision != "fp32":
            f.precision = precision
    return ops
