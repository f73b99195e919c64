"""Where the time of one forward + backward goes, op by op, on the GPU.

    python lab/bench/profile_step.py --size 120M          # B x T from the config

Every launcher of the model's recipe (andrea_numba/recipes.py, or a lab rung: --recipe) and
dropout's is wrapped with cuda.synchronize() before and after,
so each op is timed alone (this serialises the GPU: the total is a little above an unwrapped step).
Prints a table: op, calls per step, total ms, share of the step.
"""
from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))          # lab/ and andrea_numba/ from a checkout

from andrea_numba import cli
from andrea_numba.config import load_config
from andrea_numba.gpu_model import GPUModel
from andrea_numba.kernels import dropout
from andrea_numba.layout import init_params
from lab.recipes import NAMES, get


def main(argv=None):
    ap = cli.Parser(prog="python lab/bench/profile_step.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=cli.config, default="120M")
    ap.add_argument("--iters", type=cli.int_range(1, 10_000), default=3)
    ap.add_argument("--recipe", choices=NAMES, default="fp32", help="the engine's recipe or a lab rung (default fp32)")
    ap.add_argument("--json", type=cli.file_to_write(".json"), help="write the results here too")
    args = ap.parse_args(argv)
    cfg = load_config(args.size)
    m, B, T = cfg.model, cfg.train.batch_size, cfg.train.seq_len
    model = GPUModel(m, B, T, recipe=get(args.recipe))
    model.params.copy_to_device(init_params(m, 0))
    x = cuda.to_device(np.random.default_rng(0).integers(0, m.vocab_size, (B, T)).astype(np.int32))
    model.forward(x, x)                      # compile
    model.backward()
    cuda.synchronize()
    times, calls = defaultdict(float), defaultdict(int)

    def timer(f, name):
        def timed(*a, **k):
            cuda.synchronize()
            t0 = time.perf_counter()
            r = f(*a, **k)
            cuda.synchronize()
            times[name] += time.perf_counter() - t0
            calls[name] += 1
            return r
        return timed
    # the launchers of the model's recipe (model.kernels: embed, the LayerNorms, attention, the
    # linear ops) ...
    model.kernels = {op: tuple(timer(f, f.__name__) for f in pair) for op, pair in model.kernels.items()}
    # ... and dropout's, module-level
    for name in ("dropout_fwd", "dropout_bwd"):
        setattr(dropout, name, timer(getattr(dropout, name), name))
    t0 = time.perf_counter()
    for _ in range(args.iters):
        model.forward(x, x)
        model.backward()
    cuda.synchronize()
    step_ms = (time.perf_counter() - t0) / args.iters * 1e3
    rows = sorted(((n, calls[n] // args.iters, times[n] / args.iters * 1e3) for n in times), key=lambda r: -r[2])
    print(f"{cfg.name}, B={B} T={T}: one forward + backward {step_ms:.1f} ms (ops timed one by one)")
    print(f"{'launcher':<22} {'calls':>5} {'ms':>9} {'share':>6}")
    for n, c, ms in rows:
        print(f"{n:<22} {c:>5} {ms:>9.2f} {ms / step_ms:>6.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": args.size, "B": B, "T": T, "step_ms": step_ms,
                       "ops": [{"op": n, "calls": c, "ms": ms} for n, c, ms in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
