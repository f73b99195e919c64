"""Recipes: which kernel computes each op of the model, and in which format each saved tensor is
kept. One recipe per precision and class of GPU; `--precision` and `--products` pick one.

    recipe = recipe_for("bf16")                  # train.precision, train.products, this GPU
    model = GPUModel(m, B, T, recipe=recipe)     # a name works too: GPUModel(..., recipe="fp32")
    recipe.kernels["mlp"]                        # (forward launcher, backward launcher)
    recipe.saved_format("ln1")                   # "bf16" or "fp32"

    recipe            --precision  --products  GPU                     linear ops' products
    fp32-hopper       fp32         numba       compute capability 9.0  3xTF32 on wgmma (fp32-accurate)
    fp32              fp32         numba       any other; simulator    3xTF32 on mma.sync (fp32-accurate)
    bf16-hopper       bf16         numba       compute capability 9.0  bf16 wgmma, operands by TMA
    bf16-ampere       bf16         numba       any other               bf16 mma.sync, operands by cp.async
    fp16              fp16         numba       any                     fp16 mma.sync, with loss scaling
    cublas-fp32       fp32         cublas      with nvmath-python      cuBLASLt SGEMM
    cublas-bf16       bf16         cublas      with nvmath-python      cuBLASLt bf16
    cublas-fp16       fp16         cublas      with nvmath-python      cuBLASLt fp16
    cublas-fp8-fwd    fp8-fwd      cublas      compute capability 8.9+ FP8 forward, bf16 backward
    cublas-fp8-e5m2   fp8-e5m2     cublas      compute capability 8.9+ FP8 forward, E5M2 gradients
    cublas-fp8-all    fp8-all      cublas      compute capability 8.9+ FP8 forward and backward

Every recipe keeps the weights, their gradients, AdamW's moments, the LayerNorms' statistics, the
softmax and the loss in fp32; a recipe below fp32 rounds the inputs of its products (the twin at
the same precision, reference.model, rounds the same values). The trainer, the sampler, the memory
plan, the agreement harness's model rows and the benchmarks all get their recipe from recipe_for.
The lab (lab/recipes.py) declares its other rungs as recipes too; the engine never reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from numba import cuda

from reference.precision import FP8_SCOPES

from .kernels import attn_flash, attn_out, attn_qkv, cublaslt, embed, layernorm, loss, mlp
from .kernels.fp8_products import fp8_unavailable
from .kernels.common import SIMULATOR

# The activations kept as bf16 by a recipe with bf16_saved: those whose every reader is a bf16
# product, which rounds its inputs to bf16 (ties to even) before it multiplies, so keeping them
# rounded changes no bit the products see: LN1's, LN2's and LNf's outputs (the inputs of the Q, K,
# V, W_1 and logits products and of their weight gradients) and the GELU's output h (W_2's and
# dW_2's). Not y, the attention output: flash attention's backward reads it in fp32 (D = dy . y).
SAVED16 = ("ln1", "ln2", "lnf", "h")
# With bf16_outputs the ops that make a bf16 product's operand write it in bf16 themselves: flash
# attention (v14) writes y's bf16 copy y16 beside y (its backward still reads y in fp32) and dq, dk,
# dv in bf16 only; the residual + LayerNorm backward (v6) writes the residual stream's gradient's
# bf16 copy d_resid16, which the next block down's attn_out and MLP backward products read. Each is
# the fp32 value rounded as an operand copy would round it: the same bits.
OUT16 = ("d_q", "d_k", "d_v")

# the ops of a recipe's kernel table, in the order of the forward
OPS = ("embed", "layernorm", "attn_qkv", "attention", "attn_out", "residual_layernorm", "mlp", "loss")
LINEAR = ("attn_qkv", "attn_out", "mlp", "loss")      # the ops whose products the library route computes


@dataclass(frozen=True)
class Recipe:
    """One precision on one class of GPU: the kernels of each op and the formats of what is saved.

    kernels: op -> (forward launcher, backward launcher), for the ops of OPS. On the library route
        (library set) the linear ops' launchers are built for the model's sizes by cuBLASLt's
        wrapper (kernels/cublaslt.py, kernels/fp8_products.py) and LINEAR is absent here.
    precision: of the products; the twin at this precision (reference.model) computes the same.
    library: cuBLASLt's precision ("fp32", "bf16", "fp16" or an FP8 scope), or None: our kernels.
    bf16_saved: SAVED16 is kept as bf16 (uint16 bit patterns, half the bytes).
    bf16_weights: the products read their weights from params16, a bf16 copy of the parameters
        rounded once a forward (one launch instead of one rounding a product).
    bf16_outputs: the ops write the products' operands in bf16 themselves (OUT16's comment).
    keeps_logits: the training loss leaves the logits in probs and saves each row's max and sum of
        exponentials (loss_stats); the backward recomputes the softmax from them.
    operand_copies, held_copies, tensor_maps: the scratch its products need, reserved before the
        first step: bf16 copies of the operands (cublaslt.COPIES), a gradient rounded once for its two
        products (cublaslt.HELD), the table of TMA tensor maps (tma.TMAPS).
    simulated: the recipe a run in the CUDA simulator gets instead (None: this one), for a recipe whose
        twins simulate many times slower than the same math's on mma.sync (fp32-hopper's products:
        128 threads a block); the harness and the tests still run it there by name.
    needs_hopper: its products run wgmma (compute capability 9.0 only); elsewhere: the recipe a run
        gets on any other GPU (the same math on mma.sync)."""
    name: str
    precision: str
    kernels: dict
    library: str | None = None
    bf16_saved: bool = False
    bf16_weights: bool = False
    bf16_outputs: bool = False
    keeps_logits: bool = False
    operand_copies: bool = False
    held_copies: bool = False
    tensor_maps: bool = False
    needs_hopper: bool = False
    elsewhere: str | None = None
    simulated: str | None = None
    what: str = field(default="", compare=False)     # one line for the trainer's log

    def saved_format(self, name: str) -> str:
        """The format a saved activation is kept in: "bf16" or "fp32"."""
        return "bf16" if self.bf16_saved and name in SAVED16 else "fp32"

    def writes_out16(self, m) -> bool:
        """Whether a flash-attention model of this recipe and these shapes writes OUT16's bf16 operands:
        bf16_outputs and an even head size (flash v14 writes channel pairs as words)."""
        return self.bf16_outputs and (m.d_model // m.n_head) % 2 == 0

    def buffer_flags(self, m, training: bool = True) -> dict:
        """gpu_model.buffer_specs's keywords for this recipe."""
        return dict(saved16=self.bf16_saved, params16=self.bf16_weights, out16=self.writes_out16(m),
                    loss_stats=self.keeps_logits and training)


