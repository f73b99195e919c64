"""Our engine against PyTorch, like for like: in each row both sides do the same work and are timed
the same way, in one process; the ratio is a median over repeats, with its spread.

    python lab/bench/like_for_like.py                     # 12M and 120M, fp32 and bf16, every row
    python lab/bench/like_for_like.py --sizes 12M --precisions bf16 --repeats 7 --iters 30
    python lab/bench/like_for_like.py --json out.json --markdown out.md --skip-compile

The rows, ours against theirs (B x T as step_time.SHAPES, which are the sizes' configs' batches):

  fwd+bwd, graph vs reduce-overhead  one forward + backward (the trainer's model on its step's
        first microbatch) recorded once as a CUDA graph and replayed (StepGraph, as the trainer
        replays its step), against the same PyTorch model
        through torch.compile(model, mode="reduce-overhead"): its kernels replayed as CUDA graphs.
  fwd+bwd, graph vs compile  the same replay against torch.compile(model) in its default mode
        (its fused kernels, launched from Python).
  fwd+bwd, eager vs eager  ours launched kernel by kernel from Python, against PyTorch eager.
  step vs eager step  the trainer's step (Trainer.step_work, replayed as a CUDA graph): n_micro x
        (forward, backward, loss summed), the gradients divided by n_micro, their global norm,
        clipping to clip_norm, AdamW (decay on the 2-D weights) which also zeroes the gradients;
        against PyTorch eager: n_micro x (forward, loss / n_micro, backward),
        clip_grad_norm_, torch.optim.AdamW(fused=True) with decay on the 2-D weights,
        zero_grad(set_to_none=False). Neither side includes copying the batches in or reading the
        loss back (the trainer's one sync a step).
  step vs compiled step  the same step, PyTorch's model through torch.compile (default mode, the
        compiled model of "graph vs compile") and the same eager clipping, fused AdamW, zeroing.

Measured: each side by the same function, `per_iter_ms`: synchronize the device, call the side N
times back to back, synchronize again; the wall-clock time over N. The host's own work (Python's
launches, a graph's launch, torch.compile's guards) counts wherever the GPU does not hide it, on
both sides alike. (StepGraph.replay_ms times each replay between two CUDA events on our stream,
the GPU's time only; a compiled PyTorch call does host work between its kernels that such events
would not charge the same way. For our replays, one launch each, the two agree while the host
keeps ahead.) Forward + backward: the gradients add up over the iterations (ours +=, PyTorch's
.grad), never zeroed, but for reduce-overhead's, set to None before each call: its last gradients
are its graphs' outputs, which its next replay overwrites (so it skips the one add a call). Our kernels are compiled ahead on several processes and run
once eagerly before any capture; then each side is called 3 times untimed (torch.compile compiles,
and reduce-overhead records its graphs, in these calls). Then
R repeats, each timing every side once in turn; per repeat, ratio = PyTorch's ms / ours (above 1:
ours faster). A row prints each side's median ms [min-max over the repeats] and the median ratio
[min-max of the per-repeat ratios]; its verdict is "faster" when every repeat's ratio is above 1,
"slower" when every one is below 1, and "parity" when they straddle 1.

Precisions: fp32 is recipe_for("fp32") (3xTF32 products, fp32-accurate: fp32-hopper on compute
capability 9.0, fp32 elsewhere) against PyTorch fp32 with TF32 off; bf16 is recipe_for("bf16") (bf16-hopper on compute capability 9.0) against bf16
autocast. Both sides read the same token ids (the step's batches, drawn from random tokens); the
weights are each side's own initialisation. Needs PyTorch (not a dependency of the project) and a
CUDA GPU: without either it says so in one line and exits with code 2.
"""
from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from andrea_numba import cli  # noqa: E402
from lab.bench.step_time import SHAPES, torch_gpt  # noqa: E402

