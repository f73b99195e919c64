"""Time sampling on the GPU: the KV-cache decoder (andrea_numba/decode.py) against the whole forward.

    python lab/bench/decode_speed.py                          # 12M, 256 tokens, median of 5 runs
    python lab/bench/decode_speed.py --size 120M --tokens 128 --runs 3 --json decode.json
    python lab/bench/decode_speed.py --only-blocks            # just the decoder's blocks (below)
    python lab/bench/decode_speed.py --versions 1,9,5,8       # the step's rungs (lab/decode.py), one run
    python lab/bench/decode_speed.py --kernels                # where a step's time goes, kernel by kernel
    python lab/bench/decode_speed.py --kernels --versions 1,2 # the same for each rung's launchers
    ncu --profile-from-start off --section WarpStateStats python lab/bench/decode_speed.py --kernels --once
    python lab/bench/decode_speed.py --precision bf16 --no-blocks   # a bf16 run's sampler (its recipe)

Each path draws --tokens tokens after a one-token prompt with sample.generate, the same seed, on
the same weights (init_params, a little noise added so the distributions are not flat), at fp32
(--precision bf16: the whole forward of the bf16 recipe, the decoders at bf16, as a bf16 run samples):

    whole forward, eager    the forward of the last context_length tokens launched kernel by
                            kernel for each token (python -m andrea_numba.sample before the decoder)
    whole forward, graph    the same forward replayed as a CUDA graph (the trainer's sampler before it)
    decoder, eager          one position a token, its step (and the token's draw) launched kernel by
                            kernel
    decoder, graph          one position a token, its step (and the token's draw) replayed as a
                            CUDA graph, no host wait until the last token (the sampler now)

The whole forward's paths draw each token on the host (reference.decode.draw), the decoder's on
the GPU (k_decode_draw), from the same uniform numbers. Every path runs once untimed first
(compiling its kernels, capturing its graph); then --runs timed runs, wall clock of the whole
generate (draws and copies included), median. The paths must draw the same tokens (their
probabilities agree to fp32 rounding): a difference is reported and the exit code is 1, with, at
the first token where the decoder parts from the whole forward, how far the two paths'
probabilities are apart there and how near its uniform number fell to a boundary of the draw
(explain_difference). Beside the table, the GPU time of one decoder step with its draw at position ~128 (its graph replayed between
two CUDA events) and the target: 256 tokens at 12M in at most 0.05 s.

Then the decoder's blocks (--no-blocks skips them): the same GPU time of one step (t = 128 to 148,
drawing) with one launcher of kernels/decode.py at each of its other declared blocks, the
others at their defaults, one row a variant, and each variant's probabilities after those steps
against the defaults' (a block that computes something else shows there). A CUDA error poisons
the context: the first one ends the variants, said in one line (the rows so far stay printed).
With --kernels, only the step kernel by kernel (time_kernels): each launcher's launch repeated in a
graph, per launch, and the launches a step, beside an empty kernel's and the whole step's time; with
--versions too (any rung but 4), that table for each rung's launchers in turn. With --kernels
--once, no timing: one step at t = 128 launched kernel by kernel between cuda.profile_start and
profile_stop (a profiler started with its profiling off, Nsight Compute's --profile-from-start off,
then sees each of the step's launches once, not the steps that bring the decoder there).
With --versions, only the rungs of the step (lab/decode.py VERSIONS: 1 the engine's, its products'
sums across threads as shared-memory trees, attention's and the draw's by shuffles, 2 every sum by
shuffles, 3 rung 2 with attention in one block a head, 4 the whole step in one launch with grid
barriers, lab/decode_step.py, 5 the products with 128-bit loads, 6 those with their sums by
shuffles, 7 rung 6 with the classifier's too, 8 rung 5's products with rung 7's classifier, 9 the
engine with attention and the draw by trees), each at that rung: in turn, --runs
rounds of every rung, each round a new decoder whose step is captured as a graph, the GPU time of
a step with its draw (t = 128 to 148) and the wall clock of --tokens tokens drawn on it; medians
and [min-max] over the rounds, and whether every rung drew the same tokens.
Needs a CUDA GPU: in the simulator, or without a GPU, it says so in one line and exits 2.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from andrea_numba import cli  # noqa: E402
from andrea_numba.config import load_config  # noqa: E402
from andrea_numba.kernels.common import SIMULATOR, device_name  # noqa: E402
from reference.decode import draw_cdf  # noqa: E402

TARGET_S = 0.05             # 256 tokens at 12M (about 0.2 ms a token)
LAUNCHERS = ("decode_qkv", "decode_attention", "decode_matvec_add", "decode_mlp_up", "decode_logits", "decode_draw")


class Ids:
    """A tokenizer of token ids: the prompt is a list of ids, the text the tuple of drawn ids."""

    def encode(self, ids):
        return list(ids)

    def decode(self, ids):
        return tuple(ids)


def cuda_error(e: BaseException) -> bool:
    """Whether e comes from the driver (numba's CudaAPIError, cuda.core's CUDAError: after an error in a
    kernel the context is unusable)."""
    return any(c.__name__ in ("CudaDriverError", "CUDAError") for c in type(e).__mro__) or "CUDA_ERROR" in str(e)


def drawing_steps(dec, t0: int, seed: int = 0):
    """Bring a decoder to position t0 of a sequence that draws every token after a one-token prompt
    (token 0; temperature 1, top_k 40), its steps eager: the steps after it, replayed, draw as a
    sample's do."""
    dec.begin([0], np.random.default_rng(seed).random(dec.T), 1.0, 40)
    for _ in range(t0):
        dec.step()


