"""The op cases of the whole ladder: andrea_numba.cases's table with each case's module replaced by
its lab module (lab/<module>.py), whose VERSIONS hold every numbered version, the engine's among
them. The harness (python -m lab.check), the tests and the benchmarks read these to check and time
every rung; the engine's own harness (python -m andrea_numba.check) checks the engine's launchers.
"""
from __future__ import annotations

import dataclasses
import importlib

from andrea_numba.cases import CASES as ENGINE_CASES
from andrea_numba.cases import OPS, VARIANTS  # noqa: F401  (the same op lists)


def lab_module(module):
    """lab.<name> for andrea_numba.kernels.<name> where the lab holds its ladder, else the module."""
    name = module.__name__.rsplit(".", 1)[1]
    try:
        lab = importlib.import_module(f"lab.{name}")
    except ModuleNotFoundError:
        return module
    return lab if hasattr(lab, "VERSIONS") else module


CASES = {op: dataclasses.replace(case, module=lab_module(case.module)) for op, case in ENGINE_CASES.items()}
KERNEL_MODULES = tuple(dict.fromkeys(case.module for case in CASES.values()))
