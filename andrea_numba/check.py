"""The agreement harness: every CUDA kernel against its NumPy twin, on the same inputs.

    python -m andrea_numba.check                   # tiny size (NUMBA_ENABLE_CUDASIM=1 without a GPU)
    python -m andrea_numba.check --size 120M       # on a GPU
    python -m andrea_numba.check --json            # {"ok", "device", "seed", "results": [...]}

It reads the op cases of andrea_numba/cases.py: for each op (and the products and optimiser
kernels) it draws random inputs (seeded; the seed is printed), runs the twin in float64, then
EVERY version of every launcher (kernels.<module>.VERSIONS) at EVERY block size it declares, in
float32 on float32 copies of the same inputs, and compares every output and
every gradient: max abs error, relative error (max abs error / max |ref|) and the tolerance, of the
form |kernel - ref| <= atol + rtol * |ref| element by element, with atol scaled to the tensor
(atol = a * max|ref|). Before each launch it
  - fills every output buffer with NaN, so an element a kernel forgets to write fails;
  - pre-fills every parameter-gradient buffer with random values P and checks buffer - P, so a
    kernel that writes (=) instead of adding (+=) fails;
  - runs everything twice and demands bit-identical results (determinism).
Then it checks the whole model (GPUModel) the same way: the loss and every gradient tensor
against reference.model, and a bit-identical second run.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import sys
import time

import numpy as np
from numba import cuda

import reference as R
from reference.precision import FP8_SCOPES, as_grad, backward_products

from . import cli
from .cases import CASES, Dims, call
from .config import ModelConfig, exit_on_config_error, load_config
from .kernels.common import SIMULATOR, BlockDoesNotFit, device_name
from .recipes import RECIPES, recipe_for, resolve
from .layout import init_params, param_layout
from .loss_scale import INIT as LOSS_SCALE_INIT

# (rtol, a): one op in float32 against float64. fp32 keeps 24 significant bits, u = 2^-24 = 6e-8;
# an op's output passes through a chain of roundings (a sum of K terms, in any order and split,
# is within K u sum|terms| of exact, and the sum's random walk makes it about sqrt(K) u in
# practice) and the products of 3xTF32 drop terms near 2^-22 of each product. 1e-5 is about 170 u:
# room for those at the 12M and 120M shapes, while an output scaled by 1.0001 or with one term of
# a 1000-term sum dropped fails.
OP_TOL = (1e-5, 1e-5)
# The loss's probabilities p_j = exp(l_j - max) / sum carry the logits' absolute error as a relative
# one: dp_j = p_j (dl_j - sum_i p_i dl_i), so |dp_j| <= 2 p_j max|dl|, and the logits are sums of C
# products whose size grows with the model (on the H200 at 120M the probabilities of loss_fwd v1
# were 2.6e-5 of their largest value from the twin, 2026-11-30; 6.1e-6 at 12M on the H100,
# 2026-12-06). They are judged element by element against their own size: rtol 1e-4.
TENSOR_TOL = {("loss", "probs"): (1e-4, 1e-5)}
# The whole model: float32 rounding compounds over the layers. Measured on an H200 (CHANGELOG.md):
# the worst gradient tensor reaches max|err| / max|ref| = 7.3e-6 at 120M. With a = 1e-4 and rtol 1e-3
# a tensor off by 1% fails (its largest element is off by 1e-2 max|ref| > (1e-4 + 1e-3) max|ref|).
MODEL_TOL = (1e-3, 1e-4)
MODEL_DROPOUT = 0.1         # the whole-model check is a training forward: dropout on, at every site
# With bf16 products the kernels and the twin round slightly different values (fp32 against
# float64) to bf16, and where one lies at a rounding boundary they round it to neighbours; over the
# layers and the backward these differences add up: on the H200 every gradient tensor of the
# whole model landed within 7.2e-3 (12M) and 8.9e-3 (120M) of its largest value from the twin at
# bf16 (medians 3.7e-3 and 4.7e-3; 2026-12-02). The bf16 check allows a = 2^-5 (eight units of bf16
# rounding): it catches a kernel that is wrong (errors of the order of the values), not one 1% off;
# the fp32 check (MODEL_TOL) and the op checks are the sharp ones.
# fp16 keeps 11 significant bits to bf16's 8 but only 5 exponent bits: checked as it trains, with the
# loss scaled (MODEL_DLOSS): unscaled, the gradients of the attention weights (about 1e-6) reach the
# products as fp16 subnormals, whose spacing is 6e-8 whatever the value, and on the H200 one of them
# landed 3.4% of its scale from the twin (2026-12-02, d h2.attn.w_q at 12M): the underflow that loss
# scaling exists to prevent (lesson 10), not a wrong kernel. It keeps bf16's allowance.
MODEL_TOLS = {"fp32": MODEL_TOL, "bf16": (1e-3, 2.0 ** -5), "fp16": (1e-3, 2.0 ** -5)}   # by the products' precision
# FP8: the same effect with steps 16 times bf16's (E4M3's u = 2^-4): a = 2^-2 catches a
# wrong kernel (errors of the order of the values) and nothing finer; the op checks are the sharp ones.
MODEL_TOLS.update({scope: (1e-3, 2.0 ** -2) for scope in FP8_SCOPES})
# Once attention runs its products in bf16 too (attn_flash_fwd_bf16 and its kin), the gradients of W_Q
# and W_K stand apart: they reach the weights through the softmax's backward, dS = P (dP - D), where
# dP and D nearly cancel, so one rounding that the kernel and the twin resolve to neighbours (in P,
# dO or V) moves dS by a unit of dP's rounding, not of dS's. On the H200 at 120M (B = 1, T = 1024,
# 2026-12-02) they reached 2.4-3.7% of their scale in bf16 where every other tensor stayed within
# 0.78%; in fp16 (8x finer rounding) 0.29-0.46% against 0.10%: the same factor of about 5 at both
# precisions, the mark of rounding carried through a cancellation rather than of a wrong kernel. At
# bf16 and fp16 those two tensors get twice the allowance, 2^-4; the rest keep 2^-5. Not at FP8: its
# 2^-2 doubled would pass a gradient at half its value (the FP8 model rows' worst tensor, W_Q and W_K
# among them, was 19% of its scale on the H200, 2026-12-03, inside 2^-2 undoubled).
SCORE_GRADS = ("attn.w_q", "attn.w_k")          # the weights whose gradients pass through dS
SCORE_GRADS_DOUBLED = ("bf16", "fp16")          # the precisions whose allowance doubles for them


def model_tol(precision: str, tensor: str):
    """The whole-model check's (rtol, a) for one gradient tensor ("d h3.attn.w_q", "loss") at the
    products' precision: MODEL_TOLS, doubled for W_Q's and W_K's at bf16 and fp16 (SCORE_GRADS)."""
    rtol, a = MODEL_TOLS[precision]
    return (rtol, 2 * a) if precision in SCORE_GRADS_DOUBLED and tensor.endswith(SCORE_GRADS) else (rtol, a)