def step_ms(dec, t0: int, reps: int) -> float:
    """The GPU time of one step of a sample (its draw included): the decoder brought to position t0
    (drawing_steps), its step captured as a graph and replayed reps + 1 times (the position stays
    below the window), each replay between two CUDA events; the median."""
    from andrea_numba.graphs import StepGraph
    drawing_steps(dec, t0)
    return StepGraph(dec.stream, dec.work).replay_ms(reps)


@cuda.jit
def _k_nothing(x):
    """An empty kernel: what a launch in a graph costs before any work."""
    pass


def time_kernels(m, params, stream, t0: int = 128, reps: int = 20):
    """Where a step's time goes, kernel by kernel, without a profiler (Nsight Compute flushes the
    caches and holds the clocks; a graph replays with neither): each launch of one step (at t0, the
    draw on) recorded, and each launcher's first launch repeated reps times back to back in one
    graph, replayed, per launch (its work and the gap to the next launch, as in the step's graph);
    an empty kernel's the same way. Rows {"kernel", "a_step", "us", "us_a_step"}, the empty
    kernel's us, and the step's own time (step_ms). A repeated launch repeats its side effects
    (x += a product, t += 1): the decoder is brought to t0 again before each launcher."""
    from andrea_numba.decode import Decoder
    from andrea_numba.graphs import StepGraph
    from andrea_numba.kernels import decode as kd
    dec = Decoder(m, params, stream=stream)
    t0 = min(t0, dec.T - reps - 2)
    launched, orig = [], {name: getattr(kd, name) for name in LAUNCHERS}
    for name, f in orig.items():
        setattr(kd, name, lambda *a, _n=name, **kw: launched.append((_n, a, kw)))
    try:
        dec.work(stream)                                   # recorded, not launched
    finally:
        for name, f in orig.items():
            setattr(kd, name, f)
    def kind(name, a):                                     # a launcher at its shapes (W_o's and W_2's products apart)
        return name + ("" if name != "decode_matvec_add" else " {}x{}".format(*a[2].shape))
    rows, seen = [], {}
    for name, a, kw in launched:
        k = kind(name, a)
        seen.setdefault(k, (name, a, kw, sum(kind(n, b) == k for n, b, _ in launched)))
    for k, (name, a, kw, count) in seen.items():
        drawing_steps(dec, t0)
        work = lambda st, _f=orig[name], _a=a, _kw=kw: [_f(*_a, **{**_kw, "stream": st}) for _ in range(reps)]
        us = 1e3 * StepGraph(stream, work).replay_ms(5) / reps
        rows.append({"kernel": k, "a_step": count, "us": us, "us_a_step": us * count})
    empty = cuda.device_array(1, np.float32, stream=stream)
    _k_nothing[1, 32, stream](empty)
    nothing_us = 1e3 * StepGraph(stream, lambda st: [_k_nothing[1, 32, st](empty) for _ in range(reps)]).replay_ms(5) / reps
    whole = step_ms(dec, t0, reps)
    total = sum(r["us_a_step"] for r in rows)
    print(f"\nthe step kernel by kernel (t = {t0}; each launcher's launch repeated {reps} times in one graph):\n"
          f"{'launcher':<28} {'a step':>6} {'us a launch':>12} {'us a step':>10}")
    for r in rows:
        print(f"{r['kernel']:<28} {r['a_step']:>6} {r['us']:>12.2f} {r['us_a_step']:>10.1f}")
    print(f"{'sum':<28} {sum(r['a_step'] for r in rows):>6} {'':>12} {total:>10.1f}\n"
          f"an empty kernel: {nothing_us:.2f} us a launch; the step replayed whole: {1e3 * whole:.1f} us")
    return rows, nothing_us, whole