ITERS = {"tiny": 20, "12M": 20, "120M": 5}         # iterations a repeat, unless --iters
WARMUP = 3
ROWS = (   # (row, our side, PyTorch's side, needs torch.compile, is a training step)
    ("fwd+bwd, graph vs reduce-overhead", "graph", "reduce-overhead", True, False),
    ("fwd+bwd, graph vs compile", "graph", "compile", True, False),
    ("fwd+bwd, eager vs eager", "eager", "eager", False, False),
    ("step vs eager step", "step", "eager step", False, True),
    ("step vs compiled step", "step", "compiled step", True, True),
)


def say(line):
    print(line, file=sys.stderr, flush=True)


def spread(xs) -> list:
    """[median, min, max]."""
    return [float(np.median(xs)), float(min(xs)), float(max(xs))]


def verdict(ratios) -> str:
    """Ours against theirs from the per-repeat ratios (theirs / ours): parity when they straddle 1."""
    if min(ratios) > 1:
        return "faster"
    return "slower" if max(ratios) < 1 else "parity"


def summarize(ours_ms, theirs_ms) -> dict:
    ratios = [t / o for o, t in zip(ours_ms, theirs_ms)]
    return {"ours_ms": spread(ours_ms), "theirs_ms": spread(theirs_ms), "ratio": spread(ratios),
            "verdict": verdict(ratios), "ours_ms_each": list(ours_ms), "theirs_ms_each": list(theirs_ms)}


def table(results) -> list[str]:
    """The results as a Markdown table (printed as it is)."""
    f = lambda s, d=2: f"{s[0]:.{d}f} [{s[1]:.{d}f}-{s[2]:.{d}f}]"
    lines = ["| size | precision (ours / PyTorch) | row | ours ms | PyTorch ms | PyTorch / ours | verdict (ours) |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['size']} | {r['recipe']} / {r['torch']} | {r['row']} | {f(r['ours_ms'])} | "
                     f"{f(r['theirs_ms'])} | {f(r['ratio'], 3)} | {r['verdict']} |")
    return lines


def per_iter_ms(fn, iters, sync) -> float:
    """ms a call of fn: iters calls back to back between two device synchronizations, wall clock."""
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e3 / iters


def size_config(size, precision):
    from andrea_numba.config import config_from_dict, load_config, validate
    raw = load_config(size).to_dict()
    raw["train"]["precision"] = precision
    cfg = validate(config_from_dict(raw, origin="lab/bench/like_for_like.py"))
    assert (cfg.train.batch_size, cfg.train.seq_len) == SHAPES[size], f"{size}: its config's batch is not SHAPES'"
    return cfg


def our_sides(cfg, with_step: bool):
    """Our trainer for cfg, allocated as Trainer.setup allocates it, without a corpus or a run
    directory (nothing is written): random token ids stand in for the prepared corpus, the
    weights are init_params', Adam's moments zero, and the step's inputs are written once. Returns
    the trainer and {side: a call}: eager, graph (forward + backward of the first microbatch, as
    the step runs it) and step (the whole step as a graph)."""
    from andrea_numba import train as tr
    from andrea_numba.layout import init_params, n_params
    from andrea_numba.precompile import default_workers
    m, t = cfg.model, cfg.train
    trainer = tr.Trainer(cfg, "unused", log=lambda line: say(f"  trainer: {line}"), compile_workers=default_workers())
    trainer.n = n_params(m)
    trainer.train_tokens = trainer.val_tokens = np.random.default_rng(0).integers(0, m.vocab_size, 1 << 20)
    trainer.allocate()
    s, model = trainer.stream, trainer.model
    model.params.copy_to_device(init_params(m, t.seed), stream=s)
    for a in (trainer.adam_m, trainer.adam_v):
        a.copy_to_device(np.zeros(trainer.n, np.float32), stream=s)
    trainer.write_step_inputs(t.warmup_steps, t.lr)
    x, y, keys = trainer.micro_inputs[0]

    def fwd_bwd(stream):
        with model.launching_on(stream):
            model.forward(x, y, keys=keys)
            model.backward()
    trainer.timings = {}                        # (set by setup; compile_kernels adds its seconds)
    trainer.compile_kernels()                   # on default_workers() processes at once
    fwd_bwd(s)                                  # every kernel loaded (or compiled) before any capture
    if with_step:
        trainer.step_work(s)
    s.synchronize()
    try:
        sides = {"eager": lambda: fwd_bwd(s), "graph": tr.StepGraph(s, fwd_bwd).launch}
        if with_step:
            sides["step"] = tr.StepGraph(s, trainer.step_work).launch
    except Exception as e:                      # noqa: BLE001 (the driver's words, in one line)
        cli.fail(f"the CUDA graph capture failed: {' '.join(str(e).split())}", code=1)
    return trainer, sides


