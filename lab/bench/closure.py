"""What a student has to read: the trainer's import closure, the import circles, the launchers.

    python lab/bench/closure.py                 # a table of the engine's size, from this checkout
    python lab/bench/closure.py --list          # ... and the closure's modules, the function imports

The closure is every module of this project that `python -m andrea_numba.train` imports (run in a
fresh interpreter, counted in modules and lines). The import graph and its circles are
tests/test_imports.py's (every import of every andrea_numba module, inside functions too, read with
ast): the figure here is the one that test holds at 0. Imports inside a function are counted apart,
since that is how a circle used to be dodged (none can be one while the graph, which has their
edges, has no circle). Launchers are the functions that declare their blocks (`@blocks(...)`) or
carry a rung number (`@rung(N)`).
"""
import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from andrea_numba.cli import Parser  # noqa: E402
from test_imports import function_imports, import_cycles, import_graph, package_modules  # noqa: E402

PROJECT = ("andrea_numba", "reference", "lab")


def closure(module="andrea_numba.train"):
    """(module names, lines) of this project's modules that importing `module` loads."""
    code = (f"import sys, json; import {module}; "
            f"print(json.dumps({{n: getattr(m, '__file__', None) for n, m in sys.modules.items()}}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    files = {n: f for n, f in json.loads(out.stdout.splitlines()[-1]).items()
             if f and Path(f).resolve().is_relative_to(ROOT)}
    lines = sum(len(Path(f).read_text().splitlines()) for f in files.values())
    return sorted(files), lines


def project_function_imports():
    """'module:line target' for each import of a project module inside a function of andrea_numba."""
    return [f"{name}:{line} {target}" for name, path in package_modules().items()
            for line, target in function_imports(path) if target.startswith((".",) + PROJECT)]


def launchers(package):
    """Launchers defined in `package`: functions decorated @blocks(...) or @rung(...)."""
    n = 0
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Call) and getattr(d.func, "id", getattr(d.func, "attr", "")) in ("blocks", "rung")
                    for d in node.decorator_list):
                n += 1
    return n


def main(argv=None):
    ap = Parser(prog="python lab/bench/closure.py", description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="also list the closure's modules and the imports inside functions")
    args = ap.parse_args(argv)
    mods, lines = closure()
    circles = import_cycles(import_graph())
    inner = project_function_imports()
    engine_imports_lab = [m for m in mods if m.startswith("lab")]
    rows = [("trainer's import closure", f"{len(mods)} modules, {lines:,} lines"),
            ("import circles among andrea_numba's modules", f"{len(circles)}" + (f": {circles}" if circles else "")),
            ("project imports inside a function (andrea_numba)", str(len(inner))),
            ("lab modules in the trainer's closure", str(len(engine_imports_lab))),
            ("launchers in the engine (andrea_numba/)", str(launchers("andrea_numba"))),
            ("launchers in the lab (lab/)", str(launchers("lab"))),
            ("README.md", f"{len((ROOT / 'README.md').read_text().splitlines())} lines")]
    width = max(len(a) for a, _ in rows)
    print(f"| {'measure':<{width}} | value |\n|{'-' * (width + 2)}|---|")
    for a, b in rows:
        print(f"| {a:<{width}} | {b} |")
    if args.list:
        print("\n".join(mods))
        print("imports inside functions:\n  " + "\n  ".join(inner))


if __name__ == "__main__":
    main()
