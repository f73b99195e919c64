"""The GPU checks and benchmarks in one process, so every kernel compiles once:
the agreement harness (every version at every block size, ops and whole model) and
lab/bench/kernels.py's table, at the sizes given. Results go to --out as JSON and Markdown.

    python lab/bench/gpu_checks.py --out results/ --check 12M,120M --kernels 12M
    python lab/bench/gpu_checks.py --out results/ --kernels 120M --ops loss,attn

Progress goes to stderr, one line per step, so a long run shows where it is.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab" / "bench"))


def main(argv=None) -> int:
    from andrea_numba import cli
    from lab.cases import CASES

    def ops_list(text: str) -> str:
        bad = [o for o in text.split(",") if o not in CASES] if text != "all" else []
        if bad:
            raise argparse.ArgumentTypeError(f"unknown op {bad[0]!r}: give all, or ops of {', '.join(CASES)}")
        return text

    ap = cli.Parser(prog="python lab/bench/gpu_checks.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=cli.dir_to_write, required=True, help="folder for the result files")
    ap.add_argument("--check", type=cli.config_list, default=[], help="sizes for the agreement harness, comma-separated")
    ap.add_argument("--kernels", type=cli.config_list, default=[], help="sizes for lab/bench/kernels.py's table, comma-separated")
    ap.add_argument("--ops", type=ops_list, default="all", help="ops of the kernel table, comma-separated (default all)")
    ap.add_argument("--seed", type=cli.seed, default=0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import kernels as KB
    from andrea_numba import check
    from andrea_numba.kernels.common import device_name

    say = lambda s: print(s, file=sys.stderr, flush=True)
    ops = list(CASES) if args.ops == "all" else args.ops.split(",")
    ok = True
    for size in args.check:
        t0 = time.time()
        rows = check.run_checks(size, args.seed, progress=say, only=None if args.ops == "all" else ops,
                                model=args.ops == "all")
        good = all(r["ok"] for r in rows)
        ok &= good
        (out / f"check_{size}.json").write_text(json.dumps(
            {"ok": good, "device": device_name(), "seed": args.seed, "size": size, "results": rows}, indent=1))
        model = [r for r in rows if r["op"] == "model"]
        worst = max(model, key=lambda r: r["rel_err"]) if model else None
        say(f"check {size}: {sum(r['ok'] for r in rows)}/{len(rows)} agree in {time.time() - t0:.0f} s"
            + (f"; worst model tensor {worst['tensor']} rel_err {worst['rel_err']:.2e}" if worst else ""))
    for size in args.kernels:
        table = KB.bench_size(size, ops, args.seed, say=say)
        ok &= all(r["agrees"] for r in table["rows"])
        tag = size if args.ops == "all" else f"{size}_{'_'.join(ops)}"
        (out / f"kernels_{tag}.json").write_text(json.dumps(table, indent=1))
        (out / f"kernels_{tag}.md").write_text(KB.markdown([table]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
