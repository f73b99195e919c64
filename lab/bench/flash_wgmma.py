"""Flash attention v15 (wgmma, lab/attn_flash_wgmma.py) on a GPU: does it agree with v14 and the twin,
and how long do v13, v14, v15 and PyTorch's scaled_dot_product_attention take at the 12M and 120M
training shapes.

    python lab/bench/flash_wgmma.py                       # 12M (16 x 512, 6 heads) and 120M (8 x 1024, 12 heads)
    python lab/bench/flash_wgmma.py --quick               # 120M only, each version's default block, 3 repeats
    python lab/bench/flash_wgmma.py --sizes 12M --markdown out.md --json out.json
    python lab/bench/flash_wgmma.py --ptx DIR             # no GPU: v15's kernels compiled for sm_90a, ptxas -v

1. The check, at each size (random normal q, k, v, dy; no dropout, as the configs train): v14 and v15
   forward and backward with fp32 outputs (v14 is then v13) on the whole batch; v15 against v14 (max
   |v15 - v14| / max |v14|, each output), and both against the twin at bf16 (reference.attn under
   products_in("bf16"), the backward on the kernel's own y and lse) on the first sequence of the batch,
   with the harness's comparison and bf16 tolerance (check.compare, LOW_PRECISION_TOL). The harness
   itself, with dropout: python -m lab.check --size 120M --op attn_flash --version 15.
2. The times: CUDA events around back-to-back launches on one stream, the median of --repeats
   repeats after a warm-up (compile time outside). Forward and backward apart (the backward on the
   forward's y and lse), at every GPU block a version declares (--quick: its default), v13 with fp32
   outputs, v14 and v15 as the bf16-hopper recipe runs them (y16 beside y; dq, dk, dv in bf16: v15
   also with fp32 outputs, "v15 fp32"). PyTorch (when importable; not a dependency): bf16 q, k, v
   [B, H, T, hs], F.scaled_dot_product_attention(q, k, v, is_causal=True), forward alone and forward
   + backward (torch.autograd.grad of y against dy), whichever kernel PyTorch picks. Each row that
   fails prints its error instead of a time: one broken version does not end the run.
   TFLOP/s count the causal products as FlashAttention's papers do: forward 4 B H T^2 hs / 2, backward
   2.5 times that (no recomputation counted). "x layers" is fwd + bwd times the model's n_layer: the
   goal for 120M is 2.5 ms.

Writes a markdown table to stdout (and --markdown), every row to --json. In the CUDA simulator it
exits with one line: there is nothing to time there.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab" / "bench"))

from andrea_numba import cli  # noqa: E402
from andrea_numba.config import load_config  # noqa: E402
from andrea_numba.kernels.common import SIMULATOR  # noqa: E402
from kernels import time_calls  # noqa: E402  (lab/bench/kernels.py: events around back-to-back calls)

SIZES = {"12M": (16, 512), "120M": (8, 1024)}       # the configs' training microbatches (B, T)
VERSIONS = (13, 14, 15)


def one_line(e, n=300):
    return cli.one_line(f"{type(e).__name__}: {e}")[:n]


# ------------------------------------------------------------------------------------------------
# shapes and buffers

def model_shape(size):
    """(B, T, C, H, n_layer) of a size's training microbatch."""
    m = load_config(size).model
    B, T = SIZES[size]
    return B, T, m.d_model, m.n_head, m.n_layer


def flops(B, T, C):
    """(forward, backward) FLOPs of causal attention over all heads, FlashAttention's count: 4 B T^2 C
    / 2 for the two forward products (half the scores), the backward 2.5 times that."""
    fwd = 4 * B * T * T * C / 2
    return fwd, 2.5 * fwd


class Buffers:
    """Device buffers of one size: inputs, fp32 outputs, and the bf16 outputs of the out16 form."""

    def __init__(self, B, T, C, H, seed=0):
        from numba import cuda
        rng = np.random.default_rng(seed)
        self.host = {n: rng.standard_normal((B, T, C)).astype(np.float32) for n in ("q", "k", "v", "dy")}
        self.dev = {n: cuda.to_device(a) for n, a in self.host.items()}
        f32 = lambda *s: cuda.device_array(s, np.float32)
        u16 = lambda: cuda.device_array((B, T, C), np.uint16)
        self.y, self.lse, self.d_rowdot = f32(B, T, C), f32(B, H, T), f32(B, H, T)
        self.grads = [f32(B, T, C) for _ in range(3)]
        self.y16, self.grads16 = u16(), [u16() for _ in range(3)]
        self.H = H

    def fwd(self, launch, block, out16, stream=0):
        d = self.dev
        extra = {"y16": self.y16} if out16 else {}
        launch(self.y, self.lse, d["q"], d["k"], d["v"], self.H, 0.0, 0, block=block, stream=stream, **extra)

    def bwd(self, launch, block, out16, stream=0):
        d = self.dev
        grads = self.grads16 if out16 else self.grads
        launch(*grads, self.d_rowdot, d["dy"], d["q"], d["k"], d["v"], self.y, self.lse, self.H, 0.0, 0,
               block=block, stream=stream)

    def outputs(self):
        return {"y": self.y.copy_to_host(), "lse": self.lse.copy_to_host(),
                **{n: g.copy_to_host() for n, g in zip(("dq", "dk", "dv"), self.grads)}}


