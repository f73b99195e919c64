"""Training quality by precision: the same run (size, seed, data, steps) trained with fp32, bf16
and fp16 products, its validation losses side by side and plotted together.

    python lab/bench/precision_runs.py --out DIR [--size 12M] [--steps 2000] [--precisions fp32,bf16]

Each precision trains in its own process (`python -m andrea_numba.train --size SIZE --precision P
--steps N --out DIR/P`), one after another, or all at once on the one GPU with --parallel (the same
losses, bit for bit: a run's numbers do not depend on what else the GPU runs, only its time does).
--products cublas trains the bf16 and fp16 runs with cuBLASLt's products (fp32 stays the engine's
reference; the FP8 scopes, fp8-fwd, fp8-e5m2 and fp8-all, always run through cuBLASLt); a run named P/cublas in --precisions (fp32/cublas, bf16/cublas) trains P with cuBLASLt's
products beside the others. DIR receives precision_runs.md (every evaluation's
validation loss by precision, and each one's difference from fp32's at the same step),
precision_runs.json and precision_runs.png (the validation curves together). Exit code 0 when every
run finished and, with fp32 among them, every other precision's last validation loss is within 1%
of fp32's; 1 otherwise.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from andrea_numba import cli  # noqa: E402


def precisions(text: str) -> list[str]:
    """"fp32,bf16,bf16/cublas": runs by precision, "/cublas" for one with cuBLASLt's products (a second
    fp32 run, fp32/cublas, shows how far two fp32 runs whose sums differ drift apart)."""
    import argparse

    from andrea_numba.config import PRECISIONS
    values = [v for v in text.split(",") if v]
    bad = [v for v in values if v.removesuffix("/cublas") not in PRECISIONS]
    if bad or not values or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"must be precisions from {', '.join(PRECISIONS)} (each may end in /cublas) "
                                         f"separated by commas, each once, got {text!r}")
    return values


def main(argv=None) -> int:
    ap = cli.Parser(prog="python lab/bench/precision_runs.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=cli.dir_to_write, required=True, help="folder for the runs and the result files")
    ap.add_argument("--size", type=cli.config, default="12M", help="tiny, 12M, 120M or a config file (default 12M)")
    ap.add_argument("--steps", type=cli.positive_int, default=2000, help="steps of each run (default 2000)")
    ap.add_argument("--precisions", type=precisions, default=["fp32", "bf16"],
                    help="comma-separated (default fp32,bf16)")
    ap.add_argument("--products", choices=("numba", "cublas"), default="numba",
                    help="who computes the bf16 and fp16 runs' products (default numba: our kernels)")
    ap.add_argument("--parallel", action="store_true", help="train the precisions at the same time on the one GPU")
    args = ap.parse_args(argv)
    from andrea_numba.runlog import read_loss
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    curves, ok, runs = {}, True, {}
    run_dir = {p: out / p.replace("/", "_") for p in args.precisions}
    for p in args.precisions:
        if run_dir[p].exists():
            cli.fail(f"{run_dir[p]} exists already: choose another --out, or delete it")
    for p in args.precisions:
        precision, library = p.removesuffix("/cublas"), p.endswith("/cublas")
        products = "cublas" if library or precision.startswith("fp8") else "numba" if precision == "fp32" else args.products
        cmd = [sys.executable, "-m", "andrea_numba.train", "--size", args.size, "--precision", precision,
               "--steps", str(args.steps), "--out", str(run_dir[p]), "--log-every", "50", "--products", products]
        if args.parallel:                       # the CPUs shared by the runs' compile workers too
            cmd += ["--compile-workers", "4"]
        print(f"{p}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        runs[p] = subprocess.Popen(cmd, cwd=ROOT)
        if not args.parallel:
            runs[p].wait()
    for p, proc in runs.items():
        ok &= proc.wait() == 0
        curves[p] = [(r["step"], r["val_loss"]) for r in read_loss(run_dir[p]) if r.get("val_loss") is not None]
    steps = sorted({s for c in curves.values() for s, _ in c})
    head = "| step | " + " | ".join(curves) + " | " + " | ".join(f"{p} vs fp32" for p in curves if p != "fp32") + " |"
    lines = [head, "|---" * (1 + len(curves) + sum(p != "fp32" for p in curves)) + "|"]
    rows = []
    for s in steps:
        v = {p: dict(c).get(s) for p, c in curves.items()}
        rel = {p: (v[p] / v["fp32"] - 1) for p in curves if p != "fp32" and "fp32" in v and v[p] and v["fp32"]}
        rows.append({"step": s, "val_loss": v, "rel_to_fp32": rel})
        lines.append(f"| {s} | " + " | ".join("-" if v[p] is None else f"{v[p]:.4f}" for p in curves) + " | "
                     + " | ".join(f"{100 * rel[p]:+.2f}%" if p in rel else "-" for p in curves if p != "fp32") + " |")
    if rows and "fp32" in curves:
        last = rows[-1]["rel_to_fp32"]
        ok &= all(abs(r) <= 0.01 for r in last.values()) and len(last) == len(curves) - 1
    (out / "precision_runs.md").write_text("\n".join(lines) + "\n")
    (out / "precision_runs.json").write_text(json.dumps({"size": args.size, "steps": args.steps, "ok": ok,
                                                         "products": args.products, "rows": rows}, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for p, c in curves.items():
        if c:
            ax.plot(*zip(*c), marker="o", ms=3, label=p)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    ax.set_title(f"{args.size}: the same run by precision of the products ({args.products})")
    ax.legend()
    fig.savefig(out / "precision_runs.png", dpi=120, bbox_inches="tight")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
