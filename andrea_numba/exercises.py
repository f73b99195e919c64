"""The classroom exercises and their checker.

    python -m andrea_numba.exercises list                          # every exercise and the state of your file
    python -m andrea_numba.exercises check layernorm_bwd           # grade lessons/exercises/layernorm_bwd.py
    python -m andrea_numba.exercises check layernorm_bwd --file my_copy.py
    python -m andrea_numba.exercises check all --dir lessons/solutions   # a teacher's sanity check
    python -m andrea_numba.exercises check k_loss_bwd --json

Two kinds of exercise, files in lessons/exercises/ (the filled-in versions in lessons/solutions/):

numpy   write an op's backward in NumPy, with exactly the twin's signature. Graded like
        gradcheck.check_op: for a random upstream gradient G, the scalar sum(G * forward(inputs))
        is differentiated by float64 centred differences with respect to every input and
        parameter, and compared with what your backward returns; your result is also compared
        with the twin's backward on the same G. Relative error (CS231n), per tensor:
            rel_err = max|a - n| / max(1e-8, max(|a| + |n|))
            <= 1e-7 right | up to 1e-4 uncomfortable | up to 1e-2 suspicious | above 1e-2 wrong
        A row passes only when "right".
kernel  write the body of a Numba @cuda.jit kernel; the launch function is given. Graded by the
        agreement harness (check.check_launcher on the op's case of andrea_numba/cases.py):
        small float32 inputs, output buffers poisoned with NaN, += buffers pre-filled, two runs
        that must agree bit for bit, every tensor against the float64 twin with the harness
        tolerance |err| <= atol + rtol |ref| (rtol 1e-3, atol 1e-4 max|ref|): float32 cannot
        reach 1e-7.

A file that borrows the answer is refused with one line: a kernel file that imports the engine's
own kernels of its op (or the whole engine, gpu_model), any file that imports, holds or calls the
twin's backward. The forward twin and andrea_numba.kernels.common's helpers are allowed.

Kernels run in Numba's CUDA simulator (one Python thread per CUDA thread: slow, but an error in
your kernel comes back as a Python traceback with your line number). This module sets
NUMBA_ENABLE_CUDASIM=1 unless the environment already says; NUMBA_ENABLE_CUDASIM=0 runs the
kernels on your GPU.

check(name, path=None) -> dict is the same check for tests and scripts. Exit codes of the command
line: 0 every row passes, 1 a row fails / not implemented yet / the file does not load, 2 usage.
"""
from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")    # before anything imports numba

import dis  # noqa: E402
import importlib.util  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import reference as R  # noqa: E402

from . import gradcheck as G  # noqa: E402
from .cases import CASES, Dims  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXERCISE_DIR = Path("lessons") / "exercises"
TOL = G.TOL                      # float64: a row is right at rel_err <= 1e-7
STUB = "raise NotImplementedError("


@dataclass(frozen=True)
class Exercise:
    name: str               # file name without .py
    kind: str               # "numpy" or "kernel"
    op: str                 # the op pair (gradcheck / check name)
    func: str               # what the student writes: the twin's backward, or the kernel
    about: str              # one line for `list`
    hints: dict = field(default_factory=dict)    # tensor -> hint shown when its row fails
    launch: str = ""        # kernel exercises: the given launch function
    todos: int = 1          # how many stubs the file holds
    dims: tuple = ()        # kernel exercises: Dims(B, T, C, H, V, T_max) of the check


_SOFTMAX = "ds = att * (datt - sum_u(datt * att)), datt = dy_h @ v_h^T, per head"
_LOSS = "did you divide by B*T? dlogits = (probs - onehot(targets)) * dloss / (B*T)"

