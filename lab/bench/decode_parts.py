"""Where a decoder product's time goes, taken apart on the GPU.

    python lab/bench/decode_parts.py                     # the 12M shapes
    python lab/bench/decode_parts.py --size 120M --json parts.json
    ncu --cache-control none --section WarpStateStats python lab/bench/decode_parts.py --once

The decoder's step (kernels/decode.py) is some 37 launches of 8-13 us each, where an empty kernel
costs about 1 us and each product reads at most 2.4 MB of weights (lab/bench/decode_speed.py
--kernels). This times the pieces of one product, each launch repeated 20 times in a CUDA graph and
replayed (as decode_speed --kernels does: the weights stay in L2 from launch to launch), per launch:

    engine x += a @ W, block B       k_decode_matvec_add at each block it declares (MATVEC_BLOCKS)
    empty, its arguments             a kernel that does nothing, the same arguments and grid: the launch
    LayerNorm alone                  the LayerNorm the qkv, mlp_up and logits kernels start with
                                     (_layernorm_shared), every block the whole row, as qkv's grid
    LayerNorm by warps               the same with one barrier: each warp sums the row by shuffles
    rung 5, block B                  lab/decode.py rung 5's product: 4 columns a thread, a row one
                                     128-bit load, four rows a round, the KS slices met by a tree in
                                     shared memory; at the blocks it declares and at TILES
    128-bit loads, shuffles          the same 4 columns a thread, all of its K / KS rows issued before
                                     the first is used, the slices met by warp shuffles

for the three shapes of a 12M (or --size) block's products: C x C (W_o), C x 3C (qkv's three),
4C x C (W_2). Each variant's x is checked against NumPy (float64) before it is timed: a variant off
by more than 1e-4 of the largest |x| is reported and the exit code is 1. --once launches each
variant once, outside a graph, and times nothing: a profiler's run (Nsight Compute then reports
each kernel's stalls). Needs a CUDA GPU.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from numba import cuda, float32  # noqa: E402

from andrea_numba import cli  # noqa: E402
from andrea_numba.config import load_config  # noqa: E402
from andrea_numba.kernels.common import MAX_BLOCK, SIMULATOR, device_name  # noqa: E402
from andrea_numba.kernels.ptx import warp_sum  # noqa: E402

REPS = 20                                        # launches a graph
TILES = ((2, 128), (4, 64), (8, 32), (2, 64), (4, 32), (1, 128))     # (TX, KS): 4 TX columns, KS slices a block


@cuda.jit
def _k_empty(x, a, w, bf16):
    """Nothing: the launch alone, with k_decode_matvec_add's arguments."""
    pass


def _layernorm_alone():
    from andrea_numba.kernels.decode import _layernorm_shared

    @cuda.jit
    def k(x, g, b, out):
        """The LayerNorm of the row x in shared memory, as k_decode_qkv's every block computes it."""
        a = cuda.shared.array(0, float32)
        buf = cuda.shared.array(MAX_BLOCK, float32)
        C = x.shape[0]
        i = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
        for c in range(i, C, cuda.blockDim.x * cuda.blockDim.y):
            a[c] = x[c]
            a[C + c] = g[c]
            a[2 * C + c] = b[c]
        _layernorm_shared(a, buf, C, float32(1e-5))
        if cuda.blockIdx.x == 0:
            for c in range(i, C, cuda.blockDim.x * cuda.blockDim.y):
                out[c] = a[c]
    return k


