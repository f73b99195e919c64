"""Imports run downwards (docs: STYLE.md): the package's import graph has no cycles, and the kernels
import at the top of each module, never inside a function to dodge a circle.

The graph is read from the source with `ast`, without importing anything: every `import` and
`from ... import` of every module of andrea_numba/ and andrea_numba/kernels/, at any depth (inside
functions and conditional blocks too), is an edge from the module to the andrea_numba module it
names. Imports of other packages (numpy, numba, reference, ...) are not edges.
"""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "andrea_numba"
KERNELS = PACKAGE / "kernels"

# Imports a kernel module may make inside a function: optional dependencies that a machine may
# lack (the import is tried only where the feature is asked for). (file, imported module) pairs.
FUNCTION_IMPORTS_ALLOWED = {
    ("cublaslt.py", "nvmath"),                      # nvmath-python, the cuBLASLt bindings: an optional
    ("cublaslt.py", "nvmath.bindings"),             # package (pip install -e ".[cublas]"), GPU only
    ("tma.py", "cuda.bindings"),                    # cuda-python's driver bindings, for a tensor map
    ("matmul.py", "numba.cuda.cudadrv.driver"),     # numba-cuda's driver, which needs cuda-python too
}


def module_name(path):
    """andrea_numba/kernels/loss.py -> andrea_numba.kernels.loss (a package's __init__ -> the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules():
    """{module name: path} for every module of andrea_numba and its subpackages."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def parse(path):
    return ast.parse(path.read_text(), filename=str(path))


def _resolve_base(node, here, is_package):
    """The absolute module a `from` statement starts from."""
    if node.level == 0:
        return node.module
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(path, modules):
    """(line, target) for each andrea_numba module the file at `path` imports, at any depth."""
    here = module_name(path)
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    out.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_base(node, here, is_package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:                   # from package import submodule
                    out.append((node.lineno, sub))
                elif base in modules:
                    out.append((node.lineno, base))
    return out


def import_graph():
    """{module: {imported module: first line of the import}} over the andrea_numba modules."""
    modules = package_modules()
    graph = {m: {} for m in modules}
    for name, path in modules.items():
        for line, target in imported_modules(path, modules):
            if target != name:
                graph[name].setdefault(target, line)
    return graph


def strongly_connected(graph):
    """Tarjan's strongly connected components, each a sorted list of modules."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_cycles(graph):
    """The strongly connected components of more than one module (each holds a circle of imports)."""
    return [c for c in strongly_connected(graph) if len(c) > 1]


def one_cycle(graph, component):
    """A shortest circle through the component's first module, as 'a (line n) -> b ... -> a'."""
    start, inside = component[0], set(component)
    paths, seen = [[start]], {start}
    while paths:
        nxt = []
        for p in paths:
            for w in graph[p[-1]]:
                if w == start:
                    hops = p + [start]
                    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(hops, hops[1:])) + f" -> {start}"
                if w in inside and w not in seen:
                    seen.add(w)
                    nxt.append(p + [w])
        paths = nxt
    return " <-> ".join(component)


def _is_import_block(stmt):
    """An import, or an `if`/`try` at the top of a module holding only imports (an optional or a
    simulator-only import): part of the module's header."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(stmt, ast.If):
        return all(_is_import_block(s) for s in stmt.body + stmt.orelse)
    if isinstance(stmt, ast.Try):
        handlers = [s for h in stmt.handlers for s in h.body]
        return all(_is_import_block(s) or isinstance(s, (ast.Pass, ast.Assign)) for s in handlers) and \
            all(_is_import_block(s) for s in stmt.body + stmt.orelse + stmt.finalbody)
    return False


def _is_docstring(stmt):
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _walk_outside_functions(node):
    """Statements under `node`, not descending into function or class bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield child
        yield from _walk_outside_functions(child)


def mid_file_imports(path):
    """Line numbers of module-level imports (also those in a module-level `if`/`try`) that come after
    the first statement that is not an import (the docstring and `from __future__` excepted)."""
    body = parse(path).body
    first_code = next((i for i, s in enumerate(body) if not (_is_import_block(s) or (i == 0 and _is_docstring(s)))),
                      len(body))
    late = []
    for stmt in body[first_code:]:
        nodes = [stmt] + list(_walk_outside_functions(stmt)) \
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else []
        late += [n.lineno for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))]
    return late


def function_imports(path):
    """(line, imported module) for every import inside a function body (at any depth)."""
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if in_function and isinstance(child, ast.Import):
                out.extend((child.lineno, a.name) for a in child.names)
            elif in_function and isinstance(child, ast.ImportFrom):
                out.append((child.lineno, "." * child.level + (child.module or "")))
            visit(child, inner)

    visit(parse(path), False)
    return out


def test_no_import_cycles():
    graph = import_graph()
    cycles = import_cycles(graph)
    assert not cycles, f"{len(cycles)} circle(s) of imports among andrea_numba modules:\n" + \
        "\n".join(f"  {len(c)} modules {c}\n    e.g. {one_cycle(graph, c)}" for c in cycles)


def test_kernels_import_nothing_inside_functions():
    found = [f"kernels/{p.name}:{line} imports {mod}"
             for p in sorted(KERNELS.glob("*.py"))
             for line, mod in function_imports(p)
             if (p.name, mod) not in FUNCTION_IMPORTS_ALLOWED]
    assert not found, "imports inside functions (move the code instead, or allow an optional " \
        "dependency in FUNCTION_IMPORTS_ALLOWED):\n  " + "\n  ".join(found)


def test_kernels_import_at_the_top():
    found = [f"kernels/{p.name}:{line}" for p in sorted(KERNELS.glob("*.py")) for line in mid_file_imports(p)]
    assert not found, "imports after the first statement of code:\n  " + "\n  ".join(found)


def test_the_checks_see_what_they_should(tmp_path):
    """The three checks on small made-up modules: a circle, a function's import, a late import."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text('"""doc"""\nfrom __future__ import annotations\nimport os\nX = 1\nimport sys\n'
                 'if X:\n    import json\n\n\ndef f():\n    from . import b\n')
    b.write_text("try:\n    import nvmath\nexcept ImportError:\n    nvmath = None\nY = 2\n")
    assert mid_file_imports(a) == [5, 7]
    assert mid_file_imports(b) == []
    assert function_imports(a) == [(11, ".")]
    graph = {"a": {"b": 11}, "b": {"c": 1}, "c": {"a": 3}, "d": {"a": 1}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert one_cycle(graph, ["a", "b", "c"]) == "a (line 11) -> b (line 1) -> c (line 3) -> a"
