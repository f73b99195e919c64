"""Compiling ahead (andrea_numba.precompile) against compiling at launch, on a GPU: the same PTX?

Sets up a Trainer for a size (its buffers, no training), records the launches of a step, an
evaluation and the sampler, compiles them on worker processes and installs them, as a run does
before its first step. Then, for every recorded kernel signature, it compiles the same kernel in
this process, as a launch would, and compares the two PTX texts: equal once the names the compiler
makes up (mangled symbols, shared-memory arrays) and the order of the declarations are set aside.

    python lab/bench/compile_ahead_check.py --size 12M [--workers N] [--json FILE]

Prints a table: kernel, seconds compiled in its worker, PTX instructions, same. Exit 0 when every
signature was compiled ahead and every PTX matches.
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

NAMES = re.compile(r"_ZN[0-9A-Za-z_$]+")             # mangled names carry a per-process unique tag
ARRAYS = re.compile(r"_cudapy_[sl]mem_[0-9]+")        # shared and local arrays, numbered in compile order
DECLARATIONS = (".visible .shared", ".common", ".extern")


def canonical(ptx: str):
    """The PTX with generated names replaced and its module-level declarations sorted."""
    text = ARRAYS.sub("ARRAY", NAMES.sub("SYMBOL", ptx))
    lines = text.splitlines()
    return sorted(l for l in lines if l.startswith(DECLARATIONS)), [l for l in lines if not l.startswith(DECLARATIONS)]


def main(argv=None) -> int:
    from andrea_numba import cli
    ap = cli.Parser(prog="python lab/bench/compile_ahead_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=cli.config, default="12M", help="tiny, 12M, 120M or a config file (default 12M)")
    ap.add_argument("--workers", type=cli.positive_int, help="worker processes (default: one per CPU, at most 16)")
    ap.add_argument("--json", type=cli.file_to_write(".json"), help="also write every number to this file")
    args = ap.parse_args(argv)

    from numba import cuda

    from andrea_numba import train as tr
    from andrea_numba.config import ConfigError, load_config
    from andrea_numba.kernels.common import SIMULATOR, device_name
    from andrea_numba.precompile import compile_ahead, default_workers
    if SIMULATOR or not cuda.is_available():
        cli.fail("lab/bench/compile_ahead_check.py needs a CUDA GPU (the simulator compiles nothing)")
    try:
        cfg = load_config(args.size)
    except ConfigError as e:
        cli.fail(str(e))
    workers = args.workers or default_workers()
    say = lambda s: print(s, file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = tr.Trainer(cfg, Path(tmp) / "run", log=say, compile_workers=workers)
        trainer.setup()
        t0 = time.perf_counter()
        launches = trainer.kernel_launches()
        record_s = time.perf_counter() - t0
        report = compile_ahead(launches, workers, log=say)
        cc = cuda.get_current_device().compute_capability
        rows, ok = [], not report["failed"]      # (a kernel setup compiled already is not sent again)
        t0 = time.perf_counter()
        for disp, argtypes in launches:
            ahead = disp.overloads.get(argtypes)
            here = cuda.compile_ptx(disp.py_func, argtypes, cc=cc)[0]
            same = ahead is not None and canonical(ahead.inspect_asm(cc)) == canonical(here)   # (None: not compiled)
            ok &= same
            rows.append({"kernel": disp.py_func.__name__, "signature": str(argtypes), "same_ptx": same,
                         "ptx_lines": here.count("\n")})
        here_s = time.perf_counter() - t0
    result = {"size": cfg.name, "device": device_name(), "workers": report["workers"], "record_s": record_s,
              "ahead_s": report["seconds"], "ahead_compile_s": report["compile_seconds"], "here_s": here_s,
              "failed": report["failed"], "ok": ok, "rows": rows}
    lines = [f"{cfg.name} on {result['device']}: {len(launches)} kernel signatures recorded in {record_s:.2f} s; "
             f"compiled ahead on {report['workers']} processes in {report['seconds']:.1f} s "
             f"({report['compile_seconds']:.1f} s of compiling); in this process, one after another, to PTX only: "
             f"{here_s:.1f} s", "", "| kernel | PTX lines | same PTX as compiled here |", "|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['ptx_lines']} | {'yes' if r['same_ptx'] else 'NO'} |" for r in rows]
    lines += [f"\nnot compiled ahead: {name} ({why})" for name, why in report["failed"]]
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
