"""Every version of every kernel launcher of an op, at every block size it declares: does it agree
with the twin, how long does it take, how close does it come to the GPU's peak. One table, in the
way llm.c's dev/cuda times each kernel version beside its CPU reference.

    python lab/bench/kernels.py layernorm                 # one op, at the 12M and 120M training shapes
    python lab/bench/kernels.py all --sizes 12M           # every case of andrea_numba/cases.py
    python lab/bench/kernels.py attn --shape 8,1024 --json out.json --markdown out.md

The cases, their inputs and the versions come from andrea_numba/cases.py and each kernel module's
VERSIONS, so a new version shows up here without an edit. "agrees" is the agreement harness
(check.check_launcher: NaN-poisoned outputs, += prefill, two bit-identical runs, the twin in
float64) at the same shape. Time: CUDA events around repeated launches on one stream, median of
5 repeats after a warm-up (so compile time and the launch's CPU cost are outside it when the
kernel is long; at a few microseconds the CPU side of the launch shows). Work: the FLOPs of the
op's products (causal attention counts the half of the score matrix it computes) and the bytes a
perfect kernel must move (each input read once, each output written once); the % column is
against the bound that limits the op (FLOPs for products, bytes for the rest).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from andrea_numba import cli  # noqa: E402
from andrea_numba.cases import Dims, call  # noqa: E402
from lab.cases import CASES  # noqa: E402   (every rung of the ladder)
from andrea_numba.config import ConfigError, load_config  # noqa: E402

# NVIDIA H200 SXM datasheet: FP32 (no tensor cores) 67 TFLOP/s, HBM3e 4.8 TB/s.
PEAK_TFLOPS, PEAK_GBS = 67.0, 4800.0
SIZES = {"12M": (16, 512), "120M": (8, 1024)}      # the configs' training microbatches (B, T)


def work(kernel: str, d: Dims) -> tuple[float, float, str]:
    """(FLOPs, bytes, bound) of one call of a launcher at sizes d; bound: "flop" or "byte"."""
    N, C, V, T, B, P, F = d.N, d.C, d.V, d.T, d.B, d.P, 4 * d.C
    f = 4                                                    # bytes of a float32
    causal = B * T * (T + 1) * C                             # one causal product over all heads (2 FLOPs a term)
    table = {
        "embed_fwd": (0, f * 3 * N * C, "byte"),
        "embed_bwd": (0, f * (N * C + 2 * (min(V, N) + T) * C), "byte"),
        "layernorm_fwd": (0, f * 2 * N * C, "byte"),
        "layernorm_bwd": (0, f * 3 * N * C, "byte"),
        "residual_layernorm_fwd": (0, f * 4 * N * C, "byte"),          # x, f read; resid, out written
        "residual_layernorm_bwd": (0, f * 4 * N * C, "byte"),          # dresid, dout, resid read; dx written
        "attn_qkv_fwd": (2 * N * C * C * 3, f * (4 * N * C + 3 * C * C), "flop"),
        "attn_qkv_bwd": (4 * N * C * C * 3, f * (5 * N * C + 6 * C * C), "flop"),
        "attn_fwd": (2 * causal, f * 4 * N * C, "flop"),
        "attn_bwd": (4 * causal, f * 7 * N * C, "flop"),
        # flash attention: the products its kernels compute, attn_bwd's 4 and 3 recomputed (q k^T in
        # both backward kernels, dy v^T in the second); lse is B*H*T floats
        "attn_flash_fwd": (2 * causal, f * (4 * N * C + B * d.H * T), "flop"),
        "attn_flash_bwd": (7 * causal, f * (8 * N * C + B * d.H * T), "flop"),
        "attn_out_fwd": (2 * N * C * C, f * (2 * N * C + C * C), "flop"),
        "attn_out_bwd": (4 * N * C * C, f * (3 * N * C + 2 * C * C), "flop"),
        "mlp_fwd": (4 * N * C * F, f * (2 * N * C + 2 * N * F + 2 * C * F), "flop"),
        "mlp_bwd": (8 * N * C * F, f * (3 * N * C + 2 * N * F + 4 * C * F), "flop"),
        "residual_add": (0, f * 3 * N * C, "byte"),
        "residual_add_bwd": (0, f * 3 * N * C, "byte"),
        "dropout_fwd": (0, f * 2 * N * C, "byte"),          # the mask is computed, never read
        "dropout_bwd": (0, f * 2 * N * C, "byte"),
        "loss_fwd": (2 * N * C * V, f * (N * C + V * C + N * V), "flop"),
        "loss_bwd": (4 * N * C * V, f * (N * C * 2 + V * C * 2 + N * V), "flop"),
        "matmul": (2 * N * C * F, f * (N * C + C * F + N * F), "flop"),
        "grad_norm": (0, f * P, "byte"),
        "grad_scale": (0, f * 2 * P, "byte"),
        "adamw": (0, P * (4 * 4 + 1 + 3 * 4), "byte"),
        "zero": (0, f * P, "byte"),
    }
    return table[kernel]


def device_buffers(case, launch, dims, ref):
    """Device copies of what the launcher is called with (check.launcher_args, as the harness
    builds them), and its scalars."""
    from numba import cuda

    from andrea_numba import check
    inputs, outs, accums, scratch, scalars = check.launcher_args(case, launch, dims, *ref)
    d = {k: cuda.to_device(np.ascontiguousarray(v)) for k, v in inputs.items()}
    d.update({k: cuda.device_array(shape, np.float32) for k, shape in outs.items()})
    d.update({k: cuda.device_array(np.shape(ref[1][k]) or (1,), np.float32) for k in accums if k not in d})
    d.update({k: cuda.device_array(shape, dtype) for k, (shape, dtype) in scratch.items()})
    return d, scalars


def time_calls(run, stream, repeats=5, min_ms=20.0) -> float:
    """Milliseconds of one run(): CUDA events around n back-to-back runs (n for about min_ms of
    them, at most 200), median of `repeats`; a first run compiles and warms the caches."""
    from numba import cuda
    run()
    stream.synchronize()
    t0 = time.perf_counter()
    run()
    stream.synchronize()
    n = max(1, min(200, int(min_ms / 1e3 / max(time.perf_counter() - t0, 1e-6))))
    times = []
    for _ in range(repeats):
        start, end = cuda.event(), cuda.event()
        start.record(stream)
        for _ in range(n):
            run()
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end) / n)
    return float(np.median(times))


def time_launch(launch, buffers, scalars, block, stream, min_ms=20.0) -> float:
    """Milliseconds of one call of a launcher (time_calls, median of 5 repeats)."""
    return time_calls(lambda: call(launch, {**scalars, **buffers}, block=block, stream=stream), stream, 5, min_ms)


def bench_case(case, dims: Dims, rng, say=print, versions=None) -> list[dict]:
    from numba import cuda

    from andrea_numba import check
    stream = cuda.stream()
    rows = []
    for direction in ("fwd", "bwd") if case.bwd else ("fwd",):
        kernel = case.fwd if direction == "fwd" else case.bwd
        ref = check.reference_for(case, direction, dims, rng)
        flops, nbytes, bound = work(kernel, dims)
        for version, launch in case.versions(direction, versions).items():
            for block in launch.blocks:
                agree = check.check_launcher(case, direction, launch, dims, rng, block, version, ref)
                buffers, scalars = device_buffers(case, launch, dims, ref)
                ms = time_launch(launch, buffers, scalars, block, stream)
                tflops, gbs = flops / ms / 1e9, nbytes / ms / 1e6
                row = {"op": case.op, "kernel": kernel, "version": version,
                       "block": str(block).replace(" ", ""), "engine": launch is case.engine(direction),
                       "agrees": all(r["ok"] for r in agree),
                       "worst_rel_err": max(r["rel_err"] for r in agree), "ms": ms,
                       "tflops": tflops if flops else None, "gbs": gbs,
                       "peak_pct": 100 * (tflops / PEAK_TFLOPS if bound == "flop" else gbs / PEAK_GBS),
                       "bound": bound}
                rows.append(row)
                say(format_row(row))
                del buffers
    return rows


def bench_size(size: str, ops, seed: int = 0, shape=None, say=lambda s: print(s, flush=True), versions=None) -> dict:
    """The table of `ops` at a model size: its training microbatch, or shape = (B, T)."""
    from andrea_numba.kernels.common import device_name
    m = load_config(size).model
    B, T = shape or SIZES.get(size, (2, m.context_length))
    dims = Dims.of(m, B, min(T, m.context_length))
    say(f"\n{size} (B={B}, T={dims.T}, C={dims.C}, H={dims.H}, V={dims.V}, n_params={dims.P:,}) on "
        f"{device_name()}: peak {PEAK_TFLOPS} TFLOP/s fp32, {PEAK_GBS:.0f} GB/s\n{HEAD}")
    rows = []
    for op in ops:
        rows += bench_case(CASES[op], dims, np.random.default_rng(seed), say=say, versions=versions)
    return {"size": size, "B": B, "T": dims.T, "device": device_name(), "rows": rows}


HEAD = (f"{'kernel':<22} {'v':>2} {'block':<16} {'engine':<6} {'agrees':<6} {'ms':>9} {'TFLOP/s':>8} "
        f"{'GB/s':>8} {'% peak':>7}")


def format_row(r) -> str:
    name = r["kernel"] if r["kernel"].startswith(r["op"]) else r["op"]
    tf = f"{r['tflops']:8.2f}" if r["tflops"] is not None else f"{'-':>8}"
    return (f"{name:<22} {r['version']:>2} {r['block']:<16} {'yes' if r['engine'] else '':<6} "
            f"{'yes' if r['agrees'] else 'NO':<6} {r['ms']:9.4f} {tf} {r['gbs']:8.0f} "
            f"{r['peak_pct']:6.1f}% {'(FLOPs)' if r['bound'] == 'flop' else '(bytes)'}")


def markdown(tables: list[dict]) -> str:
    out = []
    for t in tables:
        out.append(f"### {t['size']}, B={t['B']} T={t['T']}\n")
        out.append("| kernel | version | block | engine | agrees | ms | TFLOP/s | GB/s | % of peak |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in t["rows"]:
            name = r["kernel"] if r["kernel"].startswith(r["op"]) else r["op"]
            tf = f"{r['tflops']:.2f}" if r["tflops"] is not None else "-"
            out.append(f"| {name} | v{r['version']} | {r['block']} | {'yes' if r['engine'] else ''} | "
                       f"{'yes' if r['agrees'] else '**no**'} | {r['ms']:.4f} | {tf} | {r['gbs']:.0f} | "
                       f"{r['peak_pct']:.1f}% ({'FLOPs' if r['bound'] == 'flop' else 'bytes'}) |")
        out.append("")
    return "\n".join(out)


def _shape(text: str) -> tuple[int, int]:
    """--shape B,T: two positive integers."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and 0 < int(p) <= 1 << 20 for p in parts):
        raise argparse.ArgumentTypeError(f"takes B,T, two positive integers, got {text!r}")
    return int(parts[0]), int(parts[1])