def profile_one_step(m, params, stream, t0: int = 128):
    """--kernels --once: a decoder brought to t0 (drawing_steps, which compiles its kernels), then
    one eager step, each of its launches once, between cuda.profile_start and cuda.profile_stop."""
    from andrea_numba.decode import Decoder
    dec = Decoder(m, params, stream=stream)
    t0 = min(t0, dec.T - 2)
    drawing_steps(dec, t0)
    stream.synchronize()
    cuda.profile_start()
    dec.step()
    stream.synchronize()
    cuda.profile_stop()
    print(f"one step at t = {t0} launched kernel by kernel for a profiler", file=sys.stderr)


def time_blocks(m, params, stream, t0: int = 128, reps: int = 20):
    """The GPU time of one step of a sample (step_ms: t = t0 to t0 + reps) at the default blocks,
    then with each launcher of kernels/decode.py at each of its other blocks: rows of {"launcher",
    "block", "ms", "probs_vs_default"} (the largest relative difference of the probabilities after
    the steps). Stops at the first CUDA error, with a row that says so."""
    from andrea_numba.decode import Decoder
    from andrea_numba.kernels import decode as kd
    orig = {name: getattr(kd, name) for name in LAUNCHERS}
    variants = [("default", None)] + [(name, b) for name in LAUNCHERS for b in orig[name].blocks[1:]]
    dec = Decoder(m, params, stream=stream)
    t0 = min(t0, dec.T - reps - 2)
    rows, base = [], None
    print(f"\ndecoder step, GPU time of a graph replay at t = {t0} to {t0 + reps}, one launcher's block varied "
          f"at a time:\n{'launcher':<20} {'block':<10} {'ms':>8} {'x default':>10} {'probs vs default':>17}")
    try:
        for name, block in variants:
            for n, f in orig.items():
                setattr(kd, n, functools.partial(f, block=block) if n == name else f)
            label = "(defaults)" if block is None else str(tuple(block) if isinstance(block, (tuple, list)) else block)
            try:
                ms = step_ms(dec, t0, reps)          # (the first variant's eager steps compile the kernels)
                probs = dec.read("probs").astype(np.float64)
                assert dec.read("pos")[0] == t0 + reps + 1
            except Exception as e:                   # noqa: BLE001 (one row a variant)
                why = " ".join(f"{type(e).__name__}: {e}".split())[:160]
                rows.append({"launcher": name, "block": block, "ms": None, "error": why})
                print(f"{name:<20} {label:<10} error {why}")
                if cuda_error(e):
                    print("a CUDA error: the context is unusable, so the remaining variants were not tried")
                    break
                continue
            if base is None:
                base = (ms, probs)
            diff = float(np.abs(probs - base[1]).max() / base[1].max())
            rows.append({"launcher": name, "block": block, "ms": ms, "probs_vs_default": diff})
            print(f"{name:<20} {label:<10} {ms:>8.4f} {base[0] / ms:>10.2f} {diff:>17.1e}", flush=True)
    finally:
        for n, f in orig.items():
            setattr(kd, n, f)
    return rows


