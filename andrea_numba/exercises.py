"""The classroom exercises, their grader, and a class's gradebook.

    python -m andrea_numba.exercises list                          # every exercise and the state of your file
    python -m andrea_numba.exercises check layernorm_bwd           # grade lessons/exercises/layernorm_bwd.py
    python -m andrea_numba.exercises check layernorm_bwd --file my_copy.py
    python -m andrea_numba.exercises check all --dir lessons/solutions   # a teacher's sanity check
    python -m andrea_numba.exercises check k_loss_bwd --json
    python -m andrea_numba.exercises grade class/                  # class/alice/*.py, class/bob/*.py -> class/grades.csv

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
        tolerance |err| <= atol + rtol |ref| (check.OP_TOL: rtol 1e-5, atol 1e-5 max|ref|): float32 cannot
        reach 1e-7. Every launch is recorded: the answer must come from your file's kernel.

Each file is graded in a process of its own, with a time limit (a fork of a warm process that
has imported the grader, where the platform forks; a fresh interpreter where it does not). That
process works out the twin's answers first, then puts up the walls of andrea_numba/sandbox.py and
runs your file: the twin's backward, the op table, the engine's kernels, the lab and
lessons/solutions are out of its reach, by any import, attribute, file or frame; a kernel
exercise's launches are recorded. A file that reaches for the answer is refused with one line
(status "refused"). The forward twin and andrea_numba.kernels.common's helpers are allowed, as
the stubs use them. What the walls can and cannot see: docs/teaching.md.

Kernels run in Numba's CUDA simulator (one Python thread per CUDA thread: slow, but an error in
your kernel comes back with your line number). This module sets NUMBA_ENABLE_CUDASIM=1 unless the
environment already says; NUMBA_ENABLE_CUDASIM=0 runs the kernels on your GPU.

check(name, path=None) -> dict is the same check for tests and scripts; status is one of
STATUSES. grade DIR grades one folder per student, every exercise file in each (--jobs processes
at a time, --timeout seconds per file), and writes the gradebook CSV (andrea_numba/gradebook.py).
Exit codes: check: 0 every row passes, 1 anything else, 2 usage; grade: 0 the gradebook is
written, 1 it could not be, 2 usage.
"""
from __future__ import annotations

import os
import sys

# The simulator unless the environment says, set before anything imports numba. A process that has
# imported numba already (the trainer, grading a --kernel file) has chosen; its environment is left
# as it is, so that the processes it starts (the trainer's compile workers) run as it does. The
# grading process it starts imports this module first, and chooses here.
if "numba" not in sys.modules:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import argparse  # noqa: E402
import atexit  # noqa: E402
import ast  # noqa: E402
import dis  # noqa: E402
import importlib.util  # noqa: E402
import inspect  # noqa: E402
import pkgutil  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import queue  # noqa: E402
import re  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from concurrent.futures import ThreadPoolExecutor, as_completed  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import reference as R  # noqa: E402

from . import check as H  # noqa: E402
from . import cli, gradebook, sandbox, warm  # noqa: E402
from . import gradcheck as G  # noqa: E402
from .cases import CASES, Dims  # noqa: E402
from .kernels.common import SIMULATOR, device_name  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXERCISE_DIR = Path("lessons") / "exercises"
TOL = G.TOL                      # float64: a row is right at rel_err <= 1e-7
STUB = "raise NotImplementedError("
STATUSES = ("pass", "fail", "not implemented", "refused", "error", "timeout", "crash", "missing")
TIMEOUT = 120.0                  # seconds one file may take, by default (a kernel file: a few in the simulator)
MAX_TIMEOUT = 86400.0
# What every exercise may import of the engine: common's helpers (and the packages above them).
# The twin's modules stay too, their backwards replaced by tripwires (sandbox.py).
ALLOWED = ("andrea_numba.kernels.common",)
# Out of the student's reach while the file runs (besides the hidden modules' own files).
BLOCKED_DIRS = ("andrea_numba", "reference", "lab", "lessons/solutions")


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
    allow: tuple = ()       # engine modules the given code uses (their kernels are allowed launches)


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
        launch="loss_bwd", dims=(1, 4, 8, 2, 7, 5), allow=("andrea_numba.kernels.matmul",)),
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
    """The check cannot grade the file: status ("not implemented", "refused" or "error") and one line."""

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