# A model that rounds its products' inputs otherwise than the kernels do (toward zero), or not at
# all, is told apart from theirs by which twin it lands nearest. The kernels and the twin at their
# precision round a few values near a halfway point to different neighbours, and over the layers
# these carry the kernels' gradients as far from the twin as 2e-2 of a tensor's scale at 12M (on
# the H100, 2026-12-07), no nearer than a model that does not round at all: no allowance can tell
# the two apart. But every tensor of the kernels' model is nearer the twin than the truncating twin
# (reference.precision.truncating; at 12M at most 0.49 of that twin's distance from the twin), and
# most tensors are nearer the twin than the unrounded (fp32) twin. So at bf16 and fp16 a gradient
# row also fails when the tensor is nearer the truncating twin, and each model gets a row "nearer
# the twin than the unrounded twin" over its gradient tensors, which fails below NEARER_SHARE of
# them (the kernels' model; a model that does not round is nearer the unrounded twin in nearly all).
NEARER_SHARE = 0.75
MODEL_DLOSS = {"fp16": LOSS_SCALE_INIT}       # the backward's dloss by precision (1 elsewhere): the trainer's first scale

# (B, T) of the op checks and of the whole-model check, by size. The op shapes cross tile edges:
# B*T rows are not a multiple of any tile's rows and T spans several attention tiles (in the
# simulator, T = 13 walks two query tiles of 8 and two key tiles of 8); the simulator needs small ones.
SHAPES = {"tiny": ((3, 13), (2, 8)), "12M": ((3, 500), (4, 512)), "120M": ((2, 1000), (1, 1024))}
# The op rows' vocabulary where it is smaller than the model's: at the tiny size (the simulator,
# CI) the loss case's 256 byte ids made it the harness's slowest case by far (its classifier
# products and softmax rows grow with V; about 180 of 500 s on a 2-core CPU). 72 ids still cross
# the simulator's 32-wide product tiles (two whole tiles and a part of a third) and the softmax's
# block-strided loops. The whole-model rows keep the model's vocabulary.
OP_VOCAB = {"tiny": 72}