def _versions(text: str) -> list:
    """"1,2": rungs of the decoder's step, each a key of lab/decode.py's VERSIONS."""
    from lab.decode import VERSIONS
    known = sorted(VERSIONS["decode_qkv"])
    try:
        vs = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be rungs separated by commas (1,2), got {text!r}") from None
    if not vs or any(v not in known for v in vs):
        raise argparse.ArgumentTypeError(f"each rung must be one of {known}, got {text!r}")
    return vs


@contextlib.contextmanager
def _rung(v: int):
    """Inside: kernels/decode.py's launchers are rung v's (lab/decode.py VERSIONS); put back after."""
    from andrea_numba.kernels import decode as kd
    from lab.decode import VERSIONS
    orig = {name: getattr(kd, name) for name in VERSIONS}
    try:
        for name, rungs in VERSIONS.items():
            setattr(kd, name, rungs[v])
        yield
    finally:
        for name, f in orig.items():
            setattr(kd, name, f)


def time_versions(m, model, versions, runs: int, tokens: int, seed: int):
    """The table of --versions (module docstring): rows {"version", "step_ms", "tokens_s"} of medians,
    each with its [min, max]; and whether every rung drew the same tokens."""
    from andrea_numba.graphs import StepGraph
    from andrea_numba.sample import generate
    from lab.decode import decoder_class
    s, times, drawn = model.stream, {v: ([], []) for v in versions}, {}
    for _ in range(runs):
        for v in versions:
            with _rung(v):
                dec = decoder_class(v)(m, model.params, stream=s, capture=StepGraph)
                t0 = max(0, min(128, dec.T - 22))
                times[v][0].append(step_ms(dec, t0, min(20, dec.T - t0 - 2)))
                drawn.setdefault(v, generate(model, Ids(), [0], tokens, seed, 1.0, 40, decoder=dec))  # (warm)
                s.synchronize()
                start = time.perf_counter()
                assert generate(model, Ids(), [0], tokens, seed, 1.0, 40, decoder=dec) == drawn[v]
                times[v][1].append(time.perf_counter() - start)
    rows = []
    print(f"\nthe step's rungs (lab/decode.py), {runs} rounds: median [min-max]\n"
          f"{'rung':<6} {'step ms (GPU)':>24} {f'{tokens} tokens s':>26}")
    for v in versions:
        st, tk = times[v]
        rows.append({"version": v, "step_ms": float(np.median(st)), "step_ms_range": [min(st), max(st)],
                     "tokens_s": float(np.median(tk)), "tokens_s_range": [min(tk), max(tk)]})
        print(f"{v:<6} {np.median(st):>8.4f} [{min(st):.4f}-{max(st):.4f}] {np.median(tk):>10.4f} [{min(tk):.4f}-{max(tk):.4f}]")
    same = all(d == drawn[versions[0]] for d in drawn.values())
    print(f"same tokens on every rung: {'yes' if same else 'NO'}")
    return rows, same


def explain_difference(model, dec, prompt, ref, got, seed: int, top_k: int = 40) -> str:
    """Why the decoder drew another token than the whole forward at the first token i where they
    part: both paths' probabilities at that position after the whole forward's tokens before it, the
    largest difference between them (relative to the largest probability), and the gap between the
    token's uniform number u and the nearest boundary of the whole forward's cumulative distribution,
    beside the two distributions' largest difference. A gap below that difference means the paths
    drew apart on a difference of rounding; a gap above it, on a difference in what they compute."""
    i = next(j for j, (a, b) in enumerate(zip(got, ref)) if a != b)
    ids = list(prompt) + list(ref[:i])
    u = float(np.random.default_rng(seed).random(i + 1)[i])
    buf = np.zeros((1, model.T), np.int32)
    buf[0, :len(ids)] = ids
    model.forward(buf, buf)
    p_w = np.array(model.probs_row(len(ids) - 1), np.float64)
    dec.reset()
    dec.feed(ids)
    p_d = np.array(dec.probs_row(), np.float64)
    cdf_w, cdf_d = draw_cdf(p_w, 1.0, top_k), draw_cdf(p_d, 1.0, top_k)     # the draw's, at temperature 1
    gap = float(np.abs(cdf_w - u).min())
    rel = float(np.abs(p_d - p_w).max() / p_w.max())
    return (f"token {i}: the probabilities differ by at most {rel:.1e} of the largest; u = {u:.6f} falls "
            f"{gap:.1e} from a boundary of the whole forward's distribution, which the decoder's moves by up "
            f"to {float(np.abs(cdf_d - cdf_w).max()):.1e}")


