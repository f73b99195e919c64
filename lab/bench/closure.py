"""What a student has to read: the trainer's import closure, the import circles, the launchers.

    python lab/bench/closure.py                 # a table of the engine's size, from this checkout

The closure is every module of this project that `python -m andrea_numba.train` imports (run in a
fresh interpreter, counted in modules and lines); a circle is a set of the project's modules that
import each other at module level (a strongly connected component of the import graph, ast-read);
an import inside a function is counted apart, since it is how a circle used to be dodged. Launchers
are the functions that declare their blocks (`@blocks(...)`) or carry a rung number.
"""
import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("andrea_numba", "reference", "lab")


def closure(module="andrea_numba.train"):
    """(module names, lines) of this project's modules that importing `module` loads."""
    code = (f"import sys, json; import {module}; "
            f"print(json.dumps({{n: getattr(m, '__file__', None) for n, m in sys.modules.items()}}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    files = {n: f for n, f in json.loads(out.stdout.splitlines()[-1]).items()
             if f and Path(f).resolve().is_relative_to(ROOT)}
    lines = sum(len(Path(f).read_text().splitlines()) for f in files.values())
    return sorted(files), lines


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """{module: set of project modules it imports at module level}, and the imports inside functions."""
    graph, inner = {}, []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = _module_name(path)
            is_pkg = path.name == "__init__.py"
            tree = ast.parse(path.read_text())
            edges = graph.setdefault(name, set())

            def target(node):
                if isinstance(node, ast.Import):
                    return [a.name for a in node.names]
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                if node.level:
                    base = base[:len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module
                subs = [f"{mod}.{a.name}" for a in node.names]
                return subs if node.module is None else [mod] + subs      # from . import x: x alone

            def visit(node, in_function):
                for child in ast.iter_child_nodes(node):
                    fn = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                    if isinstance(child, (ast.Import, ast.ImportFrom)):
                        found = [t for t in target(child) if t and t.split(".")[0] in PACKAGES]
                        if in_function and found:
                            inner.append((f"{name}:{child.lineno}", found))
                        elif not in_function:
                            edges.update(found)
                    visit(child, fn)
            visit(tree, False)
    modules = set(graph)
    return {m: {e for e in es if e in modules and e != m} for m, es in graph.items()}, inner


def closing_circles(graph, inner):
    """The imports inside functions that, moved to module level, would close a circle."""
    out = []
    for where, targets in inner:
        module = where.split(":")[0]
        trial = {m: set(es) for m, es in graph.items()}
        trial[module] |= {t for t in targets if t in graph and t != module}
        if circles(trial):
            out.append(where)
    return out


def circles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def launchers(package):
    """Launchers defined in `package`'s kernel modules: functions decorated @blocks(...) or @rung(...)."""
    n = 0
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Call) and getattr(d.func, "id", getattr(d.func, "attr", "")) in ("blocks", "rung")
                    for d in node.decorator_list):
                n += 1
    return n


def main():
    mods, lines = closure()
    graph, inner = import_graph()
    engine = {m: es for m, es in graph.items() if not m.startswith("lab")}
    inner = [(w, t) for w, t in inner if not w.startswith("lab")]
    circ, dodges = circles(engine), closing_circles(engine, inner)
    readme = len((ROOT / "README.md").read_text().splitlines())
    engine_imports_lab = sorted(m for m, es in graph.items() if m.startswith(("andrea_numba", "reference"))
                                and any(e.startswith("lab") for e in es))
    rows = [("trainer's import closure", f"{len(mods)} modules, {lines:,} lines"),
            ("import circles among the engine's modules", f"{len(circ)}" + (f": {circ}" if circ else "")),
            ("imports inside a function (engine and twin)", str(len(inner))),
            ("... of which would close a circle at module level", str(len(dodges)) + (f": {dodges}" if dodges else "")),
            ("engine modules that import the lab", str(len(engine_imports_lab))),
            ("launchers in the engine (andrea_numba/)", str(launchers("andrea_numba"))),
            ("launchers in the lab (lab/)", str(launchers("lab"))),
            ("README.md", f"{readme} lines")]
    width = max(len(a) for a, _ in rows)
    print(f"| {'measure':<{width}} | value |\n|{'-' * (width + 2)}|---|")
    for a, b in rows:
        print(f"| {a:<{width}} | {b} |")
    if "--list" in sys.argv:
        print("\n".join(mods))
        print("imports inside functions:\n  " + "\n  ".join(f"{w} {t}" for w, t in inner))


if __name__ == "__main__":
    main()
