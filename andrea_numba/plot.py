"""Plot a run's training log to a PNG: loss, learning rate and gradient norm against step.

    python -m andrea_numba.plot runs/12M                    # writes runs/12M/loss.png
    python -m andrea_numba.plot runs/12M --out curve.png --log

    from andrea_numba.plot import plot_run
    path = plot_run("runs/12M")                             # returns the Path it wrote

Three panels sharing the step axis:
  1. loss: the train loss of every step (thin, noisy), an exponential moving average of it (the
     trend), and the validation loss at evaluation steps (markers);
  2. the learning rate (warmup, then decay);
  3. the gradient norm before clipping (spikes show instability).
The log is read with andrea_numba.runlog, so it can be plotted while training runs.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")                     # no display: write files only
import matplotlib.pyplot as plt           # noqa: E402
from matplotlib.ticker import FormatStrFormatter  # noqa: E402

from andrea_numba import cli  # noqa: E402
from andrea_numba.runlog import LOSS_FILE, config_name, read_loss, read_state  # noqa: E402

MAX_STEP = 2 ** 31 - 1                    # steps are int32 in the checkpoint; a larger one is a damaged line


class NoLogError(Exception):
    """The run directory has no parsable training log."""


def ema(values: list[float], beta: float = 0.9) -> list[float]:
    """Exponential moving average with bias correction (as in Adam), so the start is not pulled to 0.

        m_t = beta * m_{t-1} + (1 - beta) * x_t,   smoothed_t = m_t / (1 - beta**t)
    """
    out, m = [], 0.0
    for t, x in enumerate(values, start=1):
        m = beta * m + (1 - beta) * x
        out.append(m / (1 - beta ** t))
    return out


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that have a finite number under `key`."""
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if not 0 <= r["step"] <= MAX_STEP or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        try:
            v = float(v)
        except OverflowError:             # an integer too large for a float
            continue
        if math.isfinite(v):
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


def plot_run(run_dir, out=None, log: bool = False) -> Path:
    """Plot RUN_DIR/.loss.json to `out` (default RUN_DIR/loss.png) and return the path written.

    Raises NoLogError if there is no parsable line in the log.
    """
    run_dir = Path(run_dir)
    rows = read_loss(run_dir)
    if not rows:
        raise NoLogError(f"no training log in {run_dir / LOSS_FILE}: "
                         f"train first (python -m andrea_numba.train ...)")
    out = Path(out) if out is not None else run_dir / "loss.png"

    fig, (ax_loss, ax_lr, ax_gn) = plt.subplots(
        3, 1, figsize=(9, 8), sharex=True, gridspec_kw={"height_ratios": [2.2, 1, 1]})

    # panel 1: loss
    steps, train = series(rows, "train_loss")
    if steps:
        ax_loss.plot(steps, train, lw=0.6, alpha=0.35, color="tab:blue", label="train")
        beta = 0.9 if len(train) < 2000 else 0.98      # long runs are noisier per pixel
        ax_loss.plot(steps, ema(train, beta), lw=1.8, color="tab:blue", label=f"train (EMA {beta})")
    vsteps, val = series(rows, "val_loss")
    if vsteps:
        ax_loss.plot(vsteps, val, "o", ms=4, color="tab:orange", label="validation")
    if log:
        ax_loss.set_yscale("log")
        for fmt in (ax_loss.yaxis.set_major_formatter, ax_loss.yaxis.set_minor_formatter):
            fmt(FormatStrFormatter("%g"))         # 3, 4, 6 rather than 3x10^0
    ax_loss.set_ylabel("loss" + (" (log)" if log else ""))
    ax_loss.legend(loc="upper right", frameon=False)

    # panels 2 and 3: learning rate, gradient norm
    for ax, key, label, color in ((ax_lr, "lr", "learning rate", "tab:green"),
                                  (ax_gn, "grad_norm", "grad norm", "tab:red")):
        xs, ys = series(rows, key)
        ax.plot(xs, ys, lw=1.0, color=color)
        ax.set_ylabel(label)
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax_gn.set_xlabel("step")

    for ax in (ax_loss, ax_lr, ax_gn):
        ax.grid(True, alpha=0.3)

    # title: config name and the last step (from .state.json when present)
    state = read_state(run_dir)
    name = config_name(state) or run_dir.name
    last = state.get("step") if state and isinstance(state.get("step"), int) else rows[-1]["step"]
    title = f"{name}: step {last}"
    if steps:
        title += f", last train loss {train[-1]:.4f}"
    if vsteps:
        title += f", val {val[-1]:.4f}"
    fig.suptitle(title)

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


@cli.exits_on(NoLogError)
def main(argv=None) -> None:
    p = cli.Parser(prog="python -m andrea_numba.plot", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=cli.existing_dir, help="the run directory holding .loss.json")
    p.add_argument("--out", type=cli.file_to_write(".png"), default=None,
                   help="PNG to write, in a directory that exists (default RUN_DIR/loss.png)")
    p.add_argument("--log", action="store_true", help="log scale for the loss axis")
    args = p.parse_args(argv)
    out = args.out if args.out is not None else args.run_dir / "loss.png"
    if out.is_dir():
        cli.fail(f"{out} is a directory: give a PNG file name with --out")
    try:
        path = plot_run(args.run_dir, out, log=args.log)
    except OSError as e:
        cli.fail(f"cannot write {out} ({e.strerror or e}): pick another file with --out")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