EXERCISES = [
    Exercise("embed_bwd", "numpy", "embed", "embed_bwd",
             "token + position embedding: scatter dout into dwte, sum over b into dwpe", {
        "wte": "token ids repeat: dwte[tokens] += dout keeps only one of the repeated rows "
               "(NumPy does not accumulate fancy-index +=): use np.add.at, or a loop over positions",
        "wpe": "dwpe[t] = sum over the batch of dout[b, t] for t < T; rows t >= T stay 0"}),
    Exercise("layernorm_bwd", "numpy", "layernorm", "layernorm_bwd",
             "layer normalisation: dx through the mean and the variance, dg, db", {
        "x": "did you subtract both means: mean(dxhat) and xhat*mean(dxhat*xhat)? "
             "(dxhat = dout * g, means over the C channels of a row, then times rstd)",
        "g": "dg = sum over all B*T rows of dout * xhat, xhat = (x - mean) * rstd",
        "b": "db = sum over all B*T rows of dout"}),
    Exercise("attn_qkv_bwd", "numpy", "attn_qkv", "attn_qkv_bwd",
             "Q, K, V projections: x feeds three products", {
        "x": "x feeds three products: dx = dq @ W_Q^T + dk @ W_K^T + dv @ W_V^T (all three terms)",
        "w_q": "dW_Q = x^T @ dq, with x and dq reshaped to [B*T, C]",
        "w_k": "dW_K = x^T @ dk, with x and dk reshaped to [B*T, C]",
        "w_v": "dW_V = x^T @ dv, with x and dv reshaped to [B*T, C]"}),
    Exercise("attn_bwd", "numpy", "attn", "attn_bwd",
             "causal softmax attention: softmax backward, per head", {
        "q": f"dq_h = ds @ k_h / sqrt(hs), {_SOFTMAX}; did you scale by 1/sqrt(hs)?",
        "k": "dk_h = ds^T @ q_h / sqrt(hs): transpose ds and scale by 1/sqrt(hs); "
             "masked entries must get no gradient (use att, which is 0 there)",
        "v": "dv_h = att^T @ dy_h: transpose att (v[u] is read by every t >= u); "
             "masked entries must get no gradient"}),
    Exercise("attn_out_bwd", "numpy", "attn_out", "attn_out_bwd",
             "attention output projection W_O", {
        "y": "dy = dout @ W_O^T: transpose the weight",
        "w_o": "dW_O = y^T @ dout over all B*T rows, shape [C, C]: check the order (y^T @ dout, not dout^T @ y)"}),
    Exercise("mlp_bwd", "numpy", "mlp", "mlp_bwd",
             "MLP: two products and the GELU derivative", {
        "gelu": "gelu'(z) = 0.5 (1 + tanh u) + 0.5 z (1 - tanh(u)^2) du/dz: did you include "
                "du/dz = k (1 + 3*0.044715 z^2), k = sqrt(2/pi)?",
        "x": "dx = dh_pre @ W_1^T with dh_pre = (dout @ W_2^T) * gelu'(h_pre); is the gelu' row right?",
        "w_1": "dW_1 = x^T @ dh_pre, dh_pre = (dout @ W_2^T) * gelu'(h_pre): gelu' at h_pre, before the GELU",
        "w_2": "dW_2 = h^T @ dout with h AFTER the GELU, rows reshaped to [B*T, 4C]"}, todos=2),
    Exercise("residual_bwd", "numpy", "residual", "residual_add_bwd",
             "residual add: the gradient reaches both terms", {
        "x": "the gradient of a sum reaches each term whole: dx = dout (not split, not halved)",
        "f": "the gradient of a sum reaches each term whole: df = dout (not split, not halved)"}),
    Exercise("dropout_bwd", "numpy", "dropout", "dropout_bwd",
             "dropout: draw the forward's mask again from the key, scale by 1/(1-p)", {
        "x": "dx = dout * keep / (1 - p): did you scale the kept elements by 1/(1-p), and draw keep "
             "from the same key and flat indices as the forward (u_i >= threshold(p))?"}),
    Exercise("loss_bwd", "numpy", "loss", "loss_bwd",
             "tied output projection + cross-entropy: dlogits, dx, dwte", {
        "x": f"{_LOSS}; then dx = dlogits @ wte",
        "wte": f"{_LOSS}; then dwte = dlogits^T @ x over all B*T positions, shape [V, C]"}),
    Exercise("k_residual_add_bwd", "kernel", "residual", "k_residual_add_bwd",
             "warm-up kernel: one thread per element, dx = df = dout", {
        "dx": "dx[i] = dout[i] for every i < n",
        "df": "df[i] = dout[i] for every i < n",
        "nan": "elements left NaN: every thread with i < dout.shape[0] must write BOTH dx[i] and df[i]"},
        launch="residual_add_bwd", dims=(1, 5, 8, 2, 7, 5)),        # 40 elements: not a multiple of the block
    Exercise("k_layernorm_bwd", "kernel", "layernorm", "k_layernorm_bwd",
             "layernorm dx kernel: one row per block, block_sum for the two means", {
        "dx": "each thread saw only its own channels: add the partial sums of the block with "
              "block_sum(buf, s) before taking the means; did you subtract both means: "
              "mean(dxhat) and xhat*mean(dxhat*xhat)?",
        "dg": "dg comes from the given k_layernorm_bwd_params: keep the given launch function",
        "db": "db comes from the given k_layernorm_bwd_params: keep the given launch function",
        "nan": "dx has elements left NaN: stride over the row, for c in range(tid, C, nt), "
               "so every channel is written"},
        launch="layernorm_bwd", dims=(1, 3, 8, 2, 7, 5)),
    Exercise("k_loss_bwd", "kernel", "loss", "k_loss_bwd",
             "dlogits = (probs - onehot) * scale, one row per block", {
        "dx": "did you multiply by scale (= dloss / (B*T))? and subtract 1 only at v == targets[row]?",
        "dwte": "did you multiply by scale (= dloss / (B*T))? and subtract 1 only at v == targets[row]?",
        "nan": "dlogits is not fully written: stride over the row, v in range(threadIdx.x, V, blockDim.x)"},
        launch="loss_bwd", dims=(1, 4, 8, 2, 7, 5)),
    Exercise("k_embed_bwd_wpe", "kernel", "embed", "k_embed_bwd_wpe",
             "position-embedding gradient: sum over b, added (+=) into dwpe", {
        "dwpe": "dwpe accumulates: add into it (+=), do not overwrite it (=); sum dout[b, t, c] over b, "
                "only for t < T",
        "nan": "dwpe became NaN: read dout only inside the bounds, i < T*C"},
        launch="embed_bwd_wpe", dims=(2, 3, 8, 2, 7, 5)),          # rows T..T_max-1 of dwpe stay untouched
]
BY_NAME = {e.name: e for e in EXERCISES}


