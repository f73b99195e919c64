"""The lab's whole-model recipes: the rungs of the step ladder that the engine's recipes
(andrea_numba/recipes.py) were reached by, each a Recipe that GPUModel runs and the harness checks.

    from lab.recipes import LAB
    model = GPUModel(m, B, T, recipe=LAB["bf16t"])
    check.model_rows(m, B, T, rng, seed, recipe=LAB["bf16w"])

Each rung names the linear ops' version it runs (attn_qkv, attn_out and the loss backward share
it; the MLP and the loss forward have their own numbers) and what it added:

    rung      linear ops  mlp  loss fwd/bwd  products
    simt      v2          v2   v2/v2         SIMT warp tiles (matmul v3)
    tf32x3    v3          v3   v3/v3         3xTF32 on warp tiles (matmul v4)
    tf32x3s   v4          v4   v4/v4         split planes (matmul v5)
    tf32x3k   v5          v5   v5/v5         k-major tiles, both parts rounded (matmul v6)
    tf32x3t   v6          v7   v6/v6         the same sums on v6's tiles (matmul v7)
    simt2     v8          v10  v8/v8         SIMT multiply-adds on k-major tiles (matmul v9)
    bf16w     v9          v13  v10/v9        bf16 inputs rounded as read, fp32 sums (matmul v10)
    bf16l     v11         v15  v12/v11       bf16 shared tiles read with ldmatrix (matmul v12)
    bf16r     v13         v17  v14/v13       wgmma where no transposed copy is needed (matmul v16)
    bf16m     v14         v18  v15/v14       wgmma for every product, transpose bits (matmul v17)
    bf16t     v15         v19  v17/v15       TMA copies from a producer warp, persistent blocks (matmul v18)
    bf16s     v15         v19  v17/v15       bf16t with every weight rounded once a forward (params16)

The engine's fp32 recipe is the next rung after tf32x3t (its linear ops' v7, mlp v12, loss v9/v7);
bf16-ampere follows bf16l (v12: bf16 copies by cp.async); bf16-hopper follows bf16s (the ops write
the products' operands in bf16; the loss keeps the logits).
"""
from __future__ import annotations

from dataclasses import replace

from lab import attn_flash, attn_out, attn_qkv, loss, mlp
from andrea_numba.recipes import BF16_AMPERE, FP32, RECIPES, Recipe


def rung(name: str, v: int, mlp_v: int | None = None, loss_fwd: int | None = None, loss_bwd: int | None = None,
         base: Recipe = FP32, **flags) -> Recipe:
    """A recipe of `base` with the linear ops at version v (the MLP's and the loss's own numbers
    where they differ)."""
    def pair(module, op, f, b):
        return module.VERSIONS[op + "_fwd"][f], module.VERSIONS[op + "_bwd"][b]
    kernels = dict(base.kernels,
                   attn_qkv=pair(attn_qkv, "attn_qkv", v, v), attn_out=pair(attn_out, "attn_out", v, v),
                   mlp=pair(mlp, "mlp", mlp_v or v, mlp_v or v),
                   loss=pair(loss, "loss", loss_fwd or v, loss_bwd or v))
    return replace(base, name=name, kernels=kernels, **flags)


_PLAIN = dict(bf16_saved=False, bf16_weights=False, bf16_outputs=False, keeps_logits=False, operand_copies=False,
              held_copies=False, tensor_maps=False, needs_hopper=False, elsewhere=None)
_BF16 = replace(BF16_AMPERE, kernels=dict(BF16_AMPERE.kernels, residual_layernorm=FP32.kernels["residual_layernorm"]))
_HOPPER = dict(_PLAIN, bf16_saved=True, operand_copies=True, held_copies=True, needs_hopper=True,
               elsewhere="bf16-ampere")

LAB = {r.name: r for r in (
    rung("simt", 2), rung("tf32x3", 3), rung("tf32x3s", 4), rung("tf32x3k", 5), rung("tf32x3t", 6, 7),
    rung("simt2", 8, 10),
    rung("bf16w", 9, 13, 10, 9, base=_BF16, **_PLAIN),
    rung("bf16l", 11, 15, 12, 11, base=_BF16, **_PLAIN),
    rung("bf16r", 13, 17, 14, 13, base=BF16_AMPERE, **_HOPPER),
    rung("bf16m", 14, 18, 15, 14, base=BF16_AMPERE, **_HOPPER),
    rung("bf16t", 15, 19, 17, 15, base=BF16_AMPERE, **dict(_HOPPER, tensor_maps=True)),
    rung("bf16s", 15, 19, 17, 15, base=BF16_AMPERE, **dict(_HOPPER, tensor_maps=True, bf16_weights=True)),
)}


def get(name: str) -> Recipe:
    """A lab recipe or an engine recipe, by name."""
    every = {**RECIPES, **LAB}
    if name not in every:
        raise KeyError(f"no recipe {name!r}: one of {', '.join(every)}")
    return every[name]


NAMES = (*RECIPES, *LAB)         # every recipe a benchmark or a lab check can name


def variant(recipe: Recipe, mlp_version: int | None = None, flash_version: int | None = None) -> Recipe:
    """`recipe` with the MLP's launchers of mlp_version, or flash attention's pair of flash_version
    (attn_flash.flash_pair: that backward and the latest forward of its precision up to it), in
    place of its own: the benchmarks' --mlp-version and --flash-version."""
    kernels = dict(recipe.kernels)
    if mlp_version is not None:
        kernels["mlp"] = mlp.VERSIONS["mlp_fwd"][mlp_version], mlp.VERSIONS["mlp_bwd"][mlp_version]
    if flash_version is not None:
        kernels["attention"] = attn_flash.flash_pair(flash_version)
    return replace(recipe, kernels=kernels)


def flash_number(recipe: Recipe) -> int:
    """The version number of the flash attention backward a recipe runs."""
    return next(v for v, f in attn_flash.VERSIONS["attn_flash_bwd"].items() if f is recipe.kernels["attention"][1])
