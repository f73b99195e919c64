"""Do two versions of an op give the same bits, here? A faster version that only reorders work
(flash attention v7 to v9 against v5, mlp v12 against v11) says it gives the earlier version's
bits; the simulator's tests show it for the logic, and this shows it for the compiled kernels on a
GPU, where the compiler may fuse a multiply and an add one way in one kernel and another way in
the other.

    python lab/bench/same_bits.py --size 12M --op attn_flash --versions 5 9 [--seed 3] [--json FILE]

Both versions run on the same inputs (the harness's, check.reference_for), the same += prefill and
NaN-poisoned outputs, at every block size they both declare (the first one's default when one of
them has no blocks), forward and backward. One line per output: identical or not, and the largest
difference in units of the last place.
"""
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from andrea_numba import check  # noqa: E402
from andrea_numba.cases import Dims, call  # noqa: E402
from lab.cases import CASES  # noqa: E402   (every rung of the ladder)
from andrea_numba.cli import Parser  # noqa: E402
from andrea_numba.config import ConfigError, load_config  # noqa: E402


def outputs_of(case, direction, launch, dims, ref, block, prefill_seed):
    """The outputs of one launcher on the case's inputs (ref: check.reference_for's tuple)."""
    values, refs, outputs, accums = ref
    inputs, outs, accums, scratch, scalars = check.launcher_args(case, launch, dims, values, refs, outputs, accums)
    rng = np.random.default_rng(prefill_seed)                       # the same prefill for both versions
    prefill = {k: rng.standard_normal(np.shape(refs[k])).astype(np.float32) for k in accums}
    d = {k: check.to_dev(v) for k, v in {**inputs, **check.poisoned_buffers(outs, scratch), **prefill}.items()}
    extra = {"block": block} if hasattr(launch, "blocks") else {}
    call(launch, {**scalars, **d}, **extra)
    cuda.synchronize()
    names = [k for k in outputs if k in outs or k in accums or k in inputs]
    return {k: check.to_host(d[k]) for k in names}


def ulps(a, b) -> int:
    """The largest distance in units of the last place between two float32 arrays (NaN: -1)."""
    a, b = np.asarray(a, np.float32).ravel(), np.asarray(b, np.float32).ravel()
    if np.isnan(a).any() or np.isnan(b).any():
        return -1
    ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)          # ordered as the floats are
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.abs(ia - ib).max()) if a.size else 0


def main(argv=None):
    ap = Parser(description="Do two versions of an op give the same bits on this machine?")
    ap.add_argument("--size", default="12M", help="tiny, 12M, 120M or a config file (default 12M)")
    ap.add_argument("--op", required=True, choices=sorted(CASES), help="the op")
    ap.add_argument("--versions", type=int, nargs=2, required=True, metavar=("A", "B"), help="the two versions")
    ap.add_argument("--seed", type=int, default=3, help="seed of the inputs (default 3)")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.size)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    case = CASES[args.op]
    m = cfg.model
    B, T = check.SHAPES.get(args.size, ((2, min(8, m.context_length)),))[0]      # the harness's op shapes
    dims = Dims.of(m, B, T)
    if args.size in check.OP_VOCAB:
        dims = dataclasses.replace(dims, V=check.OP_VOCAB[args.size])
    rows = []
    for direction in ("fwd", "bwd") if case.bwd else ("fwd",):
        launchers = case.versions(direction)
        missing = [v for v in args.versions if v not in launchers]
        if missing:           # (flash attention v9 and v10 are backward versions: v8's forward)
            print(f"{args.op} {direction}: no version {missing[0]} (it has {sorted(launchers)}): not compared")
            continue
        a, b = (launchers[v] for v in args.versions)
        blocks_a, blocks_b = getattr(a, "blocks", (None,)), getattr(b, "blocks", (None,))
        common = [blk for blk in blocks_a if blk in blocks_b] or [blocks_a[0]]
        ref = check.reference_for(case, direction, dims, np.random.default_rng(args.seed))
        for block in common:
            out_a = outputs_of(case, direction, a, dims, ref, block, args.seed + 1)
            out_b = outputs_of(case, direction, b, dims, ref, block, args.seed + 1)
            for name in out_a:
                same = bool(np.array_equal(np.asarray(out_a[name]).view(np.uint8), np.asarray(out_b[name]).view(np.uint8)))
                rows.append(dict(op=args.op, direction=direction, versions=list(args.versions), block=str(block),
                                 tensor=name, identical=same, max_ulps=ulps(out_a[name], out_b[name])))
                print(f"{args.op} {direction} v{args.versions[0]} v{args.versions[1]} block {block} {name:10s} "
                      f"{'identical' if same else 'DIFFERENT'} (max {rows[-1]['max_ulps']} ulps)")
    if not rows:
        sys.exit(f"error: {args.op} has no direction with both versions {args.versions[0]} and {args.versions[1]}")
    n_same = sum(r["identical"] for r in rows)
    print(f"{n_same}/{len(rows)} outputs bit-identical ({cuda.get_current_device().name if not check.SIMULATOR else 'simulator'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(size=args.size, B=B, T=T, rows=rows), f, indent=1)
    return 0 if n_same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
