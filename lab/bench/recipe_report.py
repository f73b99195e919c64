"""The report of a training recipe: validation loss against steps and wall time, the time from
launch to given validation losses, and the best one, for one or more run directories.

    python lab/bench/recipe_report.py RUN_DIR [RUN_DIR ...] --targets 1.50 1.47 --png curve.png --md table.md

Wall time is the run's own clock: `elapsed_s` of each .loss.json record (seconds since launch,
setup, evaluation and checkpoints included, summed over resumes).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from andrea_numba.cli import Parser, positive_float  # noqa: E402
from andrea_numba.runlog import read_loss, read_state  # noqa: E402


def summary(run_dir, targets) -> dict:
    rows = read_loss(run_dir)
    if not rows:
        raise SystemExit(f"error: {run_dir} has no .loss.json records: give a run directory of the trainer")
    state = read_state(run_dir) or {}
    vals = [r for r in rows if "val_loss" in r]
    last = rows[-1]
    tok = [r["tokens_per_s"] for r in rows[len(rows) // 10:] if "tokens_per_s" in r]
    out = {"run": str(run_dir), "name": (state.get("config") or {}).get("name"), "steps": last["step"],
           "elapsed_s": last.get("elapsed_s"), "median_tokens_per_s": sorted(tok)[len(tok) // 2] if tok else None,
           "final_train_loss": last["train_loss"], "final_val_loss": vals[-1]["val_loss"] if vals else None}
    if vals:
        best = min(vals, key=lambda r: r["val_loss"])
        out["best"] = {"val_loss": best["val_loss"], "step": best["step"], "elapsed_s": best.get("elapsed_s")}
    for t in targets:
        hit = next((r for r in vals if r["val_loss"] <= t), None)
        out[f"first_val_le_{t:.2f}"] = None if hit is None else {"step": hit["step"], "elapsed_s": hit.get("elapsed_s")}
    return out


def markdown(sums, targets) -> str:
    def t(x):
        return "-" if x is None or x.get("elapsed_s") is None else f"step {x['step']:,}, {x['elapsed_s'] / 60:.1f} min"
    head = ["run", "steps", "tokens/s", "final train", "final val", "best val (step, time)"]
    head += [f"first val <= {v:.2f}" for v in targets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in sums:
        b = s.get("best")
        cells = [s["name"] or s["run"], f"{s['steps']:,}", f"{s['median_tokens_per_s']:,.0f}",
                 f"{s['final_train_loss']:.4f}", "-" if s["final_val_loss"] is None else f"{s['final_val_loss']:.4f}",
                 "-" if b is None else f"**{b['val_loss']:.4f}** ({t(b)})"]
        cells += [t(s[f"first_val_le_{v:.2f}"]) for v in targets]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(run_dirs, labels, targets, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, (d, label) in enumerate(zip(run_dirs, labels)):
        rows = read_loss(d)
        vals = [r for r in rows if "val_loss" in r]
        steps = [r["step"] for r in rows]
        c = f"C{i}"                                  # one colour per run, in both panels
        ax[0].plot(steps, [r["train_loss"] for r in rows], color=c, lw=0.5, alpha=0.35, label=f"{label} train")
        ax[0].plot([r["step"] for r in vals], [r["val_loss"] for r in vals], color=c, lw=1.8, label=f"{label} val")
        if vals and vals[0].get("elapsed_s") is not None:
            ax[1].plot([r["elapsed_s"] / 60 for r in vals], [r["val_loss"] for r in vals], color=c, lw=1.8,
                       label=f"{label} val")
        if vals:
            best = min(vals, key=lambda r: r["val_loss"])
            ax[0].plot([best["step"]], [best["val_loss"]], "o", color=c, ms=5)
    for a, xl in zip(ax, ("optimiser step", "wall time since launch (min)")):
        for t in targets:
            a.axhline(t, color="grey", ls="--", lw=0.8)
        a.set_xlabel(xl)
        a.set_ylabel("loss (nats per character)")
        a.set_ylim(1.0, 2.6)
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None) -> int:
    ap = Parser(prog="python lab/bench/recipe_report.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories")
    ap.add_argument("--labels", nargs="+", help="a label per run (default: the directory names)")
    ap.add_argument("--targets", nargs="+", type=positive_float, default=[1.50, 1.47])
    ap.add_argument("--png", help="write the curves here")
    ap.add_argument("--md", help="write the table here (markdown)")
    args = ap.parse_args(argv)
    labels = args.labels or [Path(r).name for r in args.runs]
    if len(labels) != len(args.runs):
        ap.error("give one --labels entry per run directory")
    sums = [summary(r, args.targets) for r in args.runs]
    table = markdown(sums, args.targets)
    print(table)
    if args.md:
        Path(args.md).write_text(table)
    if args.png:
        plot(args.runs, labels, args.targets, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
