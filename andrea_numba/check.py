"""The agreement harness: every CUDA kernel against its NumPy twin, on the same inputs.

    python -m andrea_numba.check                   # tiny size (NUMBA_ENABLE_CUDASIM=1 without a GPU)
    python -m andrea_numba.check --size 120M       # on a GPU
    python -m andrea_numba.check --json            # {"ok", "device", "seed", "results": [...]}

For each op it draws fresh random inputs (seeded; the seed is printed), runs the twin in float64
and the kernels in float32 on float32 copies of the same inputs, and compares every output and
every gradient: max abs error, relative error (max abs error / max |ref|) and the tolerance, of the
form |kernel - ref| <= atol + rtol * |ref| element by element, with atol scaled to the tensor
(atol = a * max|ref|). Before each launch it
  - fills every output buffer with NaN, so an element a kernel forgets to write fails;
  - pre-fills every parameter-gradient buffer with random values P and checks buffer - P, so a
    kernel that writes (=) instead of adding (+=) fails;
  - runs everything twice and demands bit-identical results (determinism).
Then it checks the whole model (GPUModel) the same way: the loss and every gradient tensor
against reference.model, and a bit-identical second run.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np
from numba import cuda

import reference as R

from .config import ModelConfig, exit_on_config_error, load_config
from .kernels import attn, attn_out, attn_qkv, embed, layernorm, loss, mlp, optim, residual
from .kernels.common import SIMULATOR, device_name
from .layout import decay_mask, init_params, n_params, param_layout

OP_TOL = (1e-3, 1e-4)       # (rtol, a): one op in float32 against float64
MODEL_TOL = (1e-2, 1e-3)    # the whole model: float32 rounding compounds over the layers

# (B, T) of the op checks and of the whole-model check, by size; the simulator needs small ones
SHAPES = {"tiny": ((2, 8), (2, 8)), "12M": ((4, 512), (4, 512)), "120M": ((2, 1024), (1, 1024))}


def to_dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def to_host(d):
    return d.copy_to_host() if hasattr(d, "copy_to_host") else np.array(d)


def compare(op, name, got, ref, tol, prefill=None, repeat=None) -> dict:
    """One result row. got: kernel output (float32); ref: twin (float64); prefill: the values an
    accumulating buffer held before the launch; repeat: the same output from a second run."""
    rtol, a = tol
    g = got.astype(np.float64) - (0 if prefill is None else prefill.astype(np.float64))
    ref = np.asarray(ref, dtype=np.float64).reshape(g.shape)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    atol = a * scale if scale > 0 else 1e-12
    err = np.abs(g - ref)
    max_err = float(np.max(err)) if err.size else 0.0
    finite = bool(np.all(np.isfinite(g)))
    within = finite and bool(np.all(err <= atol + rtol * np.abs(ref)))
    bitwise = True if repeat is None else bool(np.array_equal(got, repeat, equal_nan=True))
    return {"op": op, "tensor": name,
            "max_abs_err": max_err if finite else math.inf,
            "rel_err": (max_err / scale if scale > 0 else max_err) if finite else math.inf,
            "tol": {"atol": atol, "rtol": rtol},
            "bitwise_repeat": bitwise,
            "ok": within and bitwise}


def run_op(op, launch, inputs, outs, accums, refs, tol=OP_TOL, rng=None):
    """Launch an op's kernels twice on fresh buffers and compare with the twin.
    inputs: name -> host array, copied before each run (some kernels update in place);
    outs: name -> shape (NaN-poisoned before each run);
    accums: names of += buffers (pre-filled with the same random values before each run);
    refs: name -> float64 twin result (for accums: the amount to be added)."""
    prefill = {k: rng.standard_normal(np.shape(refs[k])).astype(np.float32)
               * np.float32(max(1e-3, float(np.max(np.abs(refs[k]))))) for k in accums}
    runs = []
    for _ in range(2):
        d = {k: to_dev(v) for k, v in inputs.items()}
        d.update({k: to_dev(np.full(shape, np.nan, np.float32)) for k, shape in outs.items()})
        d.update({k: to_dev(p) for k, p in prefill.items()})
        launch(d)
        cuda.synchronize()
        runs.append({k: to_host(d[k]) for k in refs})
    return [compare(op, k, runs[0][k], refs[k], tol, prefill.get(k), runs[1][k]) for k in refs]


def f32(a):
    return np.asarray(a, dtype=np.float32)


def op_rows(m: ModelConfig, B: int, T: int, rng) -> list[dict]:
    """Every op pair and the utility kernels at rows N = B*T with the model's C, H, V."""
    C, H, V, F, N = m.d_model, m.n_head, m.vocab_size, 4 * m.d_model, B * T
    r = lambda *s, scale=1.0: f32(rng.standard_normal(s) * scale)
    d64 = lambda a: np.asarray(a, dtype=np.float64)
    rows = []

    # embed: token ids with repeats (V may exceed N: draw from a few ids)
    tokens = rng.integers(0, min(V, max(2, N // 3)), size=(B, T)).astype(np.int32)
    wte, wpe, dout = r(V, C), r(m.context_length, C), r(B, T, C)
    dwte, dwpe = R.embed_bwd(d64(dout), tokens, d64(wte), d64(wpe))
    rows += run_op("embed", lambda d: embed.embed_fwd(d["out"], d["tokens"], d["wte"], d["wpe"]),
                   dict(tokens=tokens, wte=wte, wpe=wpe), dict(out=(B, T, C)), [],
                   dict(out=R.embed_fwd(tokens, d64(wte), d64(wpe))), rng=rng)
    rows += run_op("embed", lambda d: embed.embed_bwd(d["dwte"], d["dwpe"], d["dout"], d["tokens"], d["links"]),
                   dict(tokens=tokens, dout=dout, links=np.zeros((2, N), np.int32)), {}, ["dwte", "dwpe"],
                   dict(dwte=dwte, dwpe=dwpe), rng=rng)
    rows += run_op("embed v1", lambda d: embed.embed_bwd_v1(d["dwte"], d["dwpe"], d["dout"], d["tokens"]),
                   dict(tokens=tokens, dout=dout), {}, ["dwte", "dwpe"], dict(dwte=dwte, dwpe=dwpe), rng=rng)

    # layernorm
    x, g, b, dout = r(N, C), r(C, scale=0.5) + 1, r(C, scale=0.5), r(N, C)
    out, mean, rstd = R.layernorm_fwd(d64(x), d64(g), d64(b), m.ln_eps)
    dx, dg, db = R.layernorm_bwd(d64(dout), d64(x), mean, rstd, d64(g))
    rows += run_op("layernorm", lambda d: layernorm.layernorm_fwd(d["out"], d["mean"], d["rstd"], d["x"],
                                                                  d["g"], d["b"], m.ln_eps),
                   dict(x=x, g=g, b=b), dict(out=(N, C), mean=(N,), rstd=(N,)), [],
                   dict(out=out, mean=mean, rstd=rstd), rng=rng)
    rows += run_op("layernorm", lambda d: layernorm.layernorm_bwd(d["dx"], d["dg"], d["db"], d["dout"], d["x"],
                                                                  d["mean"], d["rstd"], d["g"]),
                   dict(dout=dout, x=x, mean=f32(mean), rstd=f32(rstd), g=g), dict(dx=(N, C)), ["dg", "db"],
                   dict(dx=dx, dg=dg, db=db), rng=rng)

    # attn_qkv
    s = 1 / math.sqrt(C)
    x, wq, wk, wv = r(N, C), r(C, C, scale=s), r(C, C, scale=s), r(C, C, scale=s)
    dq, dk, dv = r(N, C), r(N, C), r(N, C)
    q, k, v = R.attn_qkv_fwd(d64(x), d64(wq), d64(wk), d64(wv))
    dx, dwq, dwk, dwv = R.attn_qkv_bwd(d64(dq), d64(dk), d64(dv), d64(x), d64(wq), d64(wk), d64(wv))
    rows += run_op("attn_qkv", lambda d: attn_qkv.attn_qkv_fwd(d["q"], d["k"], d["v"], d["x"],
                                                               d["w_q"], d["w_k"], d["w_v"]),
                   dict(x=x, w_q=wq, w_k=wk, w_v=wv), dict(q=(N, C), k=(N, C), v=(N, C)), [],
                   dict(q=q, k=k, v=v), rng=rng)
    rows += run_op("attn_qkv", lambda d: attn_qkv.attn_qkv_bwd(d["dx"], d["dw_q"], d["dw_k"], d["dw_v"],
                                                               d["dq"], d["dk"], d["dv"], d["x"],
                                                               d["w_q"], d["w_k"], d["w_v"]),
                   dict(dq=dq, dk=dk, dv=dv, x=x, w_q=wq, w_k=wk, w_v=wv), dict(dx=(N, C)),
                   ["dw_q", "dw_k", "dw_v"], dict(dx=dx, dw_q=dwq, dw_k=dwk, dw_v=dwv), rng=rng)

    # attn
    q, k, v, dy = r(B, T, C), r(B, T, C), r(B, T, C), r(B, T, C)
    y, att = R.attn_fwd(d64(q), d64(k), d64(v), H)
    dq, dk, dv = R.attn_bwd(d64(dy), d64(q), d64(k), d64(v), att, H)
    for name, (fwd, bwd) in (("attn", (attn.attn_fwd, attn.attn_bwd)), ("attn v1", attn.VERSIONS[1])):
        rows += run_op(name, lambda d: fwd(d["y"], d["att"], d["q"], d["k"], d["v"], H),
                       dict(q=q, k=k, v=v), dict(y=(B, T, C), att=(B, H, T, T)), [], dict(y=y, att=att), rng=rng)
        rows += run_op(name, lambda d: bwd(d["dq"], d["dk"], d["dv"], d["dy"], d["q"], d["k"], d["v"],
                                           d["att"], d["scratch"], H),
                       dict(dy=dy, q=q, k=k, v=v, att=f32(att)),
                       dict(dq=(B, T, C), dk=(B, T, C), dv=(B, T, C), scratch=(B, H, T, T)), [],
                       dict(dq=dq, dk=dk, dv=dv), rng=rng)

    # attn_out
    y, wo, dout = r(N, C), r(C, C, scale=s), r(N, C)
    dy, dwo = R.attn_out_bwd(d64(dout), d64(y), d64(wo))
    rows += run_op("attn_out", lambda d: attn_out.attn_out_fwd(d["out"], d["y"], d["w_o"]),
                   dict(y=y, w_o=wo), dict(out=(N, C)), [], dict(out=R.attn_out_fwd(d64(y), d64(wo))), rng=rng)
    rows += run_op("attn_out", lambda d: attn_out.attn_out_bwd(d["dy"], d["dw_o"], d["dout"], d["y"], d["w_o"]),
                   dict(dout=dout, y=y, w_o=wo), dict(dy=(N, C)), ["dw_o"], dict(dy=dy, dw_o=dwo), rng=rng)

    # mlp
    x, w1, w2, dout = r(N, C), r(C, F, scale=s), r(F, C, scale=1 / math.sqrt(F)), r(N, C)
    out, h_pre, h = R.mlp_fwd(d64(x), d64(w1), d64(w2))
    dx, dw1, dw2 = R.mlp_bwd(d64(dout), d64(x), h_pre, h, d64(w1), d64(w2))
    rows += run_op("mlp", lambda d: mlp.mlp_fwd(d["out"], d["h_pre"], d["h"], d["x"], d["w_1"], d["w_2"]),
                   dict(x=x, w_1=w1, w_2=w2), dict(out=(N, C), h_pre=(N, F), h=(N, F)), [],
                   dict(out=out, h_pre=h_pre, h=h), rng=rng)
    rows += run_op("mlp", lambda d: mlp.mlp_bwd(d["dx"], d["dw_1"], d["dw_2"], d["dh_pre"], d["dout"], d["x"],
                                                d["h_pre"], d["h"], d["w_1"], d["w_2"]),
                   dict(dout=dout, x=x, h_pre=f32(h_pre), h=f32(h), w_1=w1, w_2=w2),
                   dict(dx=(N, C), dh_pre=(N, F)), ["dw_1", "dw_2"], dict(dx=dx, dw_1=dw1, dw_2=dw2), rng=rng)

    # residual (flat)
    x, f, dout = r(N * C), r(N * C), r(N * C)
    dxr, dfr = R.residual_add_bwd(d64(dout))
    rows += run_op("residual", lambda d: residual.residual_add(d["out"], d["x"], d["f"]),
                   dict(x=x, f=f), dict(out=(N * C,)), [], dict(out=R.residual_add(d64(x), d64(f))), rng=rng)
    rows += run_op("residual", lambda d: residual.residual_add_bwd(d["dx"], d["df"], d["dout"]),
                   dict(dout=dout), dict(dx=(N * C,), df=(N * C,)), [], dict(dx=dxr, df=dfr), rng=rng)

    # loss (owns the tied output projection)
    x, wte = r(N, C), r(V, C, scale=0.5)
    targets = rng.integers(0, V, size=N).astype(np.int32)
    lo, losses, probs = R.loss_fwd(d64(x), d64(wte), targets)
    dx, dwte = R.loss_bwd(1.0, d64(x), d64(wte), probs, targets)
    rows += run_op("loss", lambda d: loss.loss_fwd(d["loss"], d["losses"], d["probs"], d["x"], d["wte"], d["targets"]),
                   dict(x=x, wte=wte, targets=targets), dict(loss=(1,), losses=(N,), probs=(N, V)), [],
                   dict(loss=np.array([lo]), losses=losses, probs=probs), rng=rng)
    rows += run_op("loss", lambda d: loss.loss_bwd(d["dx"], d["dwte"], d["dlogits"], d["probs"], d["x"], d["wte"],
                                                   d["targets"], 1.0),
                   dict(probs=f32(probs), x=x, wte=wte, targets=targets), dict(dx=(N, C), dlogits=(N, V)), ["dwte"],
                   dict(dx=dx, dwte=dwte), rng=rng)

    # utility kernels over a flat vector of the model's n_params
    P = n_params(m)
    grads, params, mm, vv = r(P, scale=1e-2), r(P, scale=2e-2), r(P, scale=1e-3), f32(rng.random(P) * 1e-5)
    mask = decay_mask(m, np.float64)
    norm = R.grad_norm(d64(grads))
    clipped, _ = R.clip_grad_norm(d64(grads), 0.37 * float(norm))
    rows += run_op("grad_norm", lambda d: optim.grad_norm(d["norm"], d["partial"], d["grads"]),
                   dict(grads=grads), dict(norm=(1,), partial=(optim.NORM_BLOCKS,)), [],
                   dict(norm=np.array([norm])), rng=rng)
    rows += run_op("grad_scale", lambda d: optim.grad_scale(d["grads"], d["norm"], 0.37 * float(norm), 1.0),
                   dict(grads=grads, norm=f32([norm])), {}, [], dict(grads=clipped), rng=rng)
    t, lr, b1, b2, eps, wd = 3, 1e-3, 0.9, 0.95, 1e-8, 0.1
    p_ref, m_ref, v_ref = R.adamw_step(d64(params), d64(grads), d64(mm), d64(vv), t, lr, b1, b2, eps, wd, mask)
    rows += run_op("adamw", lambda d: optim.adamw(d["params"], d["grads"], d["m"], d["v"], d["decay"],
                                                  t, lr, b1, b2, eps, wd),
                   dict(params=params, grads=grads, m=mm, v=vv, decay=mask.astype(np.uint8)), {}, [],
                   dict(params=p_ref, m=m_ref, v=v_ref), rng=rng)
    rows += run_op("zero", lambda d: optim.zero(d["grads"]), dict(grads=grads), {}, [],
                   dict(grads=np.zeros(P)), rng=rng)
    return rows


def model_rows(m: ModelConfig, B: int, T: int, rng, seed: int) -> list[dict]:
    """The whole model: loss and every gradient tensor of GPUModel against reference.model."""
    from .gpu_model import GPUModel

    params = init_params(m, seed)
    params += f32(rng.standard_normal(params.size) * 0.01)       # break the symmetry of LN params
    tokens = rng.integers(0, m.vocab_size, size=(B, T)).astype(np.int32)
    targets = rng.integers(0, m.vocab_size, size=(B, T)).astype(np.int32)
    ref_loss, acts = R.model_forward(params.astype(np.float64), m, tokens, targets)
    ref_grads = R.model_backward(params.astype(np.float64), m, acts)
    del acts
    model = GPUModel(m, B, T)
    model.params.copy_to_device(params)
    runs = []
    for _ in range(2):
        model.zero_grads()
        model.forward(tokens, targets)
        model.backward()
        cuda.synchronize()
        runs.append((np.array([model.read_loss()]), to_host(model.grads)))
    rows = [compare("model", "loss", runs[0][0], np.array([float(ref_loss)]), MODEL_TOL, repeat=runs[1][0])]
    for s in param_layout(m):
        sl = slice(s.offset, s.end)
        rows.append(compare("model", "d " + s.name, runs[0][1][sl], ref_grads[sl], MODEL_TOL,
                            repeat=runs[1][1][sl]))
    return rows


def run_checks(size="tiny", seed=None, batch=None, seq=None, ops=True, model=True, progress=None):
    cfg = load_config(size)
    m = cfg.model
    (ob, ot), (mb, mt) = SHAPES.get(size, ((2, min(8, m.context_length)),) * 2)
    ob, mb = batch or ob, batch or mb
    ot, mt = min(seq or ot, m.context_length), min(seq or mt, m.context_length)
    rng = np.random.default_rng(seed)
    rows = []
    if ops:
        t0 = time.time()
        rows += op_rows(m, ob, ot, rng)
        if progress:
            progress(f"ops checked at B={ob} T={ot} in {time.time() - t0:.1f} s")
    if model:
        t0 = time.time()
        rows += model_rows(m, mb, mt, rng, seed)
        if progress:
            progress(f"whole model checked at B={mb} T={mt} in {time.time() - t0:.1f} s")
    return rows


def launch_every_kernel():
    """Launch every kernel the harness uses once (bench/ptxcheck.py compiles them this way)."""
    run_checks("tiny", seed=0)


def format_table(rows) -> str:
    head = f"{'op':<10} {'tensor':<20} {'max_abs_err':>11} {'rel_err':>9} {'atol':>9} {'rtol':>7}  repeat  result"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['op']:<10} {r['tensor']:<20} {r['max_abs_err']:>11.2e} {r['rel_err']:>9.2e} "
                     f"{r['tol']['atol']:>9.1e} {r['tol']['rtol']:>7.0e}  "
                     f"{'same' if r['bitwise_repeat'] else 'DIFF':<6}  {'ok' if r['ok'] else 'FAIL'}")
    bad = sum(not r["ok"] for r in rows)
    lines += ["-" * len(head), f"{len(rows) - bad}/{len(rows)} agree"]
    return "\n".join(lines)


@exit_on_config_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m andrea_numba.check",
                                 description="Check every CUDA kernel and the whole GPU model against the NumPy twin.")
    ap.add_argument("--size", default="tiny", help="tiny, 12M, 120M or a config file (default tiny)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the random inputs (default: fresh, printed)")
    ap.add_argument("--batch", type=int, help="batch size B of the checks (default by size)")
    ap.add_argument("--seq", type=int, help="sequence length T of the checks (default by size)")
    ap.add_argument("--ops-only", action="store_true", help="skip the whole-model check")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    if SIMULATOR and args.size not in ("tiny", "ANDREA-tiny"):
        print(f"note: {args.size} in the CUDA simulator will take very long; tiny is the simulator's size",
              file=sys.stderr)
    if not SIMULATOR and not cuda.is_available():
        print("error: no CUDA GPU found: run on a GPU, or set NUMBA_ENABLE_CUDASIM=1 to use the simulator "
              "at --size tiny", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
    say = (lambda s: print(s, file=sys.stderr, flush=True))
    say(f"seed {seed}, device: {device_name()}")
    rows = run_checks(args.size, seed, args.batch, args.seq, model=not args.ops_only, progress=say)
    ok = all(r["ok"] for r in rows)
    if args.json:
        print(json.dumps({"ok": ok, "device": device_name(), "seed": seed, "size": args.size, "results": rows},
                         indent=1))
    else:
        print(format_table(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
