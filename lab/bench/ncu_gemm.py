"""One launch of a product kernel per shape of lab/bench/gemm.py, between cuda.profile_start and
profile_stop, for Nsight Compute to look into (stall reasons, pipes, bank conflicts):

    ncu --profile-from-start off --set full python lab/bench/ncu_gemm.py --version 6 --shape "120M mlp dx" --shape 4096

--shape picks the rows of lab/bench/gemm.py's SHAPES whose label contains the text.
"""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab" / "bench"))

from andrea_numba import cli  # noqa: E402


def main(argv=None):
    p = cli.Parser(prog="python lab/bench/ncu_gemm.py", description=__doc__.splitlines()[0])
    p.add_argument("--version", type=int, default=6, help="matmul version (default 6)")
    p.add_argument("--shape", action="append", required=True, help="text in a SHAPES label of lab/bench/gemm.py")
    args = p.parse_args(argv)
    from numba import cuda
    from gemm import SHAPES
    from andrea_numba.kernels import matmul as MM
    from lab import matmul as lab_matmul
    if args.version not in lab_matmul.VERSIONS["matmul"]:
        p.error(f"no matmul version {args.version}: choose from {sorted(lab_matmul.VERSIONS['matmul'])}")
    launch = lab_matmul.VERSIONS["matmul"][args.version]
    rows = [s for s in SHAPES if any(t in s[0] for t in args.shape)]
    if not rows:
        p.error(f"no shape matches {args.shape}: labels are {[s[0] for s in SHAPES]}")
    rng = np.random.default_rng(0)
    for label, M, N, K, ta, tb, acc in rows:
        a = cuda.to_device(rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32))
        b = cuda.to_device(rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32))
        out = cuda.device_array((M, N), np.float32)
        work = cuda.device_array(MM.splitk_work(384 if label.startswith("12M") else 768), np.float32) if ta else None
        kw = dict(trans_a=ta, trans_b=tb, accumulate=acc, block=launch.blocks[0])
        args_ = (out, work, a, b) if args.version >= 3 else (out, a, b)
        launch(*args_, **kw)                           # compile outside the profiled range
        cuda.synchronize()
        cuda.profile_start()
        launch(*args_, **kw)
        cuda.synchronize()
        cuda.profile_stop()
        print(f"{label}: M={M} N={N} K={K} profiled", flush=True)


if __name__ == "__main__":
    main()
