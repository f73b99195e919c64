"""Your kernel trains the model: the trainer's --kernel EXERCISE=FILE.

    python -m andrea_numba.train --size tiny --kernel k_layernorm_bwd=lessons/exercises/k_layernorm_bwd.py

EXERCISE is a kernel exercise (andrea_numba/exercises.py) with a place in the model, SLOTS below;
the flag may be given once per exercise. Before anything is written:

  1. the file is graded as `python -m andrea_numba.exercises check EXERCISE --file FILE` grades it:
     in a process of its own, behind the walls. Anything but a pass (a failing row, a TODO left, a
     refusal, an import error) is one line on stderr, exit code 2, and no training;
  2. the file is loaded into the trainer's process, and its launch function, wrapped by its slot's
     adapter to take the arguments the model gives the engine's launcher, is checked again by the
     agreement harness (andrea_numba.check) at this run's widths (the model's C, V and context
     length; B = 1 and the run's seq_len, at most CHECK_T, rows), called as the model calls it;
  3. the adapter takes the engine's place in the model's kernel table (GPUModel.kernels[op]'s
     backward), for the whole run. The log says whose kernel runs, and .state.json records the
     file and its sha256; `--resume` grades that file again and trains on with it, and refuses a
     file that changed since (the run resumes bit for bit, or not at all).

Only the fp32 recipe (--precision fp32, --products numba). On a GPU the trainer captures the step as
a CUDA graph: the adapters launch on the stream they are given and allocate nothing, as the given
launch functions do. A launch function changed to allocate or wait for the GPU fails the capture,
and the run trains on eagerly, launch by launch, as the log and the state then say.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .atomic import file_sha256
from .cli import existing_file, one_line
from .kernels import embed

CHECK_T = 256          # rows of the check at the run's widths: B = 1, T = min(seq_len, CHECK_T)


class KernelError(ValueError):
    """A --kernel that cannot train; str(err) is one line."""


# ---------------------------------------------------------------------------------------------
# the adapters: each takes the exercise's launch function and gives a launcher with the signature
# (and the parameter names, which the harness calls it by) of the engine's launcher it replaces

def _layernorm(launch):
    """The engine's layernorm backward takes (dx, dg, db, work, dout, x, mean, rstd, g); the
    exercise's the same without work (its dg, db come from its given kernel, a thread per channel,
    not from the engine's two stages through work)."""
    def layernorm_bwd(dx, dg, db, work, dout, x, mean, rstd, g, stream=0):
        launch(dx, dg, db, dout, x, mean, rstd, g, stream=stream)
    return layernorm_bwd


def _loss(launch):
    """The engine's loss backward takes (dx, dwte, dlogits, work, dloss, x, wte, probs, targets),
    and the model gives it probs as dlogits: the gradient overwrites the softmax in place. The
    exercise's launch is the engine's simple pair (kernels/loss.py, loss_bwd): your dlogits kernel,
    then dx and dwte by the tiled matmul, where the fp32 recipe runs 3xTF32 products with split-K
    (work is not used). Here dlogits is probs itself, so the check runs it in place, as training does."""
    def loss_bwd(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, stream=0):
        launch(dx, dwte, probs, dloss, x, wte, probs, targets, stream=stream)
    return loss_bwd


def _embed_wpe(launch):
    """The engine's embedding backward takes (dwte, dwpe, links, dout, tokens, vocab_size,
    context_length): dwte by the engine's sorted sums (its launches, its bits), then dwpe by yours."""
    def embed_bwd(dwte, dwpe, links, dout, tokens, vocab_size, context_length, stream=0):
        embed.embed_bwd_sorted_dwte(dwte, links, dout, tokens, vocab_size, stream=stream)
        launch(dwpe, dout, stream=stream)
    return embed_bwd


@dataclass(frozen=True)
class Slot:
    op: str                 # the recipe's op whose backward launcher the adapter replaces
    what: str               # what of the model your kernel computes, for the log
    adapt: Callable         # adapt(the exercise's launch function) -> the launcher the model calls
    hint: str = ""          # said when the check at the run's widths fails