def to_dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def to_host(d):
    return d.copy_to_host() if hasattr(d, "copy_to_host") else np.array(d)


def compare(op, name, got, ref, tol, prefill=None, repeat=None, bound=None, **labels) -> dict:
    """One result row. got: kernel output (float32); ref: twin (float64); prefill: the values an
    accumulating buffer held before the launch; repeat: the same output from a second run;
    bound: an elementwise allowance added to the tolerance (a low-precision version against the
    fp32 twin: what rounding its inputs may move each output by); labels: kernel, version, block."""
    rtol, a = tol
    g = got.astype(np.float64) - (0 if prefill is None else prefill.astype(np.float64))
    ref = np.asarray(ref, dtype=np.float64).reshape(g.shape)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    atol = a * scale if scale > 0 else 1e-12
    err = np.abs(g - ref)
    max_err = float(np.max(err)) if err.size else 0.0
    finite = bool(np.all(np.isfinite(g)))
    extra = 0.0 if bound is None else np.broadcast_to(np.asarray(bound, np.float64), g.shape)
    allowed = atol + rtol * np.abs(ref) + extra
    within = finite and bool(np.all(err <= allowed))
    bitwise = True if repeat is None else bool(np.array_equal(got, repeat, equal_nan=True))
    return {"op": op, **labels, "tensor": name,
            "max_abs_err": max_err if finite else math.inf,
            "rel_err": (max_err / scale if scale > 0 else max_err) if finite else math.inf,
            "tol": {"atol": atol, "rtol": rtol, **({} if bound is None else {"bound": "input rounding"})},
            "bitwise_repeat": bitwise,
            "ok": within and bitwise}


def poisoned_buffers(outs: dict, scratch: dict | None) -> dict:
    """Host arrays for a launch's outputs (name -> shape: float32 NaN) and work buffers
    (name -> (shape, dtype): NaN, or -7 for integers), so that a value it does not write shows."""
    poisoned = {k: np.full(shape, np.nan, np.float32) for k, shape in outs.items()}
    poisoned.update({k: np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -7, dtype)
                     for k, (shape, dtype) in (scratch or {}).items()})
    return poisoned


def run_op(op, launch, inputs, outs, accums, refs, tol=OP_TOL, rng=None, scratch=None, also=None, **labels):
    """Launch an op's kernels twice on fresh buffers and compare with the twin.
    inputs: name -> host array, copied before each run (some kernels update in place);
    outs: name -> shape of a float32 output (NaN-poisoned before each run);
    accums: names of += buffers (pre-filled with the same random values before each run);
    refs: name -> float64 twin result (for accums: the amount to be added);
    scratch: name -> (shape, dtype) of a work buffer (poisoned too: NaN, or -7 for integers);
    also: (refs, bounds, suffix): the same outputs compared again, with another twin and an
    elementwise allowance per output (a low-precision version against the fp32 twin), rows
    named name + suffix."""
    prefill = {k: rng.standard_normal(np.shape(refs[k])).astype(np.float32)
               * np.float32(max(1e-3, float(np.max(np.abs(refs[k]))))) for k in accums}
    poisoned = poisoned_buffers(outs, scratch)
    runs = []
    for _ in range(2):
        d = {k: to_dev(v) for k, v in {**inputs, **poisoned, **prefill}.items()}
        launch(d)
        cuda.synchronize()
        runs.append({k: to_host(d[k]) for k in refs})
    tols = {k: TENSOR_TOL.get((op, k), tol) if tol == OP_TOL else tol for k in refs}
    rows = [compare(op, k, runs[0][k], refs[k], tols[k], prefill.get(k), runs[1][k], **labels) for k in refs]
    if also is not None:
        refs2, bound, suffix = also
        rows += [compare(op, k + suffix, runs[0][k], refs2[k], tol, prefill.get(k), runs[1][k], bound=bound[k],
                         **labels) for k in refs2]
    return rows


def f32(a):
    return np.asarray(a, dtype=np.float32)


def _is_array(v):
    return isinstance(v, np.ndarray) and v.ndim > 0


def _kernel_value(v):
    """What a kernel receives for a twin value: float arrays as float32, ints as int32 or uint8."""
    if not _is_array(v):
        return v
    return v if v.dtype.kind in "iu" else f32(v)


