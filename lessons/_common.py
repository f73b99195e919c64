"""What every lesson needs: the command line, the simulator switch, step headers, figures.

Import this module FIRST in a lesson, before anything that imports numba:

    import _common as C                      # sets NUMBA_ENABLE_CUDASIM=1 when there is no GPU
    args = C.start(__doc__)                  # parses --interactive and --figures DIR
    C.step("Forward values")                 # a numbered header (and a pause with --interactive)
    C.say("Plain words between numbers.")   # dedented, wrapped text
    C.savefig(fig, "01_chain.png")           # writes into the figures folder, prints the path
    C.finish()

Command line of every lesson:

    --interactive    wait for Enter before each step (for a class); without it the lesson prints
                     everything and exits, so CI can run it
    --figures DIR    where the PNG figures go (default: a new temporary directory, printed at the
                     end; nothing is written into the repository)

Without a GPU the kernels run in Numba's CUDA simulator: this module sets NUMBA_ENABLE_CUDASIM=1
unless the variable is already set or `nvidia-smi -L` lists a GPU. Set NUMBA_ENABLE_CUDASIM=0 or 1
yourself to choose. Opened as a notebook (Jupyter, VS Code), the kernel's own arguments are ignored.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path


def _gpu_present() -> bool:
    """True when the NVIDIA driver lists a GPU (without importing numba, which reads the switch once)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        p = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return p.returncode == 0 and "GPU" in p.stdout


if "numba" not in sys.modules and "NUMBA_ENABLE_CUDASIM" not in os.environ and not _gpu_present():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"

# the repository root on the path, so `import reference` and `import andrea_numba` work from a
# checkout even without `pip install -e .`
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")                        # headless: figures go to files

WIDTH = 96
_state = {"step": 0, "interactive": False, "figures": None, "t0": time.time(), "written": []}


def _in_notebook() -> bool:
    return "ipykernel" in sys.modules


def start(doc: str | None = None, add_arguments=None) -> argparse.Namespace:
    """Parse the lesson's command line and print its title. add_arguments(parser) adds a lesson's own options."""
    first = (doc or "").strip().splitlines()[0] if doc else ""
    ap = argparse.ArgumentParser(description=first, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=textwrap.dedent(__doc__.split("Command line of every lesson:")[1]
                                                        .split("Without a GPU")[0]))
    ap.add_argument("--interactive", action="store_true", help="pause for Enter between steps")
    ap.add_argument("--figures", metavar="DIR", help="folder for the PNG figures (default: andrea-lessons/ in the "
                    "system's temporary folder, one folder that every lesson's run reuses)")
    if add_arguments is not None:
        add_arguments(ap)
    args = ap.parse_args([] if _in_notebook() else None)
    _state["interactive"] = args.interactive
    _state["figures"] = Path(args.figures) if args.figures else None
    _state["t0"] = time.time()
    print("=" * WIDTH)
    print(first)
    where = "in Numba's CUDA simulator (no GPU found)" if SIMULATED else "on the GPU"
    print(f"(kernels, where the lesson uses them, run {where})")
    print("=" * WIDTH)
    return args


def default_dir() -> Path:
    """andrea-lessons/ in the system's temporary folder: one folder for every lesson's figures and
    lesson 06's runs, reused (a figure of the same name is overwritten), so runs do not pile up."""
    return Path(tempfile.gettempdir()) / "andrea-lessons"


def figures_dir() -> Path:
    """The figures folder, created on first use."""
    if _state["figures"] is None:
        _state["figures"] = default_dir()
    _state["figures"].mkdir(parents=True, exist_ok=True)
    return _state["figures"]


def pause():
    if _state["interactive"]:
        try:
            input("\n    press Enter to continue ")
        except EOFError:                     # stdin closed: carry on
            print()


def step(title: str):
    """A numbered step header; with --interactive, waits for Enter first (except before step 1)."""
    if _state["step"] > 0:
        pause()
    _state["step"] += 1
    print()
    print(f"--- step {_state['step']}: {title} " + "-" * max(3, WIDTH - 14 - len(title)))


def say(text: str):
    """Print a paragraph (or several, separated by blank lines), dedented and wrapped."""
    text = textwrap.dedent(text).strip("\n")
    for para in text.split("\n\n"):
        if para.startswith("    ") or "\n    " in para:        # indented blocks stay as written
            print(para)
        elif re.match(r"\d+\. ", para):                          # a numbered item: hanging indent
            print(textwrap.fill(" ".join(para.split()), WIDTH, subsequent_indent="   "))
        else:
            print(textwrap.fill(" ".join(para.split()), WIDTH))
        print()


def table(rows, header=None, fmt=None):
    """Print rows as aligned columns. fmt: one format spec per column ('' for str())."""
    rows = [list(r) for r in rows]
    fmt = fmt or [""] * len(rows[0])
    cells = [[format(v, f) if f else str(v) for v, f in zip(r, fmt)] for r in rows]
    if header:
        cells.insert(0, list(header))
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    for k, r in enumerate(cells):
        print("    " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if header and k == 0:
            print("    " + "  ".join("-" * w for w in widths))
    print()


def savefig(fig, name: str) -> Path:
    """Save a matplotlib figure as DIR/name, close it, print and remember the path."""
    import matplotlib.pyplot as plt
    path = figures_dir() / name
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    record_figure(path)
    return path


def record_figure(path) -> Path:
    path = Path(path)
    _state["written"].append(path)
    print(f"    figure: {path}")
    return path


def finish():
    print()
    print("=" * WIDTH)
    if _state["written"]:
        print("figures written:")
        for p in _state["written"]:
            print(f"    {p}")
    print(f"lesson done in {time.time() - _state['t0']:.1f} s")
    print("=" * WIDTH)