def main(argv=None) -> int:
    ap = cli.Parser(prog="python lab/bench/decode_speed.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=cli.config, default="12M", help="a config size or file (default 12M)")
    ap.add_argument("--tokens", type=cli.positive_int, default=256, help="tokens drawn a run (default 256)")
    ap.add_argument("--runs", type=cli.positive_int, default=5, help="timed runs a path (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=cli.file_to_write(".json"), help="also write the rows to this file")
    ap.add_argument("--no-blocks", action="store_true", help="skip the decoder's block variants")
    ap.add_argument("--only-blocks", action="store_true", help="only the decoder's block variants")
    ap.add_argument("--versions", type=_versions, help="only the step's rungs, e.g. 1,2 (lab/decode.py)")
    ap.add_argument("--kernels", action="store_true", help="only the step's time kernel by kernel")
    ap.add_argument("--once", action="store_true",
                    help="with --kernels: one step launched for a profiler, nothing timed")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="of the paths' products (default fp32; bf16: the table of paths only)")
    args = ap.parse_args(argv)
    if args.once and not args.kernels:
        cli.fail("--once goes with --kernels (one step launched kernel by kernel for a profiler)")
    if args.precision != "fp32" and (args.versions or args.kernels or args.only_blocks or not args.no_blocks):
        cli.fail(f"--precision {args.precision}: the table of paths only, with --no-blocks (the rungs, the kernels "
                 "and the blocks are timed at fp32: the bf16 decoder runs the same kernels)")
    if SIMULATOR or not cuda.is_available():
        cli.fail("lab/bench/decode_speed.py needs a CUDA GPU (the simulator would take hours, and has no CUDA graphs)")

    from andrea_numba.decode import Decoder
    from andrea_numba.gpu_model import GPUModel
    from andrea_numba.graphs import StepGraph
    from andrea_numba.layout import init_params
    from andrea_numba.recipes import recipe_for
    from andrea_numba.sample import generate

    cfg = load_config(args.size)
    m = cfg.model
    if args.tokens + 1 > m.context_length:
        cli.fail(f"--tokens {args.tokens}: at most {m.context_length - 1} (the context length less the prompt), "
                 f"so that every token is drawn on the decoder")
    params = init_params(m, 0)
    params += np.random.default_rng(1).standard_normal(params.size).astype(np.float32) * 0.02
    model = GPUModel(m, 1, m.context_length, training=False,
                     recipe="fp32" if args.precision == "fp32" else recipe_for(args.precision))
    model.params.copy_to_device(params, stream=model.stream)
    s = model.stream
    if args.kernels:
        print(f"{cfg.name} on {device_name()}", file=sys.stderr)
        if 4 in (args.versions or []):
            cli.fail("--kernels --versions: every rung but 4 (rung 4 is one launch: --versions 4 times it whole)")
        out = []
        for v in args.versions or [1]:
            with _rung(v):
                print(f"\nrung {v} (lab/decode.py)", file=sys.stderr)
                if args.once:
                    profile_one_step(m, model.params, s)
                    continue
                rows, nothing_us, whole = time_kernels(m, model.params, s)
            out.append({"version": v, "kernels": rows, "empty_kernel_us": nothing_us, "step_ms": whole})
        if args.json and not args.once:
            Path(args.json).write_text(json.dumps({"device": device_name(), "size": args.size, "rungs": out,
                                                   "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
        return 0
    if args.versions:
        print(f"{cfg.name} on {device_name()}", file=sys.stderr)
        rows, same = time_versions(m, model, args.versions, args.runs, args.tokens, args.seed)
        if args.json:
            Path(args.json).write_text(json.dumps({"device": device_name(), "size": args.size, "versions": rows,
                                                   "same_tokens": same, "date": time.strftime("%Y-%m-%d")},
                                                  indent=1) + "\n")
        return 0 if same else 1
    if args.only_blocks:
        print(f"{cfg.name} on {device_name()}", file=sys.stderr)
        rows = time_blocks(m, model.params, s)
        if args.json:
            Path(args.json).write_text(json.dumps({"device": device_name(), "size": args.size, "blocks": rows,
                                                   "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
        return 0
    buf = cuda.pinned_array((1, m.context_length), np.int32)
    buf[:] = 0                                                # (pinned memory comes uninitialised)

    tokens = model.buf["tokens"]

    def forward_work(stream):
        with model.launching_on(stream):
            model.forward(tokens, tokens)
    model.forward(buf, buf)                                   # compiles the forward before its capture
    whole_graph = StepGraph(s, forward_work)

    def replay_forward(b):
        tokens.copy_to_device(b, stream=s)
        whole_graph.launch()

    eager_dec = Decoder(m, model.params, stream=s, precision=args.precision)
    graph_dec = Decoder(m, model.params, stream=s, capture=StepGraph, precision=args.precision,
                        log=lambda line: print(line, file=sys.stderr))
    prompt = [int(params.size % m.vocab_size)]                # any one token
    paths = {
        "whole forward, eager": dict(buf=buf),
        "whole forward, graph": dict(buf=buf, forward=replay_forward),
        "decoder, eager": dict(decoder=eager_dec),
        "decoder, graph": dict(decoder=graph_dec),
    }
    rows, drawn = [], {}
    print(f"{cfg.name} on {device_name()}, recipe {model.recipe.name}: {args.tokens} tokens after a one-token "
          f"prompt, median of {args.runs} runs", file=sys.stderr)
    for name, kw in paths.items():
        drawn[name] = generate(model, Ids(), prompt, args.tokens, args.seed, 1.0, 40, **kw)     # warm-up
        times = []
        for _ in range(args.runs):
            s.synchronize()
            t0 = time.perf_counter()
            out = generate(model, Ids(), prompt, args.tokens, args.seed, 1.0, 40, **kw)
            times.append(time.perf_counter() - t0)
            assert out == drawn[name], f"{name}: another run drew other tokens"
        med = float(np.median(times))
        rows.append({"path": name, "seconds": med, "ms_per_token": 1e3 * med / args.tokens,
                     "min_s": min(times), "max_s": max(times)})
    base = rows[0]["seconds"]
    print(f"\n{'path':<22} {'median s':>9} {'ms/token':>9} {'x whole eager':>14}")
    for r in rows:
        print(f"{r['path']:<22} {r['seconds']:>9.4f} {r['ms_per_token']:>9.3f} {base / r['seconds']:>14.1f}")

    # the GPU's time of one decoder step near position 128, drawing: its graph replayed between CUDA events
    t = max(0, min(128, graph_dec.T - 22))
    reps = min(20, graph_dec.T - t - 2)                     # reps + 1 replays: the position stays below T
    one_step = step_ms(graph_dec, t, reps)
    print(f"\ndecoder step with its draw, GPU time (graph replay, CUDA events, t = {t} to {t + reps}): "
          f"{one_step:.4f} ms")

    same = all(d == drawn["whole forward, eager"] for d in drawn.values())
    print(f"same tokens on every path: {'yes' if same else 'NO'}")
    if not same:
        for name, d in drawn.items():
            first = next((i for i, (a, b) in enumerate(zip(d, drawn["whole forward, eager"])) if a != b), None)
            print(f"  {name}: first difference at token {first}")
        if drawn["decoder, eager"] != drawn["whole forward, eager"]:
            print("  " + explain_difference(model, eager_dec, prompt, drawn["whole forward, eager"],
                                            drawn["decoder, eager"], args.seed))
    dec_s = rows[-1]["seconds"] * 256 / args.tokens
    if args.size == "12M":
        print(f"target (12M): 256 tokens in at most {TARGET_S} s; the decoder's graph path: {dec_s:.4f} s "
              f"({'met' if dec_s <= TARGET_S else 'not met'})")
    block_rows = None if args.no_blocks else time_blocks(m, model.params, s)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": device_name(), "size": args.size, "precision": args.precision, "recipe": model.recipe.name,
            "tokens": args.tokens, "runs": args.runs, "rows": rows,
            "decoder_step_gpu_ms": one_step, "same_tokens": same, "blocks": block_rows,
            "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