def _rounded(values: dict) -> dict:
    """The inputs rounded to float32 (then float64 for the twin): twin and kernels see the same numbers."""
    return {k: (f32(v).astype(np.float64) if _is_array(v) and v.dtype.kind == "f" else v) for k, v in values.items()}


def reference_for(case, direction, dims, rng):
    """(values, refs, outputs, accums): the values a launcher is called with (inputs, and for the
    backward the upstream gradients and the forward's saved outputs), the twin's float64 results,
    the output names and the += outputs."""
    values = _rounded(case.make(dims, rng))
    outs = case.forward(values)
    if direction == "fwd":
        return values, outs, case.fwd_out, (case.accumulate if case.bwd is None else ())
    values = {**values, **_rounded(case.upstream_for(outs, rng)), **_rounded(outs)}
    return values, case.backward(values), case.bwd_out, case.accumulate


# Versions whose products round their inputs below fp32 (launch.precision, e.g. matmul v10: "bf16")
# are checked twice. Against the twin run with the same precision (the twins' products go through
# reference.precision.mm, which rounds their inputs as the kernels do): both then multiply the same
# numbers, every product of two bf16 is exact, and only the order of the fp32 sums differs, so the
# fp32 tolerance OP_TOL holds. And against the fp32 twin, within an allowance added to OP_TOL
# element by element. For a plain product the allowance is what the rounding of the inputs may
# move each output by,
#     (2u + u^2) sum_k |a_ik| |b_kj|,   u = 2^-8 for bf16 (half the gap between neighbours at 1.0)
# (precision.error_bound): a version that rounds more, or rounds the wrong values, fails it.
# For an op with more than a product (GELU or a softmax between two products) it is twice the
# largest distance between the low-precision twin and the fp32 twin over the tensor: the row then
# reports how far the rounding took the op from fp32, and fails a kernel much farther away.
#
# An op that computes a product's input itself (the MLP's h = gelu(x @ W_1) and dh_pre, the loss
# backward's dlogits) rounds a value the kernel holds in fp32 and the twin in float64. Where such a
# value lies within their difference (about 1e-7 of it) of a point halfway between two bf16 values,
# kernel and twin round it to different neighbours: one term of a sum over K off by u = 2^-8 of
# itself, about u / sqrt(K) of the output's scale. The first check of those ops allows
# LOW_PRECISION_TOL: on the H200 at 12M (K = 384 and 1536) the MLP's bf16 version reached 4.2e-4 of
# the scale against the bf16 twin (2026-12-02), where a = 1e-4 had been the limit.
# Flash attention in bf16 or fp16 (v11, v12) rounds values it computes itself too (the unnormalised
# probabilities, ds), in fp32 where the twin has float64: the twin run at bf16 in float32 against
# float64 (the same effect, emulated) needed a = 4.3e-4 at the tiny size over 200 seeds, 1.7e-4 at
# 12M and 1.5e-4 at 120M (fp16: 8.6e-5, 4.3e-5, 6e-5); a = 1e-3 leaves room for the tensor core's
# own sums, and still fails a bf16 kernel that rounds the normalised probabilities instead
# (1.4e-3 to 4.3e-3).
LOW_PRECISION_TOL = {"mlp": (1e-5, 2e-3), "loss": (1e-5, 2e-3), "attn_flash": (1e-5, 1e-3)}   # (rtol, a), by case
# FP8 products (kernels/fp8_products.py) against the twin at the same scope: both quantize
# the same fp32 inputs to the same bytes (reference.fp8.quantize_gpu), so a plain product differs by
# its sums alone. Those are not fp32's: on the H200 (cuBLASLt 13.1, 2026-12-03) the FP8 products
# landed 1.4e-4 to 3.8e-4 of the output's scale from float64 sums of the same bytes at K = 384 to
# 8192 (fp32 sums: about 1e-7), the tensor cores' FP8 accumulator keeping fewer bits than fp32
# between its promotions. They are allowed a = 2^-10 (9.8e-4). An op that quantizes a value it
# computed itself (the MLP's h and dh_pre) has the bf16 case's trap with steps 16 times as coarse and
# inputs 1e3 times as far apart: a value near a halfway point rounds to neighbours 2^-3 apart on the
# kernel and the twin; the MLP reached 1.25e-2 of its scale at 12M and 1.75e-2 at 120M; it is allowed 2^-5.
# A kernel with a wrong layout, format or scale is off by the order of the values (0.1 and more).
FP8_TOL = {"mlp": (1e-3, 2.0 ** -5)}
FP8_OP_TOL = (1e-3, 2.0 ** -10)