# ---------------------------------------------------------------------------------------------
# finding and loading the student's file

class Stop(Exception):
    """The check cannot grade the file: status ("not implemented" or "error") and one line."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


def show(path) -> str:
    """A path as the student typed it: relative to the working directory where possible."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def default_path(name: str, folder=None) -> Path:
    """folder/NAME.py, else lessons/exercises/NAME.py under the working directory, else under
    the repository this package lives in."""
    if folder is not None:
        return Path(folder) / f"{name}.py"
    for root in (Path.cwd(), REPO):
        p = root / EXERCISE_DIR / f"{name}.py"
        if p.exists():
            return p
    return REPO / EXERCISE_DIR / f"{name}.py"


def _line_in(exc: BaseException, path: Path):
    """The last line of the student's file in the exception's traceback (None if absent)."""
    target, line = path.resolve(), None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if Path(frame.f_code.co_filename).resolve() == target:
            line = lineno
    if line is None:                                        # e.g. a Numba typing error message
        m = re.search(re.escape(str(path.name)) + r'", line (\d+)', str(exc))
        line = int(m.group(1)) if m else None
    return line


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _not_implemented(ex: Exercise, path: Path, line=None) -> Stop:
    """Point at the TODO above the raise that fired (or the first TODO of the file)."""
    lines = path.read_text().splitlines()
    todo = [i + 1 for i, s in enumerate(lines) if "# TODO" in s and (line is None or i + 1 <= line)]
    at = f", line {todo[-1]}" if todo else ""
    return Stop("not implemented", f"{ex.name}: not implemented yet (the TODO in {show(path)}{at})")