@cuda.jit
def _k_layernorm_by_warps(x, g, b, out):
    """The same LayerNorm with one barrier: every warp sums the whole row by itself (lane j adds
    c = j, j + 32, ..., then a butterfly of shuffles: ptx.warp_sum), so each warp holds the mean
    and rstd without waiting for another; flat thread i then writes its channels c = i, i + n, ...
    normalised into shared memory, and one barrier publishes them. Whole warps only."""
    a = cuda.shared.array(0, float32)
    C = x.shape[0]
    n = cuda.blockDim.x * cuda.blockDim.y
    i = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    lane = i % 32
    inv_c = float32(1.0) / float32(C)
    s = float32(0.0)
    for c in range(lane, C, 32):
        s += x[c]
    mu = warp_sum(s, 1, 16) * inv_c
    s = float32(0.0)
    for c in range(lane, C, 32):
        d = x[c] - mu
        s += d * d
    r = float32(1.0) / math.sqrt(warp_sum(s, 1, 16) * inv_c + float32(1e-5))
    for c in range(i, C, n):
        a[c] = (x[c] - mu) * r * g[c] + b[c]
    cuda.syncthreads()
    if cuda.blockIdx.x == 0:
        for c in range(i, C, n):
            out[c] = a[c]


def _wide_shuffles(R: int, TX4: int, KS: int):
    """x[n] += sum_k a[k] w[k, n] with 128-bit loads: thread (ty, tx) of a block (KS, TX4), the
    slices along the warp's lanes, owns columns n .. n + 3, n = 4 (TX4 blockIdx + tx), and rows
    k = ty + KS j, j < R (K = R KS): R loads issued before any is used (R a constant: the loop is
    unrolled), then the KS slices of each column met by a butterfly of shuffles within each warp
    and the warps' sums after one barrier."""
    from andrea_numba.kernels.ptx import load4

    @cuda.jit
    def k(x, a, w):
        buf = cuda.shared.array((4, MAX_BLOCK), float32)
        ty, tx = cuda.threadIdx.x, cuda.threadIdx.y
        n = 4 * (cuda.blockIdx.x * TX4 + tx)
        N = w.shape[1]
        s0 = float32(0.0)
        s1 = float32(0.0)
        s2 = float32(0.0)
        s3 = float32(0.0)
        for j in range(R):
            kk = ty + KS * j
            w0, w1, w2, w3 = load4(w, kk * N + n)
            ak = a[kk]
            s0 += ak * w0
            s1 += ak * w1
            s2 += ak * w2
            s3 += ak * w3
        s0, s1 = warp_sum(s0, 1, 16), warp_sum(s1, 1, 16)
        s2, s3 = warp_sum(s2, 1, 16), warp_sum(s3, 1, 16)
        nw = KS // 32
        if ty % 32 == 0:
            i = tx * nw + ty // 32
            buf[0, i] = s0
            buf[1, i] = s1
            buf[2, i] = s2
            buf[3, i] = s3
        cuda.syncthreads()
        if ty == 0:
            for q in range(1, nw):
                buf[0, tx * nw] += buf[0, tx * nw + q]
                buf[1, tx * nw] += buf[1, tx * nw + q]
                buf[2, tx * nw] += buf[2, tx * nw + q]
                buf[3, tx * nw] += buf[3, tx * nw + q]
            x[n] += buf[0, tx * nw]
            x[n + 1] += buf[1, tx * nw]
            x[n + 2] += buf[2, tx * nw]
            x[n + 3] += buf[3, tx * nw]
    return k


