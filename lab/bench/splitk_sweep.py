"""The weight gradients' products at every tile and number of K slices, against pick_tile's choice.

    python lab/bench/splitk_sweep.py --json splitk.json

Each of the 12M and 120M weight gradients (dW += x^T @ dy, K = 8192 rows: W_1, W_2, W_O and the
classifier's wte) on operands rounded to bf16 once (as the engine's producers write them), run by
matmul_bf16_wgmma (matmul v18) at its "auto" block, then at each tile of TMA_TILES with the split
of K forced to S = 1, 2, 3, 4, 6, 8, 12, 16 slices (where S partial tiles fit the engine's work
buffer), and PyTorch's bf16 matmul writing fp32 (torch.mm's out_dtype) when PyTorch is installed.
Ours are CUDA graph replays (gemm.timed_graph), PyTorch's events around back-to-back calls; ms.
It says how far a better split would go, and how far the library is.
"""
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab" / "bench"))

from andrea_numba import cli  # noqa: E402

SHAPES = [("12M dW_1", 384, 1536, 384), ("12M dW_2", 1536, 384, 384), ("12M dW_O", 384, 384, 384),
          ("120M dW_1", 768, 3072, 768), ("120M dW_2", 3072, 768, 768), ("120M dW_O", 768, 768, 768),
          ("120M dwte", 50304, 768, 768)]       # (label, M, N, the model's width C)
K = 8192
SLICES = (1, 2, 3, 4, 6, 8, 12, 16)


def main(argv=None) -> int:
    ap = cli.Parser(prog="python lab/bench/splitk_sweep.py", description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=cli.file_to_write(".json"), help="also write every time here")
    args = ap.parse_args(argv)
    from andrea_numba.kernels.common import SIMULATOR, cdiv, device_name
    if SIMULATOR:
        cli.fail("lab/bench/splitk_sweep.py times products on a GPU; the simulator has nothing to time")
    from numba import cuda

    from andrea_numba.kernels import matmul as MM
    from gemm import bf16_bits, timed, timed_graph
    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    auto_splitk, rows = MM.splitk, []
    print(f"{device_name()}: bf16 operands, fp32 out (+=), K = {K}; ms")
    try:
        for label, M, N, C in SHAPES:
            a = rng.standard_normal((K, M)).astype(np.float32)
            b = rng.standard_normal((K, N)).astype(np.float32)
            da, db = cuda.to_device(bf16_bits(a)), cuda.to_device(bf16_bits(b))
            out = cuda.to_device(np.zeros((M, N), np.float32))
            work = cuda.device_array(MM.splitk_work(C), np.float32)
            run = lambda block: (lambda st: MM.matmul_bf16_wgmma(out, work, da, db, True, False, True, block=block, stream=st))
            MM.splitk = auto_splitk
            tile = MM.pick_tile(M, N, K, work, MM.sm_count())
            times = {"auto": timed_graph(run(MM.TMA_AUTO))}
            for t in MM.TMA_TILES["gpu"]:
                for S in SLICES:
                    if S > 1 and S * M * N > work.shape[0]:
                        continue
                    ks = cdiv(cdiv(K, S), t[2]) * t[2]
                    forced = (cdiv(K, ks), ks)
                    MM.splitk = lambda M_, N_, K_, z, block, w, r=None, forced=forced: forced if w is not None else (1, K_)
                    times[f"{t[0]}x{t[1]} S={forced[0]}"] = timed_graph(run(t))
            MM.splitk = auto_splitk
            if torch is not None:
                ta = torch.as_tensor(a, device="cuda").to(torch.bfloat16).T
                tb = torch.as_tensor(b, device="cuda").to(torch.bfloat16)
                times["PyTorch, fp32 out"] = timed(lambda: torch.mm(ta, tb, out_dtype=torch.float32))
            ours = {k: v for k, v in times.items() if k != "PyTorch, fp32 out" and v is not None}
            best = min(ours, key=ours.get)
            print(f"{label} ({M} x {N}): auto {tile[0]}x{tile[1]} {times['auto']:.4f}; best {best} {ours[best]:.4f}"
                  + (f"; PyTorch {times['PyTorch, fp32 out']:.4f}" if "PyTorch, fp32 out" in times else ""), flush=True)
            rows.append(dict(product=label, M=M, N=N, K=K, auto_tile=list(tile), times=times))
    finally:
        MM.splitk = auto_splitk
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
