"""The whole model's bits on a GPU: one forward + backward of each recipe on the same parameters and
tokens, the loss and every gradient.

    python lab/bench/model_bits.py --sizes 12M 120M --json bits.json          # every recipe's fingerprint
    python lab/bench/model_bits.py --sizes 12M --against bits.json            # ... the same bits as then?
    python lab/bench/model_bits.py --sizes 120M --same bf16s bf16-hopper      # two recipes, bit for bit

A fingerprint is the sha256 of the loss's and the gradient's bytes: two trees (before and after a
change that should move no bit, such as code moved between modules) give the same fingerprints or
the change moved a bit. --same compares two recipes that should give the same bits (bf16s against
bf16t, or bf16-hopper against bf16s: the same products reading the same rounded operands, written by
other kernels) and says how far apart they are when they do not. The simulator tests check the
same at the tiny size (tests/test_out16.py); this is the check at 12M and 120M on the GPU's own code.
--matmul N: with --same, the second recipe's products on TMA run matmul vN (19, 23: the split-K
slices added in the product's kernel, matmul.tma_matmul), the first's on v18 as the engine.
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = {"tiny": (1, 8), "12M": (16, 512), "120M": (8, 1024)}     # the step's shapes


def run(m, B, T, recipe, matmul=18):
    """(loss, gradients) of one forward + backward of `recipe` at B x T."""
    from andrea_numba import gpu_model as G
    from lab import matmul as lab_matmul
    from andrea_numba.layout import init_params
    rng = np.random.default_rng(17)
    tokens, targets = (rng.integers(0, m.vocab_size, (B, T)).astype(np.int32) for _ in range(2))
    with lab_matmul.tma_matmul(matmul):
        model = G.GPUModel(m, B, T, recipe=recipe)
        model.params.copy_to_device(init_params(m, 3))
        model.forward(tokens, targets)
        model.backward()
        model.stream.synchronize()
        out = model.read_loss(), model.grads.copy_to_host()
        del model
    return out


def fingerprint(loss, grads) -> str:
    return hashlib.sha256(np.float32(loss).tobytes() + grads.tobytes()).hexdigest()


def main():
    from lab.recipes import NAMES, get
    from andrea_numba.recipes import RECIPES, unavailable
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["12M", "120M"], choices=tuple(SHAPES))
    ap.add_argument("--recipes", nargs="+", choices=NAMES, help="default: every engine recipe that runs here")
    ap.add_argument("--same", nargs=2, choices=NAMES, metavar="RECIPE", help="compare these two, bit for bit")
    ap.add_argument("--matmul", type=int, choices=(18, 19, 23), default=18,
                    help="with --same: the second run's matmul version for the products on TMA (default 18)")
    ap.add_argument("--against", help="a --json file of an earlier run: the same fingerprints?")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    from andrea_numba.config import load_config
    results, ok = [], True
    for size in args.sizes:
        m = load_config(size).model
        B, T = SHAPES[size]
        if args.same:
            (l0, g0), (l1, g1) = (run(m, B, T, get(n), mm) for n, mm in zip(args.same, (18, args.matmul)))
            same = l0 == l1 and np.array_equal(g0.view(np.uint32), g1.view(np.uint32))
            far = float(np.max(np.abs(g0.astype(np.float64) - g1)) / max(np.max(np.abs(g0)), 1e-30))
            second = args.same[1] + ("" if args.matmul == 18 else f" on matmul v{args.matmul}")
            print(f"{size}: {second} against {args.same[0]}: loss {l1!r} vs {l0!r}; gradients "
                  + ("identical" if same else f"differ: max |d| / max |g| = {far:.2e}, "
                     f"{int(np.sum(g0.view(np.uint32) != g1.view(np.uint32)))} of {g0.size} elements"), flush=True)
            results.append(dict(size=size, same=args.same, matmul=args.matmul, loss=[l0, l1], identical=bool(same),
                                rel_diff=far))
            ok &= same
            continue
        for name in args.recipes or [n for n in RECIPES if not unavailable(n)]:
            loss, grads = run(m, B, T, get(name))
            results.append(dict(size=size, recipe=name, loss=loss, sha256=fingerprint(loss, grads)))
            print(f"{size:<5} {name:<16} loss {loss!r:<12} {results[-1]['sha256'][:16]}", flush=True)
    if args.against:
        before = {(r["size"], r["recipe"]): r["sha256"] for r in json.loads(Path(args.against).read_text())
                  if "recipe" in r}
        for r in results:
            if "recipe" in r and (r["size"], r["recipe"]) in before:
                same = before[r["size"], r["recipe"]] == r["sha256"]
                ok &= same
                print(f"{r['size']:<5} {r['recipe']:<16} {'same bits' if same else 'DIFFERENT BITS'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