def load(ex: Exercise, path: Path):
    """Import the student's file by path. Stop with one line on a missing file, a syntax error or
    an import error, naming the file and the line."""
    if not path.exists():
        raise Stop("error", f"{ex.name}: no file {show(path)} (copy it from lessons/exercises/)")
    modname = f"_andrea_exercise_{ex.name}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod                  # Numba and dataclasses look modules up by name
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as e:
        raise Stop("error", f"{ex.name}: {show(path)}, line {e.lineno}: {type(e).__name__}: {e.msg}") from None
    except Exception as e:  # noqa: BLE001  (whatever the student's file raises, report it in one line)
        line = _line_in(e, path)
        raise Stop("error", f"{ex.name}: {show(path)}{f', line {line}' if line else ''} does not import: "
                            f"{_first_line(e)}") from None
    needed = [ex.func] + (["gelu_grad"] if ex.name == "mlp_bwd" else []) + ([ex.launch] if ex.launch else [])
    for name in needed:
        if not callable(getattr(mod, name, None)):
            raise Stop("error", f"{ex.name}: {show(path)} defines no function {name}")
    return mod


def _imported_modules(path: Path) -> set:
    """Every module the file imports, by full name: `from a.b import c` counts as a.b and a.b.c."""
    import ast
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def borrowed(ex: Exercise, mod, path: Path) -> str | None:
    """One line when the student's file borrows the answer instead of writing it: it imports the
    engine's own kernels of this op (or the whole engine), or holds or calls the twin's backward."""
    case = CASES[ex.op]
    if ex.kind == "kernel":
        engine = {case.module.__name__, "andrea_numba.gpu_model", "andrea_numba.recipes"}
        hit = sorted(_imported_modules(path) & engine)
        own = [n for n, v in vars(mod).items()
               if getattr(getattr(v, "py_func", v), "__module__", None) == case.module.__name__]
        if hit or own:
            return (f"{ex.name}: {show(path)} imports the engine's own kernels ({(hit or own)[0]}): "
                    f"write the kernel yourself (andrea_numba.kernels.common's helpers are allowed)")
    banned = {case.bwd: case.twin_bwd}
    if ex.name == "mlp_bwd":
        banned["gelu_grad"] = R.gelu_grad
    hit = sorted(m for m in _imported_modules(path) if m.rsplit(".", 1)[-1] in banned and m.startswith("reference"))
    if hit:
        return f"{ex.name}: {show(path)} imports the twin's {hit[0].rsplit('.', 1)[-1]}: write your own"
    for name, fn in banned.items():
        if any(v is fn for v in vars(mod).values()):
            return f"{ex.name}: {show(path)} calls the twin's {name}: write your own"
    functions = [getattr(v, "py_func", v) for v in vars(mod).values()]      # a @cuda.jit kernel's Python function
    codes = [f.__code__ for f in functions if inspect.isfunction(f) and f.__module__ == mod.__name__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if inspect.iscode(c)]
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval in banned:
                return f"{ex.name}: {show(path)} calls the twin's {ins.argval}: write your own"   # R.layernorm_bwd(...)
    return None


# ---------------------------------------------------------------------------------------------
# verdicts

def verdict(err: float) -> str:
    """CS231n's reading of a float64 relative error."""
    if not math.isfinite(err) or err > 1e-2:
        return "wrong"
    if err > 1e-4:
        return "suspicious"
    if err > TOL:
        return "uncomfortable"
    return "right"


