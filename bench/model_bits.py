"""Two products kinds of the whole model, bit for bit, on a GPU: one forward + backward of each on the
same parameters and tokens, the loss and every gradient compared.

    python bench/model_bits.py [--size 120M] [--products bf16s bf16o] [--matmul 23] [--json FILE]

For kinds that should give the same bits (bf16s against bf16t, or bf16o against bf16s: the same
products reading the same rounded operands, written by other kernels), the line says "identical";
otherwise how far apart they are (relative to the largest gradient). The simulator tests check the
same at the tiny size (tests/test_out16.py); this is the check at 12M and
120M on the GPU's own code. --matmul N: the second kind's products on TMA run matmul vN (19, 23: the
split-K slices added in the product's kernel, matmul.tma_matmul), the first's on v18 as the engine.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="120M", choices=("tiny", "12M", "120M"))
    ap.add_argument("--products", nargs=2, default=["bf16s", "bf16o"], metavar="KIND")
    ap.add_argument("--matmul", type=int, choices=(18, 19, 23), default=18,
                    help="the second run's matmul version for the products on TMA (default 18, the engine's)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    from andrea_numba import gpu_model as G
    from andrea_numba.config import load_config
    from andrea_numba.layout import init_params
    m = load_config(args.size).model
    B, T = {"tiny": (1, 8), "12M": (16, 512), "120M": (8, 1024)}[args.size]     # the step's shapes
    for kind in args.products:
        if kind not in G.PRODUCTS:
            sys.exit(f"bench/model_bits.py: unknown products kind {kind!r} (gpu_model.PRODUCTS)")
    rng = np.random.default_rng(17)
    tokens, targets = (rng.integers(0, m.vocab_size, (B, T)).astype(np.int32) for _ in range(2))
    params = init_params(m, 3)
    from andrea_numba.kernels import matmul as MM
    runs = []
    for kind, mm in zip(args.products, (18, args.matmul)):
        with MM.tma_matmul(mm):
            model = G.GPUModel(m, B, T, products=kind)
            model.params.copy_to_device(params)
            model.forward(tokens, targets)
            model.backward()
            model.stream.synchronize()
            runs.append((model.read_loss(), model.grads.copy_to_host()))
            del model
    (l0, g0), (l1, g1) = runs
    same = l0 == l1 and np.array_equal(g0.view(np.uint32), g1.view(np.uint32))
    far = float(np.max(np.abs(g0.astype(np.float64) - g1)) / max(np.max(np.abs(g0)), 1e-30))
    second = args.products[1] + ("" if args.matmul == 18 else f" on matmul v{args.matmul}")
    line = (f"{args.size}: {second} against {args.products[0]}: loss {l1!r} vs {l0!r}; gradients "
            + ("identical" if same else f"differ: max |d| / max |g| = {far:.2e}, "
               f"{int(np.sum(g0.view(np.uint32) != g1.view(np.uint32)))} of {g0.size} elements"))
    print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(size=args.size, products=args.products, matmul=args.matmul, loss=[l0, l1],
                                                   identical=bool(same), rel_diff=far), indent=1))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
