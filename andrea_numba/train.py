"""Train a model end to end on the GPU with the CUDA kernels.

    python -m andrea_numba.train --size 12M                  # default corpus, runs/ANDREA-12M-TRAIN
    python -m andrea_numba.train --size tiny --steps 20 --out runs/tiny
    python -m andrea_numba.train --config my.json --data book.txt
    python -m andrea_numba.train --resume runs/tiny          # continue bit-exactly

One optimiser step:

    for microbatch in range(n_microbatches):
        forward(microbatch); backward()          # gradients add up (+=)
    grads *= 1 / n_microbatches                  # k_grad_scale
    norm = |grads|; clip to clip_norm            # k_grad_norm_partial, k_grad_norm_final, k_grad_scale
    AdamW step with the scheduled lr             # k_adamw
    grads = 0                                    # k_zero

Before the first step the trainer prints the memory plan (every buffer, by kind), checks it
against the GPU's free memory and allocates everything once, device buffers and the pinned host
buffers the token batches and the step's statistics travel through. Every launch and copy goes to
one stream of the run's own; a step waits for the GPU once, to read 8 bytes (the loss and the
gradient norm). docs/host-syncs.md lists every wait. The data order is a pure function of (seed,
step), so a checkpoint (step, weights, Adam m and v) is all a run needs to resume bit-exactly.

Run directory (andrea_numba.runlog names its files): checkpoint.bin, .loss.json (one JSON line per
step, appended), .samples.json (text sampled during training), .state.json (config, step, tokens
seen, timings, the sha256 of the checkpoint, of the corpus and of the token files), data/ (the
prepared token files; a resumed run trains on these, checked against their recorded sha256).
SIGTERM (or Ctrl-C) writes a checkpoint at the next step boundary and exits 0; SIGUSR1 writes one
and keeps training.
"""
from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda

import reference as R

from . import data as D
from .atomic import atomic_write_json
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .config import Config, ConfigError, config_from_dict, load_config, validate
from .gpu_model import GPUModel, buffer_specs
from .kernels import optim, residual
from .kernels.common import SIMULATOR, device_name
from .layout import decay_mask, init_params, n_params
from .runlog import (CHECKPOINT_FILE, DATA_DIR, LOSS_FILE, SAMPLES_FILE, STATE_FILE, RunDirError,
                     data_dir_of, data_dir_record, read_run_state)
from .sample import generate as generate_text


class TrainError(RuntimeError):
    """A run that cannot start or continue; str(err) is one line: what is wrong and what to do."""


# ----------------------------------------------------------------------------------------------
# the memory plan

def memory_plan(cfg: Config, B: int | None = None) -> list[tuple[str, str, int]]:
    """(kind, buffer, bytes) of every device buffer a run allocates, at microbatch size B."""
    m, t = cfg.model, cfg.train
    B = B or t.batch_size
    P = n_params(m)
    rows = [(s.kind, s.name, s.nbytes) for s in buffer_specs(m, B, t.seq_len)]
    rows += [("optimizer", "adam_m", 4 * P), ("optimizer", "adam_v", 4 * P), ("optimizer", "decay_mask", P),
             ("optimizer", "norm_partial", 4 * optim.NORM_BLOCKS), ("optimizer", "stats", 8)]
    rows += [("sampler", s.name, s.nbytes) for s in buffer_specs(m, 1, m.context_length, training=False,
                                                                 own_params=False)]
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
    """Refuse (TrainError) when the plan exceeds the free memory; returns the planned bytes."""
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
    raise TrainError(f"the run needs {need / 2**30:.2f} GiB on the GPU but only {free_bytes / 2**30:.2f} GiB "
                     f"are free: {hint}")


# ----------------------------------------------------------------------------------------------
# the trainer