def low_precision_bound(case, precision, values, lp_ref, fp_ref, name):
    """The allowance of output `name` against the fp32 twin (the comment above)."""
    if case.fwd == "matmul":                  # a plain product: the bound from its inputs
        f = case.fixed
        return R.error_bound(values["a"], values["b"], precision, f.get("trans_a", False), f.get("trans_b", False))
    gap = np.abs(np.asarray(lp_ref[name], np.float64) - np.asarray(fp_ref[name], np.float64))
    return 2.0 * float(np.max(gap)) if gap.size else 0.0


def low_precision_reference(case, direction, ref, precision):
    """(ref with the twin's results recomputed at `precision`, the values the launcher gets staying
    as they were: it rounds them itself; the fp32 comparison `also` of _check_launcher: the fp32
    twin's results, each output's allowance, the rows' suffix). Worked out once per precision for
    all of an op's versions and blocks (op_rows)."""
    values, fp32_refs, outputs, accums = ref
    if precision in FP8_SCOPES and direction == "bwd":      # the backward's products at the scope's
        marked = {k: as_grad(v) if k in case.upstream else v for k, v in values.items()}   # (gradient operands)
        with R.products_in(precision), backward_products():
            refs = case.backward(marked)
    else:
        with R.products_in(precision):
            refs = case.forward(values) if direction == "fwd" else case.backward(values)
    bounds = {k: low_precision_bound(case, precision, values, refs, fp32_refs, k) for k in fp32_refs}
    return (values, refs, outputs, accums), (fp32_refs, bounds, f" vs fp32 twin ({precision} products)")


def launcher_args(case, launch, dims, values, refs, outputs, accums):
    """What one launcher is called with, as the names of its parameters pick it from a case's
    values (a launcher may do part of an op, as an exercise's does: only its outputs count):
    (inputs: host arrays as the kernels take them, outs: name -> shape of the outputs it writes,
    accums: the outputs it adds into, scratch: name -> (shape, dtype), scalars)."""
    names = inspect.signature(launch).parameters
    inputs = {k: _kernel_value(v) for k, v in values.items() if _is_array(v) and k in names}
    scalars = {k: v for k, v in values.items() if not _is_array(v) and k in names}
    outputs = [k for k in outputs if k in names]
    accums = [k for k in accums if k in outputs]
    outs = {k: np.shape(refs[k]) or (1,) for k in outputs if k not in inputs and k not in accums}
    scratch = {k: (shape(dims), dtype) for k, (shape, dtype) in case.scratch.items() if k in names}
    return inputs, outs, accums, scratch, {**scalars, **case.fixed}


def check_launcher(case, direction, launch, dims, rng, block=None, version=None, ref=None, tol=OP_TOL, low=None):
    """Rows for one launcher (one version at one block size) of an op against its twin, called
    with keyword buffers (launcher_args). A low-precision version (launch.precision) against the
    twin on rounded inputs, and its outputs again against the fp32 twin within the rounding's
    bound (the comment above low_precision_reference, which gives `low` when it is not given)."""
    ref = ref or reference_for(case, direction, dims, rng)
    precision = getattr(launch, "precision", None)
    if precision is None:
        return _check_launcher(case, direction, launch, dims, rng, block, version, ref, tol)
    lp, also = low or low_precision_reference(case, direction, ref, precision)
    if precision in FP8_SCOPES:
        tol = FP8_TOL.get(case.op, FP8_OP_TOL)
    else:
        tol = LOW_PRECISION_TOL.get(case.op, tol)
    return _check_launcher(case, direction, launch, dims, rng, block, version, lp, tol, also=also)


def _check_launcher(case, direction, launch, dims, rng, block, version, ref, tol, also=None):
    values, refs, outputs, accums = ref
    inputs, outs, accums, scratch, scalars = launcher_args(case, launch, dims, values, refs, outputs, accums)
    keep = [k for k in outputs if k in outs or k in accums or k in inputs]
    refs = {k: np.atleast_1d(refs[k]) for k in keep}
    if also is not None:
        also = ({k: np.atleast_1d(also[0][k]) for k in keep}, *also[1:])
    extra = {"block": block} if hasattr(launch, "blocks") else {}

    def run(d):
        call(launch, {**scalars, **d}, **extra)

    kernel = case.fwd if direction == "fwd" else case.bwd
    if block is None:
        block = getattr(launch, "blocks", ("default",))[0]
    return run_op(case.op, run, inputs, outs, accums, refs, tol, rng, scratch, also=also,
                  kernel=kernel, version=version, block=str(block).replace(" ", ""))


