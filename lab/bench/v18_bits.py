"""Does matmul v18 give matmul v17's bits on this GPU? A first look before the harness.

    python lab/bench/v18_bits.py [--json FILE]
    python lab/bench/v18_bits.py --against flag-built [--json FILE]

v18 (TMA, a producer warp, mbarriers, persistent blocks: kernels/wgmma_tma.py) adds the same
products in the same order as v17 wherever its wgmma has v17's width (BN = 128), so its output
should equal v17's bit for bit there; at BN = 256 another instruction may add in another order.
Each row runs one product shape with edges (M, N, K not multiples of the tiles), every transpose,
the += form, and a split-K one, at every v18 tile and "auto", against v17 at its default tile:
identical or not, and the largest difference relative to the largest output. Each launch is
synchronised with a time limit in mind: a ring whose protocol deadlocks on the hardware hangs the
process, which the caller's `timeout` ends.

--against flag-built: the engine's written-out kernel (k_matmul_bf16_wgmma) against the lab's
flag-built kernel it was written out from (lab/wgmma_tma.py: make_tma_kernel at epilogue None,
fixup 0, launched by tma_product) at the same tile: the same code for the GPU, so every row must be
identical (any difference fails the run).
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# (label, M, N, K, trans_a, trans_b, accumulate, split-K work)
CASES = [
    # (M, N, K: rows of whole 16-byte chunks, as a tensor map needs, none a multiple of a tile)
    ("x @ W (edges)", 1000, 1096, 520, False, False, False, False),
    ("dy @ W^T (edges)", 1000, 1096, 520, False, True, False, False),
    ("dy @ W^T (odd N)", 1000, 1095, 520, False, True, False, False),
    ("x^T @ dy += (edges)", 1000, 1096, 520, True, False, True, False),
    ("a^T @ b^T (edges)", 1000, 1096, 520, True, True, False, False),
    ("dW += x^T @ dy, split-K", 768, 768, 8192, True, False, True, True),
    ("x @ W 120M mlp", 8192, 3072, 768, False, False, False, False),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--against", choices=("v17", "flag-built"), default="v17",
                    help="v17 (matmul_bf16_wgmma_cp_async at its default tile) or flag-built (the lab's "
                         "flag-built v18 kernel at the same tile: bit for bit)")
    args = ap.parse_args()
    from numba import cuda

    from andrea_numba.kernels import matmul as MM
    from lab.wgmma_tma import tma_product
    flag_built = args.against == "flag-built"
    other = "flag-built" if flag_built else "v17"
    rng = np.random.default_rng(5)
    rows, bad = [], 0
    for label, M, N, K, ta, tb, acc, split in CASES:
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        o0 = rng.standard_normal((M, N)).astype(np.float32)
        da, db = cuda.to_device(a), cuda.to_device(b)
        work = cuda.device_array(max(MM.splitk_work(768, 8192), 8 * M * N), np.float32) if split else None
        out = cuda.to_device(o0)
        if not flag_built:
            MM.matmul_bf16_wgmma_cp_async(out, work, da, db, ta, tb, acc)
            cuda.synchronize()
            ref = out.copy_to_host()
        for block in MM.matmul_bf16_wgmma.blocks:
            if flag_built:                              # the lab's flag-built kernel at this tile
                out.copy_to_device(o0)
                tma_product(out, work, da, db, ta, tb, acc, block, 0)
                cuda.synchronize()
                ref = out.copy_to_host()
            scale = float(np.abs(ref).max())
            out.copy_to_device(o0)
            t0 = time.time()
            MM.matmul_bf16_wgmma(out, work, da, db, ta, tb, acc, block=block)
            cuda.synchronize()
            got = out.copy_to_host()
            same = bool(np.array_equal(got, ref))
            rel = float(np.abs(got.astype(np.float64) - ref).max() / scale) if np.isfinite(got).all() else float("inf")
            bad += (not same) if flag_built else rel > 1e-3
            rows.append(dict(case=label, M=M, N=N, K=K, block=str(block), against=other, identical=same, rel_diff=rel,
                             seconds=round(time.time() - t0, 2)))
            print(f"{label:<26} {str(block):<20} {'identical' if same else 'differs'}  max |v18 - {other}| / "
                  f"max |{other}| = {rel:.2e}  ({time.time() - t0:.1f} s with compiling)", flush=True)
    if flag_built:
        print(f"{len(rows)} products, {bad} not identical to the flag-built kernel's")
    else:
        print(f"{len(rows)} products, {bad} off by more than 1e-3 of the largest output")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