class Trainer:
    def __init__(self, cfg: Config, run_dir, data_dir=None, log=print, log_every=10):
        self.cfg, self.run_dir, self.log, self.log_every = cfg, Path(run_dir), log, log_every
        self.data_dir = Path(data_dir) if data_dir else self.run_dir / DATA_DIR
        self.stop_requested = self.save_requested = False

    # -- setup: everything that allocates happens here, before the first step --
    def setup(self, resume: bool = False):
        cfg, m, t = self.cfg, self.cfg.model, self.cfg.train
        t_setup = time.time()
        state = read_run_state(self.run_dir) if resume else None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.meta = self.prepare_data(state)
        self.train_tokens, self.val_tokens, _ = D.load(self.data_dir)
        for name, toks in (("training", self.train_tokens), ("validation", self.val_tokens)):
            if len(toks) < t.seq_len + 2:
                raise TrainError(f"the {name} split has {len(toks)} tokens, fewer than seq_len + 2 = "
                                 f"{t.seq_len + 2}: use more text or a smaller seq_len")
        self.tokenizer = D.load_tokenizer(self.data_dir)
        self.n = n_params(m)
        plan = memory_plan(cfg)
        self.log(format_plan(plan))
        self.planned_bytes = sum(r[2] for r in plan)
        if not SIMULATOR:
            free, total = cuda.current_context().get_memory_info()
            check_fits(cfg, free)
            self.free_before = free
        self.device = device_name()
        self.allocate()
        self.timings = {"setup_s": 0.0, "train_s": 0.0}
        if state is not None:
            shas = [h for h in (state.get("checkpoint_sha256"), state.get("previous_checkpoint_sha256")) if h]
            step, params, mm, vv, sha = load_checkpoint(self.run_dir / CHECKPOINT_FILE, self.n, shas)
            tokens_per_step = t.batch_size * t.seq_len * t.n_microbatches
            self.step, self.tokens_seen = step, step * tokens_per_step
            self.checkpoint_sha256 = sha
            self.timings.update(state.get("timings", {}))
            self.log(f"resumed from {self.run_dir / CHECKPOINT_FILE} at step {step}")
        else:
            params, mm, vv = init_params(m, t.seed), np.zeros(self.n, np.float32), np.zeros(self.n, np.float32)
            self.step, self.tokens_seen = 0, 0
        s = self.stream
        self.model.params.copy_to_device(params, stream=s)
        self.adam_m.copy_to_device(mm, stream=s)
        self.adam_v.copy_to_device(vv, stream=s)
        s.synchronize()                        # setup's sync: the run starts with its state on the GPU
        self.memory = {"planned_bytes": self.planned_bytes}
        if not SIMULATOR:
            self.memory["allocated_by_setup_bytes"] = self.free_before - cuda.current_context().get_memory_info()[0]
        self.timings["setup_s"] += time.time() - t_setup

    def prepare_data(self, state: dict | None) -> dict:
        """The run's token files and their meta. A new run prepares them from the config's corpus
        (reusing a data directory that already holds them). A resumed run trains on the files it
        started with, checked against the record in .state.json; only when they are gone are they
        prepared again, and only from a corpus with the recorded sha256."""
        d, m = self.cfg.data, self.cfg.model

        def prepare(expect_sha256=None):
            return D.prepare(d.source, d.tokenizer, m.vocab_size, d.val_fraction, self.data_dir,
                             progress=self.log, expect_sha256=expect_sha256)
        if state is None:
            return prepare()
        record = state.get("data") or {}
        if not (self.data_dir / D.META).exists():
            prepare(record.get("source_sha256"))
        return D.check_prepared(self.data_dir, record)

    def allocate(self):
        """Every buffer of the run: the models' device buffers, the optimiser's, and pinned host
        memory for what travels between host and GPU during training."""
        m, t = self.cfg.model, self.cfg.train
        B, T = t.batch_size, t.seq_len
        # one stream for the whole run: every launch and copy is ordered on it, none goes to the
        # legacy default stream (which would wait for, and hold up, all other work on the GPU)
        s = self.stream = cuda.stream()
        self.model = GPUModel(m, B, T, stream=s, dropout=t.dropout)
        self.sampler = GPUModel(m, 1, m.context_length, stream=s, training=False, params=self.model.params)
        self.adam_m = cuda.device_array(self.n, np.float32, stream=s)
        self.adam_v = cuda.device_array(self.n, np.float32, stream=s)
        self.decay = cuda.to_device(decay_mask(m, np.uint8), stream=s)
        self.partial = cuda.device_array(optim.NORM_BLOCKS, np.float32, stream=s)
        self.stats = cuda.device_array(2, np.float32, stream=s)    # [loss summed over microbatches, grad norm]
        # pinned (page-locked) host memory: copies from and to it run asynchronously on the stream.
        # Each microbatch of a step has its own slot, so no slot is refilled while its copy may be
        # pending; the evaluation batches are the same every time, filled once here.
        self.batch_x = cuda.pinned_array((t.n_microbatches, B, T), np.int32)
        self.batch_y = cuda.pinned_array((t.n_microbatches, B, T), np.int32)
        self.eval_x = cuda.pinned_array((t.eval_batches, B, T), np.int32)
        self.eval_y = cuda.pinned_array((t.eval_batches, B, T), np.int32)
        for i in range(t.eval_batches):
            self.eval_x[i], self.eval_y[i] = D.get_batch(self.val_tokens, B, T, t.seed, 0, i, split="val")
        self.stats_host = cuda.pinned_array(2, np.float32)
        self.sample_buf = cuda.pinned_array((1, m.context_length), np.int32)

    # -- one optimiser step --
    def lr(self, step):
        t = self.cfg.train
        return R.lr_at(step, t.lr, t.min_lr, t.warmup_steps, t.steps, t.lr_decay)

    def train_step(self, step):
        t, model, s = self.cfg.train, self.model, self.stream
        loss_sum, norm = self.stats[0:1], self.stats[1:2]
        optim.zero(self.stats, stream=s)
        for micro in range(t.n_microbatches):
            x, y = self.batch_x[micro], self.batch_y[micro]
            x[:], y[:] = D.get_batch(self.train_tokens, t.batch_size, t.seq_len, t.seed, step, micro)
            model.forward(x, y, dropout_key=R.dropout_key(t.seed, step, micro))   # while the GPU works,
                                                 # the host fills the next slot
            model.backward()
            residual.residual_add(loss_sum, loss_sum, model.buf["loss"], stream=s)
        optim.grad_scale(model.grads, norm, 0.0, 1.0 / t.n_microbatches, stream=s)   # mean over microbatches
        optim.grad_norm(norm, self.partial, model.grads, stream=s)
        optim.grad_scale(model.grads, norm, t.clip_norm, 1.0, stream=s)             # clip by global norm
        lr = self.lr(step)
        optim.adamw(model.params, model.grads, self.adam_m, self.adam_v, self.decay, step + 1, lr,
                    t.beta1, t.beta2, t.eps, t.weight_decay, stream=s)
        model.zero_grads()
        self.stats.copy_to_host(self.stats_host, stream=s)
        s.synchronize()                          # the step's only sync
        loss, grad_norm = self.stats_host
        return float(loss) / t.n_microbatches, float(grad_norm), lr

    def evaluate(self):
        """Mean validation loss over eval_batches fixed microbatches (the same ones every time)."""
        t, s = self.cfg.train, self.stream
        loss_sum = self.stats[0:1]
        optim.zero(self.stats, stream=s)
        for i in range(t.eval_batches):
            self.model.forward(self.eval_x[i], self.eval_y[i])
            residual.residual_add(loss_sum, loss_sum, self.model.buf["loss"], stream=s)
        self.stats.copy_to_host(self.stats_host, stream=s)
        s.synchronize()                          # the evaluation's one sync
        return float(self.stats_host[0]) / t.eval_batches

    def generate(self, prompt: str, n_tokens: int, seed: int, temperature=1.0, top_k=40) -> str:
        """Sample n_tokens after prompt with the forward-only model (B=1, full context)."""
        return generate_text(self.sampler, self.tokenizer, prompt, n_tokens, seed, temperature, top_k,
                             self.sample_buf)

    # -- run files --
    def checkpoint(self):
        t0 = time.time()
        params, mm, vv = [a.copy_to_host(stream=self.stream) for a in (self.model.params, self.adam_m, self.adam_v)]
        self.stream.synchronize()                # the file is written from these host copies

        def record(sha):                   # on disk, not yet in place: put both checksums on record
            self.previous_checkpoint_sha256 = getattr(self, "checkpoint_sha256", None)
            self.checkpoint_sha256 = sha
            self.write_state()

        save_checkpoint(self.run_dir / CHECKPOINT_FILE, self.step, params, mm, vv, before_replace=record)
        self.log(f"checkpoint: step {self.step} -> {self.run_dir / CHECKPOINT_FILE} ({time.time() - t0:.1f} s)")

    def write_state(self):
        state = {"step": self.step, "config": self.cfg.to_dict(), "tokenizer": self.meta.get("tokenizer"),
                 "data": {**self.meta, "dir": data_dir_record(self.run_dir, self.data_dir)},
                 "tokens_seen": self.tokens_seen, "n_params": self.n, "timings": self.timings,
                 "checkpoint": CHECKPOINT_FILE, "checkpoint_sha256": getattr(self, "checkpoint_sha256", None),
                 "previous_checkpoint_sha256": getattr(self, "previous_checkpoint_sha256", None),
                 "memory": self.memory, "device": self.device, "time": time.time()}
        atomic_write_json(self.run_dir / STATE_FILE, state)

    def append(self, name, record):
        with open(self.run_dir / name, "a") as f:
            f.write(json.dumps(record) + "\n")

    # -- the loop --
    def run(self, steps=None):
        t = self.cfg.train
        last = t.steps if steps is None else steps
        tokens_per_step = t.batch_size * t.seq_len * t.n_microbatches
        handlers = self.install_signal_handlers()
        t_start, done_here = time.time(), 0
        try:
            while self.step < last:
                t0 = time.time()
                loss, norm, lr = self.train_step(self.step)
                dt = time.time() - t0
                self.step += 1
                done_here += 1
                self.tokens_seen += tokens_per_step
                self.timings["train_s"] += dt
                rec = {"step": self.step, "train_loss": loss, "lr": lr, "grad_norm": norm,
                       "tokens_per_s": tokens_per_step / dt, "time": time.time()}
                if not math.isfinite(loss):
                    raise TrainError(f"the loss became {loss} at step {self.step}: lower the learning rate "
                                     f"(train.lr) or the clip norm; the last checkpoint is intact")
                if self.step % t.eval_interval == 0 or self.step == last:
                    rec["val_loss"] = self.evaluate()
                self.append(LOSS_FILE, rec)
                if self.step % self.log_every == 0 or "val_loss" in rec or self.step == last:
                    eta = (time.time() - t_start) / done_here * (last - self.step)
                    val = f" | val {rec['val_loss']:.4f}" if "val_loss" in rec else ""
                    self.log(f"step {self.step:>6}/{last} | loss {loss:.4f}{val} | lr {lr:.2e} | norm {norm:.3f} | "
                             f"{rec['tokens_per_s']:,.0f} tok/s | ETA {format_eta(eta)}")
                if self.step % t.sample_interval == 0 or self.step == last:
                    text = self.generate("\n", t.sample_tokens, seed=t.seed * 1_000_003 + self.step)
                    self.append(SAMPLES_FILE, {"step": self.step, "prompt": "\n", "text": text, "time": time.time()})
                if self.step % t.checkpoint_interval == 0 or self.step == last or self.save_requested:
                    self.save_requested = False
                    self.checkpoint()
                if self.stop_requested:             # the checkpoint was written just above
                    self.log(f"stopped by signal at step {self.step}; resume with --resume {self.run_dir}")
                    return 0
            return 0
        finally:
            for sig, h in handlers.items():
                signal.signal(sig, h)
            self.report_memory()

    def report_memory(self):
        """Planned bytes against what the device lost to this run (free memory before setup minus
        free memory now): the loop allocates nothing, so only compiled kernel code adds to it."""
        if SIMULATOR:
            return
        used = self.free_before - cuda.current_context().get_memory_info()[0]
        self.memory["used_after_training_bytes"] = used
        mib = lambda b: f"{b / 2**20:,.1f} MiB"
        self.log(f"memory: planned {mib(self.planned_bytes)}, allocated by setup "
                 f"{mib(self.memory['allocated_by_setup_bytes'])}, in use after training {mib(used)}")
        self.write_state()

    def install_signal_handlers(self):
        def stop(signum, frame):
            self.stop_requested = self.save_requested = True

        def save(signum, frame):
            self.save_requested = True

        old = {}
        for sig, h in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (getattr(signal, "SIGUSR1", None), save)):
            if sig is not None:
                old[sig] = signal.signal(sig, h)
        return old


