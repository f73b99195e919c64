"""The engine wing holds the kernels that train, named by what they are; the lab holds the ladder.

Precision is a recipe (andrea_numba/recipes.py), a product is chosen by its launcher (matmul_tf32x3,
matmul_bf16_wgmma, ...), and a tile family by a name that says what it is ("tf32x3", "bf16", ...):
the lettered kinds that once chose them ("tf32x3w", "bf16t", ...) appear in no string of the engine,
and no engine module keeps a numbered launcher that no recipe runs. (The lab's recipe names,
lab/recipes.py, are another namespace: `python -m lab.check --recipe bf16t` is a rung of the step.)
"""
import ast
import importlib
import pkgutil
import re
from pathlib import Path

import numpy as np
import pytest

import andrea_numba.kernels as K
from andrea_numba import recipes
from andrea_numba.kernels import matmul
from andrea_numba.kernels.common import SIMULATOR

ROOT = Path(__file__).resolve().parent.parent

# the lettered kinds that chose a product's tiles and launcher before the recipes and families
LETTERED_KINDS = ("tf32x3w", "bf16t", "bf16a", "f16w", "simt2", "bf16w", "bf16l", "bf16g", "bf16h", "bf16r",
                  "bf16m", "tf32x3s", "tf32x3k", "tf32x3t", "bf16s", "bf16o")
KIND = re.compile(r"\b(" + "|".join(LETTERED_KINDS) + r")\b")


def _strings(path):
    """(line, text) of every string constant of a module: literals, docstrings, f-strings' parts."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_no_lettered_kind_in_a_string_of_the_engine():
    found = [f"{path.relative_to(ROOT)}:{line}: {KIND.search(text).group(0)!r}"
             for path in sorted((ROOT / "andrea_numba").rglob("*.py"))
             for line, text in _strings(path) if KIND.search(text)]
    assert not found, "lettered kinds in the engine's strings (name the launcher or the tile family):\n" + \
        "\n".join(found)


def _kernel_modules():
    return [importlib.import_module(f"andrea_numba.kernels.{info.name}") for info in pkgutil.iter_modules(K.__path__)]


def test_the_engine_keeps_no_numbered_launcher_that_no_recipe_runs():
    """A launcher (a function with declared blocks, or a rung) that an engine kernel module defines
    is named by what it is, not *_v<N>, unless a recipe runs it: the other numbered rungs are the
    lab's (lab/<module>.py)."""
    run = {f for r in recipes.RECIPES.values() for pair in r.kernels.values() for f in pair}
    numbered = [f"{module.__name__}.{name}" for module in _kernel_modules() for name, value in vars(module).items()
                if callable(value) and getattr(value, "__module__", None) == module.__name__
                and (hasattr(value, "blocks") or hasattr(value, "rung"))
                and re.search(r"_v\d+$", name) and value not in run]
    assert not numbered, f"numbered launchers in the engine that no recipe runs: {numbered}"


def test_the_engine_tile_families_are_those_its_products_name():
    """matmul.TILE_FAMILIES holds the engine's families, each the .family of an engine product launcher
    (of the rung its family records), and the lab's, which lab/matmul.py adds under their rung's name
    ("v3", ...): no other name."""
    engine = {name: value for name, value in vars(matmul).items()
              if name.startswith("matmul_") and hasattr(value, "family") and value.__module__ == matmul.__name__}
    assert {launch.family for launch in engine.values()} == {"tf32x3", "fp16", "bf16", "bf16_wgmma_cp_async", "tf32x3_wgmma"}
    for launch in engine.values():
        assert matmul.TILE_FAMILIES[launch.family].rung == launch.rung, launch.__name__
    from lab import matmul as lab_matmul          # registers the lab's families
    for family, record in matmul.TILE_FAMILIES.items():
        if family not in {launch.family for launch in engine.values()}:
            assert family == f"v{record.rung}", family
            assert lab_matmul.VERSIONS["matmul"][record.rung].family == family
    for launch in engine.values():                # the lab's ladder holds the engine's rungs under their numbers
        assert lab_matmul.VERSIONS["matmul"][launch.rung] is launch, launch.__name__