SLOTS = {
    "k_layernorm_bwd": Slot("layernorm", "layernorm backward (LNf's; the model's other LayerNorms are fused "
                            "with a residual add, residual_layernorm)", _layernorm),
    "k_loss_bwd": Slot("loss", "loss backward (dlogits; then dx and dwte by the tiled matmul)", _loss,
                       "the trainer runs it in place (dlogits is probs): each thread must read probs[n, v] "
                       "before it writes dlogits[n, v], and touch no other element"),
    "k_embed_bwd_wpe": Slot("embed", "position-embedding backward (dwpe; dwte by the engine)", _embed_wpe),
}
NO_SLOT = {
    "k_residual_add_bwd": "the model has no residual-add backward to replace: the residual stream's "
                          "gradient reaches both paths in place (one buffer, no copy), and each residual "
                          "add is fused with the LayerNorm after it (residual_layernorm)",
}


# ---------------------------------------------------------------------------------------------
# the flag

def flag(text: str) -> tuple[str, Path]:
    """argparse type of --kernel EXERCISE=FILE: (exercise, path), or one line saying what is wrong."""
    from . import exercises as E    # the grader and the harness: loaded for --kernel only
    names = ", ".join(SLOTS)
    name, eq, file = text.partition("=")
    name = name.strip()
    if not eq or not name or not file:
        raise argparse.ArgumentTypeError(f"must be EXERCISE=FILE (e.g. k_layernorm_bwd=lessons/exercises/"
                                         f"k_layernorm_bwd.py), got {text!r}; the exercises: {names}")
    if name in NO_SLOT:
        raise argparse.ArgumentTypeError(f"{name} cannot train: {NO_SLOT[name]}; the exercises that can: {names}")
    ex = E.BY_NAME.get(name)
    if ex is not None and ex.kind == "numpy":
        twin = [k for k in SLOTS if E.BY_NAME[k].op == ex.op]          # the kernel exercise of the same op
        kernel = f"; the kernel exercise of its op is {twin[0]}" if twin else ""
        raise argparse.ArgumentTypeError(f"{name} is a NumPy exercise, and the trainer runs kernels{kernel}; "
                                         f"the kernel exercises that train: {names}")
    if name not in SLOTS:
        raise argparse.ArgumentTypeError(f"unknown exercise {name!r}: choose from {names}")
    return name, existing_file(file)


# ---------------------------------------------------------------------------------------------
# graded, loaded, checked at the run's widths

@dataclass
class YourKernel:
    name: str               # the exercise
    path: Path
    sha256: str
    graded: str             # "3/3": the grader's rows that agree
    checked: str            # the same at the run's widths
    launch: Callable        # the adapter: the launcher the model calls

    @property
    def slot(self) -> Slot:
        return SLOTS[self.name]

    def describe(self) -> str:
        """The log's line."""
        from . import exercises as E    # the grader and the harness: loaded for --kernel only
        return (f"{self.slot.what}: your kernel from {E.show(self.path)} (graded: {self.graded} rows agree; "
                f"at this run's widths: {self.checked})")

    def record(self, file: str) -> dict:
        """Its entry in .state.json's "kernels" (file: the path as the state records it)."""
        return {"file": file, "sha256": self.sha256, "op": self.slot.op, "graded": self.graded}


def _rows(rows) -> str:
    return f"{sum(r['ok'] for r in rows)}/{len(rows)}"


def _check_fp32(cfg):
    t = cfg.train
    if (t.precision, t.products) != ("fp32", "numba"):
        raise KernelError(f"--kernel trains with the fp32 recipe only (--precision fp32, --products numba); "
                          f"this run's is --precision {t.precision} --products {t.products}")