CRITERION_NUMPY = ("float64 centred differences (h=1e-5) on a random upstream gradient; right: rel_err "
                   "<= 1e-7 | uncomfortable <= 1e-4 | suspicious <= 1e-2 | wrong above (CS231n)")


def _criterion_kernel():
    from .check import OP_TOL
    rtol, a = OP_TOL
    return (f"float32 kernel against the float64 twin, harness tolerance |err| <= atol + rtol|ref| "
            f"(rtol {rtol:.0e}, atol {a:.0e} max|ref|; float32 cannot reach the float64 1e-7); "
            f"outputs NaN-poisoned, += buffers pre-filled, two runs must agree bit for bit")


# ---------------------------------------------------------------------------------------------
# numpy exercises: gradcheck's cases with the student's backward in place of the twin's

def _check_numpy(ex: Exercise, mod, seed: int) -> list[dict]:
    case = CASES[ex.op]
    student, twin = getattr(mod, ex.func), case.twin_bwd
    params = list(inspect.signature(twin).parameters)     # the student's file has the twin's signature
    names = [n[1:] for n in case.bwd_out]                 # the backward returns their gradients, in order
    inputs = case.make(G.DIMS, np.random.default_rng(seed))
    seen = {}

    def checked(**kwargs):
        out = student(*[kwargs[p] for p in params])
        if len(names) == 1 and isinstance(out, np.ndarray):      # a one-gradient backward returns it alone
            out = (out,)
        if not isinstance(out, (tuple, list)) or len(out) != len(names):
            got = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
            raise Stop("error", f"{ex.name}: {ex.func} returned {got}; it must return "
                                f"{len(names)}: ({', '.join('d' + n for n in names)})")
        for n, g in zip(names, out):
            if np.shape(g) != np.shape(inputs[n]):
                raise Stop("error", f"{ex.name}: {ex.func} returned d{n} of shape {np.shape(g)}; "
                                    f"it must have the shape of {n}, {np.shape(inputs[n])}")
        grads = tuple(np.array(g, dtype=np.float64) for g in out)
        seen["kwargs"], seen["grads"] = dict(kwargs), dict(zip(case.bwd_out, grads))
        return grads

    checked.__signature__ = inspect.signature(twin)
    rows = G.check_op(case, seed, backward=checked)
    ref = case.backward(seen["kwargs"])                   # the twin, on the very same arguments
    mine = seen["grads"]
    out = []
    if ex.name == "mlp_bwd":                                          # part 1 of the exercise, alone
        z = np.linspace(-5.0, 5.0, 101)
        g = np.asarray(mod.gelu_grad(z.copy()), dtype=np.float64)
        if g.shape != z.shape:
            raise Stop("error", f"{ex.name}: gelu_grad returned shape {g.shape} for z of shape {z.shape}")
        numeric = G.numerical_gradient(lambda: float(np.sum(R.gelu(z))), z)
        out.append(_numpy_row(ex, "gelu", "gelu'(z)", G.rel_error(g, numeric), G.rel_error(g, R.gelu_grad(z))))
    for r in rows:
        n = r["tensor"]
        out.append(_numpy_row(ex, n, "d" + n, r["rel_err"], G.rel_error(mine["d" + n], ref["d" + n])))
    return out


def _numpy_row(ex, key, tensor, err, err_twin):
    v = verdict(max(err, err_twin))
    ok = v == "right"
    return {"tensor": tensor, "rel_err": err, "rel_err_twin": err_twin, "verdict": v, "ok": ok,
            "hint": None if ok else ex.hints.get(key, f"compare with the docstring's formula for {tensor}")}


# ---------------------------------------------------------------------------------------------
# kernel exercises: the agreement harness on tiny float32 inputs

