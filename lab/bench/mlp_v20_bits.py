"""mlp v20 (the GELU in matmul v18's epilogues) against v19 (the GELU as passes of its own) on a
GPU: the same inputs as the engine gives them (x and h saved as bf16), every output compared, and
each timed as a CUDA graph replay (lab/bench/gemm.py's timed_graph).

    python lab/bench/mlp_v20_bits.py [--size 120M] [--json FILE]

On a GPU the compiler may fuse a multiply and an add differently in the epilogue than in v19's
GELU kernels, so the bits may differ in the last place; the line says by how much (relative to each
output's largest value). The harness's mlp case feeds fp32 h, where v20 is v19: this is its check.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="120M", choices=("12M", "120M"))
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    from numba import cuda

    from andrea_numba.kernels import matmul as MM
    from andrea_numba.kernels import mlp
    from lab import mlp as lab_mlp
    from gemm import timed_graph
    from reference.precision import round_bf16
    N, C = (16 * 512, 384) if args.size == "12M" else (8 * 1024, 768)
    F = 4 * C
    rng = np.random.default_rng(13)
    bits16 = lambda a: (round_bf16(a).view(np.uint32) >> 16).astype(np.uint16)
    host = dict(x=bits16(rng.standard_normal((N, C)).astype(np.float32)),
                w_1=(0.02 * rng.standard_normal((C, F))).astype(np.float32),
                w_2=(0.02 * rng.standard_normal((F, C))).astype(np.float32),
                dout=(1e-3 * rng.standard_normal((N, C))).astype(np.float32))
    d = {k: cuda.to_device(v) for k, v in host.items()}
    work = cuda.device_array(MM.splitk_work(C, N), np.float32)
    rows, outs = [], []
    for v, fwd, bwd in ((19, mlp.mlp_fwd_bf16_wgmma, mlp.mlp_bwd_bf16_wgmma), (20, lab_mlp.mlp_fwd_v20, lab_mlp.mlp_bwd_v20)):
        b = dict(out=cuda.device_array((N, C), np.float32), h_pre=cuda.device_array((N, F), np.float32),
                 h=cuda.device_array((N, F), np.uint16), dx=cuda.device_array((N, C), np.float32),
                 dh_pre=cuda.device_array((N, F), np.float32), dw_1=cuda.to_device(np.zeros((C, F), np.float32)),
                 dw_2=cuda.to_device(np.zeros((F, C), np.float32)))
        run_f = lambda st, b=b, fwd=fwd: fwd(b["out"], b["h_pre"], b["h"], work, d["x"], d["w_1"], d["w_2"], stream=st)
        run_b = lambda st, b=b, bwd=bwd: bwd(b["dx"], b["dw_1"], b["dw_2"], b["dh_pre"], work, d["dout"], d["x"],
                                             b["h_pre"], b["h"], d["w_1"], d["w_2"], stream=st)
        run_f(0)
        run_b(0)
        cuda.synchronize()
        outs.append({k: b[k].copy_to_host() for k in ("out", "h_pre", "h", "dx", "dw_1", "dw_2")})
        rows.append(dict(version=v, fwd_ms=timed_graph(run_f), bwd_ms=timed_graph(run_b)))
        print(f"mlp v{v} at {args.size}: forward {rows[-1]['fwd_ms']:.3f} ms, backward {rows[-1]['bwd_ms']:.3f} ms "
              f"(CUDA graph replays; the backward's dW += accumulates over the replays)", flush=True)
    cmp = {}
    for k in outs[0]:
        a, b = outs[0][k], outs[1][k]
        if k == "h":                               # bf16 bit patterns: compare their values
            a, b = ((x.astype(np.uint32) << 16).view(np.float32) for x in (a, b))
        same = bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))
        rel = float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(a).max(), 1e-30))
        cmp[k] = dict(identical=same, rel_diff=rel)
        print(f"  {k:6s} {'identical' if same else 'differs'}  max |v20 - v19| / max |v19| = {rel:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(size=args.size, rows=rows, compare=cmp), indent=1))
    sys.exit(0 if all(c["rel_diff"] < 1e-2 for c in cmp.values()) else 1)


if __name__ == "__main__":
    main()