def format_eta(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    mnt, s = divmod(rem, 60)
    return f"{h}h{mnt:02d}m" if h else f"{mnt}m{s:02d}s"


# ----------------------------------------------------------------------------------------------
# command line

def build_config(args) -> Config:
    cfg = load_config(args.config or args.size)
    train = {k: v for k, v in (("steps", args.steps), ("seed", args.seed), ("batch_size", args.batch_size),
                               ("n_microbatches", args.microbatches), ("seq_len", args.seq_len)) if v is not None}
    data = {"source": args.data} if args.data else {}
    if train or data:
        raw = cfg.to_dict()
        raw["train"].update(train)
        raw["data"].update(data)
        cfg = config_from_dict(raw, origin="command line")
    return validate(cfg)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m andrea_numba.train", description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--size", default="12M", help="tiny, 12M or 120M (default 12M)")
    g.add_argument("--config", help="a config JSON file instead of a size")
    g.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its checkpoint")
    ap.add_argument("--data", help="a UTF-8 text file to train on (default: the config's source)")
    ap.add_argument("--out", help="run directory (default runs/<config name>)")
    ap.add_argument("--steps", type=int, help="optimiser steps (default: the config's)")
    ap.add_argument("--seed", type=int, help="seed of initialisation and data order")
    ap.add_argument("--batch-size", type=int, help="sequences per microbatch")
    ap.add_argument("--microbatches", type=int, help="microbatches per optimiser step")
    ap.add_argument("--seq-len", type=int, help="tokens per sequence")
    ap.add_argument("--log-every", type=int, default=10, help="print a progress line every N steps")
    args = ap.parse_args(argv)
    log = lambda s: print(s, flush=True)
    try:
        if not SIMULATOR and not cuda.is_available():
            raise TrainError("no CUDA GPU found: train on a machine with an NVIDIA GPU, or set "
                             "NUMBA_ENABLE_CUDASIM=1 to run the tiny size in the simulator (slow)")
        if args.resume:
            run_dir = Path(args.resume)
            state = read_run_state(run_dir)
            raw = state["config"]
            if args.steps is not None and isinstance(raw.get("train"), dict):
                raw["train"]["steps"] = args.steps
            cfg = config_from_dict(raw, origin=str(run_dir / STATE_FILE))
            trainer = Trainer(cfg, run_dir, data_dir_of(run_dir, state), log, args.log_every)
            trainer.setup(resume=True)
        else:
            cfg = build_config(args)
            run_dir = Path(args.out or f"runs/{cfg.name}")
            if (run_dir / CHECKPOINT_FILE).exists() or (run_dir / STATE_FILE).exists():
                raise TrainError(f"{run_dir} already holds a run: continue it with --resume {run_dir}, "
                                 f"choose another --out, or delete the directory")
            trainer = Trainer(cfg, run_dir, None, log, args.log_every)
            log(f"{cfg.name}: {n_params(cfg.model):,} parameters, {device_name()}, run directory {run_dir}")
            trainer.setup()
        t0 = time.time()
        trainer.write_state()
        code = trainer.run()
        log(f"done: step {trainer.step}, {trainer.tokens_seen:,} tokens, {time.time() - t0:.1f} s")
        return code
    except (ConfigError, CheckpointError, D.DataError, RunDirError, TrainError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
