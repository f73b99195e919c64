"""One table of op cases: everything the tools need to know about each op, in one place.

    from andrea_numba.cases import CASES, Dims
    case = CASES["layernorm"]
    values = case.make(Dims.of(model_config, B=3, T=13), rng)     # every input, float64 / int
    outs = case.forward(values)                                   # the twin: {"out", "mean", "rstd"}
    grads = case.backward({**values, **outs, **case.upstream_for(outs, rng)})   # {"dx", "dg", "db"}

An entry knows the op's NumPy twin (reference.<fwd>, reference.<bwd>), its kernel module (with
VERSIONS of every launcher), how to make random inputs at given sizes, the names of the forward's
outputs and the backward's outputs, which backward outputs the kernels add into (+=), the upstream
gradients and which output each belongs to, and the kernels' work buffers. The agreement harness
(check.py), the gradient checks (gradcheck.py), the exercise grader (exercises.py), lesson 03 and
lab/bench/kernels.py all read this table; none keeps a list of its own.

Names are the contract. The twin's forward returns its outputs in the order of `fwd_out`, its
backward in the order of `bwd_out`; a backward output is named "d" + the input it differentiates.
Every kernel launcher takes, as keywords, its outputs, then its work buffers, then exactly the
twin's arguments in the twin's order (llm.c's order: outputs, inputs, weights, sizes), then
`block` and `stream`. So `launch(**buffers)` and `twin(**values)` are called from one dict, and a
student can diff a launcher's signature against its twin's line by line (tests/test_cases.py
checks it for every version).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable

import numpy as np

import reference as R

from .kernels import (attn, attn_flash, attn_out, attn_qkv, dropout, embed, layernorm, loss, matmul, mlp, optim,
                      residual)
from . import recipes
from .kernels.matmul import splitk_work


@dataclass(frozen=True)
class Dims:
    """The sizes an op case is made at. N = B*T rows; P = elements of a flat parameter vector."""
    B: int
    T: int
    C: int
    H: int
    V: int
    T_max: int
    P: int = 64
    eps: float = 1e-5

    @property
    def N(self) -> int:
        return self.B * self.T

    @classmethod
    def of(cls, m, B: int, T: int) -> "Dims":
        """The model's C, H, V and context length (and its n_params for the optimiser kernels)."""
        from .layout import n_params
        return cls(B, T, m.d_model, m.n_head, m.vocab_size, m.context_length, n_params(m), m.ln_eps)


def call(fn: Callable, values: dict, **extra):
    """fn(**the entries of values that fn takes), so one dict feeds the twin and every launcher."""
    names = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in values.items() if k in names}, **extra)