def _check_kernel(ex: Exercise, mod, path: Path, seed: int) -> list[dict]:
    from numba import cuda

    from . import check as H
    from .kernels.common import SIMULATOR

    if not SIMULATOR and not cuda.is_available():
        raise Stop("error", f"{ex.name}: no CUDA GPU found: run with NUMBA_ENABLE_CUDASIM=1 (the simulator)")
    kernel = getattr(mod, ex.func)
    if not SIMULATOR:        # on a GPU a raise inside a kernel does not reach Python: read the source
        lines, start = inspect.getsourcelines(getattr(kernel, "py_func", kernel))
        stub = [start + i for i, s in enumerate(lines) if STUB in s]
        if stub:
            raise _not_implemented(ex, path, stub[0])
    rng = np.random.default_rng(seed)
    case = CASES[ex.op]
    rows = H.check_launcher(case, "bwd", getattr(mod, ex.launch), Dims(*ex.dims), rng)
    out = []
    for r in rows:
        finite = math.isfinite(r["max_abs_err"])
        if r["ok"]:
            v, hint = "right", None
        elif not finite:
            v, hint = "wrong (NaN left)", ex.hints.get("nan") or ex.hints.get(r["tensor"])
        elif not r["bitwise_repeat"]:
            v, hint = "wrong (runs differ)", "two runs gave different bits: sum in a fixed order, no atomics"
        else:
            v, hint = "wrong", ex.hints.get(r["tensor"], "compare with the docstring's formula")
        out.append({"tensor": r["tensor"], "rel_err": r["rel_err"], "max_abs_err": r["max_abs_err"],
                    "tol": r["tol"], "bitwise_repeat": r["bitwise_repeat"], "verdict": v, "ok": r["ok"],
                    "hint": hint})
    return out


# ---------------------------------------------------------------------------------------------
# the check

def check(name: str, path=None, seed: int = 0) -> dict:
    """Grade one exercise file (default: lessons/exercises/NAME.py). Returns
    {"name", "kind", "op", "file", "device", "criterion", "status", "ok", "message", "rows"}:
    status "pass" | "fail" | "not implemented" | "error"; rows [{"tensor", "rel_err", "verdict",
    "ok", "hint", ...}]; message: the one line when there are no rows."""
    if name not in BY_NAME:
        raise ValueError(f"unknown exercise {name!r}: python -m andrea_numba.exercises list")
    ex = BY_NAME[name]
    path = Path(path) if path is not None else default_path(name)
    res = {"name": name, "kind": ex.kind, "op": ex.op, "file": show(path), "device": "NumPy, float64",
           "criterion": CRITERION_NUMPY, "status": "error", "ok": False, "message": None, "rows": []}
    try:
        mod = load(ex, path)
        why = borrowed(ex, mod, path)
        if why:
            raise Stop("error", why)
        if ex.kind == "numpy":
            rows = _check_numpy(ex, mod, seed)
        else:
            from .kernels.common import device_name
            res["device"], res["criterion"] = device_name(), _criterion_kernel()
            rows = _check_kernel(ex, mod, path, seed)
    except Stop as s:
        res["status"], res["message"] = s.status, s.message
        return res
    except NotImplementedError as e:
        res["status"], res["message"] = "not implemented", _not_implemented(ex, path, _line_in(e, path)).message
        return res
    except Exception as e:  # noqa: BLE001  (the student's code raised: one line with its place)
        line = _line_in(e, path)
        where = f" at {show(path)}, line {line}" if line else f" (in {show(path)})"
        res["message"] = f"{name}: your code raised{where}: {_first_line(e)}"
        return res
    res["rows"], res["ok"] = rows, all(r["ok"] for r in rows)
    res["status"] = "pass" if res["ok"] else "fail"
    return res


def file_status(name: str, path=None) -> str:
    """For `list`, without running anything: missing | syntax error | not started | in progress |
    written (not checked)."""
    path = Path(path) if path is not None else default_path(name)
    if not path.exists():
        return "missing"
    text = path.read_text()
    try:
        compile(text, str(path), "exec")
    except SyntaxError as e:
        return f"syntax error, line {e.lineno}"
    stubs = text.count(STUB)
    if stubs >= BY_NAME[name].todos:
        return "not started"
    return "in progress" if stubs else "written (run check)"