# the kernels every recipe of ours shares; a recipe names what it changes
_COMMON = dict(
    embed=(embed.embed_fwd, embed.embed_bwd_sorted),
    # the first LayerNorm (no residual sum before it) and LNf's backward; the 2L others are fused
    # with the residual add that makes their input (residual_layernorm)
    layernorm=(layernorm.layernorm_fwd, layernorm.layernorm_bwd_two_stage),
    residual_layernorm=(layernorm.residual_layernorm_fwd, layernorm.residual_layernorm_bwd_partials),
)

FP32 = Recipe(
    "fp32", "fp32", dict(
        _COMMON,
        attention=(attn_flash.attn_flash_fwd_tf32x3, attn_flash.attn_flash_bwd_tf32x3),   # fp32, on tensor cores
        attn_qkv=(attn_qkv.attn_qkv_fwd_tf32x3, attn_qkv.attn_qkv_bwd_tf32x3), attn_out=(attn_out.attn_out_fwd_tf32x3, attn_out.attn_out_bwd_tf32x3),
        mlp=(mlp.mlp_fwd_tf32x3, mlp.mlp_bwd_tf32x3), loss=(loss.loss_fwd_tf32x3, loss.loss_bwd_tf32x3)),
    what="fp32 (products on tensor cores as 3xTF32, as accurate as fp32)")

FP32_HOPPER = Recipe(
    "fp32-hopper", "fp32", dict(
        FP32.kernels,
        attn_qkv=(attn_qkv.attn_qkv_fwd_tf32x3_wgmma, attn_qkv.attn_qkv_bwd_tf32x3_wgmma),
        attn_out=(attn_out.attn_out_fwd_tf32x3_wgmma, attn_out.attn_out_bwd_tf32x3_wgmma),
        mlp=(mlp.mlp_fwd_tf32x3_wgmma, mlp.mlp_bwd_tf32x3_wgmma), loss=(loss.loss_fwd_tf32x3_wgmma, loss.loss_bwd_tf32x3_wgmma)),
    needs_hopper=True, elsewhere="fp32", simulated="fp32",
    what="fp32 (products as 3xTF32 on Hopper's wgmma, as accurate as fp32)")

BF16_AMPERE = Recipe(
    "bf16-ampere", "bf16", dict(
        _COMMON,
        # the bf16 LayerNorm output written by the LayerNorm itself (rows of whole 16-byte chunks)
        residual_layernorm=(layernorm.residual_layernorm_fwd_vec4, layernorm.residual_layernorm_bwd_partials),
        attention=(attn_flash.attn_flash_fwd_bf16, attn_flash.attn_flash_bwd_bf16),
        attn_qkv=(attn_qkv.attn_qkv_fwd_bf16, attn_qkv.attn_qkv_bwd_bf16), attn_out=(attn_out.attn_out_fwd_bf16, attn_out.attn_out_bwd_bf16),
        mlp=(mlp.mlp_fwd_bf16, mlp.mlp_bwd_bf16), loss=(loss.loss_fwd_bf16, loss.loss_bwd_bf16)),
    bf16_saved=True, operand_copies=True,
    what="bf16 products (mma.sync on bf16 copies of the operands, fp32 sums), flash attention in bf16")