def main(argv=None) -> int:
    ap = cli.Parser(prog="python lab/bench/kernels.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("op", type=cli.one_of(["all", *CASES], "op"), metavar="OP",
                    help=f"an op of andrea_numba/cases.py, or all: {', '.join(CASES)}")
    ap.add_argument("--sizes", type=cli.config_list, default="12M,120M",
                    help="model sizes, comma-separated (default 12M,120M)")
    ap.add_argument("--shape", type=_shape, help="B,T instead of the size's training microbatch")
    ap.add_argument("--seed", type=cli.seed, default=0)
    ap.add_argument("--version", action="append", metavar="N", type=cli.int_range(1, 99),
                    help="time only this version number of each launcher (repeatable; default every version)")
    ap.add_argument("--json", type=cli.file_to_write(".json"), help="write the rows as JSON here")
    ap.add_argument("--markdown", type=cli.file_to_write(".md"), help="write the tables as Markdown here")
    args = ap.parse_args(argv)
    ops = list(CASES) if args.op == "all" else [args.op]
    from numba import cuda

    from andrea_numba.kernels.common import SIMULATOR
    if SIMULATOR or not cuda.is_available():
        print("error: lab/bench/kernels.py times kernels on a GPU: run it on a machine with an NVIDIA GPU, "
              "without NUMBA_ENABLE_CUDASIM=1", file=sys.stderr)
        return 2
    try:
        tables = [bench_size(size, ops, args.seed, args.shape, versions=args.version) for size in args.sizes]
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(tables, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(tables))
    bad = [r for t in tables for r in t["rows"] if not r["agrees"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
