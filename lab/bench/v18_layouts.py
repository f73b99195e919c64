"""Does the layout of an operand in shared memory change matmul v18's speed? One product, four ways.

    python lab/bench/v18_layouts.py [--json FILE]

wgmma reads each operand from shared memory K-major (a row of the tile holds one m or n and its
k values) or M/N-major (a row holds one k and 64 values of m or n: the transpose bits). v18 keeps
each operand as it is stored, so the forward products x @ W read W N-major and the weight
gradients x^T @ dy read both operands M/N-major, while the logits x @ wte^T read both K-major;
on the H200 the logits ran at 505 TFLOP/s and the 120M MLP's x @ W_1, the same K, at 382. This
times the same product (bf16 operands already rounded, so only the kernel runs; CUDA graph
replays as lab/bench/gemm.py) with each operand in each orientation:

    A K-major, B K-major     out = a @ b^T     a [M, K], b [N, K]
    A K-major, B N-major     out = a @ b       a [M, K], b [K, N]
    A M-major, B K-major     out = a^T @ b^T   a [K, M], b [N, K]
    A M-major, B N-major     out = a^T @ b     a [K, M], b [K, N]

at the shapes of the 120M MLP's forward and weight gradient and a square one, at v18's default
tile. Same products, same sums: only the shared-memory layout (and the copies' boxes) differ.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = [("120M mlp x @ W_1", 8192, 3072, 768), ("120M dW_1 (K = tokens)", 768, 3072, 8192),
          ("square 4096", 4096, 4096, 4096)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    from numba import cuda

    from andrea_numba.kernels import matmul as MM
    from andrea_numba.kernels.wgmma import bf16_bits
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gemm import timed, timed_graph
    rng = np.random.default_rng(7)
    rows = []
    print("| product | M | N | K | A K, B K | A K, B N | A M, B K | A M, B N | (ms; TFLOP/s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, M, N, K in SHAPES:
        a = bf16_bits(rng.standard_normal((M, K)).astype(np.float32))      # op(a) [M, K]
        b = bf16_bits(rng.standard_normal((K, N)).astype(np.float32))      # op(b) [K, N]
        out = cuda.device_array((M, N), np.float32)
        work = cuda.device_array(MM.splitk_work(768, 8192), np.float32)
        cells, ref = [], None
        for ta, tb in ((False, True), (False, False), (True, True), (True, False)):
            da = cuda.to_device(np.ascontiguousarray(a.T) if ta else a)
            db = cuda.to_device(b if not tb else np.ascontiguousarray(b.T))
            run = (lambda st, da=da, db=db, ta=ta, tb=tb: MM.matmul_bf16_wgmma(out, work, da, db, ta, tb, stream=st))
            run(0)
            cuda.synchronize()
            got = out.copy_to_host()
            ref = got if ref is None else ref
            ms = timed_graph(run) or timed(lambda: run(0))
            tf = 2 * M * N * K / ms / 1e9
            rows.append(dict(product=label, M=M, N=N, K=K, a_mn_major=ta, b_mn_major=not tb, ms=ms, tflops=tf,
                             same_bits=bool(np.array_equal(got, ref))))
            cells.append(f"{ms:.3f}; {tf:.0f}" + ("" if np.array_equal(got, ref) else " (other bits)"))
        print(f"| {label} | {M} | {N} | {K} | " + " | ".join(cells) + " | |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