@dataclass(frozen=True)
class OpCase:
    op: str                      # name of the op (a row of the kernel table)
    module: ModuleType           # andrea_numba.kernels.<module> (its rungs), or lab.<module> (VERSIONS: every rung)
    fwd: str                     # launcher and twin name of the forward ("layernorm_fwd")
    fwd_out: tuple               # what the twin's forward returns, in order
    make: Callable               # make(dims, rng) -> {name: value} of every input
    bwd: str | None = None       # launcher and twin name of the backward (None: no backward)
    bwd_out: tuple = ()          # what the twin's backward returns, in order
    accumulate: tuple = ()       # backward outputs the kernels add into (+=)
    upstream: dict = field(default_factory=dict)     # upstream gradient -> forward output it belongs to
    scratch: dict = field(default_factory=dict)      # kernel work buffer -> (shape(dims), dtype)
    fixed: dict = field(default_factory=dict)        # launcher arguments this case fixes (matmul's transposes)
    twin: str | None = None      # the twin's name when it is not the launcher's (AdamW v2's: adamw_zero)
    only: tuple = ()             # the launcher versions this case checks (empty: all of them)

    # -- the twin --
    @property
    def twin_fwd(self) -> Callable:
        return getattr(R, self.twin or self.fwd)

    @property
    def twin_bwd(self) -> Callable:
        return getattr(R, self.bwd)

    def forward(self, values: dict, twin=None) -> dict:
        """The twin's forward (or `twin`, a function with its signature) as {fwd_out name: value}."""
        out = call(twin or self.twin_fwd, {**values, **self.fixed})
        return dict(zip(self.fwd_out, out if len(self.fwd_out) > 1 else (out,)))

    def backward(self, values: dict, twin=None) -> dict:
        """The twin's backward (or `twin`) as {bwd_out name: value}; values holds the upstream
        gradients, the inputs and the forward's outputs."""
        out = call(twin or self.twin_bwd, values)
        return dict(zip(self.bwd_out, out if len(self.bwd_out) > 1 else (out,)))

    def upstream_for(self, outs: dict, rng) -> dict:
        """A random upstream gradient for each differentiable output (a float for a scalar loss)."""
        g = {}
        for name, out in self.upstream.items():
            shape = np.shape(outs[out])
            g[name] = float(rng.standard_normal()) if shape == () else rng.standard_normal(shape)
        return g

    def differentiable(self) -> tuple:
        """The inputs the backward differentiates: "dx" -> "x"."""
        return tuple(name[1:] for name in self.bwd_out)

    # -- the kernels --
    def versions(self, direction: str = "fwd", numbers=None) -> dict:
        """{version: launcher} of the forward ("fwd") or backward ("bwd") launcher (those in
        `only`, when the case names some: the others are another case's; and of those, the
        version numbers in `numbers`, when given: --version of the harness and the benchmarks).
        An engine module's are the launchers that declare their rung (the engine's and the simple
        pair the lessons teach: engine_versions); a lab module's (lab/, the same case with module=lab.<module>) are its
        VERSIONS, the whole ladder."""
        name = self.fwd if direction == "fwd" else self.bwd
        versions = getattr(self.module, "VERSIONS", {}).get(name) or engine_versions(self.module, name)
        return {v: launch for v, launch in versions.items()
                if (not self.only or v in self.only) and (not numbers or v in numbers)}

    def engine(self, direction: str = "fwd") -> Callable:
        """The launcher the engine runs for this op in fp32: the fp32 recipe's (andrea_numba/recipes.py)
        for the ops of a recipe, the products' (matmul_tf32x3) for matmul, else the op's highest rung
        in the engine (attn_bwd_tiled for GPUModel(flash=False), adamw, ...)."""
        name = self.fwd if direction == "fwd" else self.bwd
        if self.op in _RECIPE_OP:
            return recipes.get("fp32").kernels[_RECIPE_OP[self.op]][direction == "bwd"]
        if self.fwd == "matmul":
            return matmul.matmul_tf32x3
        rungs = engine_versions(self.module, name)
        return rungs[max(rungs)]


def engine_versions(module: ModuleType, name: str) -> dict:
    """{rung: launcher} of an engine module's launchers of one op: those named `name` or
    `name_<what it is>` (not `name_bwd...`, the backward of a forward named `name`) that declare
    their rung of the ladder (common.rung), by rung."""
    found = {}
    for attr, value in vars(module).items():
        what = attr[len(name) + 1:] if attr.startswith(name + "_") else None
        if (attr == name or (what and not what.startswith("bwd"))) and callable(value) and hasattr(value, "rung"):
            found[value.rung] = value
    return dict(sorted(found.items()))


# the op cases whose kernels a recipe names, and the recipe's name for each
_RECIPE_OP = dict(embed="embed", layernorm="layernorm", attn_qkv="attn_qkv", attn_flash="attention", attn_out="attn_out",
                  residual_layernorm="residual_layernorm", mlp="mlp", loss="loss")


# ---------------------------------------------------------------------------------------------
# input makers: float64 arrays (and int token ids), drawn from rng at the given sizes

