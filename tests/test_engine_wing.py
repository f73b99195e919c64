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

import andrea_numba.kernels as K
from andrea_numba import recipes
from andrea_numba.kernels import matmul

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
    assert {launch.family for launch in engine.values()} == {"tf32x3", "fp16", "bf16", "bf16_wgmma_cp_async"}
    for launch in engine.values():
        assert matmul.TILE_FAMILIES[launch.family].rung == launch.rung, launch.__name__
    from lab import matmul as lab_matmul          # registers the lab's families
    for family, record in matmul.TILE_FAMILIES.items():
        if family not in {launch.family for launch in engine.values()}:
            assert family == f"v{record.rung}", family
            assert lab_matmul.VERSIONS["matmul"][record.rung].family == family
    for launch in engine.values():                # the lab's ladder holds the engine's rungs under their numbers
        assert lab_matmul.VERSIONS["matmul"][launch.rung] is launch, launch.__name__