def op_rows(m: ModelConfig, B: int, T: int, rng, ops=None, versions=None, vocab=None, cases=None) -> list[dict]:
    """Every version of every launcher of every case (or of `ops`; only the version numbers in
    `versions`, if given), at every block size it declares, at rows N = B*T with the model's C, H
    and n_params, and the model's V or `vocab`. cases: the op cases (default the engine's, CASES; the
    lab's, lab/cases.py, hold the whole ladder)."""
    dims = Dims.of(m, B, T)
    if vocab:
        dims = dataclasses.replace(dims, V=vocab)
    rows = []
    for case in (cases or CASES).values():
        if ops and case.op not in ops:
            continue
        for direction in ("fwd", "bwd") if case.bwd else ("fwd",):
            ref = reference_for(case, direction, dims, rng)
            low = {}                                   # precision -> low_precision_reference, once
            for version, launch in case.versions(direction, versions).items():
                precision = getattr(launch, "precision", None)
                if precision is not None and precision not in low:
                    low[precision] = low_precision_reference(case, direction, ref, precision)
                for block in launch.blocks:
                    try:
                        rows += check_launcher(case, direction, launch, dims, rng, block, version, ref,
                                               low=low.get(precision))
                    except BlockDoesNotFit as e:       # e.g. a GPU flash block at the tiny size's head size 4
                        print(f"not checked at this size: {e}", file=sys.stderr)
    return rows


def model_rows(m: ModelConfig, B: int, T: int, rng, seed: int, recipe="fp32",
               attention=(False, True)) -> list[dict]:
    """The whole model: loss and every gradient tensor of GPUModel against reference.model, in a
    training forward with dropout (probability MODEL_DROPOUT, a key drawn from rng); once with the
    engine's attention ("model") and once with flash attention ("model, flash attention").
    recipe: GPUModel's (a Recipe or an engine recipe's name; its precision picks the twin's, and the
    tolerance: MODEL_TOLS);
    attention: which of the two to run (flash: True)."""
    from .gpu_model import GPUModel

    params = init_params(m, seed)
    params += f32(rng.standard_normal(params.size) * 0.01)       # break the symmetry of LN params
    tokens = rng.integers(0, m.vocab_size, size=(B, T)).astype(np.int32)
    targets = rng.integers(0, m.vocab_size, size=(B, T)).astype(np.int32)
    key = int(rng.integers(0, 2 ** 32))
    recipe = resolve(recipe)
    precision = recipe.precision
    if precision != "fp32":      # attention v2 has no bf16 / fp16 version: the flash model only
        attention = tuple(a for a in attention if a)
    dloss = MODEL_DLOSS.get(precision, 1.0)      # the gradients compared as the backward leaves them: scaled

    def twin(precision):
        loss, acts = R.model_forward(params.astype(np.float64), m, tokens, targets, MODEL_DROPOUT, key, precision)
        return np.concatenate([[float(loss)], R.model_backward(params.astype(np.float64), m, acts, dloss)])
    ref = twin(precision)
    wrong = {}                                  # the models the kernels must be nearer to the twin than
    if precision in R.precision.TRUNCATE:
        with R.precision.truncating():
            wrong["truncated"] = twin(precision)
        wrong["unrounded"] = twin("fp32")
    rows = []
    label = "" if precision == "fp32" else f", {precision} products"
    for op, flash in ((f"model{label}", False), (f"model, flash attention{label}", True)):
        if flash not in attention:
            continue
        model = GPUModel(m, B, T, dropout=MODEL_DROPOUT, flash=flash, recipe=recipe)
        model.params.copy_to_device(params)
        runs = []
        for _ in range(2):
            model.zero_grads()
            model.forward(tokens, targets, dropout_key=key)
            model.backward(dloss)
            cuda.synchronize()
            runs.append((np.array([model.read_loss()]), to_host(model.grads)))
        rows += model_compare(op, m, precision, runs, ref, wrong)
        del model                             # one model's buffers at a time (120M: several GB each)
    return rows


