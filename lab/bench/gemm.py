"""The product kernels against cuBLAS: TFLOP/s of every matmul version at the shapes the models
run, beside cuBLAS SGEMM (through CuPy, TF32 off) measured in the same process.

    python lab/bench/gemm.py                     # 12M and 120M shapes + 4096^3, markdown table on stdout
    python lab/bench/gemm.py --json out.json
    python lab/bench/gemm.py --versions 4,5 --blocks     # every declared tile of each version, the best shown

Each row is one product out[M, N] (+)= op(a) @ op(b) as the engine calls it (which operand is
transposed, and whether it adds into out). "err" is max |out - ref| / max |ref| against a float64
product of the same inputs: fp32 products land near 1e-7 to 1e-6; a TF32-only product would show
about 1e-3, and sums that keep fewer bits than fp32 adds (a whole K chained through a tensor core's
own additions, matmul v25's first form) 1e-5 and more at K in the thousands. Our kernels' times are CUDA graph replays of 3 calls timed with CUDA events (the GPU's
time, as in the trainer's graph: a small product takes less time on the GPU than Python takes to
launch it; --timing launches times back-to-back launches instead), cuBLAS's are events around
back-to-back calls (its launches are cheap); medians of 5 repeats. CuPy is used by this benchmark
only (the project never needs it). v20-v22 are the products through cuBLASLt (kernels/cublaslt.py:
fp32, bf16 and fp16 compute on the same fp32 buffers), present on a GPU with nvmath-python, timed
as our kernels are. When a bf16 version is timed (v10) and PyTorch is installed,
a last column times PyTorch's bf16 matmul on the same shapes (cuBLAS's bf16 tensor-core GEMM,
bf16 out, what bf16 autocast runs; for a += product the product alone).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from andrea_numba import cli  # noqa: E402

# the tile families of warp_tile.py, whose tiles warp_tile.resolve makes of a block (their kernels'
# registers are reported)
WARP_FAMILIES = ("v3", "v4", "v5", "v6", "v7", "tf32x3", "v10", "fp16")

# (label, M, N, K, trans_a, trans_b, accumulate): at 12M (N = 16*512 rows, C = 384) and 120M
# (N = 8*1024 rows, C = 768, V = 50304)
SHAPES = [
    ("12M qkv / mlp fwd x @ W", 8192, 1536, 384, False, False, False),
    ("12M mlp dx = dh @ W_1^T", 8192, 384, 1536, False, True, False),
    ("12M dW_1 += x^T @ dh", 384, 1536, 8192, True, False, True),
    ("12M dW_2 += h^T @ dout", 1536, 384, 8192, True, False, True),
    ("12M dW_O += y^T @ dout", 384, 384, 8192, True, False, True),
    ("120M mlp fwd x @ W_1", 8192, 3072, 768, False, False, False),
    ("120M mlp dx = dh @ W_1^T", 8192, 768, 3072, False, True, False),
    ("120M dW_1 += x^T @ dh", 768, 3072, 8192, True, False, True),
    ("120M dW_2 += h^T @ dout", 3072, 768, 8192, True, False, True),
    ("120M dW_O += y^T @ dout", 768, 768, 8192, True, False, True),
    ("120M logits x @ wte^T", 8192, 50304, 768, False, True, False),
    ("120M dwte += dlogits^T @ x", 50304, 768, 8192, True, False, True),
    ("square 4096", 4096, 4096, 4096, False, False, False),
]


def bf16_bits(x):
    """x rounded to bf16, ties to even, as uint16 bit patterns (finite inputs)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def timed_graph(launch_on, reps=5, inner=3):
    """Median ms of one call of launch_on(stream) on the GPU: `inner` calls recorded once as a CUDA
    graph (as the trainer records its step), the replays timed with CUDA events. A 12M product
    runs on the GPU for less time than Python takes to launch it (its split-K is two launches), so
    back-to-back launches would time the host, not the kernel. None if the capture fails."""
    from numba import cuda
    from andrea_numba.train import StepGraph
    s = cuda.stream()
    launch_on(s)                             # compiles, and asks for the occupancy, outside the capture
    s.synchronize()
    try:
        graph = StepGraph(s, lambda builder: [launch_on(builder) for _ in range(inner)])
    except Exception as e:                   # noqa: BLE001 (reported; the events' timing stands in)
        print(f"graph capture failed ({' '.join(str(e).split())}): timing launches instead", file=sys.stderr)
        return None
    return graph.replay_ms(reps) / inner