def main(argv=None) -> int:
    ap = cli.Parser(prog="python lab/bench/decode_parts.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=cli.config, default="12M", help="a config size or file (default 12M)")
    ap.add_argument("--json", type=cli.file_to_write(".json"), help="also write the rows to this file")
    ap.add_argument("--once", action="store_true", help="launch each variant once and time nothing (for a profiler)")
    args = ap.parse_args(argv)
    if SIMULATOR or not cuda.is_available():
        cli.fail("lab/bench/decode_parts.py needs a CUDA GPU (the simulator has no CUDA graphs)")
    from andrea_numba.graphs import StepGraph
    from andrea_numba.kernels import decode as kd
    from lab.decode import decode_matvec_add_v5

    cfg = load_config(args.size)
    C = cfg.model.d_model
    s = cuda.stream()
    rng = np.random.default_rng(0)

    def dev(*shape):
        return cuda.to_device(rng.standard_normal(shape).astype(np.float32), stream=s)

    def us(launch, checked=True) -> float:
        if args.once:                                # one launch a variant: its check's, else this one
            if not checked:
                launch(s)
                s.synchronize()
            return math.nan
        launch(s)
        s.synchronize()
        return 1e3 * StepGraph(s, lambda st: [launch(st) for _ in range(REPS)]).replay_ms(5) / REPS

    rows, bad = [], []

    def row(what, shape, t, err=None):
        rows.append({"what": what, "shape": shape, "us": round(t, 3), "err": err})
        print(f"{shape:<12} {what:<44} {t:8.2f} us" + ("" if err is None else f"   max error {err:.1e}"), flush=True)
        if err is not None and not err <= 1e-4:
            bad.append(f"{shape} {what}")

    print(f"{cfg.name} (C = {C}) on {device_name()}: each launch repeated {REPS} times in a graph, per launch\n")
    for K, N in ((C, C), (C, 3 * C), (4 * C, C)):
        shape = f"{K} x {N}"
        a, w, x = dev(K), dev(K, N), dev(N)
        x0 = x.copy_to_host()
        want = x0.astype(np.float64) + a.copy_to_host().astype(np.float64) @ w.copy_to_host().astype(np.float64)
        scale = np.abs(want).max()

        def check(launch):
            x.copy_to_device(x0, stream=s)
            launch(s)
            got = x.copy_to_host(stream=s)
            s.synchronize()
            return float(np.abs(got - want).max() / scale)
        for blk in kd.MATVEC_BLOCKS["gpu"]:
            grid = math.ceil(N / blk[0])
            launch = lambda st, g=grid, b=blk: kd.k_decode_matvec_add[g, b, st](x, a, w, False)
            err = check(launch)
            row(f"engine, block {blk}", shape, us(launch), err)
        blk = kd.MATVEC_BLOCKS["gpu"][0]
        row(f"empty, its arguments, block {blk}", shape,
            us(lambda st: _k_empty[math.ceil(N / blk[0]), blk, st](x, a, w, False), checked=False))
        for blk in dict.fromkeys(decode_matvec_add_v5.blocks + TILES):
            if N % (4 * blk[0]):
                continue
            launch = lambda st, b=blk: decode_matvec_add_v5(x, a, w, block=b, stream=st)
            err = check(launch)
            row(f"rung 5, block {blk} ({N // (4 * blk[0])} blocks)", shape, us(launch), err)
        for TX4, KS in TILES:
            if K % KS or N % (4 * TX4) or KS < 32:
                continue
            k = _wide_shuffles(K // KS, TX4, KS)
            launch = lambda st, k=k, b=(KS, TX4): k[N // (4 * TX4), b, st](x, a, w)
            err = check(launch)
            row(f"128-bit loads, shuffles, TX {TX4} KS {KS} ({N // (4 * TX4)} blocks)", shape, us(launch), err)
    xg, g, b, out = dev(C), dev(C), dev(C), dev(C)
    xh, gh, bh = (v.copy_to_host().astype(np.float64) for v in (xg, g, b))
    want = (xh - xh.mean()) / np.sqrt(xh.var() + 1e-5) * gh + bh

    def ln_error(launch):
        launch(s)
        return float(np.abs(out.copy_to_host(stream=s) - want).max() / np.abs(want).max())
    ln = _layernorm_alone()
    for name, kern in (("LayerNorm alone", ln), ("LayerNorm by warps, one barrier", _k_layernorm_by_warps)):
        for blk in kd.QKV_BLOCKS["gpu"][:3]:
            grid = math.ceil(3 * C / blk[0])
            launch = lambda st, k=kern, gr=grid, bb=blk: k[gr, bb, st, 12 * C](xg, g, b, out)
            err = ln_error(launch)
            row(f"{name}, {grid} blocks of {blk}", f"{C}", us(launch), err)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device_name(), "size": args.size, "reps": REPS, "rows": rows,
                                               "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
    if bad:
        print("wrong results: " + "; ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