def model_compare(op, m, precision, runs, ref, wrong) -> list[dict]:
    """The whole model's rows: runs, two runs' (loss [1], flat gradient) of the kernels; ref, the
    twin's [loss, gradient...] at the precision; wrong, {"truncated", "unrounded": the same of the
    wrong models} below fp32 (else empty): each gradient row also fails nearer the truncating twin
    than the twin, and a last row gives the share of gradient tensors nearer the twin than the
    unrounded twin (NEARER_SHARE's comment)."""
    tensors = [("loss", slice(0, 1), runs[0][0], runs[1][0], MODEL_TOLS[precision])]
    tensors += [("d " + s.name, slice(1 + s.offset, 1 + s.end), runs[0][1][s.offset:s.end],
                 runs[1][1][s.offset:s.end], model_tol(precision, s.name)) for s in param_layout(m)]
    rows, nearer = [], []                # nearer: per gradient tensor, nearer the twin than the unrounded twin
    for name, sl, got, again, tol_t in tensors:
        row = compare(op, name, got, ref[sl], tol_t, repeat=again)
        if wrong:                        # the kernels' distance from each wrong model, as rel_err measures it
            far = {k: compare(op, name, got, w[sl], tol_t)["rel_err"] for k, w in wrong.items()}
            row = {**row, "wrong_models": far, "ok": row["ok"] and row["rel_err"] < far["truncated"]}
            if name != "loss":
                nearer.append(row["rel_err"] < far["unrounded"])
        rows.append(row)
    if wrong:
        share = sum(nearer) / len(nearer)
        rows.append({"op": op, "tensor": "share nearer the twin than the unrounded twin",
                     "max_abs_err": 1 - share, "rel_err": 1 - share, "tol": {"atol": 1 - NEARER_SHARE, "rtol": 0.0},
                     "bitwise_repeat": True, "ok": share >= NEARER_SHARE, "share": share})
    return rows


def run_checks(size="tiny", seed=None, batch=None, seq=None, ops=True, model=True, progress=None, only=None,
               versions=None, recipe="fp32", compile_workers=0, cases=None):
    """Rows of the op checks (every case, or the cases named in `only`; every version, or those
    numbered in `versions`) and of the whole model (GPUModel with `recipe`). compile_workers > 0
    (on a GPU): first the same checks with every launch recorded instead of run (their rows thrown
    away), every kernel they launch compiled on that many processes (andrea_numba.precompile) or loaded from
    the kernel cache (andrea_numba.kernel_cache), then
    the checks themselves, whose launches find their kernels compiled."""
    if compile_workers and not SIMULATOR:
        from .kernel_cache import KernelCache
        from .precompile import compile_ahead, record_launches
        launches = record_launches(lambda: run_checks(size, seed, batch, seq, ops, model, None, only, versions,
                                                      recipe, 0, cases))
        compile_ahead(launches, compile_workers, log=progress, cache=KernelCache.open(log=progress))
    cfg = load_config(size)
    m = cfg.model
    (ob, ot), (mb, mt) = SHAPES.get(size, ((2, min(8, m.context_length)),) * 2)
    ob, mb = batch or ob, batch or mb
    ot, mt = min(seq or ot, m.context_length), min(seq or mt, m.context_length)
    rng = np.random.default_rng(seed)
    rows = []
    if ops:
        t0 = time.time()
        rows += op_rows(m, ob, ot, rng, only, versions, vocab=OP_VOCAB.get(size), cases=cases)
        if progress:
            vocab = f" V={OP_VOCAB[size]}" if size in OP_VOCAB else ""
            progress(f"ops checked at B={ob} T={ot}{vocab} in {time.time() - t0:.1f} s")
    if model:
        t0 = time.time()
        rows += model_rows(m, mb, mt, rng, seed, recipe)
        if progress:
            progress(f"whole model checked at B={mb} T={mt} in {time.time() - t0:.1f} s")
    return rows


def launch_every_kernel():
    """Launch every kernel the harness uses once (lab/bench/ptxcheck.py compiles them this way)."""
    run_checks("tiny", seed=0)


def label(r) -> str:
    """What ran: "layernorm_bwd v2 [256]" (launcher, version, block), or the op for model rows."""
    if not r.get("kernel"):
        return r["op"]
    name = r["kernel"] if r["kernel"].startswith(r["op"]) else r["op"]       # "matmul a@b^T"
    return f"{name} v{r['version']} [{r['block']}]"


