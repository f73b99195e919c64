"""FP8: what eight bits do to each op, the FP8 kernels against the twin, a run's record.

docs/fp8.md has the study's table, the kernels' checks on the H200 and the training runs' records.

    python -m andrea_numba.fp8 study                        # 12M's shapes, B = 2, T = 64: the table
    python -m andrea_numba.fp8 study --size tiny --plot fp8.png --json fp8.json
    python -m andrea_numba.fp8 check [--size 120M]          # the FP8 kernels against the twin (GPU: all rows)
    python -m andrea_numba.fp8 history RUN_DIR --plot h.png # an FP8 run's amax and underflow record

study (CPU, NumPy):

Each op whose twin multiplies matrices (the projections, attention, the MLP, the classifier) runs
its forward and backward three more times, with its products' operands quantized to FP8
(reference/fp8.py: per tensor, scaled from the tensor's absolute maximum, rounded, saturating), the
products in float64, at each scope of reference.precision.FP8_SCOPES:

    fp8-fwd    the forward's products in E4M3, the backward's in bf16 (as the GPU runs them)
    fp8-e5m2   the forward's in E4M3, the backward's with their gradient operand in E5M2
    fp8-all    every operand of every product in E4M3

and each output is compared with the same op's twin with exact products: the table gives, per op,
scope and output, max |fp8 - exact| / max |exact| (u: E4M3's unit roundoff 2^-4, E5M2's 2^-3), and
the largest fraction of any quantized operand that underflowed to zero. The backward runs on the
FP8 forward's own outputs, as training would. Norms, the softmax, the loss and the optimiser are not
quantized (their ops are not in the table). The backward's upstream gradients are marked as
gradients (reference.precision.as_grad); the loss's is a scalar, so its saved probs, which its
backward turns into dlogits, are marked instead.
"""
from __future__ import annotations

import numpy as np

import reference as R
from reference.precision import FP8_SCOPES, as_grad, backward_products, fp8_log

from . import cli
from .cases import CASES, Dims
from .config import load_config

# the ops whose twins' products go through reference.precision.mm (attention: the flash twin, the
# engine's; the plain attention twin multiplies with einsum, exactly)
STUDY_OPS = ("attn_qkv", "attn_flash", "attn_out", "mlp", "loss")


