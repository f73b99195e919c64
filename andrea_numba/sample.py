"""Generate text from a run's checkpoint.

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
from .train import CHECKPOINT, TrainError, read_run_state, sample_from


def generate_cpu(params, m, tokenizer, prompt, n_tokens, seed, temperature=1.0, top_k=40) -> str:
    """The same sampling loop as train.generate, with the NumPy twin computing the logits."""
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
        cfg = config_from_dict(state["config"], origin=f"{run}/.state.json")
        m = cfg.model
        data_dir = Path(state.get("data", {}).get("dir") or run / "data")
        tokenizer = D.load_tokenizer(data_dir)
        step, params, *_ = load_checkpoint(run / CHECKPOINT, n_params(m))
        print(f"{cfg.name} at step {step} ({'NumPy twin on the CPU' if args.cpu else 'CUDA kernels'})",
              file=sys.stderr)
        if args.cpu:
            text = generate_cpu(params.astype(np.float32), m, tokenizer, args.prompt, args.tokens, args.seed,
                                args.temperature, args.top_k)
        else:
            from numba import cuda

            from .gpu_model import GPUModel
            from .kernels.common import SIMULATOR
            from .train import generate
            if not SIMULATOR and not cuda.is_available():
                raise TrainError("no CUDA GPU found: sample with --cpu (the NumPy twin)")
            model = GPUModel(m, 1, m.context_length, training=False)
            model.params.copy_to_device(params)
            text = generate(model, tokenizer, args.prompt, args.tokens, args.seed, args.temperature, args.top_k)
        print(args.prompt + text)
        return 0
    except (ConfigError, CheckpointError, D.DataError, TrainError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