# ------------------------------------------------------------------------------------------------
# 1. the check

def check_size(size, bufs, say):
    """Rows: v15 against v14 on the whole batch, v14 and v15 against the twin at bf16 on sequence 0."""
    import reference as R
    from andrea_numba import check
    from lab import attn_flash as lab_attn_flash
    B, T, C, H, _ = model_shape(size)
    rows, got = [], {}
    for v in (14, 15):
        try:
            fwd, bwd = lab_attn_flash.flash_pair(v)
            bufs.fwd(fwd, fwd.blocks[0], False)
            bufs.bwd(bwd, bwd.blocks[0], False)
            got[v] = bufs.outputs()
        except Exception as e:  # noqa: BLE001
            rows.append({"size": size, "check": f"v{v} runs", "ok": False, "error": one_line(e)})
            say(f"{size}: v{v} failed: {one_line(e)}")
    if 14 in got and 15 in got:
        for name in got[15]:
            a, b = got[15][name], got[14][name]
            rel = float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))
            finite = bool(np.isfinite(a).all())
            rows.append({"size": size, "check": f"v15 vs v14 {name}", "rel_err": rel, "ok": finite and rel < 1e-2})
    h = {n: a[:1].astype(np.float64) for n, a in bufs.host.items()}
    with R.products_in("bf16"):
        y_ref, lse_ref = R.attn_flash_fwd(h["q"], h["k"], h["v"], H)
    tol = check.LOW_PRECISION_TOL["attn_flash"]
    for v, out in got.items():
        with R.products_in("bf16"):
            dq, dk, dv = R.attn_flash_bwd(h["dy"], h["q"], h["k"], h["v"], out["y"][:1].astype(np.float64),
                                          out["lse"][:1].astype(np.float64), H)
        for name, ref in dict(y=y_ref, lse=lse_ref, dq=dq, dk=dk, dv=dv).items():
            r = check.compare("attn_flash", name, out[name][:1], ref, tol)
            rows.append({"size": size, "check": f"v{v} vs twin {name}", "rel_err": r["rel_err"], "ok": r["ok"]})
    for r in rows:
        if "rel_err" in r:
            say(f"{size}: {r['check']:<22} rel_err {r['rel_err']:.2e}  {'ok' if r['ok'] else 'DISAGREES'}")
    return rows


# ------------------------------------------------------------------------------------------------
# 2. the times

def our_rows(size, bufs, repeats, quick, say):
    """A row per (version, form, block): forward and backward ms, or the error."""
    from numba import cuda
    from lab import attn_flash as lab_attn_flash
    B, T, C, H, L = model_shape(size)
    f_fwd, f_bwd = flops(B, T, C)
    stream = cuda.stream()
    plan = [(13, False, "v13"), (14, True, "v14"), (15, True, "v15"), (15, False, "v15 fp32")]
    rows = []
    for v, out16, label in plan:
        try:
            fwd, bwd = lab_attn_flash.flash_pair(v)
        except Exception as e:  # noqa: BLE001
            rows.append({"size": size, "version": label, "block": "-", "error": one_line(e)})
            continue
        fblocks = fwd.blocks[:1] if quick else fwd.blocks
        bblocks = bwd.blocks[:1] if quick else bwd.blocks
        for i in range(max(len(fblocks), len(bblocks))):
            fb, bb = fblocks[min(i, len(fblocks) - 1)], bblocks[min(i, len(bblocks) - 1)]
            row = {"size": size, "version": label, "block": f"{fb} / {bb}".replace(" ", "").replace("/", " / ")}
            try:
                row["fwd_ms"] = time_calls(lambda: bufs.fwd(fwd, fb, out16, stream), stream, repeats)
                bufs.fwd(fwd, fblocks[0], out16, stream)         # y, lse for the backward
                row["bwd_ms"] = time_calls(lambda: bufs.bwd(bwd, bb, out16, stream), stream, repeats)
                row["fwd_tflops"] = f_fwd / row["fwd_ms"] / 1e9
                row["bwd_tflops"] = f_bwd / row["bwd_ms"] / 1e9
                row["total_ms"] = row["fwd_ms"] + row["bwd_ms"]
                row["layers_ms"] = L * row["total_ms"]
            except Exception as e:  # noqa: BLE001
                row["error"] = one_line(e)
            rows.append(row)
            say(_row_text(row))
    return rows