def _rel(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    return float(np.max(np.abs(got - ref)) / scale) if scale > 0 else float(np.max(np.abs(got)))


def _backward_inputs(case, values, outs, upstream):
    """The backward's arguments with its upstream gradients marked (the loss: its probs)."""
    marked = {k: as_grad(v) for k, v in upstream.items()}
    saved = dict(outs)
    if case.op == "loss":
        saved["probs"] = as_grad(outs["probs"])
    return {**values, **saved, **marked}


def study(size: str = "12M", B: int = 2, T: int = 64, seed: int = 0, scopes=FP8_SCOPES) -> list[dict]:
    """Rows {op, scope, direction, tensor, rel_err, underflow} for every op of STUDY_OPS."""
    m = load_config(size).model
    dims = Dims.of(m, B, T)
    rows = []
    for op in STUDY_OPS:
        case = CASES[op]
        rng = np.random.default_rng(seed)
        values = case.make(dims, rng)
        with R.products_in("fp32"):
            ref_f = case.forward(values)
            upstream = case.upstream_for(ref_f, rng)
            ref_b = case.backward({**values, **ref_f, **upstream})
        for scope in scopes:
            with R.products_in(scope), fp8_log() as log_f:
                outs = case.forward(values)
            with R.products_in(scope), backward_products(), fp8_log() as log_b:
                grads = case.backward(_backward_inputs(case, values, outs, upstream))
            for direction, got, ref, log in (("fwd", outs, ref_f, log_f), ("bwd", grads, ref_b, log_b)):
                under = max((e["underflow"] for e in log), default=0.0)
                for name in ref:
                    if np.issubdtype(np.asarray(ref[name]).dtype, np.floating):
                        rows.append(dict(op=op, scope=scope, direction=direction, tensor=name,
                                         rel_err=_rel(got[name], ref[name]), underflow=under,
                                         quantized=len(log)))
    return rows


def _grid(rows):
    """(scopes, outputs (op, direction, tensor), {(op, direction, tensor, scope): row}), in the rows' order."""
    scopes = list(dict.fromkeys(r["scope"] for r in rows))
    keys = list(dict.fromkeys((r["op"], r["direction"], r["tensor"]) for r in rows))
    return scopes, keys, {(r["op"], r["direction"], r["tensor"], r["scope"]): r for r in rows}


def format_table(rows) -> str:
    scopes, keys, by = _grid(rows)
    head = f"{'op':<11} {'pass':<4} {'tensor':<8} " + " ".join(f"{s:>10}" for s in scopes) + "   underflow (max, of any operand)"
    lines = [head, "-" * len(head)]
    for op, direction, tensor in keys:
        cells = [by.get((op, direction, tensor, s)) for s in scopes]
        errs = " ".join(f"{c['rel_err']:>10.2e}" if c else f"{'-':>10}" for c in cells)
        under = " ".join(f"{c['underflow']:.1%}" if c and c["quantized"] else "bf16" for c in cells)
        lines.append(f"{op:<11} {direction:<4} {tensor:<8} {errs}   {under}")
    lines += ["",
              "each scope's column: max |fp8 - exact| / max |exact| of the output against the same twin with",
              f"exact products (u, the unit roundoff: E4M3 2^-4 = {2.0 ** -4:.4f}, E5M2 2^-3 = {2.0 ** -3:.3f});",
              "underflow, one value a scope in the columns' order: the largest fraction of the nonzero values of",
              "any operand that this pass quantized which became 0 in FP8; bf16 where the pass quantized nothing",
              "(fp8-fwd's backward multiplies in bf16)"]
    return "\n".join(lines)


def plot(rows, path) -> None:
    """A bar per op output and scope, log scale, with E4M3's and E5M2's unit roundoff drawn (an exact
    output, an fp8-fwd backward's weight gradient, has no bar)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .atomic import atomic_write
    from reference.fp8 import E4M3, E5M2
    scopes, keys, by = _grid(rows)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(keys)), 4.8))
    width = 0.8 / len(scopes)
    for i, s in enumerate(scopes):
        ys = [by[(*k, s)]["rel_err"] if (*k, s) in by else np.nan for k in keys]
        ys = [y or np.nan for y in ys]                   # (an exact output: no bar)
        ax.bar(np.arange(len(keys)) + (i - (len(scopes) - 1) / 2) * width, ys, width, label=s)
    for fmt, style in ((E4M3, "--"), (E5M2, ":")):
        ax.axhline(fmt.unit_roundoff, color="gray", linestyle=style, linewidth=1, label=f"u of {fmt.name}")
    ax.set_yscale("log")
    ax.set_ylim(1e-4, 1.0)
    ax.set_xticks(np.arange(len(keys)), [f"{o} {d} {t}" for o, d, t in keys], rotation=70, ha="right", fontsize=8)
    ax.set_ylabel("max |fp8 - exact| / max |exact|")
    ax.set_title("FP8 in the twin: each op's outputs against exact products")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# python -m andrea_numba.fp8 check: the GPU's FP8 kernels against the twin (the harness's rows)

QUANT_SHAPES = ((37, 50), (64, 16), (3, 1))     # ragged rows and columns, whole tiles, a column


def _quant_input(rng, shape):
    """Values spread over 9 decades (subnormals after scaling, underflow), zeros of both signs (every
    shape of QUANT_SHAPES has two values at least)."""
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-20.0, 0.0, shape))).astype(np.float32)
    x.reshape(-1)[:2] = 0.0, -0.0
    return x


def quantize_rows(seed: int = 0) -> list[dict]:
    """k_quantize and k_quantize_t (kernels/fp8.py) against reference.fp8.quantize_fp32: every
    byte (and every padding byte zero), amax, scale, descale, the underflow count; run twice, the
    same bytes. Rows in the harness's form (check.format_table)."""
    from numba import cuda

    from reference.fp8 import E4M3, E5M2, decode, descale_fp32, quantize_fp32

    from .kernels import fp8 as Q
    rng = np.random.default_rng(seed)
    rows = []
    for shape in QUANT_SHAPES:
        x = _quant_input(rng, shape)
        for fmt in (E4M3, E5M2):
            want, amax, scale = quantize_fp32(x, fmt)
            under = int(np.sum((decode(want, fmt) == 0) & (x != 0)))
            for t in (False, True):
                rows_, k = (shape[1], shape[0]) if t else shape
                ld = Q.padded(k)
                expect = np.zeros((rows_, ld), np.uint8)
                expect[:, :k] = want.T if t else want
                runs = []
                for _ in range(2):
                    codes = cuda.to_device(np.full(rows_ * ld, 0xAB, np.uint8))      # poisoned
                    stats, count = cuda.to_device(np.full(Q.STATS, np.nan, np.float32)), cuda.to_device(np.full(1, -7, np.int32))
                    partial = cuda.device_array(Q.AMAX_BLOCKS, np.float32)
                    got = Q.quantize(codes, stats, count, partial, cuda.to_device(x), fmt, transpose=t)
                    runs.append((got.copy_to_host(), stats.copy_to_host(), int(count.copy_to_host()[0])))
                got, st, n = runs[0]
                wrong = int(np.sum(got != expect))
                same_stats = (st[2] == amax and st[1] == scale and st[0] == descale_fp32(amax, fmt) and n == under)
                rows.append({"op": "fp8_quantize", "kernel": "fp8_quantize_t" if t else "fp8_quantize",
                             "version": 1, "block": fmt.name, "tensor": f"x {shape[0]}x{shape[1]}",
                             "max_abs_err": float(wrong), "rel_err": wrong / got.size,
                             "tol": {"atol": 0.0, "rtol": 0.0},
                             "bitwise_repeat": bool(np.array_equal(runs[1][0], got)),
                             "ok": wrong == 0 and same_stats and np.array_equal(runs[1][0], got)})
    return rows


def product_rows(size: str = "12M", scopes=FP8_SCOPES, seed: int = 0) -> list[dict]:
    """matmul v24 (E4M3 through cuBLASLt) on every transposed form of the harness's matmul cases,
    and the linear ops at each scope (kernels/fp8_products.linear_ops), against the twin at the same
    scope and against the fp32 twin within their rounding (check.check_launcher). A GPU with FP8 only."""
    from . import check
    from .kernels import fp8_products as F
    F.require_fp8()
    m = load_config(size).model
    B, T = check.SHAPES[size][0]
    dims = Dims.of(m, B, T)
    rng = np.random.default_rng(seed)
    rows = []
    for case in CASES.values():
        if case.fwd == "matmul":
            rows += check.check_launcher(case, "fwd", F.matmul_fp8, dims, rng, version=24)
    for scope in scopes:
        ops = F.linear_ops(scope, dims.N, m.d_model, m.vocab_size, m.n_layer)
        for op in ("attn_qkv", "attn_out", "mlp"):
            for direction in ("fwd", "bwd"):
                rows += check.check_launcher(CASES[op], direction, ops[f"{op}_{direction}"], dims, rng,
                                             version=scope, block=scope)
    return rows


# ---------------------------------------------------------------------------------------------
# python -m andrea_numba.fp8 history RUN_DIR...: what the trainer recorded of each quantized tensor

# the tensors drawn in the amax panel: an activation and a gradient operand of each linear op, a weight
AMAX_SHOWN = ("attn_qkv.fwd.x", "attn_out.fwd.y", "mlp.fwd.h", "mlp.fwd.w_1", "attn_out.bwd.dout",
              "mlp.bwd.dout", "mlp.bwd.dh_pre", "attn_qkv.bwd.dq")
UNDERFLOW_SHOWN = 8          # the underflow panel: the tensors that lost most


class HistoryError(Exception):
    """A run directory without a readable FP8 record; str(err) is one line: what, and what to do."""


def read_history(run_dir) -> list[dict]:
    """The records of a run's FP8 file (runlog.FP8_FILE: one JSON line every --log-every steps), or
    a one-line error (HistoryError) when there are none."""
    import json
    from pathlib import Path

    from .runlog import FP8_FILE
    path = Path(run_dir) / FP8_FILE
    if not path.is_file():
        raise HistoryError(f"no FP8 record in {path}: it is written by runs trained with --precision "
                             f"fp8-fwd, fp8-e5m2 or fp8-all")
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
            records.append({"step": int(rec["step"]), "tensors": list(rec["tensors"])})
        except (ValueError, KeyError, TypeError):
            raise HistoryError(f"{path}, line {n}, is not an FP8 record: the file is damaged") from None
    if not records:
        raise HistoryError(f"{path} is empty: the run has not logged a step yet")
    return records


def by_tensor(records) -> dict:
    """{label: [(step, max amax over layers, max underflow over layers)]}, in the records' order."""
    out = {}
    for rec in records:
        per = {}
        for t in rec["tensors"]:
            a, u = per.get(t["label"], (0.0, 0.0))
            per[t["label"]] = (max(a, t["amax"]), max(u, t["underflow"]))
        for label, (a, u) in per.items():
            out.setdefault(label, []).append((rec["step"], a, u))
    return out


def history_table(runs: dict) -> str:
    """Per run and tensor: amax at the first and last record, the largest underflow over the run."""
    lines = [f"{'run':<12} {'tensor':<22} {'amax first':>11} {'amax last':>11} {'underflow max':>14} {'at step':>8}",
             "-" * 84]
    for name, records in runs.items():
        for label, series in by_tensor(records).items():
            worst = max(series, key=lambda r: r[2])
            lines.append(f"{name:<12} {label:<22} {series[0][1]:>11.3g} {series[-1][1]:>11.3g} {worst[2]:>13.2%} "
                         f"{worst[0]:>8}")
    return "\n".join(lines)


def plot_history(runs: dict, path) -> None:
    """A row per run: amax (max over layers) of AMAX_SHOWN against the step, log scale; the fraction
    of values that underflowed, for the UNDERFLOW_SHOWN tensors that lost most."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .atomic import atomic_write
    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 3.4 * len(runs)), squeeze=False)
    for (name, records), (ax_a, ax_u) in zip(runs.items(), axes):
        series = by_tensor(records)
        for label in AMAX_SHOWN:
            if label in series:
                steps, amax, _ = zip(*series[label])
                ax_a.plot(steps, amax, label=label, lw=1.2)
        worst = sorted(series, key=lambda k: -max(u for _, _, u in series[k]))[:UNDERFLOW_SHOWN]
        for label in worst:
            steps, _, under = zip(*series[label])
            ax_u.plot(steps, [100 * u for u in under], label=label, lw=1.2)
        ax_a.set_yscale("log")
        ax_a.set_title(f"{name}: amax (largest over the layers)", fontsize=10)
        ax_u.set_title(f"{name}: values that underflowed to 0 (%, worst layer)", fontsize=10)
        for ax in (ax_a, ax_u):
            ax.set_xlabel("step")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def main(argv=None) -> None:
    p = cli.Parser(prog="python -m andrea_numba.fp8", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=cli.Parser)
    s = sub.add_parser("study", help="the table of every op's error with FP8 products, in the twin")
    s.add_argument("--size", type=cli.one_of(["tiny", "12M", "120M"], "size"), default="12M",
                   help="the model whose shapes the ops take (default 12M)")
    s.add_argument("--batch", type=cli.int_range(1, 64), default=2, help="B (default 2)")
    s.add_argument("--seq", type=cli.int_range(1, 1024), help="T (default 64, or the model's context where shorter)")
    s.add_argument("--seed", type=cli.int_range(0, 2 ** 31 - 1), default=0)
    s.add_argument("--scope", nargs="+", type=cli.one_of(FP8_SCOPES, "scope"), default=list(FP8_SCOPES))
    s.add_argument("--plot", type=cli.file_to_write(".png"), help="also draw the table into this PNG")
    s.add_argument("--json", type=cli.file_to_write(".json"), help="also write the rows as JSON")
    c = sub.add_parser("check", help="the GPU's FP8 kernels against the twin: the quantize kernels (also in the "
                       "simulator) and, on a GPU with FP8, matmul v24 and the linear ops at every scope")
    c.add_argument("--size", type=cli.one_of(["tiny", "12M", "120M"], "size"), default="12M",
                   help="the model whose shapes the product checks take (default 12M)")
    c.add_argument("--scope", nargs="+", type=cli.one_of(FP8_SCOPES, "scope"), default=list(FP8_SCOPES))
    c.add_argument("--json", type=cli.file_to_write(".json"), help="also write the rows as JSON")
    h = sub.add_parser("history", help="what an FP8 run recorded of each quantized tensor (amax, underflow): "
                       "a table, and with --plot the curves")
    h.add_argument("runs", nargs="+", type=cli.existing_dir, metavar="RUN_DIR", help="run directories of FP8 runs")
    h.add_argument("--plot", type=cli.file_to_write(".png"), help="also draw the curves into this PNG")
    args = p.parse_args(argv)
    if args.command == "history":
        from pathlib import Path
        try:
            runs = {Path(r).name: read_history(r) for r in args.runs}
        except HistoryError as e:
            cli.fail(str(e))
        print(history_table(runs))
        if args.plot:
            plot_history(runs, args.plot)
            print(f"wrote {args.plot}")
        return
    if args.command == "check":
        raise SystemExit(run_check(args))
    ctx = load_config(args.size).model.context_length
    args.seq = min(64, ctx) if args.seq is None else args.seq
    if args.seq > ctx:
        cli.fail(f"--seq {args.seq} is longer than the {args.size} model's context ({ctx}): give at most {ctx}")
    rows = study(args.size, args.batch, args.seq, args.seed, args.scope)
    print(f"FP8 in the twin at {args.size}'s shapes, B = {args.batch}, T = {args.seq}:")
    print(format_table(rows))
    if args.json:
        from .atomic import atomic_write_json
        atomic_write_json(args.json, rows)
        print(f"wrote {args.json}")
    if args.plot:
        plot(rows, args.plot)
        print(f"wrote {args.plot}")


def run_check(args) -> int:
    """The check command: its table; 0 when every row agrees, 1 otherwise."""
    from . import check
    from .kernels import fp8_products as F
    rows = quantize_rows()
    reason = F.fp8_unavailable()
    if reason is None:
        rows += product_rows(args.size, args.scope)
    print(check.format_table(rows))
    if reason:
        print(f"products not checked here: {reason}")
    if args.json:
        from .atomic import atomic_write_json
        atomic_write_json(args.json, rows)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    main()
