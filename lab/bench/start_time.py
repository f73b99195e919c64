"""How long a training run takes to reach its first step, with the kernel cache empty and full.

Starts `python -m andrea_numba.train --size SIZE --steps 1` as a new process REPEATS times with
an empty kernel cache (a fresh directory each time: every kernel compiled) and REPEATS times with
the cache the first run filled, and times each from the moment the process is started to the log
line "first step done" (wall clock, measured here; the trainer's own figure, from /proc, beside
it). Prints a markdown table and writes it, with the raw figures, to --out.

    python lab/bench/start_time.py --size 12M --repeats 3 --out start_time.json
    python lab/bench/start_time.py --size 12M --repeats 2 --precision fp32   # the runs at another precision
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from andrea_numba import cli  # noqa: E402
from andrea_numba.cli import Parser, positive_int  # noqa: E402


def one_run(size: str, cache: Path, out: Path, extra=()) -> dict:
    """Start a run, return the wall seconds to its "first step done" line and what its log said."""
    env = dict(os.environ, ANDREA_KERNEL_CACHE=str(cache))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "andrea_numba.train", "--size", size, "--steps", "1",
                             "--out", str(out), *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first, lines = None, []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if first is None and "first step done" in line:
            first = time.monotonic() - t0
    proc.wait()
    if proc.returncode != 0 or first is None:
        raise SystemExit("error: the run failed:\n" + "\n".join(lines[-20:]))
    said = next((float(m.group(1)) for l in lines if (m := re.search(r"first step done ([\d.]+) s", l))), None)
    cached = next((l for l in lines if l.startswith("kernel cache:")), "")
    compiled = next((l for l in lines if l.startswith("compiled ")), "")
    parts = next((m.group(1) for l in lines if (m := re.search(r"first step done .*? \((.*)\)$", l))), "")
    return {"wall_s": round(first, 2), "logged_s": said, "cache_line": cached, "compile_line": compiled,
            "parts": parts}


def main(argv=None) -> int:
    ap = Parser(description="Seconds from process start to the end of the first step, kernel cache empty and full.")
    ap.add_argument("--size", type=cli.config, default="12M", help="tiny, 12M, 120M or a config file (default 12M)")
    ap.add_argument("--repeats", type=positive_int, default=3, help="runs of each kind (default 3)")
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"),
                    help="the runs' --precision (default: the config's)")
    ap.add_argument("--out", type=cli.file_to_write(".json"), help="write the table and the raw figures to this .json file")
    args = ap.parse_args(argv)
    extra = ("--precision", args.precision) if args.precision else ()
    from andrea_numba.kernels.common import SIMULATOR, device_name
    if SIMULATOR:
        print("error: this measures compiling on a GPU; the simulator compiles nothing", file=sys.stderr)
        return 2
    rows = {"empty": [], "full": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        full = tmp / "cache-full"
        for i in range(args.repeats):
            rows["empty"].append(one_run(args.size, full if i == 0 else tmp / f"cache-empty-{i}", tmp / f"run-e{i}",
                                         extra))
            print("empty cache:", rows["empty"][-1], flush=True)
        for i in range(args.repeats):
            rows["full"].append(one_run(args.size, full, tmp / f"run-f{i}", extra))
            print("full cache: ", rows["full"][-1], flush=True)
    table = ["| kernel cache | runs | process start to the end of the first step, s: median [min-max] | the trainer's log "
             "| where the last run's start went |",
             "|---|---|---|---|---|"]
    for kind, runs in rows.items():
        w = [r["wall_s"] for r in runs]
        table.append(f"| {kind} | {len(w)} | {statistics.median(w):.2f} [{min(w):.2f}-{max(w):.2f}] | "
                     f"{runs[-1]['cache_line'] or runs[-1]['compile_line']} | {runs[-1]['parts']} |")
    text = "\n".join(table)
    flags = f" --precision {args.precision}" if args.precision else ""
    print(f"\n{device_name()}, `python -m andrea_numba.train --size {args.size} --steps 1{flags}`\n\n{text}")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": device_name(), "size": args.size,
                                              "precision": args.precision, "runs": rows,
                                        "table": text}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
