"""Generate text from a run's checkpoint, and the sampling loop the trainer uses too.

    python -m andrea_numba.sample RUN_DIR --prompt "def main(" --tokens 200
    python -m andrea_numba.sample RUN_DIR --prompt "import " --cpu      # the NumPy twin, no GPU
    python -m andrea_numba.sample RUN_DIR --best                        # the best validation loss's weights

On the GPU it runs the CUDA kernels (a forward-only GPUModel of batch 1); with --cpu it runs the
NumPy twin (reference.model_logits), so a laptop without a GPU can sample from a checkpoint
trained on one. Sampling: softmax(logits / temperature) over the top_k most likely tokens.

Both sample at fp32 and bf16 on a KV cache while the sequence fits the context: each drawn token is
one position, its k and v kept for the positions after it, instead of the whole forward of the
context again (the GPU's decoder: andrea_numba/decode.py; the twin's: reference/decode.py), its
products rounding as training's did at the run's precision. Past the context the window slides and
every position moves, and at fp16 and the FP8 scopes there is no decoder: there each token runs the
whole forward of the last context_length tokens.

The checkpoint (checkpoint.bin, or best.bin with --best) is checked against the sha256 that the
trainer recorded in .state.json; every argument and every file of the run is checked before the
first token, and a problem is one line on stderr with exit code 2.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

import reference as R
from reference.decode import KVCache, draw

from . import cli
from . import data as D
from .checkpoint import CheckpointError, load_checkpoint
from .config import ConfigError, config_from_dict
from .decode import PRECISIONS as DECODER_PRECISIONS, Decoder
from .gpu_model import GPUModel
from .graphs import GRAPHS, StepGraph
from .kernel_cache import KernelCache
from .kernels.common import SIMULATOR
from .layout import n_params
from .precompile import compile_ahead, default_workers, record_launches
from .recipes import recipe_for, unavailable
from .runlog import BEST_FILE, CHECKPOINT_FILE, DATA_DIR, STATE_FILE, RunDirError, read_run_state

MAX_TOKENS = 1_000_000          # --tokens: a limit against typos


class SampleError(RuntimeError):
    """Sampling that cannot run here; str(err) is one line: what is wrong and what to do."""


def generate(model, tokenizer, prompt: str, n_tokens: int, seed: int, temperature=1.0, top_k=40,
             buf=None, forward=None, decoder=None) -> str:
    """Autoregressive sampling with a forward-only GPUModel of batch 1: run the forward on the last
    model.T tokens (context_length here; the trainer's sampler, on its training model's buffers,
    sees seq_len), draw the next token from softmax(logits / temperature) restricted to the top_k
    most likely (reference.decode.draw, with the next of the uniform numbers the seed gives),
    repeat. buf: a [1, T] int32 host buffer for the tokens (the trainer passes pinned memory
    allocated at setup, so the copy to the device is asynchronous). forward(buf): runs the model's
    forward on buf (default model.forward(buf, buf); the trainer's replays a CUDA graph).
    decoder: a Decoder of window model.T on the model's weights (andrea_numba/decode.py): while the
    sequence fits the window, each token is one position on its KV cache instead of the whole
    forward, and is drawn there, on the GPU, from the same probabilities to fp32 rounding (so the
    same tokens) with the same uniform numbers; past it, the whole forward of the last model.T
    tokens, as without it."""
    T = model.T
    buf = np.zeros((1, T), np.int32) if buf is None else buf
    forward = forward or (lambda b: model.forward(b, b))
    ids = list(tokenizer.encode(prompt)) or [0]
    uniforms = np.random.default_rng(seed).random(n_tokens)   # u_i draws the i-th token (the draws of rng.choice)
    out = []
    if decoder is not None and len(ids) <= T:
        assert decoder.T == T, f"the decoder's window {decoder.T} is not the model's {T}"
        out = decoder.sample(ids, uniforms[:T + 1 - len(ids)], temperature, top_k)   # one host sync
        ids += out
    for u in uniforms[len(out):]:
        ctx = ids[-T:]
        buf[0, :] = 0                # safe to refill: probs_row waited for the last copy out of buf
        buf[0, :len(ctx)] = ctx
        forward(buf)
        p = model.probs_row(len(ctx) - 1)          # a host sync: the host draws the token
        nxt = draw(p, u, temperature, top_k)
        ids.append(nxt)
        out.append(nxt)
    return tokenizer.decode(out)


def generate_cpu(params, m, tokenizer, prompt, n_tokens, seed, temperature=1.0, top_k=40, precision="fp32",
                 products="numba") -> str:
    """The same sampling loop as generate, with the NumPy twin computing the logits (its products
    at the run's precision). At fp32 and bf16 while the sequence fits the context, one position a
    token on a KV cache (reference/decode.py, its products at the run's precision); past the context
    (the window slides, and every position moves) and at other precisions, the whole forward of the
    last context_length tokens each time."""
    ids = list(tokenizer.encode(prompt)) or [0]
    uniforms = np.random.default_rng(seed).random(n_tokens)
    out = []
    cache = KVCache(params, m, precision) if precision in DECODER_PRECISIONS else None
    fed = 0                                  # tokens of ids the cache has read
    for u in uniforms:
        if cache is not None and len(ids) <= m.context_length:
            for token in ids[fed:]:
                logits = cache.step(token)
            fed = len(ids)
            logits = logits.astype(np.float64)
        else:
            ctx = np.array([ids[-m.context_length:]])
            logits = R.model_logits(params, m, ctx, precision)[0, -1].astype(np.float64)
        p = np.exp(logits - logits.max())
        nxt = draw(p / p.sum(), u, temperature, top_k)
        ids.append(nxt)
        out.append(nxt)
    return tokenizer.decode(out)


def _require_gpu() -> None:
    from numba import cuda

    if not SIMULATOR and not cuda.is_available():
        raise SampleError("no CUDA GPU found: sample with --cpu (the NumPy twin)")


def generate_gpu(params, m, tokenizer, prompt, n_tokens, seed, temperature=1.0, top_k=40, precision="fp32",
                 products="numba") -> str:
    """generate on a forward-only GPUModel of batch 1 holding the given weights, with the run's
    recipe (recipes.recipe_for its precision and products, on this GPU: as the trainer's own samples).
    At fp32 and bf16, one position a token on a KV cache (andrea_numba/decode.py, at the recipe's
    precision, its step replayed as a CUDA graph where there are graphs) while the sequence fits the
    context, as generate_cpu's twin does."""
    _require_gpu()
    model = GPUModel(m, 1, m.context_length, training=False, recipe=recipe_for(precision, products))
    model.params.copy_to_device(params, stream=model.stream)       # ordered before the first forward
    decoder = None
    if model.precision in DECODER_PRECISIONS:
        decoder = Decoder(m, model.params, m.context_length, stream=model.stream,
                          capture=StepGraph if GRAPHS else None, precision=model.precision)
    compile_sampler(model, decoder)
    return generate(model, tokenizer, prompt, n_tokens, seed, temperature, top_k, decoder=decoder)


def compile_sampler(model, decoder=None, log=None):
    """Before the first token, as the trainer before its first step: the kernels of the whole forward
    and of the decoder's step, recorded without running (precompile.record_launches), loaded from the
    kernel cache where an earlier run compiled them (kernel_cache.py) and the rest compiled on worker
    processes (precompile.compile_ahead). Nothing here can fail the sampling: a kernel left out is
    compiled at its first launch. In the simulator nothing is compiled."""
    if SIMULATOR:
        return None
    buf = np.zeros((1, model.T), np.int32)
    work = [lambda: model.forward(buf, buf)] + ([lambda: decoder.work(decoder.stream)] if decoder else [])
    try:
        launches = record_launches(*work)
        model.stream.synchronize()               # the recorded forward copied its token ids in
    except Exception:                          # compiled at their first launches instead
        return None
    return compile_ahead(launches, default_workers(), log=log,
                         cache=KernelCache.open(log=lambda line: print(line, file=sys.stderr)))


def _data_dir(run: Path, state: dict) -> Path:
    """runlog.data_dir_of, after checking the record's shape (a hand-edited state may hold anything)."""
    record = state.get("data")
    if record is not None and not isinstance(record, dict):
        raise RunDirError(f"{run / STATE_FILE}: 'data' must be an object: restore the file or start a new run")
    where = (record or {}).get("dir") or DATA_DIR
    if not isinstance(where, str):
        raise RunDirError(f"{run / STATE_FILE}: 'data.dir' must be a path: restore the file or start a new run")
    return run / where


def _tokenizer(data_dir: Path, vocab_size: int):
    """The run's tokenizer, whose ids must fit the model's vocabulary."""
    try:
        tokenizer = D.load_tokenizer(data_dir)
    except D.DataError:
        raise
    except Exception as e:                       # a damaged tokenizer.json: the library's own error
        raise SampleError(f"cannot read the tokenizer in {data_dir} ({cli.one_line(e)}): "
                          f"prepare the data again") from None
    if tokenizer.vocab_size > vocab_size:
        raise SampleError(f"the tokenizer in {data_dir} has {tokenizer.vocab_size:,} tokens but the model "
                          f"{vocab_size:,}: the data directory belongs to another run")
    return tokenizer


def _checkpoint(run: Path, state: dict, best: bool):
    """(path, accepted sha256s, what to call it) of the checkpoint to sample from."""
    if not best:
        path = run / CHECKPOINT_FILE
        if not path.is_file():
            raise SampleError(f"{run} has no {CHECKPOINT_FILE} yet: wait for the first checkpoint "
                              f"(every train.checkpoint_interval steps, and at the end of the run)")
        shas = [state.get(k) for k in ("checkpoint_sha256", "previous_checkpoint_sha256")]
        return path, [h for h in shas if isinstance(h, str) and h], "latest checkpoint"
    path, record = run / BEST_FILE, state.get("best")
    if record is None or not path.is_file():
        raise SampleError(f"{run} has no {BEST_FILE} yet: the trainer writes it at the first validation "
                          f"loss (every train.eval_interval steps); sample the latest checkpoint without --best")
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        raise RunDirError(f"{run / STATE_FILE}: 'best' has no sha256 of {BEST_FILE}, so it cannot be checked: "
                          f"sample the latest checkpoint without --best")
    val = record.get("val_loss")
    val = f", val loss {val:.4f}" if isinstance(val, (int, float)) and math.isfinite(val) else ""
    return path, [record["sha256"]], f"best checkpoint{val}"


def _encode(tokenizer, prompt: str, vocab_size: int) -> list[int]:
    try:
        ids = list(tokenizer.encode(prompt))
    except Exception as e:
        raise SampleError(f"the run's {tokenizer.name} tokenizer cannot encode the prompt "
                          f"({cli.one_line(e)}): use other text") from None
    if any(not 0 <= int(i) < vocab_size for i in ids):
        raise SampleError(f"the prompt encodes to token ids beyond the model's vocabulary ({vocab_size:,}): "
                          f"the data directory belongs to another run")
    return ids


@cli.exits_on(ConfigError, CheckpointError, D.DataError, RunDirError, SampleError, OSError)
def main(argv=None) -> int:
    ap = cli.Parser(prog="python -m andrea_numba.sample", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=cli.existing_dir, help="a run directory written by python -m andrea_numba.train")
    ap.add_argument("--prompt", type=cli.text, default="\n", help="text to continue (default: a newline)")
    ap.add_argument("--tokens", type=cli.int_range(1, MAX_TOKENS), default=200,
                    help="tokens to generate (default 200)")
    ap.add_argument("--temperature", type=cli.positive_float, default=1.0,
                    help="divides the logits: below 1 sharper, above 1 flatter (default 1)")
    ap.add_argument("--top-k", type=cli.int_range(0, 65536), default=40,
                    help="sample among the k most likely tokens, 0 for all (default 40)")
    ap.add_argument("--seed", type=cli.seed, default=0, help="seed of the draws (default 0)")
    ap.add_argument("--best", action="store_true",
                    help=f"sample from {BEST_FILE}, the weights of the best validation loss so far")
    ap.add_argument("--cpu", action="store_true", help="run the NumPy twin instead of the CUDA kernels")
    args = ap.parse_args(argv)
    run = args.run_dir
    state = read_run_state(run)
    cfg = config_from_dict(state["config"], origin=str(run / STATE_FILE))
    m = cfg.model
    if args.top_k > m.vocab_size:
        cli.fail(f"argument --top-k: {args.top_k} exceeds the model's vocabulary ({m.vocab_size:,} tokens): "
                 f"use at most {m.vocab_size}, or 0 for all")
    tokenizer = _tokenizer(_data_dir(run, state), m.vocab_size)
    _encode(tokenizer, args.prompt, m.vocab_size)
    path, shas, what = _checkpoint(run, state, args.best)
    step, params, *_ = load_checkpoint(path, n_params(m), shas)
    precision, products = cfg.train.precision, cfg.train.products
    if not args.cpu:
        _require_gpu()
        reason = unavailable(recipe_for(precision, products))
        if reason:
            raise SampleError(f"{reason}; or sample on the CPU with --cpu (the NumPy twin at {precision})")
    print(f"{cfg.name}, {what} at step {step} ({'NumPy twin on the CPU' if args.cpu else 'CUDA kernels'}"
          f"{'' if precision == 'fp32' else f', {precision} products'})", file=sys.stderr)
    gen = generate_cpu if args.cpu else generate_gpu
    text = gen(params, m, tokenizer, args.prompt, args.tokens, args.seed, args.temperature, args.top_k, precision,
               products)
    out = args.prompt + text
    try:
        print(out)
    except UnicodeEncodeError:                   # a terminal that cannot show every character
        enc = sys.stdout.encoding or "ascii"
        print(out.encode(enc, errors="replace").decode(enc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
