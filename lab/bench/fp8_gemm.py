"""FP8 products against bf16 ones, at the shapes of the linear layers: does E4M3 pay?

    python lab/bench/fp8_gemm.py [--json out.json]         (a GPU with FP8 tensor cores: Ada or Hopper)

Each row is one product out[M, N] = op(a) @ op(b) as the engine calls it (a "+=" product timed
without its accumulation), as CUDA graph replays (lab/bench/gemm.py's timed_graph: the GPU's time, medians of 5) in these forms:
    v18          our bf16 wgmma product (kernels/wgmma_tma.py), operands rounded to bf16 copies first
    v21          cuBLASLt bf16 (kernels/cublaslt.py): the bf16 copies, then the library's product
    v24          cuBLASLt E4M3 (kernels/fp8_products.py): each operand's amax, scale and bytes (three
                 launches an operand), then the FP8 product: what a training step pays
    fp8 only     the FP8 product alone, on operands quantized beforehand
    quantize     the two operands' quantization alone (amax, scale, bytes; transposed where needed)
and, where PyTorch is installed, torch.matmul in bf16 (cuBLAS) and torch._scaled_mm in E4M3 with
per-tensor scales (cuBLASLt; fp32 out), on operands already in their format: the libraries' own
figures for the products alone. err: max |out - ref| / max |ref| against float64 (v24: about 2^-4
of the inputs' rounding; bf16: 2^-8).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from andrea_numba import cli  # noqa: E402
from lab.bench import gemm  # noqa: E402
from lab.bench.gemm import timed_graph  # noqa: E402

# the linear layers' products of lab/bench/gemm.py (the classifier's stay bf16 at every FP8 scope), one
# projection of 120M and a large square one
SHAPES = [s for s in gemm.SHAPES if "wte" not in s[0]] + [
    ("120M x @ W_q", 8192, 768, 768, False, False, False),
    ("square 8192", 8192, 8192, 8192, False, False, False),
]

def torch_times(M, N, K):
    """(bf16 ms, fp8 ms) of PyTorch's products alone on [M, K] @ [K, N], or (None, None)."""
    try:
        import torch
    except ImportError:
        return None, None
    dev = "cuda"
    a = torch.randn(M, K, device=dev).to(torch.bfloat16)
    b = torch.randn(K, N, device=dev).to(torch.bfloat16)

    def t(fn, reps=20):
        fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / reps

    bf = t(lambda: a @ b)
    try:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()          # column-major, as _scaled_mm wants
        one = torch.ones((), device=dev)
        f8 = t(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.float32))
    except Exception as e:                   # noqa: BLE001 (an older PyTorch: reported)
        print(f"torch._scaled_mm failed: {' '.join(str(e).split())[:200]}", file=sys.stderr)
        f8 = None
    return bf, f8


def main(argv=None) -> int:
    p = cli.Parser(prog="python lab/bench/fp8_gemm.py", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=cli.file_to_write(".json"), help="also write the rows as JSON")
    args = p.parse_args(argv)
    from numba import cuda

    from andrea_numba.kernels import fp8_products as F
    from lab.matmul import VERSIONS
    reason = F.fp8_unavailable()
    if reason:
        cli.fail(reason)
    mm = VERSIONS["matmul"]
    rng = np.random.default_rng(0)
    rows = []
    head = ("| product | M x N x K | v18 ms | v21 ms | v24 ms | fp8 only ms | quantize ms | torch bf16 ms | "
            "torch fp8 ms | v24 / v21 | fp8 only / torch bf16 | err v24 | err v21 |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for label, M, N, K, ta, tb, _ in SHAPES:
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
        da, db = cuda.to_device(a), cuda.to_device(b)
        out = cuda.device_array((M, N), np.float32)
        work = cuda.device_array(1 << 26, np.float32)
        res = {"product": label, "M": M, "N": N, "K": K}
        for v in (18, 21, 24):
            if v not in mm:
                continue
            launch = mm[v]
            kw = {} if v != 18 else {"block": launch.blocks[0]}
            res[f"v{v}_ms"] = timed_graph(lambda s: launch(out, work, da, db, ta, tb, False, stream=s, **kw))
            out_z = cuda.to_device(np.zeros((M, N), np.float32))
            launch(out_z, work, da, db, ta, tb, False, **kw)
            cuda.synchronize()
            res[f"err_v{v}"] = float(np.max(np.abs(out_z.copy_to_host() - ref)) / np.max(np.abs(ref)))
        qa = F.FP8.quantize(da, "e4m3", ta, 0, "bench.a")
        qb = F.FP8.quantize(db, "e4m3", not tb, 1, "bench.b")
        res["fp8_only_ms"] = timed_graph(lambda s: F.mm(out, qa, qb, False, s))
        res["quantize_ms"] = timed_graph(lambda s: (F.FP8.quantize(da, "e4m3", ta, 0, "bench.a", s),
                                                    F.FP8.quantize(db, "e4m3", not tb, 1, "bench.b", s)))
        res["torch_bf16_ms"], res["torch_fp8_ms"] = torch_times(M, N, K)
        rows.append(res)

        def f(key):
            v = res.get(key)
            return f"{v:.4f}" if v else "-"

        ratio = res["v24_ms"] / res["v21_ms"] if res.get("v24_ms") and res.get("v21_ms") else None
        pure = res["fp8_only_ms"] / res["torch_bf16_ms"] if res.get("fp8_only_ms") and res.get("torch_bf16_ms") else None
        print(f"| {label} | {M} x {N} x {K} | {f('v18_ms')} | {f('v21_ms')} | {f('v24_ms')} | {f('fp8_only_ms')} | "
              f"{f('quantize_ms')} | {f('torch_bf16_ms')} | {f('torch_fp8_ms')} | "
              f"{'%.2f' % ratio if ratio else '-'} | {'%.2f' % pure if pure else '-'} | "
              f"{res.get('err_v24', float('nan')):.1e} | {res.get('err_v21', float('nan')):.1e} |", flush=True)
    if args.json:
        from andrea_numba.atomic import atomic_write_json
        atomic_write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