def _source(ex: Exercise, path: Path) -> str:
    if not path.exists():
        raise Stop("error", f"{ex.name}: no file {show(path)} (copy it from lessons/exercises/)")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise Stop("error", f"{ex.name}: {show(path)} is not UTF-8 text") from None
    except OSError as e:
        raise Stop("error", f"{ex.name}: cannot read {show(path)} ({e.strerror})") from None


def _compiled(ex: Exercise, path: Path, source: str):
    """The file's code object, named by its absolute path (what the launch record matches kernels by)."""
    try:
        return compile(source, str(path.resolve()), "exec")
    except SyntaxError as e:
        raise Stop("error", f"{ex.name}: {show(path)}, line {e.lineno}: {type(e).__name__}: {e.msg}") from None
    except ValueError as e:                                 # e.g. a NUL byte in the source
        raise Stop("error", f"{ex.name}: {show(path)} cannot be compiled: {e}") from None


def _module(ex: Exercise, path: Path):
    """An empty module for the file, in sys.modules (Numba and dataclasses look modules up by name)."""
    modname = f"_andrea_exercise_{ex.name}_{abs(hash(str(path.resolve())))}"
    mod = importlib.util.module_from_spec(importlib.util.spec_from_file_location(modname, path))
    sys.modules[modname] = mod
    return mod