def timed(fn, reps=5, inner=3):
    from numba import cuda
    fn()
    cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = cuda.event(), cuda.event()
        e0.record()
        for _ in range(inner):
            fn()
        e1.record()
        e1.synchronize()
        times.append(cuda.event_elapsed_time(e0, e1) / inner)
    return float(np.median(times))


def _versions(text: str) -> list:
    """"2,3,4": matmul versions, each a key of matmul.VERSIONS."""
    from lab.matmul import VERSIONS
    known = sorted(VERSIONS["matmul"])
    try:
        vs = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be versions separated by commas (2,3,4), got {text!r}") from None
    if not vs or any(v not in known for v in vs):
        raise argparse.ArgumentTypeError(f"each version must be one of {known}, got {text!r}")
    return vs


def main(argv=None):
    p = cli.Parser(prog="python lab/bench/gemm.py", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=cli.file_to_write(".json"), help="also write the rows as JSON")
    p.add_argument("--versions", default="3,4,6", type=_versions, help="matmul versions to time (default 3,4,6)")
    p.add_argument("--blocks", action="store_true",
                   help="time every declared tile of each version and show the fastest (default: the first tile only)")
    p.add_argument("--operands", choices=("fp32", "bf16"), default="fp32",
                   help="what a bf16 version is given: fp32 operands, rounded into its bf16 copies on each call "
                        "(the default: as a caller with fp32 tensors), or bf16 ones rounded once before the timing "
                        "(as the engine's producers write them; then PyTorch's bf16 matmul with an fp32 output "
                        "is timed too, where this PyTorch has torch.mm's out_dtype)")
    p.add_argument("--timing", choices=("graph", "launches"), default="graph",
                   help="our kernels timed as CUDA graph replays (the GPU's time, the default) or as "
                        "back-to-back launches from Python (the host's launch cost included)")
    args = p.parse_args(argv)
    from numba import cuda
    from andrea_numba.kernels import matmul as MM
    from lab import matmul as lab_matmul
    from andrea_numba.kernels.common import SIMULATOR
    if SIMULATOR or not cuda.is_available():
        cli.fail("lab/bench/gemm.py times the products on a GPU: run it on a machine with an NVIDIA GPU, "
                 "without NUMBA_ENABLE_CUDASIM=1")
    try:
        import cupy
    except ImportError:
        cupy = None
    versions = args.versions
    torch = None
    if any(getattr(lab_matmul.VERSIONS["matmul"][v], "precision", None) == "bf16" for v in versions):
        try:
            import torch
        except ImportError:
            pass
    rng = np.random.default_rng(0)
    rows = []
    print("| product | M | N | K | " + " | ".join(f"v{v} ms | v{v} TFLOP/s | v{v} err" for v in versions)
          + " | cuBLAS SGEMM ms | cuBLAS TFLOP/s |" + (" torch bf16 ms | torch bf16 TFLOP/s |" if torch else "")
          + (" torch bf16, fp32 out ms | TFLOP/s |" if torch and args.operands == "bf16" else ""))
    print("|---" * (4 + 3 * len(versions) + 2 + (2 if torch else 0) + (2 if torch and args.operands == "bf16" else 0)) + "|")
    for label, M, N, K, ta, tb, acc in SHAPES:
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        o0 = rng.standard_normal((M, N)).astype(np.float32) if acc else np.zeros((M, N), np.float32)
        big = M * N * K > 2e11
        ref = None
        if not big:                                     # float64 reference (skipped for the logits)
            ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64) + o0
        da, db = cuda.to_device(a), cuda.to_device(b)
        if args.operands == "bf16":                     # rounded once (ties to even): the products read them as stored
            da, db = cuda.to_device(bf16_bits(a)), cuda.to_device(bf16_bits(b))
        out = cuda.to_device(o0)
        # the engine's split-K buffer for the weight gradients (a^T @ b) at the shape's width;
        # the other products get none, as in the engine
        work = cuda.device_array(MM.splitk_work(384 if label.startswith("12M") else 768), np.float32) if ta else None
        flops = 2.0 * M * N * K
        row = dict(product=label, M=M, N=N, K=K)
        cells = []
        best_block = {}
        for v in versions:
            launch = lab_matmul.VERSIONS["matmul"][v]
            per_block = {}
            for blk in (launch.blocks if args.blocks else launch.blocks[:1]):
                kw = dict(trans_a=ta, trans_b=tb, accumulate=acc, block=blk)
                on = (lambda st: launch(out, work, da, db, **kw, stream=st)) if v >= 3 else \
                    (lambda st: launch(out, da, db, **kw, stream=st))
                out.copy_to_device(o0)
                on(0)
                err = float("nan")
                if ref is not None:
                    err = float(np.abs(out.copy_to_host() - ref).max() / np.abs(ref).max())
                ms = timed_graph(on) if args.timing == "graph" else None
                per_block[blk] = (ms if ms is not None else timed(lambda: on(0)), err)
            blk = min(per_block, key=lambda b: per_block[b][0])
            ms, err = per_block[blk]
            best_block[v] = blk
            row[f"v{v}_ms"], row[f"v{v}_tflops"], row[f"v{v}_err"] = ms, flops / ms / 1e9, err
            row[f"v{v}_block"] = list(blk) if isinstance(blk, tuple) else blk
            row[f"v{v}_blocks_ms"] = {str(b): round(t, 4) for b, (t, _) in per_block.items()}
            cells.append(f"{ms:.3f} | {flops / ms / 1e9:.1f} | {err:.1e}")
        if cupy is not None and args.operands == "fp32":    # (on uint16 bit patterns CuPy would multiply integers)
            ca = cupy.asarray(da).T if ta else cupy.asarray(da)
            cb = cupy.asarray(db).T if tb else cupy.asarray(db)
            co = cupy.asarray(out)
            ms = timed(lambda: cupy.matmul(ca, cb, out=co) if not acc else co.__iadd__(cupy.matmul(ca, cb)))
            row["cublas_ms"], row["cublas_tflops"] = ms, flops / ms / 1e9
            cells.append(f"{ms:.3f} | {flops / ms / 1e9:.1f}")
        else:
            cells.append("- | -")
        if torch is not None:
            tdev = torch.device("cuda")
            ta_ = torch.as_tensor(a, device=tdev).to(torch.bfloat16)
            tb_ = torch.as_tensor(b, device=tdev).to(torch.bfloat16)
            ta_, tb_ = (ta_.T if ta else ta_), (tb_.T if tb else tb_)
            ms = timed(lambda: torch.matmul(ta_, tb_))
            row["torch_bf16_ms"], row["torch_bf16_tflops"] = ms, flops / ms / 1e9
            cells.append(f"{ms:.3f} | {flops / ms / 1e9:.1f}")
            if args.operands == "bf16":                 # the same product with an fp32 output, as ours writes
                try:
                    ms = timed(lambda: torch.mm(ta_, tb_, out_dtype=torch.float32))
                    row["torch_bf16_fp32out_ms"], row["torch_bf16_fp32out_tflops"] = ms, flops / ms / 1e9
                    cells.append(f"{ms:.3f} | {flops / ms / 1e9:.1f}")
                except (TypeError, RuntimeError) as e:  # an older PyTorch
                    row["torch_bf16_fp32out_ms"] = f"{type(e).__name__}: {' '.join(str(e).split())[:120]}"
                    cells.append("- | -")
            del ta_, tb_
        print(f"| {label} | {M} | {N} | {K} | " + " | ".join(cells) + " |", flush=True)
        for v in (v for v in versions if v >= 3):        # registers and spills of the warp-tile kernel
            from andrea_numba.kernels.warp_tile import resolve
            family = getattr(lab_matmul.VERSIONS["matmul"][v], "family", None)
            if family not in WARP_FAMILIES:             # another tile module's kernel, or the library (v20-v22)
                continue
            kern = MM._k_matmul_warp(resolve(family, best_block[v], da, db), ta, tb)
            try:
                row[f"v{v}_regs"] = list(kern.get_regs_per_thread().values())
                row[f"v{v}_local_bytes"] = list(kern.get_local_mem_per_thread().values())
            except Exception as e:                      # noqa: BLE001 (a report, not a check)
                row[f"v{v}_regs"] = str(e)
        rows.append(row)
    for r in rows:
        print(r["product"], {k: v for k, v in r.items() if "regs" in k or "local" in k or "block" in k})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
