"""The agreement harness with the lab's recipes too: `python -m lab.check` takes every flag of
`python -m andrea_numba.check`, checks every rung of each op's ladder (lab/cases.py), and --recipe
may name a lab rung (lab/recipes.py) as well as an engine recipe.

    python -m lab.check --size 12M --model-only --recipe bf16t
"""
import sys

from andrea_numba import check
from andrea_numba.recipes import RECIPES
from lab.cases import CASES
from lab.recipes import LAB

if __name__ == "__main__":
    sys.exit(check.main(recipes={**RECIPES, **LAB}, cases=CASES, prog="python -m lab.check"))