def _run_module(ex: Exercise, mod, code, path: Path):
    """Run the file's top level in its module. Stop with one line on an error, naming the line."""
    try:
        exec(code, vars(mod))
    except sandbox.Refused:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001  (whatever the student's file raises, in one line)
        line = _line_in(e, path)
        raise Stop("error", f"{ex.name}: {show(path)}{f', line {line}' if line else ''} does not import: "
                            f"{_first_line(e)}") from None
    needed = [ex.func] + (["gelu_grad"] if ex.name == "mlp_bwd" else []) + ([ex.launch] if ex.launch else [])
    for name in needed:
        if not callable(getattr(mod, name, None)):
            raise Stop("error", f"{ex.name}: {show(path)} defines no function {name}")


def load(ex: Exercise, path: Path):
    """Import the student's file by path, in this process and without walls (check() grades in a
    process of its own). Stop with one line on a missing file, a syntax error or an import error."""
    path = Path(path)
    mod = _module(ex, path)
    _run_module(ex, mod, _compiled(ex, path, _source(ex, path)), path)
    return mod


def _imported_modules(source: str, path: Path) -> set:
    """Every module the file imports, by full name: `from a.b import c` counts as a.b and a.b.c."""
    names = set()
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def imports_answer(ex: Exercise, source: str, path: Path) -> str | None:
    """One line when the file's import statements borrow the answer (read before it runs): a kernel
    file that imports the engine's own kernels of its op (or the whole engine), any file that
    imports the twin's backward."""
    case = CASES[ex.op]
    imported = _imported_modules(source, path)
    if ex.kind == "kernel":
        hit = sorted(imported & {case.module.__name__, "andrea_numba.gpu_model", "andrea_numba.recipes"})
        if hit:
            return (f"{ex.name}: {show(path)} imports the engine's own kernels ({hit[0]}): "
                    f"write the kernel yourself (andrea_numba.kernels.common's helpers are allowed)")
    banned = _banned(ex)
    hit = sorted(m for m in imported if m.rsplit(".", 1)[-1] in banned and m.startswith("reference"))
    if hit:
        return f"{ex.name}: {show(path)} imports the twin's {hit[0].rsplit('.', 1)[-1]}: write your own"
    return None


def _banned(ex: Exercise) -> set:
    """The names of the twin's functions that are this exercise's answer."""
    return {CASES[ex.op].bwd} | ({"gelu_grad"} if ex.name == "mlp_bwd" else set())


def borrowed(ex: Exercise, mod, path: Path) -> str | None:
    """One line when the loaded file holds or names the answer: the engine's kernels of its op, the
    twin's backward (which the walls have made a tripwire, sandbox.Tripwire, by then), code that
    names it (R.layernorm_bwd), or a kernel that calls what only a host can run. The walls refuse
    the routes that no reading of the file shows."""
    case = CASES[ex.op]
    for name, value in vars(mod).items():
        if ex.kind == "kernel" and getattr(getattr(value, "py_func", value), "__module__", None) == case.module.__name__:
            return (f"{ex.name}: {show(path)} imports the engine's own kernels ({name}): "
                    f"write the kernel yourself (andrea_numba.kernels.common's helpers are allowed)")
        if isinstance(value, sandbox.Tripwire):
            return f"{ex.name}: {show(path)} calls the twin's {value.name}: write your own"
    banned = _banned(ex)
    functions = [getattr(v, "py_func", v) for v in vars(mod).values()]      # a @cuda.jit kernel's Python function
    codes = [f.__code__ for f in functions if inspect.isfunction(f) and f.__module__ == mod.__name__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if inspect.iscode(c)]
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval in banned:     # R.layernorm_bwd(...)
                whose = "the twin's" if ex.kind == "numpy" else "the twin's or the engine's"
                return f"{ex.name}: {show(path)} calls {whose} {ins.argval}: write your own"
    if ex.kind == "kernel":
        for value in vars(mod).values():
            fn = getattr(value, "py_func", None)
            what = sandbox.kernel_host_calls(value) if inspect.isfunction(fn) and fn.__module__ == mod.__name__ else None
            if what:
                return (f"{ex.name}: {show(path)}: {fn.__name__} uses {what}, which only the host can run: a kernel "
                        f"computes with cuda, math, numba's types and other @cuda.jit functions")
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
    rtol, a = H.OP_TOL
    return (f"float32 kernel against the float64 twin, harness tolerance |err| <= atol + rtol|ref| "
            f"(rtol {rtol:.0e}, atol {a:.0e} max|ref|; float32 cannot reach the float64 1e-7); "
            f"outputs NaN-poisoned, += buffers pre-filled, two runs must agree bit for bit")


# ---------------------------------------------------------------------------------------------
# the twin's side, worked out before the student's file runs (the walls then hide the twin's backward)

GELU_Z = np.linspace(-5.0, 5.0, 101)          # where mlp_bwd's gelu_grad is checked


def _expected(ex: Exercise, seed: int) -> dict:
    """numpy: the backward's signature, the check's inputs and the twin's gradients on them;
    kernel: the harness's reference (values, twin results) and its random generator, the device."""
    case = CASES[ex.op]
    if ex.kind == "numpy":
        values, outs, upstream = G.op_values(case, seed)
        want = {"signature": inspect.signature(case.twin_bwd), "values": values,
                "twin": case.backward({**values, **outs, **upstream})}
        if ex.name == "mlp_bwd":
            want["gelu_grad"] = R.gelu_grad(GELU_Z)
        return want
    if not SIMULATOR and not cuda.is_available():
        raise Stop("error", f"{ex.name}: no CUDA GPU found: run with NUMBA_ENABLE_CUDASIM=1 (the simulator)")
    rng, dims = np.random.default_rng(seed), Dims(*ex.dims)
    return {"rng": rng, "dims": dims, "ref": H.reference_for(case, "bwd", dims, rng), "device": device_name()}


# ---------------------------------------------------------------------------------------------
# numpy exercises: gradcheck's cases with the student's backward in place of the twin's

def _check_numpy(ex: Exercise, mod, seed: int, want: dict) -> list[dict]:
    case = CASES[ex.op]
    student, params = getattr(mod, ex.func), list(want["signature"].parameters)   # the twin's, as the student's
    names = [n[1:] for n in case.bwd_out]                       # the backward returns their gradients, in order
    inputs = want["values"]
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
        seen["grads"] = dict(zip(case.bwd_out, grads))
        return grads

    checked.__signature__ = want["signature"]
    rows = G.check_op(case, seed, backward=checked)
    ref, mine = want["twin"], seen["grads"]                      # the twin, on the very same arguments
    out = []
    if ex.name == "mlp_bwd":                                          # part 1 of the exercise, alone
        z = GELU_Z.copy()
        g = np.asarray(mod.gelu_grad(z.copy()), dtype=np.float64)
        if g.shape != z.shape:
            raise Stop("error", f"{ex.name}: gelu_grad returned shape {g.shape} for z of shape {z.shape}")
        numeric = G.numerical_gradient(lambda: float(np.sum(R.gelu(z))), z)
        out.append(_numpy_row(ex, "gelu", "gelu'(z)", G.rel_error(g, numeric), G.rel_error(g, want["gelu_grad"])))
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
# kernel exercises: the agreement harness on tiny float32 inputs, every launch recorded

def _check_kernel(ex: Exercise, mod, path: Path, want: dict, record: sandbox.LaunchRecord) -> list[dict]:
    kernel = getattr(mod, ex.func)
    if not SIMULATOR:        # on a GPU a raise inside a kernel does not reach Python: read the source
        lines, start = inspect.getsourcelines(getattr(kernel, "py_func", kernel))
        stub = [start + i for i, s in enumerate(lines) if STUB in s]
        if stub:
            raise _not_implemented(ex, path, stub[0])
    record.kernel = kernel
    launch = record.watch(getattr(mod, ex.launch))
    rows = H.check_launcher(CASES[ex.op], "bwd", launch, want["dims"], want["rng"], ref=want["ref"])
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
# grading one file, inside its own process

def _result(ex: Exercise, shown: str) -> dict:
    return {"name": ex.name, "kind": ex.kind, "op": ex.op, "file": shown,
            "device": "NumPy, float64" if ex.kind == "numpy" else "", "status": "error", "ok": False,
            "message": None, "rows": [],
            "criterion": CRITERION_NUMPY if ex.kind == "numpy" else _criterion_kernel()}


def _walls(ex: Exercise, path: Path, mod, log_fd: int):
    """The walls for this file (and, for a kernel exercise, its launch record, installed)."""
    refuse = sandbox.Refuser(log_fd, f"{ex.name}: {show(path)}", vars(mod))
    reference = [n for n in sys.modules if n == "reference" or n.startswith("reference.")]
    keep = sandbox.reachable_modules(ALLOWED + ex.allow + tuple(reference))
    record = None
    if ex.kind == "kernel":
        helpers = [sys.modules[n].__file__ for n in keep if n.startswith("andrea_numba.kernels.")]
        record = sandbox.LaunchRecord(refuse, path, helpers)
        record.install()
    walls = sandbox.Walls(refuse, path, keep, [REPO / d for d in BLOCKED_DIRS])
    return walls, record


def _grade_here(name: str, path: Path, seed: int = 0, log_fd: int = 2) -> dict:
    """Grade one file in this process: work out the twin's answers, put the walls up (for good:
    this is for a process that grades this one file, check() starts one), run the file, check it.
    Refusals are also written, at once, as lines to log_fd. Returns check()'s dict."""
    ex, path = BY_NAME[name], Path(path)
    res = _result(ex, show(path))
    try:
        source = _source(ex, path)
        want = _expected(ex, seed)
        res["device"] = want.get("device", res["device"])
        code = _compiled(ex, path, source)
        for info in pkgutil.iter_modules(R.__path__):    # every twin module, so that the walls scrub all
            importlib.import_module(f"reference.{info.name}")
        mod = _module(ex, path)
        walls, record = _walls(ex, path, mod, log_fd)
        why = imports_answer(ex, source, path)
        if why:
            raise Stop("refused", why)
        walls.up(protect=sandbox.protected())
        _run_module(ex, mod, code, path)
        why = borrowed(ex, mod, path)
        if why:
            raise Stop("refused", why)
        rows = _check_numpy(ex, mod, seed, want) if ex.kind == "numpy" else _check_kernel(ex, mod, path, want, record)
        walls.verify()
    except sandbox.Refused as e:
        res["status"], res["message"] = "refused", str(e)
        return res
    except Stop as s:
        res["status"], res["message"] = s.status, s.message
        return res
    except NotImplementedError as e:
        res["status"], res["message"] = "not implemented", _not_implemented(ex, path, _line_in(e, path)).message
        return res
    except (Exception, SystemExit) as e:  # noqa: BLE001  (the student's code raised: one line with its place)
        line = _line_in(e, path)
        where = f" at {show(path)}, line {line}" if line else f" (in {show(path)})"
        res["message"] = f"{name}: your code raised{where}: {_first_line(e)}"
        return res
    res["rows"], res["ok"] = rows, all(r["ok"] for r in rows)
    res["status"] = "pass" if res["ok"] else "fail"
    return res


# ---------------------------------------------------------------------------------------------
# one process per file (andrea_numba/warm.py): a warm process imports the grader once, and a fork
# of it grades each file

# The warm process's code. It puts the package's repository first on sys.path, so that it grades
# with this copy of the grader, whatever the working directory.
SERVE = ("import json, sys\n"
         "sys.path.insert(0, sys.argv[1])\n"
         "try:\n"
         "    from andrea_numba.exercises import serve\n"
         "except Exception as e:\n"
         "    print(json.dumps({'fatal': f'{type(e).__name__}: {e}'}), flush=True)\n"
         "    sys.exit(1)\n"
         "serve()\n")


def serve():
    """The warm grading process: each request ({name, path, shown, seed, echo, cwd}) is one file."""
    warm.serve(_grading_process)


def _grading_process(req: dict, token: str, out: int):
    """In the file's own process: grade it and send the result line (after any refusal lines)."""
    os.chdir(req["cwd"])
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    if not req["echo"]:
        os.dup2(null, 2)
    os.dup2(2, 1)                                   # the student's prints: the caller's stderr, or nowhere
    warnings.simplefilter("ignore")                 # a warning's source line is read from files the walls close
    res = _grade_here(req["name"], Path(req["path"]), req["seed"], out)
    warm.send(out, f"{token} {json.dumps(res)}\n")


def _answer(ex: Exercise, shown: str, timeout: float, ran: warm.Ran) -> dict:
    """check()'s dict from what a file's process sent: a refusal line wins over the result line; no
    result line is a timeout (the time limit came first) or a crash."""
    lines = ran.text.splitlines()
    refusals = [s[len("refused "):] for s in lines if s.startswith("refused ")]
    found = [s[len(ran.token) + 1:] for s in lines if s.startswith(ran.token + " ")]
    res = _result(ex, shown)
    if found:
        try:
            res = json.loads(found[-1])
        except ValueError:
            res["message"] = f"{ex.name}: the grading process of {shown} sent a result that cannot be read"
    elif ran.timed_out:
        res["status"] = "timeout"
        res["message"] = f"{ex.name}: {shown} took longer than {timeout:g} s, the time limit (an endless loop?)"
    else:
        res["status"], res["message"] = "crash", f"{ex.name}: {shown} ended its grading process ({ran.how})"
    if refusals and res["status"] != "refused":
        res.update(status="refused", ok=False, message=refusals[0], rows=[])
    res["seconds"] = round(ran.seconds, 3)
    return res


class Grader:
    """Grades files one at a time, each in a process of its own forked from this grader's warm
    process. echo: the students' prints reach this process's stderr (check) or nowhere (grade)."""

    def __init__(self, echo: bool = True):
        self.warm = warm.Warm([sys.executable, "-c", SERVE, str(REPO)], echo)

    def grade(self, name: str, path, seed: int = 0, timeout: float = TIMEOUT) -> dict:
        ex, path = BY_NAME[name], Path(path)
        req = {"name": name, "path": str(path.resolve()), "shown": show(path), "seed": seed,
               "echo": self.warm.echo, "cwd": os.getcwd()}
        try:
            return _answer(ex, req["shown"], timeout, self.warm.run(req, timeout))
        except warm.Lost as e:
            res = _result(ex, req["shown"])
            res["status"], res["message"] = "crash", f"{name}: the grading process of {req['shown']} was lost ({e})"
            return res

    def close(self):
        self.warm.close()


_CHECKER = []                   # check()'s grader, started on the first check


def check(name: str, path=None, seed: int = 0, timeout: float = TIMEOUT) -> dict:
    """Grade one exercise file (default: lessons/exercises/NAME.py) in a process of its own, with the
    walls up and a time limit of `timeout` seconds. Returns {"name", "kind", "op", "file", "device",
    "criterion", "status", "ok", "message", "rows", "seconds"}: status one of STATUSES; rows
    [{"tensor", "rel_err", "verdict", "ok", "hint", ...}]; message: the one line when there are no rows."""
    if name not in BY_NAME:
        raise ValueError(f"unknown exercise {name!r}: python -m andrea_numba.exercises list")
    if not _CHECKER:
        _CHECKER.append(Grader(echo=True))
        atexit.register(_CHECKER[0].close)
    return _CHECKER[0].grade(name, Path(path) if path is not None else default_path(name), seed, timeout)


# ---------------------------------------------------------------------------------------------
# a class: one folder per student

def grade_class(folder: Path, seed: int = 0, timeout: float = TIMEOUT, jobs: int = 1, progress=None):
    """Grade every exercise file in every student folder of `folder`, `jobs` files at a time.
    Returns (students, exercises, rows): the exercises any student handed in, and one gradebook
    row per student and exercise (status "missing" where the student's folder lacks the file).
    progress(line) is called as each file finishes."""
    folder = Path(folder)
    students = gradebook.student_folders(folder)
    names = [e.name for e in EXERCISES if any((folder / s / f"{e.name}.py").is_file() for s in students)]
    pairs = [(s, n) for s in students for n in names]
    todo = [(s, n) for s, n in pairs if (folder / s / f"{n}.py").is_file()]
    workers = [Grader(echo=False) for _ in range(max(1, min(jobs, len(todo))))]
    free = queue.SimpleQueue()
    for w in workers:
        free.put(w)

    def one(student, name):
        w = free.get()
        path = folder / student / f"{name}.py"
        try:
            return w.grade(name, path, seed, timeout)
        except Exception as e:  # noqa: BLE001  (a grader's failure is this file's row, not the class's end)
            res = _result(BY_NAME[name], show(path))
            res["status"], res["message"] = "crash", f"{name}: the grader failed on {show(path)}: {_first_line(e)}"
            return res
        finally:
            free.put(w)

    results = {}
    pool = ThreadPoolExecutor(len(workers))
    try:
        futures = {pool.submit(one, s, n): (s, n) for s, n in todo}
        for i, done in enumerate(as_completed(futures), 1):
            (s, n), res = futures[done], done.result()
            results[s, n] = res
            if progress:
                progress(f"[{i}/{len(todo)}] {s}/{n}.py: {res['status']} ({res.get('seconds', 0.0):.1f} s)")
    finally:
        for w in workers:
            w.close()
        pool.shutdown(cancel_futures=True)
    return students, names, [gradebook.row(s, n, results.get((s, n))) for s, n in pairs]


def file_status(name: str, path=None) -> str:
    """For `list`, without running anything: missing | syntax error | not started | in progress |
    written (not checked)."""
    path = Path(path) if path is not None else default_path(name)
    if not path.exists():
        return "missing"
    try:
        text = path.read_text()
        compile(text, str(path), "exec")
    except SyntaxError as e:
        return f"syntax error, line {e.lineno}"
    except (UnicodeDecodeError, ValueError):
        return "not UTF-8 text"
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



def _timeout(text: str) -> float:
    """A time limit in seconds: positive, at most a day."""
    v = cli.positive_float(text)
    if v > MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_TIMEOUT:g} seconds, got {text!r}")
    return v


