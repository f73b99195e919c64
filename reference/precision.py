"""Number formats below fp32, as the kernels round to them.

A float32 is 1 sign bit, 8 exponent bits and 23 mantissa bits. bfloat16 ("brain float") keeps the
sign and all 8 exponent bits, so its range is float32's, and only the top 7 mantissa bits: a
bf16 value is a float32 whose low 16 bits are zero. With the implicit leading 1 that is 8
significant bits: neighbours 2^-7 apart at 1.0, so a float32 rounded to the nearest bf16 moves by
at most half of that, u = 2^-8 of itself (about 0.4%: the unit roundoff).

Rounding to nearest, ties to even, on the bit pattern (what the GPU's cvt.rn.bf16x2.f32 does):

    bits = x viewed as uint32
    keep = bits >> 16                      # the bf16 that truncation would give
    bits += 0x7FFF + (keep & 1)            # past the halfway point (or at it, with keep odd): carry
    bf16 = bits & 0xFFFF0000               # a carry into the exponent is the right rounding too

A product of two bf16 values has at most 16 significant bits: it is exact in float32. That is
why the tensor cores multiply bf16 pairs and add in fp32, and why a bf16 product kernel and the
twin below agree to fp32 rounding once both see the same rounded inputs.
"""
import contextlib
import contextvars

import numpy as np


def round_bf16(x):
    """x (float32 or float64, any shape) rounded to the nearest bfloat16 (ties to even), returned
    as float32 (the low 16 bits zero). NaN stays NaN; values past bf16's largest finite value
    round to infinity, as the GPU's conversion does."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)           # room for the carry
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = bits.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out)


def round_fp16(x):
    """x rounded to the nearest IEEE half (fp16: 5 exponent bits, 10 mantissa bits, ties to even;
    past 65504: inf; below 6.1e-5 the subnormals, spaced 2^-24), returned as float32: NumPy's own
    float16, which rounds as the GPU's cvt.rn.f16x2.f32 does."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def truncate_bf16(x):
    """x cut to bfloat16 by dropping its low 16 bits: toward zero. Not what the kernels do; the
    whole-model check's wrong model, that a model rounding as the kernels do must be nearer to
    than to this (andrea_numba/check.py)."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(np.isnan(x), x, (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32))


def truncate_fp16(x):
    """x cut to fp16 toward zero: the nearest fp16, moved one step toward zero where it lies
    farther from zero than x."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16)
        past = np.abs(h.astype(np.float32)) > np.abs(x)
        h = np.where(past, np.nextafter(h, np.float16(0)), h)
    return h.astype(np.float32)


ROUND = {"bf16": round_bf16, "fp16": round_fp16}   # precision -> rounding of a product's inputs
TRUNCATE = {"bf16": truncate_bf16, "fp16": truncate_fp16}
_PRODUCTS = contextvars.ContextVar("products", default=None)
_TRUNCATE = contextvars.ContextVar("truncate", default=False)


@contextlib.contextmanager
def truncating():
    """Inside: the products' inputs are cut toward zero instead of rounded to nearest (the wrong
    model the whole-model check measures its distance from)."""
    token = _TRUNCATE.set(True)
    try:
        yield
    finally:
        _TRUNCATE.reset(token)


@contextlib.contextmanager
def products_in(precision):
    """Inside: the twins' products (mm) run at `precision` ("bf16": their inputs rounded; None or
    "fp32": exact). The twins keep the signatures of the math (and of the exercises)."""
    token = _PRODUCTS.set(None if precision == "fp32" else precision)
    try:
        yield
    finally:
        _PRODUCTS.reset(token)


def current():
    """The precision products_in set ("bf16", "fp16", an FP8 scope), or None: exact products."""
    return _PRODUCTS.get()


def mm(a, b):
    """a @ b as a product kernel of the current precision (products_in) computes it: exact by
    default; at "bf16" both inputs rounded to bf16 first (every product of two bf16 values is
    exact; the sums stay in the inputs' dtype); at an FP8 scope (FP8_SCOPES) see fp8_mm. The twins'
    products all go through here."""
    precision = _PRODUCTS.get()
    if precision is None:
        return a @ b
    if precision in FP8_SCOPES:
        return fp8_mm(precision, a, b)
    rnd = (TRUNCATE if _TRUNCATE.get() else ROUND)[precision]
    return rnd(a).astype(a.dtype) @ rnd(b).astype(b.dtype)


# FP8 (reference/fp8.py), simulated: each operand of a product quantized per tensor as the
# GPU quantizes it (quantize_gpu: scaled from its fp32 amax, rounded, scaled back), the product in
# float64. Which products, and to which format, is the scope's:
#     "fp8-fwd"    the forward's products in E4M3; the backward's in bf16 (as the GPU runs them)
#     "fp8-e5m2"   every product in E4M3, but a gradient operand of the backward's in E5M2
#     "fp8-all"    every product's operands in E4M3
# A model trained at an FP8 scope keeps attention's products and the classifier's in bf16 (the
# twin model enters higher() around them; reference/model.py): FP8 is for the linear layers.
# The backward is the code run inside backward_products(). A gradient operand is a Grad array: the
# caller marks the backward's upstream gradients (as_grad), NumPy carries the mark through the
# twins' arithmetic (a view, a product, a sum with a plain array are Grads too), and fp8_mm marks
# what it returns in the backward. fp8_log() collects, for every quantized operand, its format,
# shape, amax and the fractions that underflowed and saturated.
FP8_SCOPES = ("fp8-fwd", "fp8-e5m2", "fp8-all")
_BACKWARD = contextvars.ContextVar("backward", default=False)
_FP8_LOG = contextvars.ContextVar("fp8_log", default=None)


