"""Generate text from a run's checkpoint, and the sampling loop the trainer uses too.

    python -m andrea_numba.sample RUN_DIR --prompt "def main(" --tokens 200
    python -m andrea_numba.sample RUN_DIR --prompt "import " --cpu      # the NumPy twin, no GPU

On the GPU it runs the CUDA kernels (a forward-only GPUModel of batch 1); with --cpu it runs the
NumPy twin (reference.model_logits), so a laptop without a GPU can sample from a checkpoint
trained on one. Sampling: softmax(logits / temperature) over the top_k most likely tokens.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import reference as R

from . import data as D
from .checkpoint import CheckpointError, load_checkpoint
from .config import ConfigError, config_from_dict
from .layout import n_params
from .runlog import CHECKPOINT_FILE, STATE_FILE, RunDirError, data_dir_of, read_run_state


class SampleError(RuntimeError):
    """Sampling that cannot run here; str(err) is one line: what is wrong and what to do."""


def generate(model, tokenizer, prompt: str, n_tokens: int, seed: int, temperature=1.0, top_k=40,
             buf=None) -> str:
    """Autoregressive sampling with a forward-only GPUModel of batch 1: run the forward on the last
    context_length tokens, sample the next token from softmax(logits / temperature) restricted to
    the top_k most likely, repeat. buf: a [1, T] int32 host buffer for the tokens (the trainer
    passes pinned memory allocated at setup, so the copy to the device is asynchronous)."""
    T = model.T
    buf = np.zeros((1, T), np.int32) if buf is None else buf
    ids = list(tokenizer.encode(prompt)) or [0]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_tokens):
        ctx = ids[-T:]
        buf[0, :] = 0                # safe to refill: probs_row waited for the last copy out of buf
        buf[0, :len(ctx)] = ctx
        model.forward(buf, buf)
        p = model.probs_row(len(ctx) - 1).astype(np.float64)       # a host sync: the host draws the token
        nxt = sample_from(p, rng, temperature, top_k)
        ids.append(nxt)
        out.append(nxt)
    return tokenizer.decode(out)


def generate_cpu(params, m, tokenizer, prompt, n_tokens, seed, temperature=1.0, top_k=40) -> str:
    """The same sampling loop as generate, with the NumPy twin computing the logits."""
    ids = list(tokenizer.encode(prompt)) or [0]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_tokens):
        ctx = np.array([ids[-m.context_length:]])
        logits = R.model_logits(params, m, ctx)[0, -1].astype(np.float64)
        p = np.exp(logits - logits.max())
        nxt = sample_from(p / p.sum(), rng, temperature, top_k)
        ids.append(nxt)
        out.append(nxt)
    return tokenizer.decode(out)


def sample_from(p, rng, temperature=1.0, top_k=40) -> int:
    """Draw a token from probabilities p after temperature and top-k (deterministic given rng)."""
    logits = np.log(np.maximum(p, 1e-30)) / max(temperature, 1e-6)
    if top_k and top_k < len(p):
        kth = np.partition(logits, -top_k)[-top_k]
        logits = np.where(logits >= kth, logits, -np.inf)
    q = np.exp(logits - logits.max())
    q /= q.sum()
    return int(rng.choice(len(q), p=q))


def generate_gpu(params, m, tokenizer, prompt, n_tokens, seed, temperature=1.0, top_k=40) -> str:
    """generate on a forward-only GPUModel of batch 1 holding the given weights."""
    from numba import cuda

    from .gpu_model import GPUModel
    from .kernels.common import SIMULATOR
    if not SIMULATOR and not cuda.is_available():
        raise SampleError("no CUDA GPU found: sample with --cpu (the NumPy twin)")
    model = GPUModel(m, 1, m.context_length, training=False)
    model.params.copy_to_device(params, stream=model.stream)       # ordered before the first forward
    return generate(model, tokenizer, prompt, n_tokens, seed, temperature, top_k)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m andrea_numba.sample", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a run directory written by python -m andrea_numba.train")
    ap.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    ap.add_argument("--tokens", type=int, default=200, help="tokens to generate (default 200)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", action="store_true", help="run the NumPy twin instead of the CUDA kernels")
    args = ap.parse_args(argv)
    try:
        run = Path(args.run_dir)
        state = read_run_state(run)
        cfg = config_from_dict(state["config"], origin=str(run / STATE_FILE))
        m = cfg.model
        tokenizer = D.load_tokenizer(data_dir_of(run, state))
        step, params, *_ = load_checkpoint(run / CHECKPOINT_FILE, n_params(m))
        print(f"{cfg.name} at step {step} ({'NumPy twin on the CPU' if args.cpu else 'CUDA kernels'})",
              file=sys.stderr)
        gen = generate_cpu if args.cpu else generate_gpu
        text = gen(params, m, tokenizer, args.prompt, args.tokens, args.seed, args.temperature, args.top_k)
        print(args.prompt + text)
        return 0
    except (ConfigError, CheckpointError, D.DataError, RunDirError, SampleError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