def format_table(rows) -> str:
    w = max([len(label(r)) for r in rows] + [10])
    head = f"{'kernel':<{w}} {'tensor':<18} {'max_abs_err':>11} {'rel_err':>9} {'atol':>9} {'rtol':>7}  repeat  result"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{label(r):<{w}} {r['tensor']:<18} {r['max_abs_err']:>11.2e} {r['rel_err']:>9.2e} "
                     f"{r['tol']['atol']:>9.1e} {r['tol']['rtol']:>7.0e}  "
                     f"{'same' if r['bitwise_repeat'] else 'DIFF':<6}  {'ok' if r['ok'] else 'FAIL'}")
    bad = sum(not r["ok"] for r in rows)
    lines += ["-" * len(head), f"{len(rows) - bad}/{len(rows)} agree"]
    return "\n".join(lines)


@exit_on_config_error
def main(argv=None, recipes=RECIPES, cases=None, prog="python -m andrea_numba.check") -> int:
    """The command line; recipes: the recipes --recipe may name, cases: the op cases it checks (the
    lab's entry, lab/check.py, adds its rungs to both)."""
    cases = cases or CASES
    ap = cli.Parser(prog=prog,
                    description="Check every CUDA kernel and the whole GPU model against the NumPy twin.")
    ap.add_argument("--size", default="tiny", type=cli.config, help="tiny, 12M, 120M or a config file (default tiny)")
    ap.add_argument("--seed", type=cli.seed, default=None, help="seed of the random inputs (default: fresh, printed)")
    ap.add_argument("--batch", type=cli.int_range(1, 4096), help="batch size B of the checks (default by size)")
    ap.add_argument("--seq", type=cli.int_range(1, 65536), help="sequence length T of the checks (default by size)")
    ap.add_argument("--ops-only", action="store_true", help="skip the whole-model check")
    ap.add_argument("--model-only", action="store_true", help="only the whole-model check (the engine's kernels)")
    ap.add_argument("--op", action="append", metavar="OP", type=cli.one_of(cases, "op"),
                    help=f"check only this op (repeatable): {', '.join(cases)}")
    ap.add_argument("--version", action="append", metavar="N", type=cli.int_range(1, 99),
                    help="check only this version number of each launcher (repeatable; default every version)")
    ap.add_argument("--recipe", type=cli.one_of(recipes, "recipe"),
                    help="the whole model's recipe, checked against the twin at its precision: "
                         f"{', '.join(recipes)} (default: the one a --precision fp32 run gets here, fp32-hopper "
                         "on compute capability 9.0 and fp32 elsewhere; cublas-* need a GPU with nvmath-python)")
    ap.add_argument("--compile-workers", type=cli.int_range(0, 64), default=0, metavar="N",
                    help="on a GPU: compile every kernel the checks launch on N processes first (default 0: each "
                         "at its first launch)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    if args.recipe is not None and (args.ops_only or args.op or args.version):
        cli.fail("argument --recipe: picks the whole model's recipe; it cannot be combined with --ops-only, "
                 "--op or --version")
    if args.model_only and (args.ops_only or args.op or args.version):
        cli.fail("argument --model-only: cannot be combined with --ops-only, --op or --version")
    T = load_config(args.size).model.context_length
    if args.seq is not None and args.seq > T:
        cli.fail(f"argument --seq: {args.seq} exceeds the model's context length ({T}): use at most {T}")
    if not SIMULATOR and not cuda.is_available():
        print("error: no CUDA GPU found: run on a GPU, or set NUMBA_ENABLE_CUDASIM=1 to use the simulator "
              "at --size tiny", file=sys.stderr)
        return 2
    if SIMULATOR and args.size not in ("tiny", "ANDREA-tiny"):
        print(f"note: {args.size} in the CUDA simulator will take very long; tiny is the simulator's size",
              file=sys.stderr)
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
    say = (lambda s: print(s, file=sys.stderr, flush=True))
    say(f"seed {seed}, device: {device_name()}")
    recipe = recipes[args.recipe] if args.recipe else recipe_for("fp32")
    rows = run_checks(args.size, seed, args.batch, args.seq, ops=not args.model_only,
                      model=not (args.ops_only or args.op or args.version), progress=say, only=args.op,
                      versions=args.version, recipe=recipe, compile_workers=args.compile_workers, cases=cases)
    ok = all(r["ok"] for r in rows)
    if args.json:
        print(json.dumps({"ok": ok, "device": device_name(), "seed": seed, "size": args.size, "results": rows},
                         indent=1))
    else:
        print(format_table(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