def torch_sides(cfg, batches, bf16: bool, compiled: bool, with_step: bool, device="cuda"):
    """{side: a call} of PyTorch's GPT (step_time.torch_gpt) on the trainer's batches [n_micro, 2, B, T]:
    eager, reduce-overhead, compile (forward + backward of the first microbatch), eager step and
    compiled step (the training step of the module docstring). device "cpu" tries the code
    without a GPU (reduce-overhead then runs without graphs)."""
    import torch
    m, t = cfg.model, cfg.train
    B, T, n_micro = t.batch_size, t.seq_len, t.n_microbatches
    xs = [torch.as_tensor(np.asarray(batches[i, 0]), dtype=torch.long, device=device) for i in range(n_micro)]
    ys = [torch.as_tensor(np.asarray(batches[i, 1]), dtype=torch.long, device=device) for i in range(n_micro)]

    def fwd_bwd(model, mark_step=False):
        def run():
            if mark_step:                       # a new iteration for the CUDA graphs of reduce-overhead,
                torch.compiler.cudagraph_mark_step_begin()
                model.zero_grad(set_to_none=True)   # whose last gradients are its graphs' outputs: not added to
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                loss = model(xs[0], ys[0])
            loss.backward()
        return run

    def step(model, params):
        decay, rest = [p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                                 {"params": rest, "weight_decay": 0.0}],
                                lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, fused=True)

        def run():
            for i in range(n_micro):
                with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                    loss = model(xs[i], ys[i])
                (loss / n_micro).backward()
            torch.nn.utils.clip_grad_norm_(params, t.clip_norm)
            opt.step()
            opt.zero_grad(set_to_none=False)
        return run
    eager = torch_gpt(m, B, T, device)[0]
    sides = {"eager": fwd_bwd(eager)}
    if with_step:
        sides["eager step"] = step(eager, list(eager.parameters()))
    if compiled:
        torch._dynamo.reset()                   # nothing compiled for an earlier size or precision
        graphed = torch.compile(torch_gpt(m, B, T, device)[0], mode="reduce-overhead")
        sides["reduce-overhead"] = fwd_bwd(graphed, mark_step=True)
        plain = torch_gpt(m, B, T, device)[0]
        fused = torch.compile(plain)            # one compiled model: the forward + backward and the step
        sides["compile"] = fwd_bwd(fused)
        if with_step:
            sides["compiled step"] = step(fused, list(plain.parameters()))
    return sides