def torch_rows(size, repeats, say):
    """PyTorch's scaled_dot_product_attention in bf16: forward, and forward + backward."""
    B, T, C, H, L = model_shape(size)
    f_fwd, f_bwd = flops(B, T, C)
    rows = []
    try:
        import torch
        import torch.nn.functional as F
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        g = torch.Generator(device="cuda").manual_seed(0)
        shape = (B, H, T, C // H)
        q, k, v, dy = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        q, k, v = (x.requires_grad_() for x in (q, k, v))

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd():
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(y, (q, k, v), dy)

        def t(fn):
            fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            n = max(1, min(200, int(0.02 / max(time.perf_counter() - t0, 1e-6))))
            times = []
            for _ in range(repeats):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(n):
                    fn()
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) / n)
            return float(np.median(times))
        row = {"size": size, "version": f"torch {torch.__version__} sdpa bf16", "block": "-"}
        row["fwd_ms"] = t(fwd)
        row["total_ms"] = t(fwd_bwd)
        row["bwd_ms"] = row["total_ms"] - row["fwd_ms"]
        row["fwd_tflops"] = f_fwd / row["fwd_ms"] / 1e9
        row["bwd_tflops"] = f_bwd / row["bwd_ms"] / 1e9 if row["bwd_ms"] > 0 else None
        row["layers_ms"] = L * row["total_ms"]
        row["note"] = "bwd = (fwd + bwd) - fwd"
    except Exception as e:  # noqa: BLE001
        row = {"size": size, "version": "torch sdpa bf16", "block": "-", "error": one_line(e)}
    rows.append(row)
    say(_row_text(row))
    return rows


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def _row_text(r):
    if "error" in r:
        return f"{r['size']} {r['version']} {r['block']}: error {r['error']}"
    return (f"{r['size']} {r['version']:<10} {r['block']:<20} fwd {r['fwd_ms']:.3f} ms, bwd {r['bwd_ms']:.3f} ms, "
            f"x layers {r['layers_ms']:.2f} ms")