class Grad(np.ndarray):
    """An array that is (derived from) a gradient of the backward pass: its products' operand in
    E5M2 at scope "fp8-e5m2"."""


def as_grad(a):
    """a (an array or a number) marked as a gradient (a view: no copy)."""
    return np.asarray(a).view(Grad)


@contextlib.contextmanager
def backward_products():
    """Inside: the products are the backward pass's (their scope's backward formats)."""
    token = _BACKWARD.set(True)
    try:
        yield
    finally:
        _BACKWARD.reset(token)


@contextlib.contextmanager
def fp8_log():
    """Inside: every operand fp8_mm quantizes is recorded in the list this yields."""
    log = []
    token = _FP8_LOG.set(log)
    try:
        yield log
    finally:
        _FP8_LOG.reset(token)


@contextlib.contextmanager
def higher():
    """Inside: at an FP8 scope, the products run in bf16 (attention's and the classifier's, in a model
    trained at that scope); any other precision stays as it is."""
    token = _PRODUCTS.set("bf16" if _PRODUCTS.get() in FP8_SCOPES else _PRODUCTS.get())
    try:
        yield
    finally:
        _PRODUCTS.reset(token)


def fp8_mm(scope, a, b):
    """a @ b with a and b quantized per tensor (reference/fp8.py's quantize_gpu) as scope says (above)."""
    from .fp8 import E4M3, E5M2, quantize_gpu
    backward = _BACKWARD.get()
    if backward and scope == "fp8-fwd":
        out = round_bf16(a).astype(np.float64) @ round_bf16(b).astype(np.float64)
    else:
        ops = []
        for x in (a, b):
            fmt = E5M2 if backward and scope == "fp8-e5m2" and isinstance(x, Grad) else E4M3
            q = quantize_gpu(np.asarray(x), fmt)
            log = _FP8_LOG.get()
            if log is not None:
                log.append(dict(format=fmt.name, shape=tuple(np.shape(x)), backward=backward, amax=q.amax,
                                underflow=q.underflow, saturated=q.saturated))
            ops.append(q.values)
        out = ops[0] @ ops[1]
    return out.view(Grad) if isinstance(a, Grad) or isinstance(b, Grad) else out


# (u, e) of a format: rounding moves a value x by at most u |x| + e (e: half the spacing of its
# subnormals, where they matter for the inputs of a product; bf16's are fp32's, far below)
ROUNDING = {"bf16": (2.0 ** -8, 0.0), "fp16": (2.0 ** -11, 2.0 ** -25)}


def error_bound(a, b, precision, trans_a=False, trans_b=False):
    """Elementwise bound on |op(a) @ op(b) at `precision` - the exact product| from the rounding of
    the inputs alone: each input moves by at most u |x| + e (ROUNDING), so each product a_ik b_kj by
    at most (2u + u^2) |a_ik| |b_kj| + e (1 + u) (|a_ik| + |b_kj|) + e^2, summed over k (bf16:
    (2u + u^2) sum_k |a_ik| |b_kj|, u = 2^-8). An fp16 input past 65504 would be inf: none may be."""
    if precision in FP8_SCOPES:
        return fp8_error_bound(a, b, trans_a, trans_b)
    u, e = ROUNDING[precision]
    a, b = np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64))
    a, b = (a.T if trans_a else a), (b.T if trans_b else b)
    bound = (2 * u + u * u) * (a @ b)
    if e:
        bound += e * (1 + u) * (a.sum(axis=1, keepdims=True) + b.sum(axis=0, keepdims=True)) + a.shape[1] * e * e
    return bound


def fp8_error_bound(a, b, trans_a=False, trans_b=False):
    """error_bound for a forward product at an FP8 scope (both operands E4M3, scaled per tensor):
    an operand x moves by at most d_x = u |x| + e_x, u = 2^-4 (plus 2^-23 for the fp32 multiply by the
    scale), e_x half the smallest subnormal scaled back (2^-10 amax_x / 448); so a_ik b_kj by at most
    d_a |b| + |a| d_b + d_a d_b, summed over k."""
    from .fp8 import E4M3
    a, b = np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64))
    a, b = (a.T if trans_a else a), (b.T if trans_b else b)
    u = E4M3.unit_roundoff + 2.0 ** -23
    da, db = (u * x + E4M3.smallest / 2 * (x.max(initial=0.0) / E4M3.max_value) for x in (a, b))
    return da @ b + a @ db + da @ db