def measure(size, precision, args):
    """The rows of one size and precision: every side built, warmed up, then timed in turns."""
    import torch
    from numba import cuda
    cfg = size_config(size, precision)
    with_step, compiled = not args.skip_train_step, not args.skip_compile
    say(f"{size} {precision}: our trainer built, its kernels compiled ahead, its graphs captured")
    trainer, ours = our_sides(cfg, with_step)
    theirs = torch_sides(cfg, trainer.batches_host, precision == "bf16", compiled, with_step)
    sync = lambda: (cuda.synchronize(), torch.cuda.synchronize())
    sides = [("ours", k, f) for k, f in ours.items()] + [("theirs", k, f) for k, f in theirs.items()]
    for who, name, fn in sides:
        t0 = time.perf_counter()
        for _ in range(WARMUP):
            fn()
        sync()
        say(f"{size} {precision}: {'ours' if who == 'ours' else 'PyTorch'} {name} warmed up "
            f"({WARMUP} calls, {time.perf_counter() - t0:.1f} s with compiling)")
    iters = args.iters or ITERS[size]
    ms = {(who, name): [] for who, name, _ in sides}
    for r in range(args.repeats):
        for who, name, fn in sides:
            ms[who, name].append(per_iter_ms(fn, iters, sync))
        say(f"{size} {precision}: repeat {r + 1}/{args.repeats} done")
    rows = []
    for row, mine, other, needs_compile, is_step in ROWS:
        if (needs_compile and not compiled) or (is_step and not with_step):
            continue
        rows.append({"size": size, "precision": precision, "recipe": trainer.model.recipe.name,
                     "torch": "bf16 autocast" if precision == "bf16" else "fp32, TF32 off", "row": row,
                     "ours": mine, "theirs": other, "iters": iters, "repeats": args.repeats,
                     **summarize(ms["ours", mine], ms["theirs", other])})
    for line in table(rows)[2:]:                 # on stderr now: a later size that fails keeps these
        say(line)
    del trainer, ours, theirs, sides, fn
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    cuda.current_context().deallocations.clear()    # our buffers freed now, not at numba's leisure
    return rows


def main(argv=None) -> int:
    ap = cli.Parser(prog="python lab/bench/like_for_like.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", choices=list(SHAPES), default=["12M", "120M"])
    ap.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    ap.add_argument("--repeats", type=cli.int_range(2, 1000), default=5, help="repeats R (default 5)")
    ap.add_argument("--iters", type=cli.int_range(1, 100_000),
                    help="calls a repeat times on each side (default by size: "
                    + ", ".join(f"{k} {v}" for k, v in ITERS.items()) + ")")
    ap.add_argument("--json", type=cli.file_to_write(".json"), help="write every time here too")
    ap.add_argument("--markdown", type=cli.file_to_write(".md"), help="write the table here too")
    ap.add_argument("--skip-train-step", action="store_true", help="leave the training-step rows out")
    ap.add_argument("--skip-compile", action="store_true", help="leave the torch.compile rows out")
    args = ap.parse_args(argv)
    prog = "lab/bench/like_for_like.py"
    try:
        import torch
    except ImportError:
        cli.fail(f"{prog} needs PyTorch (not a dependency of the project): pip install torch")
    from numba import cuda

    import numba
    from andrea_numba.kernels.common import SIMULATOR, device_name
    if SIMULATOR or not cuda.is_available() or not torch.cuda.is_available():
        cli.fail(f"{prog} needs a CUDA GPU for PyTorch and for numba (the simulator cannot time)")
    from importlib.metadata import PackageNotFoundError, version
    try:
        numba_cuda = version("numba-cuda")
    except PackageNotFoundError:
        numba_cuda = "(not a package here)"
    about = {"gpu": device_name(), "torch": torch.__version__, "numba": numba.__version__,
             "numba-cuda": numba_cuda, "date": time.strftime("%Y-%m-%d %H:%M %Z")}
    say(" ".join(f"{k} {v};" for k, v in about.items()))
    results = [r for size in args.sizes for p in args.precisions for r in measure(size, p, args)]
    note = ("ms: median [min-max] over the repeats of a call's time (a repeat: N calls between two syncs, "
            "wall clock); PyTorch / ours: median [min-max] of the per-repeat ratios, above 1 ours faster; "
            "parity: the ratios straddle 1")
    lines = ["; ".join(f"{k} {v}" for k, v in about.items()), "", *table(results), "", note]
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({**about, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