def _normal(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


def _embed(d: Dims, rng):
    # token ids with repeats, shaped like text: one id in 30% of the positions (the space is 30% of
    # the default corpus), the others spread over min(V, N / 3) ids. Uniform ids hid what made
    # embed_bwd v2 slow in training (one block walking the common token's 2,400 positions).
    spread = rng.integers(0, min(d.V, max(2, d.N // 3)), size=(d.B, d.T))
    tokens = np.where(rng.random((d.B, d.T)) < 0.3, min(d.V - 1, 1), spread).astype(np.int32)
    return dict(tokens=tokens, wte=_normal(rng, d.V, d.C), wpe=_normal(rng, d.T_max, d.C),
                vocab_size=d.V, context_length=d.T_max)


def _layernorm(d: Dims, rng):
    return dict(x=_normal(rng, d.N, d.C), g=1 + _normal(rng, d.C, scale=0.5), b=_normal(rng, d.C, scale=0.5),
                eps=d.eps)


def _attn_qkv(d: Dims, rng):
    s = 1 / math.sqrt(d.C)
    return dict(x=_normal(rng, d.N, d.C), w_q=_normal(rng, d.C, d.C, scale=s), w_k=_normal(rng, d.C, d.C, scale=s),
                w_v=_normal(rng, d.C, d.C, scale=s))


# dropout in the cases: a probability high enough that a tiny case drops many elements, and a
# key drawn from rng. The mask is a function of the key and the index only, so it is the same in
# every evaluation of a gradient check: the mask is fixed, the finite differences see a smooth op.
DROPOUT_P = 0.25


def _dropout_key(rng):
    return int(rng.integers(0, 2 ** 32))


def _attn(d: Dims, rng):
    return dict(q=_normal(rng, d.B, d.T, d.C), k=_normal(rng, d.B, d.T, d.C), v=_normal(rng, d.B, d.T, d.C),
                n_head=d.H, dropout_p=DROPOUT_P, dropout_key=_dropout_key(rng))


def _attn_out(d: Dims, rng):
    return dict(y=_normal(rng, d.N, d.C), w_o=_normal(rng, d.C, d.C, scale=1 / math.sqrt(d.C)))


def _mlp(d: Dims, rng):
    F = 4 * d.C
    return dict(x=_normal(rng, d.N, d.C), w_1=_normal(rng, d.C, F, scale=1 / math.sqrt(d.C)),
                w_2=_normal(rng, F, d.C, scale=1 / math.sqrt(F)))


def _dropout(d: Dims, rng):
    return dict(x=_normal(rng, d.N * d.C), dropout_p=DROPOUT_P, dropout_key=_dropout_key(rng))


def _residual(d: Dims, rng):
    return dict(x=_normal(rng, d.N * d.C), f=_normal(rng, d.N * d.C))


def _loss(d: Dims, rng):
    return dict(x=_normal(rng, d.N, d.C), wte=_normal(rng, d.V, d.C, scale=0.5),
                targets=rng.integers(0, d.V, size=d.N).astype(np.int32))


def _matmul(trans_a, trans_b, deep=False):
    def make(d: Dims, rng):
        M, K, N = (d.N, DEEP_K, DEEP_N) if deep else (d.N, d.C, 4 * d.C)      # deep, or an MLP-like product
        a = _normal(rng, K, M) if trans_a else _normal(rng, M, K)
        b = _normal(rng, N, K) if trans_b else _normal(rng, K, N)
        return dict(a=a, b=b)
    return make


def _grads(d: Dims, rng):
    return dict(grads=_normal(rng, d.P, scale=1e-2))


def _grad_scale(d: Dims, rng):
    grads = _normal(rng, d.P, scale=1e-2)
    norm = float(np.sqrt(grads @ grads))
    return dict(grads=grads, norm=np.array([norm]), max_norm=0.37 * norm, scale=1.0)   # clips


def _adamw(d: Dims, rng):
    decay = (rng.random(d.P) < 0.8).astype(np.uint8)
    return dict(params=_normal(rng, d.P, scale=2e-2), grads=_normal(rng, d.P, scale=1e-2),
                m=_normal(rng, d.P, scale=1e-3), v=rng.random(d.P) * 1e-5, decay=decay,
                t=3, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                stats=np.array([3.25, 0.75]))     # [loss, grad norm], finite: the step is applied


def _adamw_zero(d: Dims, rng):
    values = _adamw(d, rng)
    t, lr = values.pop("t"), values.pop("lr")
    return dict(values, hyper=R.adamw_hyper(t, lr, values["beta1"], values["beta2"]))


# ---------------------------------------------------------------------------------------------
# the table, in the order of the kernel table; then other kernels of its ops (flash attention), the
# products and the optimiser's kernels

F32, I32 = np.float32, np.int32

_WORK = {"work": (lambda d: (splitk_work(d.C, d.N),), F32)}     # split-K buffer of the warp-tile products
# (also the layernorm backward's partial parameter sums: layernorm_bwd v4, residual_layernorm_bwd v2)

_OPS = [
    OpCase("embed", embed, "embed_fwd", ("out",), _embed,
           "embed_bwd", ("dwte", "dwpe"), accumulate=("dwte", "dwpe"), upstream={"dout": "out"},
           scratch={"links": (lambda d: (2, d.N), I32)}),
    OpCase("layernorm", layernorm, "layernorm_fwd", ("out", "mean", "rstd"), _layernorm,
           "layernorm_bwd", ("dx", "dg", "db"), accumulate=("dg", "db"), upstream={"dout": "out"},
           scratch={**_WORK}),
    OpCase("attn_qkv", attn_qkv, "attn_qkv_fwd", ("q", "k", "v"), _attn_qkv,
           "attn_qkv_bwd", ("dx", "dw_q", "dw_k", "dw_v"), accumulate=("dw_q", "dw_k", "dw_v"),
           upstream={"dq": "q", "dk": "k", "dv": "v"}, scratch={**_WORK}),
    OpCase("attn", attn, "attn_fwd", ("y", "att"), _attn,
           "attn_bwd", ("dq", "dk", "dv"), upstream={"dy": "y"},
           scratch={"scratch": (lambda d: (d.B, d.H, d.T, d.T), F32)}),
    OpCase("attn_out", attn_out, "attn_out_fwd", ("out",), _attn_out,
           "attn_out_bwd", ("dy", "dw_o"), accumulate=("dw_o",), upstream={"dout": "out"},
           scratch={**_WORK}),
    OpCase("mlp", mlp, "mlp_fwd", ("out", "h_pre", "h"), _mlp,
           "mlp_bwd", ("dx", "dw_1", "dw_2"), accumulate=("dw_1", "dw_2"), upstream={"dout": "out"},
           scratch={"dh_pre": (lambda d: (d.N, 4 * d.C), F32), **_WORK}),
    OpCase("residual", residual, "residual_add", ("out",), _residual,
           "residual_add_bwd", ("dx", "df"), upstream={"dout": "out"}),
    OpCase("dropout", dropout, "dropout_fwd", ("out",), _dropout,
           "dropout_bwd", ("dx",), upstream={"dout": "out"}),
    OpCase("loss", loss, "loss_fwd", ("loss", "losses", "probs"), _loss,
           "loss_bwd", ("dx", "dwte"), accumulate=("dwte",), upstream={"dloss": "loss"},
           scratch={"dlogits": (lambda d: (d.N, d.V), F32), **_WORK}),
]
# Other kernels of the table's ops, checked as cases of their own and not among the ops of lesson
# 03 and the exercises (which teach the plain ones): the engine runs both. Flash attention saves
# lse [B, H, T] instead of att [B, H, T, T] and recomputes the probabilities in its backward (lse
# is saved, not differentiated: like attn's att it has no upstream gradient); residual_layernorm is
# the residual add and the LayerNorm after it in one pass.
def _residual_layernorm(d: Dims, rng):
    return dict(x=_normal(rng, d.N, d.C), f=_normal(rng, d.N, d.C, scale=0.5), g=1 + _normal(rng, d.C, scale=0.5),
                b=_normal(rng, d.C, scale=0.5), eps=d.eps)


_VARIANTS = [
    # the residual add and the LayerNorm after it as one op (df = dx: the engine passes one buffer)
    OpCase("residual_layernorm", layernorm, "residual_layernorm_fwd", ("resid", "out", "mean", "rstd"),
           _residual_layernorm, "residual_layernorm_bwd", ("dx", "df", "dg", "db"), accumulate=("dg", "db"),
           upstream={"dresid": "resid", "dout": "out"}, scratch={**_WORK}),
    OpCase("attn_flash", attn_flash, "attn_flash_fwd", ("y", "lse"), _attn,
           "attn_flash_bwd", ("dq", "dk", "dv"), upstream={"dy": "y"},
           scratch={"d_rowdot": (lambda d: (d.B, d.H, d.T), F32)}),
]
_PRODUCTS = [
    OpCase("matmul", matmul, "matmul", ("out",), _matmul(False, False), scratch={**_WORK}),
    OpCase("matmul a@b^T", matmul, "matmul", ("out",), _matmul(False, True), fixed=dict(trans_b=True),
           scratch={**_WORK}),
    OpCase("matmul a^T@b +=", matmul, "matmul", ("out",), _matmul(True, False),
           accumulate=("out",), fixed=dict(trans_a=True, accumulate=True), scratch={**_WORK}),
]
# The tiled products the ops launch, once more at a shape whose K runs more than two k-stages of
# every tile 32 deep or less (K = 72 > 2 x 32) and whose N needs a second column tile of the widest
# (N = 136 > 128), with M = B*T rows: at the tiny size the MLP-like shape above (39 x 8 x 32) runs
# one k-stage and one column tile, so a tile that drops a k term or a column tile passes it. The
# simulator harness leaves out an op's row at a second tile only when one of these checks that
# tile at a shape that runs it (tests/test_kernels.py). fp32 (3xTF32), fp16, bf16 (mma.sync) and
# bf16 wgmma (cp.async): the tiles the ops launch; the TMA tiles run K 64 deep, which would need K
# above 128 and is left to their own tests and the GPU's harness.
DEEP_K, DEEP_N = 72, 136
_DEEP_VERSIONS = (8, 11, 13, 17)
_DEEP_WORK = {"work": (lambda d: (splitk_work(DEEP_K, max(d.N, DEEP_N)),), F32)}
_PRODUCTS += [
    OpCase("matmul deep", matmul, "matmul", ("out",), _matmul(False, False, deep=True), scratch=_DEEP_WORK,
           only=_DEEP_VERSIONS),
    OpCase("matmul deep a@b^T", matmul, "matmul", ("out",), _matmul(False, True, deep=True),
           fixed=dict(trans_b=True), scratch=_DEEP_WORK, only=_DEEP_VERSIONS),
    OpCase("matmul deep a^T@b +=", matmul, "matmul", ("out",), _matmul(True, False, deep=True),
           accumulate=("out",), fixed=dict(trans_a=True, accumulate=True), scratch=_DEEP_WORK,
           only=_DEEP_VERSIONS),
]
_OPTIMISER = [
    OpCase("grad_norm", optim, "grad_norm", ("norm",), _grads,
           scratch={"partial": (lambda d: (optim.NORM_BLOCKS,), F32)}),
    OpCase("grad_scale", optim, "grad_scale", ("grads",), _grad_scale),
    OpCase("adamw", optim, "adamw", ("params", "m", "v"), _adamw, only=(1,)),
    # version 2 reads lr and the bias corrections from the device and clears the gradient: its
    # twin is reference.adamw_zero (the learning rate and the corrections in one array, hyper)
    OpCase("adamw_zero", optim, "adamw", ("params", "grads", "m", "v"), _adamw_zero, twin="adamw_zero", only=(2, 3)),
    OpCase("zero", optim, "zero", ("arr",), lambda d, rng: dict(arr=_normal(rng, d.P))),
]

CASES = {c.op: c for c in _OPS + _VARIANTS + _PRODUCTS + _OPTIMISER}
OPS = [c.op for c in _OPS]               # the op pairs of the kernel table, in its order, and dropout
VARIANTS = [c.op for c in _VARIANTS]     # other kernels of those ops (flash attention, the fused residual + LayerNorm)
KERNEL_MODULES = (embed, layernorm, attn_qkv, attn, attn_flash, attn_out, mlp, residual, dropout, loss, matmul,
                  optim)