# a numbered kernel name: k_matmul_v18, k_round_bf16_v2, k_loss_fwd_v3_..., the lab's way to name a rung
NUMBERED = re.compile(r"_v\d+(_|$)")


@pytest.mark.skipif(not SIMULATOR, reason="records the simulator's launches (NUMBA_ENABLE_CUDASIM=1)")
def test_every_kernel_the_recipes_launch_is_named_without_a_version_number(monkeypatch):
    """The kernels that one forward + backward of each engine recipe of ours launches (a one-layer tiny
    model), and those of the recipes' products where K splits (k_splitk_sum) or a tensor map cannot
    read an operand (matmul_bf16_wgmma's fallback), are named by what they are: no _v<N>. The
    launches are recorded, not run (the simulator's kernel call replaced), so this is quick."""
    import dataclasses

    from numba import cuda
    from numba.cuda.simulator import kernel as sim_kernel

    from andrea_numba import gpu_model as G
    from andrea_numba.config import load_config
    from andrea_numba.layout import init_params

    launched = {}                                         # kernel name -> where it was launched
    where = [""]
    monkeypatch.setattr(sim_kernel.FakeCUDAKernel, "__call__",
                        lambda kernel, *args: launched.setdefault(kernel.fn.__name__, set()).add(where[0]))
    m = dataclasses.replace(load_config("tiny").model, n_layer=1)
    ours = [r for r in recipes.RECIPES.values() if r.library is None]
    assert {r.name for r in ours} == {"fp32", "fp32-hopper", "bf16-hopper", "bf16-ampere", "fp16"}
    for recipe in ours:
        where[0] = recipe.name
        model = G.GPUModel(m, 1, 8, recipe=recipe)
        model.params.copy_to_device(init_params(m, 1))
        tokens = np.zeros((1, 8), np.int32)
        model.forward(tokens, tokens)
        model.backward()
    products = (matmul.matmul_tf32x3, matmul.matmul_tf32x3_wgmma, matmul.matmul_fp16, matmul.matmul_bf16,
                matmul.matmul_bf16_wgmma_cp_async, matmul.matmul_bf16_wgmma)
    M = N = 32
    K = 1024
    for launch in products:                               # dW += x^T @ dy with a work buffer: split over K
        where[0] = launch.__name__
        x, dy = cuda.to_device(np.zeros((K, M), np.float32)), cuda.to_device(np.zeros((K, N), np.float32))
        work = cuda.to_device(np.zeros(16 * M * N, np.float32))
        launch(cuda.to_device(np.zeros((M, N), np.float32)), work, x, dy, trans_a=True, accumulate=True)
    where[0] = "matmul_bf16_wgmma, rows of 12 values"   # no tensor map: matmul_bf16_wgmma_cp_async
    matmul.matmul_bf16_wgmma(cuda.to_device(np.zeros((12, 64), np.float32)), None,
                             cuda.to_device(np.zeros((16, 12), np.uint16)), cuda.to_device(np.zeros((16, 64), np.uint16)),
                             trans_a=True)
    assert {"k_matmul_tf32x3", "k_matmul_fp16", "k_matmul_bf16", "k_matmul_bf16_wgmma_cp_async", "k_matmul_bf16_wgmma",
            "k_splitk_sum", "k_round_bf16", "k_loss_fwd_stats"} <= set(launched)
    assert "k_matmul_bf16_wgmma_cp_async" in {n for n, w in launched.items() if "matmul_bf16_wgmma, rows of 12 values" in w}
    numbered = {name: sorted(w) for name, w in launched.items() if NUMBERED.search(name)}
    assert not numbered, f"numbered kernels launched by the engine's recipes: {numbered}"