def _grade(args) -> int:
    """The grade command: every student folder of args.dir, the gradebook CSV, a summary."""
    try:
        students = gradebook.student_folders(args.dir)
    except OSError as e:
        cli.fail(f"cannot read the class folder {show(args.dir)} ({e.strerror or e})")
    if not students:
        cli.fail(f"no student folders in {show(args.dir)}: give a folder that holds one folder per student "
                 f"(class/alice/layernorm_bwd.py, class/bob/...)")
    if not any((args.dir / s / f"{e.name}.py").is_file() for s in students for e in EXERCISES):
        cli.fail(f"no exercise files in the student folders of {show(args.dir)}: a student's file is named "
                 f"after its exercise (layernorm_bwd.py; see python -m andrea_numba.exercises list)")
    csv_path = args.csv or args.dir / "grades.csv"
    try:
        cli.file_to_write(".csv")(str(csv_path))
    except argparse.ArgumentTypeError as e:
        cli.fail(f"argument --csv: {e}")
    students, names, rows = grade_class(args.dir, args.seed, args.timeout, args.jobs,
                                        progress=lambda line: print(line, file=sys.stderr, flush=True))
    try:
        gradebook.write_csv(csv_path, rows)
    except OSError as e:
        print(gradebook.summary(students, names, rows, None))
        print(f"error: cannot write the gradebook {show(csv_path)} ({e.strerror or e})", file=sys.stderr)
        return 1
    print(gradebook.summary(students, names, rows, show(csv_path)))
    return 0