BF16_HOPPER = Recipe(
    "bf16-hopper", "bf16", dict(
        _COMMON,
        # the bf16 LayerNorm output written by the LayerNorm itself; its backward writes d_resid16
        residual_layernorm=(layernorm.residual_layernorm_fwd_vec4, layernorm.residual_layernorm_bwd_bf16),
        attention=(attn_flash.attn_flash_fwd_bf16_out16, attn_flash.attn_flash_bwd_bf16_out16),
        attn_qkv=(attn_qkv.attn_qkv_fwd_bf16_wgmma, attn_qkv.attn_qkv_bwd_bf16_wgmma), attn_out=(attn_out.attn_out_fwd_bf16_wgmma, attn_out.attn_out_bwd_bf16_wgmma),
        mlp=(mlp.mlp_fwd_bf16_wgmma, mlp.mlp_bwd_bf16_wgmma), loss=(loss.loss_fwd_bf16_wgmma, loss.loss_bwd_bf16_wgmma)),
    bf16_saved=True, bf16_weights=True, bf16_outputs=True, keeps_logits=True,
    operand_copies=True, held_copies=True, tensor_maps=True, needs_hopper=True, elsewhere="bf16-ampere",
    what="bf16 products (Hopper's wgmma, operands copied by TMA, fp32 sums), flash attention in bf16")

FP16 = Recipe(
    "fp16", "fp16", dict(
        _COMMON,
        attention=(attn_flash.attn_flash_fwd_fp16, attn_flash.attn_flash_bwd_fp16),
        attn_qkv=(attn_qkv.attn_qkv_fwd_fp16, attn_qkv.attn_qkv_bwd_fp16), attn_out=(attn_out.attn_out_fwd_fp16, attn_out.attn_out_bwd_fp16),
        mlp=(mlp.mlp_fwd_fp16, mlp.mlp_bwd_fp16), loss=(loss.loss_fwd_fp16, loss.loss_bwd_fp16)),
    what="fp16 products (mma.sync, fp32 sums) and flash attention in fp16, with dynamic loss scaling")


def _library(precision: str) -> Recipe:
    """The library route at a precision: every product of the linear ops through cuBLASLt, our
    kernels for the rest (attention at the products' precision, bf16 for the FP8 scopes)."""
    flash = {"fp32": FP32.kernels["attention"], "fp16": FP16.kernels["attention"]}.get(
        precision, BF16_AMPERE.kernels["attention"])
    what = (f"FP8 products for the linear layers through cuBLASLt ({precision}), the classifier's and "
            "attention's products in bf16" if precision in FP8_SCOPES
            else f"{precision} products through cuBLASLt")
    return Recipe("cublas-" + precision, "fp32" if precision == "fp32" else precision,
                  dict(_COMMON, attention=flash), library=precision, what=what)


RECIPES = {r.name: r for r in (FP32, FP32_HOPPER, BF16_HOPPER, BF16_AMPERE, FP16,
                               *(_library(p) for p in ("fp32", "bf16", "fp16", *FP8_SCOPES)))}


def hopper_here() -> bool:
    """Whether this process's GPU runs wgmma (compute capability 9.0); the simulator runs its twin."""
    if SIMULATOR:
        return True
    try:
        return tuple(cuda.get_current_device().compute_capability) == (9, 0)
    except Exception:                   # no GPU here: no wgmma either
        return False


def get(name: str) -> Recipe:
    """The engine's recipe of that name (KeyError with the names when there is none)."""
    if name not in RECIPES:
        raise KeyError(f"no recipe {name!r}: one of {', '.join(RECIPES)}")
    return RECIPES[name]


# the recipe of each --precision on our kernels (on a GPU without wgmma: its `elsewhere`)
BY_PRECISION = {"fp32": "fp32-hopper", "bf16": "bf16-hopper", "fp16": "fp16"}


def recipe_for(precision: str = "fp32", products: str = "numba", hopper: bool | None = None) -> Recipe:
    """The recipe of a run: its train.precision and train.products ("numba": our kernels, "cublas":
    the library), on this GPU (hopper=None: whether this GPU runs wgmma; a recipe that needs Hopper
    gives way to its `elsewhere` on any other GPU, and in the simulator to its `simulated` if it
    names one)."""
    if products == "cublas" or precision in FP8_SCOPES:
        return get("cublas-" + precision)
    recipe = get(BY_PRECISION[precision])
    if hopper is None and SIMULATOR and recipe.simulated:
        return get(recipe.simulated)
    if recipe.needs_hopper and not (hopper_here() if hopper is None else hopper):
        recipe = get(recipe.elsewhere)
    return recipe


def resolve(recipe) -> Recipe:
    """A Recipe as it is, or the engine's recipe of that name."""
    return recipe if isinstance(recipe, Recipe) else get(recipe)


def unavailable(recipe) -> str | None:
    """Why this recipe cannot run in this process, in one line (None: it can): the library route
    needs cuBLASLt (nvmath-python, a GPU), an FP8 scope a GPU with FP8 tensor cores."""
    recipe = resolve(recipe)
    if recipe.library in FP8_SCOPES:
        return fp8_unavailable()
    return cublaslt.unavailable() if recipe.library is not None else None
