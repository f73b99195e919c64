"""Where a 3xTF32 product's time goes: the same split-tile kernel (matmul v5's) with three, one or
no tensor-core products per fragment, timed on the GPU.

    python lab/bench/gemm_ablate.py

If the time falls about threefold from three products to one, the tensor cores are the limit; if
it hardly moves, the limit is elsewhere (copies, shared-memory reads, barriers, latency). "none"
keeps every copy and shared read but replaces the mma by one multiply-add per value read: the
floor that the data movement alone sets. "split at read" keeps one shared plane of raw values and
splits them as the fragments are read (matmul v6: half the shared traffic, more arithmetic).
Prints a markdown table (ms and TFLOP/s counted as 2 M N K, whatever the kernel's accuracy; only
the 3xTF32 columns are fp32-accurate products).

    python lab/bench/gemm_ablate.py --splits

times the split at read three ways (lab/split_tile.SPLITS) on the 128 x 64 tile: "round" (v6, five
instructions a value), "half" (four: small's low bits left for the tensor core to drop) and
"trunc" (three: small truncated by the tensor core), and says whether each gives v6's bits and
its error against float64.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = [("120M mlp fwd x @ W_1", 8192, 3072, 768), ("square 4096", 4096, 4096, 4096)]
TILES = [(128, 64, 16, 64, 32), (64, 64, 16, 32, 32), (128, 128, 16, 64, 64), (128, 128, 16, 64, 32)]


def main(argv=None):
    from andrea_numba import cli
    ap = cli.Parser(prog="python lab/bench/gemm_ablate.py", description=__doc__.splitlines()[0])
    ap.add_argument("--splits", action="store_true", help="time the three ways to split at read instead")
    args = ap.parse_args(argv)
    from numba import cuda, float32

    from lab.split_tile import split_bytes, tile_mma_split
    from lab.matmul import make_tile
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gemm import timed

    def kernel(tile, products, presplit=True, split_mode="round", max_registers=None):
        mma, threads = tile_mma_split(False, False, *tile, True, products=products, presplit=presplit,
                                      split_mode=split_mode)
        t = make_tile(("v5", *tile, True))           # matmul v5's tile: its epilogue
        zero, store, TM, TN = t.zero, t.store, t.TM, t.TN

        @cuda.jit(**({"max_registers": max_registers} if max_registers else {}))   # (not in the simulator)
        def k_ablate(out, a, b):
            acc = cuda.local.array((TM, TN), float32)
            zero(acc)
            mma(acc, a, b, 0, a.shape[1])
            store(out, acc, False)
        return k_ablate, t.grid, threads

    rng = np.random.default_rng(0)
    if args.splits:
        return splits(kernel, timed, rng)
    print("| product | tile | 3xTF32 ms | TFLOP/s | 1xTF32 ms | TFLOP/s | no mma ms | TFLOP/s "
          "| 3xTF32, split at read ms | TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, M, N, K in SHAPES:
        a = cuda.to_device(rng.standard_normal((M, K)).astype(np.float32))
        b = cuda.to_device(rng.standard_normal((K, N)).astype(np.float32))
        out = cuda.device_array((M, N), np.float32)
        for tile in TILES:
            cells = []
            for products, presplit in ((3, True), (1, True), (0, True), (3, False)):
                if presplit and split_bytes(*tile[:2]) > 48 * 1024:
                    cells.append("- | -")                      # beyond the static shared-memory limit
                    continue
                k, grid, threads = kernel(tile, products, presplit)
                ms = timed(lambda: k[grid(M, N), threads](out, a, b))
                cells.append(f"{ms:.3f} | {2.0 * M * N * K / ms / 1e9:.1f}")
            print(f"| {label} | {tile} | " + " | ".join(cells) + " |", flush=True)


def splits(kernel, timed, rng):
    from numba import cuda
    tile = TILES[0]
    print("| product | split | register cap | ms | TFLOP/s | same bits as round | max error / max |ref| |")
    print("|---|---|---|---|---|---|---|")
    for label, M, N, K in SHAPES + [("120M mlp dx-like 8192 x 768 x 3072", 8192, 768, 3072)]:
        ah = rng.standard_normal((M, K)).astype(np.float32)
        bh = rng.standard_normal((K, N)).astype(np.float32)
        ref = ah.astype(np.float64) @ bh.astype(np.float64)
        a, b = cuda.to_device(ah), cuda.to_device(bh)
        out = cuda.device_array((M, N), np.float32)
        first = None
        for mode, regs in (("round", None), ("half", None), ("trunc", None), ("half", 168), ("trunc", 168), ("trunc", 128)):
            k, grid, threads = kernel(tile, 3, False, mode, regs)
            k[grid(M, N), threads](out, a, b)
            got = out.copy_to_host()
            first = got if first is None else first
            same = bool(np.array_equal(got.view(np.uint32), first.view(np.uint32)))
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
            ms = timed(lambda: k[grid(M, N), threads](out, a, b))
            print(f"| {label} | {mode} | {regs or '-'} | {ms:.3f} | {2.0 * M * N * K / ms / 1e9:.1f} | {same} | {err:.2e} |", flush=True)


if __name__ == "__main__":
    main()