# ---------------------------------------------------------------------------------------------
# printing

def format_result(res: dict) -> str:
    if res["message"]:
        return res["message"]
    kernel = res["kind"] == "kernel"
    lines = [f"{res['name']} ({res['kind']}, op {res['op']}): {res['file']}  [{res['device']}]"]
    if kernel:
        head = f"  {'tensor':<10} {'rel_err':>9} {'max_abs_err':>11} {'atol':>8}  verdict"
    else:
        head = f"  {'tensor':<10} {'vs numeric':>10} {'vs twin':>9}  verdict"
    lines += [head, "  " + "-" * (len(head) - 2)]
    for r in res["rows"]:
        if kernel:
            lines.append(f"  {r['tensor']:<10} {r['rel_err']:>9.2e} {r['max_abs_err']:>11.2e} "
                         f"{r['tol']['atol']:>8.1e}  {r['verdict']}")
        else:
            lines.append(f"  {r['tensor']:<10} {r['rel_err']:>10.2e} {r['rel_err_twin']:>9.2e}  {r['verdict']}")
        if r["hint"]:
            lines.append(f"      HINT: {r['hint']}")
    n_ok = sum(r["ok"] for r in res["rows"])
    lines.append("  " + "-" * (len(head) - 2))
    lines.append(f"  {res['name']}: {'PASS' if res['ok'] else 'FAIL'}, {n_ok}/{len(res['rows'])} tensors right")
    lines.append(f"  ({res['criterion']})")
    return "\n".join(lines)


def format_list(folder=None) -> str:
    rows = [(e.name, e.kind, e.op, e.about, file_status(e.name, default_path(e.name, folder))) for e in EXERCISES]
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    where = show(default_path(EXERCISES[0].name, folder).parent)
    lines = [f"exercises in {where}/  (check one: python -m andrea_numba.exercises check NAME)",
             f"{'name':<{w[0]}}  {'kind':<{w[1]}}  {'op':<{w[2]}}  {'what':<{w[3]}}  status"]
    lines += [f"{n:<{w[0]}}  {k:<{w[1]}}  {o:<{w[2]}}  {a:<{w[3]}}  {s}" for n, k, o, a, s in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    from . import cli
    ap = cli.Parser(prog="python -m andrea_numba.exercises",
                    description="The classroom exercises: list them, check your work.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_list = sub.add_parser("list", help="every exercise and the state of your file")
    p_list.add_argument("--dir", type=cli.existing_dir, help="folder of the exercise files (default lessons/exercises)")
    p_check = sub.add_parser("check", help="grade an exercise file")
    p_check.add_argument("name", help="exercise name (see list), or 'all'")
    p_check.add_argument("--file", type=cli.existing_file, help="the file to grade (default lessons/exercises/NAME.py)")
    p_check.add_argument("--dir", type=cli.existing_dir, help="folder of the exercise files (default lessons/exercises)")
    p_check.add_argument("--seed", type=cli.seed, default=0, help="seed of the random inputs (default 0)")
    p_check.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)

    if args.cmd == "list":
        print(format_list(args.dir))
        return 0
    names = [e.name for e in EXERCISES] if args.name == "all" else [args.name]
    if args.name not in BY_NAME and args.name != "all":
        print(f"error: unknown exercise {args.name!r}; the exercises: {', '.join(BY_NAME)}", file=sys.stderr)
        return 2
    if args.file and len(names) > 1:
        print("error: --file grades one exercise; use --dir with 'all'", file=sys.stderr)
        return 2
    results = [check(n, args.file or default_path(n, args.dir), args.seed) for n in names]
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=1, default=float))
    else:
        print("\n\n".join(format_result(r) for r in results))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