@cli.exits_on()
def main(argv=None) -> int:
    ap = cli.Parser(prog="python -m andrea_numba.exercises",
                    description="The classroom exercises: list them, check your work, grade a class.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_list = sub.add_parser("list", help="every exercise and the state of your file")
    p_list.add_argument("--dir", type=cli.existing_dir, help="folder of the exercise files (default lessons/exercises)")
    p_check = sub.add_parser("check", help="grade an exercise file")
    p_check.add_argument("name", help="exercise name (see list), or 'all'")
    p_check.add_argument("--file", type=cli.existing_file, help="the file to grade (default lessons/exercises/NAME.py)")
    p_check.add_argument("--dir", type=cli.existing_dir, help="folder of the exercise files (default lessons/exercises)")
    p_check.add_argument("--seed", type=cli.seed, default=0, help="seed of the random inputs (default 0)")
    p_check.add_argument("--timeout", type=_timeout, default=TIMEOUT,
                         help=f"seconds a file may take (default {TIMEOUT:g})")
    p_check.add_argument("--json", action="store_true", help="print the result as JSON")
    p_grade = sub.add_parser("grade", help="grade a class: DIR holds one folder per student, each holding "
                                           "exercise files by their names")
    p_grade.add_argument("dir", type=cli.existing_dir, help="the class folder (DIR/alice/layernorm_bwd.py, ...)")
    p_grade.add_argument("--csv", type=cli.file_to_write(".csv"), help="the gradebook to write (default DIR/grades.csv)")
    p_grade.add_argument("--timeout", type=_timeout, default=TIMEOUT,
                         help=f"seconds one file may take (default {TIMEOUT:g})")
    p_grade.add_argument("--jobs", type=cli.int_range(1, 256), default=os.cpu_count() or 1,
                         help="files graded at once, one process each (default: the CPU count)")
    p_grade.add_argument("--seed", type=cli.seed, default=0, help="seed of the random inputs (default 0)")
    args = ap.parse_args(argv)

    if args.cmd == "list":
        print(format_list(args.dir))
        return 0
    if args.cmd == "grade":
        return _grade(args)
    names = [e.name for e in EXERCISES] if args.name == "all" else [args.name]
    if args.name not in BY_NAME and args.name != "all":
        print(f"error: unknown exercise {args.name!r}; the exercises: {', '.join(BY_NAME)}", file=sys.stderr)
        return 2
    if args.file and len(names) > 1:
        print("error: --file grades one exercise; use --dir with 'all'", file=sys.stderr)
        return 2
    results = [check(n, args.file or default_path(n, args.dir), args.seed, args.timeout) for n in names]
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=1, default=float))
    else:
        print("\n\n".join(format_result(r) for r in results))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
