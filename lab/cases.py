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


def ladder() -> str:
    """Every op's ladder, a line per launcher: its rungs, the engine's (its modules hold them) starred."""
    lines = []
    for case in CASES.values():
        engine = ENGINE_CASES[case.op]
        for direction in ("fwd", "bwd") if case.bwd else ("fwd",):
            name = case.fwd if direction == "fwd" else case.bwd
            ours = set(engine.versions(direction))
            rungs = " ".join(f"v{v}{'*' if v in ours else ''}" for v in case.versions(direction))
            lines.append(f"{case.op:<20} {name:<24} {rungs}")
    return "\n".join(lines) + "\n(* in the engine: a recipe's kernel, the simple pair the lessons teach, or one they call)"


if __name__ == "__main__":
    print(ladder())