def prepare(wanted, cfg, expect=None) -> list[YourKernel]:
    """wanted: [(exercise, path)] from --kernel. Each file graded in a process of its own, loaded
    here, its adapter checked at the run's widths; KernelError with one line for anything but a
    pass. expect: {exercise: sha256} a resumed run's files must still have."""
    from . import exercises as E    # the grader and the harness: loaded for --kernel only
    from . import gradebook
    if not wanted:
        return []
    _check_fp32(cfg)
    seen = set()
    for name, _ in wanted:
        if name in seen:
            raise KernelError(f"--kernel {name} is given twice: give each exercise once")
        seen.add(name)
    shas = {}
    for name, path in wanted:
        try:
            shas[name] = file_sha256(path)
        except OSError as e:
            raise KernelError(f"--kernel {name}: cannot read {E.show(path)} ({e.strerror or e})") from None
        if expect and shas[name] != expect[name]:
            raise KernelError(f"the run trained with your {name} from {E.show(path)}, which has changed since "
                              f"(sha256 {shas[name][:16]}..., the run's {expect[name][:16]}...): restore it to "
                              f"resume, or start a new run with --out")
    grader = E.Grader(echo=False)
    try:
        results = {name: grader.grade(name, path) for name, path in wanted}
    finally:
        grader.close()
    out = []
    for name, path in wanted:
        res = results[name]
        if res["status"] != "pass":
            why = gradebook.reason(res).removeprefix(f"{name}: ")
            rows = f", {_rows(res['rows'])} rows agree" if res["rows"] else ""
            raise KernelError(f"--kernel {name}: {E.show(path)} does not pass the grader ({res['status']}{rows}): "
                              f"{why}; nothing was trained (every row: python -m andrea_numba.exercises check {name} "
                              f"--file {E.show(path)})")
        out.append(_load(name, path, shas[name], _rows(res["rows"]), cfg))
    return out


def _load(name: str, path: Path, sha: str, graded: str, cfg) -> YourKernel:
    """The graded file loaded into this process (the same bytes), its adapter checked at the run's widths."""
    from . import check as H    # the grader and the harness: loaded for --kernel only
    from . import exercises as E
    from .cases import CASES, Dims
    ex = E.BY_NAME[name]
    try:
        mod = E.load(ex, path)
    except E.Stop as s:
        raise KernelError(f"--kernel {name}: {s.message.removeprefix(f'{name}: ')}") from None
    if file_sha256(path) != sha:
        raise KernelError(f"--kernel {name}: {E.show(path)} changed while it was graded: run again")
    launch = SLOTS[name].adapt(getattr(mod, ex.launch))
    m, t = cfg.model, cfg.train
    dims = Dims.of(m, 1, min(t.seq_len, CHECK_T))
    try:
        rows = H.check_launcher(CASES[SLOTS[name].op], "bwd", launch, dims, np.random.default_rng(t.seed))
    except Exception as e:  # noqa: BLE001  (the student's code raised: one line)
        raise KernelError(f"--kernel {name}: {E.show(path)} raised at this run's widths (C={m.d_model}, "
                          f"V={m.vocab_size}, T={dims.T}): {type(e).__name__}: {one_line(e)}") from None
    bad = [r for r in rows if not r["ok"]]
    if bad:
        r = bad[0]
        hint = SLOTS[name].hint or "does it assume the grader's sizes or block shape?"
        raise KernelError(f"--kernel {name}: {E.show(path)} passes the grader but not at this run's widths "
                          f"(C={m.d_model}, V={m.vocab_size}, T={dims.T}): {r['tensor']} wrong "
                          f"(rel_err {r['rel_err']:.1e}{'' if r['bitwise_repeat'] else ', two runs differ'}); {hint}")
    return YourKernel(name, path, sha, graded, _rows(rows), launch)


def install(model, kernels: list[YourKernel]):
    """Each kernel's adapter in the model's kernel table, as its op's backward (the forward stays)."""
    for k in kernels:
        forward = model.kernels[k.slot.op][0]
        model.kernels[k.slot.op] = (forward, k.launch)


def recorded(state: dict, where: str) -> dict:
    """{exercise: {"file", "sha256", ...}} of a run's state (empty: the engine's kernels), checked."""
    found = state.get("kernels") or {}
    ok = isinstance(found, dict) and all(
        n in SLOTS and isinstance(r, dict) and isinstance(r.get("file"), str) and isinstance(r.get("sha256"), str)
        for n, r in found.items())
    if not ok:
        raise KernelError(f"{where}: 'kernels' is not a record of --kernel files (exercise -> file, sha256): "
                          f"restore the file or start a new run")
    return found
