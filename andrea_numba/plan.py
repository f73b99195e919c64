"""The memory plan of a run, and whether it fits where it is to run.

    rows = memory_plan(cfg)          # [(kind, buffer, bytes)]: every device buffer of a run
    print(format_plan(rows))         # by kind, the total, the three largest
    check_device(cfg)                # PlanError (one line) when it does not fit the GPU's free
                                     # memory, or is far too big for the CUDA simulator

The trainer prints the plan, checks it before any data is prepared and then allocates exactly
these buffers, once: GPUModel's buffer_specs, the optimiser's vectors, what a step reads that
changes from step to step (its token batches, dropout's keys, AdamW's learning rate and bias
corrections) and, at fp32 and bf16, the sampler's KV-cache decoder (decode_specs: its cache [n_layer,
seq_len, d_model] twice and a few rows). The sampler's whole forward allocates nothing: it runs on
the training model's buffers.
"""
from __future__ import annotations

import math

from numba import cuda

from reference.dropout import SITES

from .config import Config, load_config
from .decode import PRECISIONS as DECODER_PRECISIONS, decode_specs
from .gpu_model import buffer_specs, products_scratch
from .kernels import optim
from .kernels.common import SIMULATOR
from .layout import n_params
from .recipes import recipe_for, unavailable

HYPER_WORDS = 2         # AdamW's [lr, bc1, bc2] as float32, in two uint64 words of the step's scalars


def step_scalar_words(cfg: Config) -> int:
    """uint64 words of a step's scalars on the device (train.Trainer.allocate): dropout's keys
    [n_microbatches, n_layer, 3], then AdamW's [lr, bc1, bc2] as float32 (HYPER_WORDS words)."""
    return cfg.train.n_microbatches * cfg.model.n_layer * SITES + HYPER_WORDS


class PlanError(RuntimeError):
    """A run that does not fit where it is to run; str(err) is one line: what and what to do."""


def memory_plan(cfg: Config, B: int | None = None) -> list[tuple[str, str, int]]:
    """(kind, buffer, bytes) of every device buffer a run allocates, at microbatch size B."""
    m, t = cfg.model, cfg.train
    B = B or t.batch_size
    P = n_params(m)
    recipe = recipe_for(t.precision, t.products)          # the run's recipe on this GPU
    rows = [(s.kind, s.name, s.nbytes) for s in buffer_specs(m, B, t.seq_len, **recipe.buffer_flags(m))]
    rows += [("optimizer", "adam_m", 4 * P), ("optimizer", "adam_v", 4 * P), ("optimizer", "decay_mask", P),
             ("optimizer", "norm_partial", 4 * optim.NORM_BLOCKS), ("optimizer", "stats", 8)]
    rows += [("step", "batches", 4 * t.n_microbatches * 2 * B * t.seq_len),      # int32 [n_micro, 2, B, T]
             ("step", "step_scalars", 8 * step_scalar_words(cfg))]
    # cuBLASLt's workspace, the operands' 16-bit copies (kernels/cublaslt.py: the library's, or matmul v13's)
    where = "library" if t.products == "cublas" else "scratch"
    rows += [(where, name, nbytes) for name, nbytes in products_scratch(recipe, B * t.seq_len, m.d_model, m.vocab_size, m.n_layer).items()]
    if recipe.precision in DECODER_PRECISIONS:      # the sampler's decoder (train.Trainer.allocate)
        rows += [(s.kind, "decoder." + s.name, s.nbytes) for s in decode_specs(m, t.seq_len)]
    return rows


def format_plan(rows) -> str:
    kinds = {}
    for kind, _, nbytes in rows:
        kinds[kind] = kinds.get(kind, 0) + nbytes
    biggest = sorted(rows, key=lambda r: -r[2])[:3]
    lines = ["memory plan (bytes on the GPU):"]
    lines += [f"  {kind:<12} {nbytes / 2**20:>10.1f} MiB" for kind, nbytes in kinds.items()]
    lines.append(f"  {'total':<12} {sum(kinds.values()) / 2**20:>10.1f} MiB")
    lines.append("  largest: " + ", ".join(f"{name} {nb / 2**20:.1f} MiB" for _, name, nb in biggest))
    return "\n".join(lines)


def check_fits(cfg: Config, free_bytes: int, margin: float = 0.95) -> int:
    """Refuse (PlanError) when the plan exceeds the free memory; returns the planned bytes."""
    need = sum(r[2] for r in memory_plan(cfg))
    if need <= margin * free_bytes:
        return need
    t = cfg.train
    fits = [b for b in range(t.batch_size - 1, 0, -1)
            if sum(r[2] for r in memory_plan(cfg, b)) <= margin * free_bytes]
    if fits:
        b = fits[0]
        n = t.n_microbatches * math.ceil(t.batch_size / b)
        hint = f"use --batch-size {b} --microbatches {n} (the same tokens per step in smaller microbatches)"
    else:
        hint = "even a microbatch of 1 sequence does not fit: use a smaller model or a larger GPU"
    raise PlanError(f"the run needs {need / 2**30:.2f} GiB on the GPU but only {free_bytes / 2**30:.2f} GiB "
                     f"are free: {hint}")


# The CUDA simulator runs every GPU thread as Python: an ANDREA-tiny step (64 tokens) takes about
# TINY_SIM_STEP_S seconds on one CPU core. A config whose step is more than SIM_MAX_WORK times that
# work is refused there, before any data is prepared: the 12M default would need months.
TINY_SIM_STEP_S = 10.0
SIM_MAX_WORK = 16


def step_work(cfg: Config) -> int:
    """A rough measure of one optimiser step's work: tokens per step x (parameters + the
    attention's n_layer x seq_len x d_model per token)."""
    m, t = cfg.model, cfg.train
    return t.batch_size * t.seq_len * t.n_microbatches * (n_params(m) + m.n_layer * t.seq_len * m.d_model)


def check_simulator_size(cfg: Config, resuming: bool = False) -> None:
    """PlanError (one line) when cfg is far too big for the CUDA simulator."""
    ratio = step_work(cfg) / step_work(load_config("tiny"))
    if ratio <= SIM_MAX_WORK:
        return
    hours = ratio * TINY_SIM_STEP_S * cfg.train.steps / 3600
    span = f"roughly {hours:,.0f} hours" if hours < 48 else f"roughly {hours / 24:,.0f} days" if hours < 24 * 365 \
        else "years"
    what = "resume this run on a machine with an NVIDIA GPU" if resuming else \
        "use --size tiny here, or train on a machine with an NVIDIA GPU"
    raise PlanError(f"{cfg.name} is too big for the CUDA simulator (NUMBA_ENABLE_CUDASIM=1): a step is about "
                     f"{ratio:,.0f} times the work of an ANDREA-tiny step, so {cfg.train.steps:,} steps would take "
                     f"{span}; {what}")


def check_device(cfg: Config, resuming: bool = False) -> None:
    """Before any data is prepared: the run must fit the GPU's free memory (or, in the simulator,
    be small enough to finish), and cuBLASLt (and its FP8 products) must be able to run where the
    config asks for them."""
    reason = unavailable(recipe_for(cfg.train.precision, cfg.train.products))
    if reason:
        raise PlanError(reason)
    if SIMULATOR:
        check_simulator_size(cfg, resuming)
    else:
        check_fits(cfg, cuda.current_context().get_memory_info()[0])