def markdown(rows, checks):
    lines = ["| size | version | block (fwd / bwd) | fwd ms | bwd ms | fwd + bwd ms | x layers ms | fwd TFLOP/s | bwd TFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['size']} | {r['version']} | {r['block']} | error: {r['error'].replace('|', '/')} | | | | | |")
        else:
            lines.append(f"| {r['size']} | {r['version']} | {r['block']} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | "
                         f"{r['total_ms']:.3f} | {r['layers_ms']:.2f} | {_f(r.get('fwd_tflops'), '.0f')} | "
                         f"{_f(r.get('bwd_tflops'), '.0f')} |")
    if checks:
        lines += ["", "| size | check | rel_err | ok |", "|---|---|---|---|"]
        for c in checks:
            lines.append(f"| {c['size']} | {c['check']} | {_f(c.get('rel_err'), '.2e') if 'error' not in c else c['error']} | "
                         f"{'ok' if c['ok'] else 'NO'} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# compile only

def ptx_only(out_dir: Path, say=print):
    """v15's three kernels at every GPU block, fp32 and bf16 outputs, compiled for sm_90a (cuda.compile_ptx
    with cc=(9, 0, "a")) at the 120M shape's types (hs = 64; 12M has the same) and assembled by
    ptxas -v: registers, spills, and whether ptxas serializes the wgmmas (its warning C7518)."""
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda, typeof
    from numba.core import types as nbtypes
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))  # no driver: the
    #                                                                   device functions compile for sm_90 too
    from andrea_numba.kernels.dropout import mask_args
    from lab import attn_flash_wgmma as V15
    out_dir.mkdir(parents=True, exist_ok=True)
    ptxas = shutil.which("ptxas")
    B, T, C, H, _ = model_shape("120M")
    f32 = lambda *s: np.zeros(s, np.float32)
    ok = True
    blocks = dict.fromkeys(V15.FLASH_WGMMA_FWD_BLOCKS["gpu"] + V15.FLASH_WGMMA_BWD_BLOCKS["gpu"])
    for block in blocks:
        for out16 in (False, True):
            kernels = V15.make_kernels(C // H, block[0], block[1], True, out16)
            o = np.zeros((B, T, C // 2), np.int32) if out16 else f32(B, T, C)
            drop = mask_args(0.0, 0)
            argsets = [(f32(B, T, C), o, f32(B, H, T), f32(B, T, C), f32(B, T, C), f32(B, T, C), np.float32(1), *drop),
                       (o, f32(B, H, T), *(f32(B, T, C) for _ in range(5)), f32(B, H, T), np.float32(1), *drop),
                       (o, o, *(f32(B, T, C) for _ in range(4)), f32(B, H, T), f32(B, H, T), np.float32(1), *drop)]
            for kern, args in zip(kernels, argsets):
                name = f"{kern.py_func.__name__}_{block[0]}x{block[1]}"
                try:
                    ptx, _ = cuda.compile_ptx(kern.py_func, nbtypes.void(*(typeof(a) for a in args)), cc=(9, 0, "a"),
                                              launch_bounds=kern.targetoptions.get("launch_bounds"))
                except Exception as e:  # noqa: BLE001
                    ok = False
                    say(f"{name}: compile error {one_line(e)} (numba-cuda needs NVVM, and NVRTC for the "
                        f"'a' target: libnvrtc on LD_LIBRARY_PATH)")
                    continue
                path = out_dir / f"{name}.ptx"
                path.write_text(ptx)
                target = next((ln.split()[1] for ln in ptx.splitlines() if ln.startswith(".target")), "?")
                line = f"{name}: {target}, {ptx.count('wgmma.mma_async')} wgmma.mma_async"
                if ptxas:
                    p = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(path), "-o", os.devnull],
                                       capture_output=True, text=True)
                    text = p.stderr + p.stdout
                    info = "; ".join(ln.split(":", 1)[-1].strip() for ln in text.splitlines()
                                     if "Used" in ln or "spill" in ln)
                    serial = "C7518" in text
                    ok = ok and p.returncode == 0 and not serial
                    line += f"; ptxas rc {p.returncode}: {info}" + ("; WGMMA SERIALIZED (C7518)" if serial else "")
                else:
                    line += "; no ptxas on the PATH"
                say(line)
    return ok


def main(argv=None):
    p = cli.Parser(prog="python lab/bench/flash_wgmma.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=None, help="default: 12M 120M (--quick: 120M)")
    p.add_argument("--quick", action="store_true", help="120M only, each version's default block, 3 repeats")
    p.add_argument("--repeats", type=cli.positive_int, default=None, help="repeats of each timing, median taken (default 7; --quick 3)")
    p.add_argument("--no-check", action="store_true", help="time only")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--markdown", type=cli.file_to_write(".md"), help="also write the tables here")
    p.add_argument("--json", type=cli.file_to_write(".json"), help="every row as JSON")
    p.add_argument("--ptx", type=cli.dir_to_write, help="compile only (no GPU): v15's kernels for sm_90a into this "
                   "directory, with ptxas -v's registers and spills")
    args = p.parse_args(argv)
    if SIMULATOR:
        cli.fail("flash_wgmma.py times kernels on a GPU; the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) runs no "
                 "wgmma: unset it (--ptx compiles without a GPU)", code=1)
    if args.ptx:
        sys.exit(0 if ptx_only(args.ptx) else 1)
    from numba import cuda
    if not cuda.is_available():
        cli.fail("no CUDA GPU found (lab/bench/flash_wgmma.py --ptx DIR compiles v15 without one)", code=1)
    sizes = args.sizes or (["120M"] if args.quick else ["12M", "120M"])
    repeats = args.repeats or (3 if args.quick else 7)
    say = lambda s: print(s, file=sys.stderr, flush=True)
    name = cuda.get_current_device().name
    say(f"device: {name.decode() if isinstance(name, bytes) else name}")
    rows, checks = [], []
    for size in sizes:
        B, T, C, H, L = model_shape(size)
        say(f"{size}: B {B}, T {T}, C {C}, {H} heads of {C // H}, {L} layers")
        try:
            bufs = Buffers(B, T, C, H)
        except Exception as e:  # noqa: BLE001
            rows.append({"size": size, "version": "-", "block": "-", "error": one_line(e)})
            continue
        if not args.no_check:
            try:
                checks += check_size(size, bufs, say)
            except Exception as e:  # noqa: BLE001
                checks.append({"size": size, "check": "check", "ok": False, "error": one_line(e)})
                say(f"{size}: the check failed: {one_line(e)}")
        rows += our_rows(size, bufs, repeats, args.quick, say)
        if not args.no_torch:
            rows += torch_rows(size, repeats, say)
        del bufs
    table = markdown(rows, checks)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "checks": checks}, indent=1))
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
