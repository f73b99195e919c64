"""Train a model end to end on the GPU with the CUDA kernels.

    python -m andrea_numba.train --size 12M                  # default corpus, runs/ANDREA-12M-TRAIN
    python -m andrea_numba.train --size tiny --steps 20 --out runs/tiny
    python -m andrea_numba.train --config my.json --data book.txt
    python -m andrea_numba.train --resume runs/tiny          # continue bit-exactly
    python -m andrea_numba.train --resume runs/tiny --steps 40   # train a finished run further
    python -m andrea_numba.train --size tiny --kernel k_layernorm_bwd=lessons/exercises/k_layernorm_bwd.py
                                                             # your kernel, graded, in the model (your_kernels.py)

One optimiser step:

    copy the step's token batches, dropout keys, lr and bias corrections to the device
    for microbatch in range(n_microbatches):
        forward(microbatch); backward()          # gradients add up (+=)
    grads *= 1 / n_microbatches                  # k_grad_scale
    norm = |grads|; clip to clip_norm            # k_grad_norm_partial, k_grad_norm_final, k_grad_scale
    AdamW step with the scheduled lr, grads = 0  # k_adamw: skipped on the device if loss or norm is not finite

Before the first step the trainer prints the memory plan (andrea_numba.plan: every buffer, by kind), checks it
against the GPU's free memory and allocates everything once, device buffers and the pinned host
buffers the token batches and the step's statistics travel through. Every launch and copy goes to
one stream of the run's own; a step waits for the GPU once, to read 8 bytes (the loss and the
gradient norm). docs/host-syncs.md lists every wait. The data order is a pure function of (seed,
step), so a checkpoint (step, weights, Adam m and v) is all a run needs to resume bit-exactly.

CUDA graph (on a GPU, unless --no-graph): a step is a few hundred kernel launches, each costing
the host some 70 us of Python. So the first step runs launch by launch (eager), and then the
trainer records the same launches once into a CUDA graph (cuda.core's graph builder, given to
every launch as its stream: recorded, not run) and from then on replays that graph, one call a
step. A kernel's arguments are frozen in the graph, so everything that changes from step to step
lives in device buffers the step reads: the token batches, dropout's keys, AdamW's learning rate
and bias corrections, copied in before each replay. Eager steps read the very same buffers with
the very same launches, so the two modes give bit-identical weights, and a run may switch modes
when it resumes. The simulator has no graphs: there every step is eager.

Run directory (andrea_numba.runlog names its files): checkpoint.bin, best.bin (the checkpoint of
the lowest validation loss so far), .loss.json (one JSON line per step, appended), .samples.json
(text sampled during training), .state.json (config, step, tokens seen, timings, the sha256 of the
checkpoints, of the corpus and of the token files), .lock (held while a trainer works in the
directory) and data/ (the prepared token files; a resumed run trains on these, checked against
their recorded sha256). SIGTERM (or Ctrl-C) writes a checkpoint of the last finished step and
exits 0; SIGUSR1 writes one and keeps training. A diverged step (loss or gradient norm NaN or
infinite) is not applied and stops the run with exit code 2; its last checkpoint stays as it was.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from numba import cuda

import reference as R

from . import data as D
from .atomic import atomic_write_json, file_sha256, remove_stale_temporaries
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .cli import Parser, nonneg_int, positive_int
from .cli import seed as seed_type
from .config import Config, ConfigError, config_from_dict, load_config, validate
from .filewriter import FileWriter
from .loss_scale import MIN_SCALE, LossScale, LossScaleError
from .mfu import flops_per_token, format_mfu, mfu, peak_flops
from .decode import PRECISIONS as DECODER_PRECISIONS, Decoder
from .gpu_model import GPUModel
from .graphs import GRAPHS, StepGraph
from .kernel_cache import KernelCache
from .recipes import recipe_for
from .kernels import cublaslt, optim, residual
from .kernels.common import SIMULATOR, device_name
from .layout import decay_mask, init_params, n_params
from .precompile import MAX_WORKERS, compile_ahead, default_workers, record_launches
from .plan import HYPER_WORDS, PlanError, check_device, check_fits, format_plan, memory_plan, step_scalar_words
from .runlog import (
    BEST_FILE,
    CHECKPOINT_FILE,
    DATA_DIR,
    FP8_FILE,
    LOSS_FILE,
    SAMPLES_FILE,
    STATE_FILE,
    RunDirError,
    RunLock,
    data_dir_of,
    data_dir_record,
    path_of,
    path_record,
    read_run_state,
)
from .sample import generate as generate_text
from .your_kernels import KernelError, YourKernel
from . import your_kernels


class TrainError(RuntimeError):
    """A run that cannot start or continue; str(err) is one line: what is wrong and what to do."""


def divergence_hints(t) -> str:
    """What in the train config a diverged run can change, as one clause."""
    hints = [f"lower train.lr (now {t.lr:g}; try {t.lr / 10:g})"]
    if t.clip_norm == 0:
        hints.append("turn clipping on (train.clip_norm is 0, i.e. off; 1.0 is usual)")
    elif t.clip_norm > 1:
        hints.append(f"clip harder (train.clip_norm is {t.clip_norm:g}; 1.0 is usual)")
    if t.warmup_steps == 0:
        hints.append("warm up (train.warmup_steps is 0; a few percent of train.steps is usual)")
    return ", ".join(hints[:-1]) + (" and " if len(hints) > 1 else "") + hints[-1]


# ----------------------------------------------------------------------------------------------
# the trainer

class Trainer:
    def __init__(self, cfg: Config, run_dir, data_dir=None, log=print, log_every=10, launch_time=None, graph=True,
                 compile_workers=0, kernels: list[YourKernel] | None = None):
        self.cfg, self.run_dir, self.log, self.log_every = cfg, Path(run_dir), log, log_every
        self.kernels = kernels or []         # a student's kernels in the model's place (andrea_numba/your_kernels.py)
        self.compile_workers = compile_workers   # processes that compile the kernels before step 1 (0: at launch)
        # how the steps launch: "graph" (captured after the first step, then replayed) or "eager"
        self.launches = "graph" if graph and GRAPHS else "eager"
        self.launches_why = "" if self.launches == "graph" else "--no-graph" if not graph else \
            "the CUDA simulator runs no graphs"
        self.graph = None                    # the StepGraph, once captured
        self.sampler_graph = None            # the sampler's forward as a StepGraph once captured (False: it failed)
        self.sampler_warm = False            # the sampler ran once eagerly (compiled): ready to capture
        self.eval_graph = None               # an evaluation batch as a StepGraph once captured (False: it failed)
        self.eval_warm = False               # an evaluation ran once eagerly: ready to capture
        self.data_dir = Path(data_dir) if data_dir else self.run_dir / DATA_DIR
        self.stop_requested = False
        self.save_requests = self.saves_done = 0       # SIGUSR1 counts up; the loop catches up
        self.handlers = None
        self.launch_time = time.monotonic() if launch_time is None else launch_time
        self.start = {}                      # this process's start, in seconds: before setup, setup, kernels
        self.elapsed_before = 0.0            # elapsed_s of the earlier processes of this run
        self.resume = None                   # what check_resume found
        self.best = None                     # {"file", "step", "val_loss", "sha256"} of best.bin
        self.checkpoint_step = None          # step of the checkpoint on disk (None: none yet)
        self.checkpoint_sha256 = self.previous_checkpoint_sha256 = None
        self.files = FileWriter(log)         # writes best.bin, checkpoint.bin and their records
        # fp16: the dynamic loss scale (andrea_numba/loss_scale.py); the record of it that goes with
        # the checkpoint on disk (written into .state.json with it)
        self.scaler = LossScale() if cfg.train.precision == "fp16" else None
        self.checkpoint_loss_scale = None

    def elapsed(self) -> float:
        """Wall seconds of this run since it was launched, over every process that worked on it."""
        return self.elapsed_before + time.monotonic() - self.launch_time

    # -- before anything is written: is the run directory one to resume? --
    def check_resume(self, state: dict | None = None) -> dict:
        """Read and check everything a resume needs, writing nothing: the state, the checkpoint
        (none: the run stopped before its first one and starts again from step 0), best.bin and the
        prepared tokens. TrainError, CheckpointError, DataError or RunDirError, one line, otherwise."""
        state = read_run_state(self.run_dir) if state is None else state
        t, n = self.cfg.train, n_params(self.cfg.model)
        path = self.run_dir / CHECKPOINT_FILE
        shas = [h for h in (state.get("checkpoint_sha256"), state.get("previous_checkpoint_sha256"))
                if isinstance(h, str) and h]
        if path.exists():
            step, params, mm, vv, sha = load_checkpoint(path, n, shas)
        elif state.get("previous_checkpoint_sha256"):
            raise CheckpointError(f"{path} is missing, but {self.run_dir / STATE_FILE} records the checkpoints the run "
                                  f"wrote: restore it, or start a new run")
        else:                                # killed before its first checkpoint was in place
            step, params, mm, vv, sha = 0, None, None, None, None
        if step > t.steps:
            raise TrainError(f"the run in {self.run_dir} is at step {step} already, beyond the {t.steps} steps asked "
                             f"for (--steps): give --steps {step + 1} or more to train on from there")
        best = self._check_best(state, step, n)
        meta = self._check_data(state)
        scaler = None                        # fp16: the loss scale that goes with the checkpoint
        if self.scaler is not None and params is not None:
            scaler = LossScale.from_dict(state.get("loss_scale"), str(self.run_dir / STATE_FILE))
        self.resume = dict(state=state, step=step, params=params, m=mm, v=vv, sha=sha, best=best, meta=meta,
                           loss_scale=scaler)
        return self.resume

    def _check_best(self, state: dict, step: int, n: int) -> dict | None:
        """The best.bin record a resumed run compares against. A best.bin that does not match its
        record is accepted only when it is from a step after the checkpoint (written just before a
        kill, before its record): the resumed run gets there again and writes the same bytes."""
        record, path = state.get("best"), self.run_dir / BEST_FILE
        if record is not None and not (isinstance(record, dict) and isinstance(record.get("sha256"), str)
                                       and isinstance(record.get("step"), int)
                                       and isinstance(record.get("val_loss"), (int, float))):
            raise RunDirError(f"{self.run_dir / STATE_FILE}: 'best' is not a record of {BEST_FILE} (file, step, val_loss, "
                              f"sha256): restore the file, or remove the 'best' entry and {BEST_FILE}")
        if not path.exists():
            if record is not None:
                self.log(f"{path} (step {record['step']}) is missing: the next evaluation writes a new one")
            return None
        if record is not None and file_sha256(path) == record["sha256"]:
            return record
        best_step = load_checkpoint(path, n)[0]
        if best_step > step:
            return record
        raise CheckpointError(f"{path} does not match the sha256 recorded in {self.run_dir / STATE_FILE}: it was changed "
                              f"or damaged after it was written; restore it, or delete it (the run then writes a new "
                              f"one at its next evaluation)")

    def _check_data(self, state: dict) -> dict | None:
        """The run's token files checked against the state's record (read only). When they are gone,
        the corpus they were prepared from must still have its recorded sha256: setup prepares them
        again. Returns the meta, or None when setup has to prepare."""
        record = state.get("data") or {}
        if (self.data_dir / D.META).exists():
            return D.check_prepared(self.data_dir, record)
        source, want = self.cfg.data.source, record.get("source_sha256")
        sha = D.stdlib_corpus()[1] if source == "stdlib" else D.read_text_file(source)[1]
        if want is not None and sha != want:
            raise D.DataError(f"the corpus {source} changed since the run was prepared: its sha256 is {sha[:16]}..., "
                              f"the run's record {want[:16]}...; restore the original text or start a new run")
        return None

    # -- setup: everything that allocates happens here, before the first step --
    def setup(self, resume: bool = False):
        cfg, m, t = self.cfg, self.cfg.model, self.cfg.train
        t_setup = time.time()
        if "before setup" not in self.start:   # interpreter, imports, config and run directory
            self.start["before setup"] = process_age()
        if resume and self.resume is None:
            self.check_resume()
        found = self.resume if resume else None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if found is not None and found["meta"] is not None:
            self.meta = found["meta"]
        else:
            self.meta = self.prepare_data(found and found["state"])
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
            free = cuda.current_context().get_memory_info()[0]
            check_fits(cfg, free)
            self.free_before = free
        self.device = device_name()
        self.flops_token = flops_per_token(m, t.seq_len)          # model FLOPs of a training token (mfu.py)
        self.peak = peak_flops(self.device, t.precision)          # this GPU's dense peak, or None
        self.allocate()
        self.log(f"launches: {self.describe_launches()}")
        recipe = self.model.recipe
        self.log(f"precision: {t.precision}, recipe {recipe.name} (andrea_numba/recipes.py): {recipe.what}; "
                 "weights, gradients, AdamW, LayerNorm, the softmax and the loss in fp32"
                 + (f"; each quantized tensor's amax and underflow in {FP8_FILE}" if self.model.fp8 is not None else ""))
        if t.products == "cublas":
            self.log(f"products: cuBLASLt {cublaslt.version()} (kernels/cublaslt.py; every other op our kernels)")
        for k in self.kernels:
            self.log(k.describe())
        self.timings = {"setup_s": 0.0, "train_s": 0.0}
        if found is not None and found["params"] is not None:
            params, mm, vv = found["params"], found["m"], found["v"]
            self.step = self.checkpoint_step = found["step"]
            self.checkpoint_sha256 = found["sha"]
            self.log(f"resumed from {self.run_dir / CHECKPOINT_FILE} at step {self.step}")
        else:
            params, mm, vv = init_params(m, t.seed), np.zeros(self.n, np.float32), np.zeros(self.n, np.float32)
            self.step = 0
            if found is not None:
                self.log(f"{self.run_dir} has no checkpoint yet (the run stopped before its first one): "
                         f"training it again from step 0")
        if found is not None:
            timings = found["state"].get("timings")
            if isinstance(timings, dict):
                self.timings.update({k: v for k, v in timings.items() if isinstance(v, (int, float))})
            self.elapsed_before = float(self.timings.pop("elapsed_s", 0.0))
            self.best = found["best"]
            if found["loss_scale"] is not None:  # fp16: the scale of the checkpoint
                self.scaler = found["loss_scale"]
                self.checkpoint_loss_scale = self.scaler.to_dict()
        self.tokens_seen = self.step * self.tokens_per_step
        s = self.stream
        self.model.params.copy_to_device(params, stream=s)
        self.adam_m.copy_to_device(mm, stream=s)
        self.adam_v.copy_to_device(vv, stream=s)
        s.synchronize()                        # setup's sync: the run starts with its state on the GPU
        self.memory = {"planned_bytes": self.planned_bytes}
        if not SIMULATOR:
            self.memory["allocated_by_setup_bytes"] = self.free_before - cuda.current_context().get_memory_info()[0]
        self.resume = None                     # the host copies are on the GPU now
        dt = time.time() - t_setup
        self.timings["setup_s"] += dt                # the run's, over its processes
        self.start["setup"] = self.start.get("setup", 0.0) + dt     # this process's

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
        """Every buffer of the run: the model's device buffers, the optimiser's, what a step reads
        that changes from step to step, and pinned host memory for what travels between host and
        GPU during training."""
        m, t = self.cfg.model, self.cfg.train
        B, T, n_micro = t.batch_size, t.seq_len, t.n_microbatches
        # one stream for the whole run: every launch and copy is ordered on it, none goes to the
        # legacy default stream (which would wait for, and hold up, all other work on the GPU)
        s = self.stream = cuda.stream()
        self.model = GPUModel(m, B, T, stream=s, dropout=t.dropout, recipe=recipe_for(t.precision, t.products))
        your_kernels.install(self.model, self.kernels)
        # the sampler: a forward at batch 1 on the first row of the training model's buffers (they
        # are free between steps), with the training sequence length as its window
        self.sampler = GPUModel(m, 1, T, stream=s, training=False, share=self.model, recipe=self.model.recipe)
        # ... and at fp32 and bf16, while the text fits seq_len, a KV-cache decoder on the same weights,
        # its products at the run's precision: one position a drawn token, drawn on the GPU
        # (andrea_numba/decode.py; its cache, rows and pinned host buffers are its own)
        self.sample_buf = cuda.pinned_array((1, T), np.int32)
        self.decoder = Decoder(m, self.model.params, T, stream=s, capture=self.capture_decoder, log=self.log,
                               precision=self.model.precision) \
            if self.model.precision in DECODER_PRECISIONS else None
        self.adam_m = cuda.device_array(self.n, np.float32, stream=s)
        self.adam_v = cuda.device_array(self.n, np.float32, stream=s)
        self.decay = cuda.to_device(decay_mask(m, np.uint8), stream=s)
        self.partial = cuda.device_array(optim.NORM_BLOCKS, np.float32, stream=s)
        self.stats = cuda.device_array(2, np.float32, stream=s)    # [loss summed over microbatches, grad norm]
        # What a step reads that changes from step to step, in device buffers written before the
        # step (so that a captured graph reads each step's values), each the copy of a pinned host
        # buffer of the same layout:
        #   batches  int32 [n_micro, 2, B, T]: microbatch i's token ids (i, 0) and targets (i, 1)
        #   scalars  uint64 [n_micro * n_layer * 3 + 2]: dropout's keys [n_micro, n_layer, 3], then
        #            AdamW's [lr, bc1, bc2, unused] as four float32 in the last two words
        self.batches = cuda.device_array((n_micro, 2, B, T), np.int32, stream=s)
        self.scalars = cuda.device_array(step_scalar_words(self.cfg), np.uint64, stream=s)
        self.batches_host = cuda.pinned_array((n_micro, 2, B, T), np.int32)
        self.scalars_host = cuda.pinned_array(step_scalar_words(self.cfg), np.uint64)
        self.scalars_host[:] = 0
        n_keys = self.scalars.size - HYPER_WORDS
        self.keys_host = self.scalars_host[:n_keys].reshape(n_micro, m.n_layer, -1)
        self.hyper_host = self.scalars_host[n_keys:].view(np.float32)
        keys = self.scalars[:n_keys].reshape(n_micro, m.n_layer, self.keys_host.shape[2])
        self.hyper = self.scalars[n_keys:].view(np.float32)
        # the device views each microbatch's forward reads: (token ids [B, T], targets [B, T], keys [L, 3])
        self.micro_inputs = [(self.batches[i, 0], self.batches[i, 1], keys[i]) for i in range(n_micro)]
        self.loss_sum, self.norm = self.stats[0:1], self.stats[1:2]
        # pinned (page-locked) host memory: copies from and to it run asynchronously on the stream.
        # The step's slots are refilled only after the step's sync, when their copies are done;
        # the evaluation batches are the same every time, filled once here.
        self.eval_x = cuda.pinned_array((t.eval_batches, B, T), np.int32)
        self.eval_y = cuda.pinned_array((t.eval_batches, B, T), np.int32)
        for i in range(t.eval_batches):
            self.eval_x[i], self.eval_y[i] = D.get_batch(self.val_tokens, B, T, t.seed, 0, i, split="val")
        self.stats_host = cuda.pinned_array(2, np.float32)
        # the weights, m and v on their way to checkpoint.bin and best.bin: three [n_params]
        self.state_host = [cuda.pinned_array(self.n, np.float32) for _ in range(3)]

    def describe_launches(self) -> str:
        if self.launches == "graph":
            return "CUDA graph (the first step eager, then the step captured once and replayed)"
        return f"eager, kernel by kernel ({self.launches_why})"

    # -- one optimiser step --
    def lr(self, step):
        t = self.cfg.train
        return R.lr_at(step, t.lr, t.min_lr, t.warmup_steps, t.steps, t.lr_decay)

    def train_step(self, step):
        """One optimiser step: its inputs to the device, then its work, eager or as the replay of
        the captured graph (captured here after the first eager step), then its one sync."""
        t, s = self.cfg.train, self.stream
        lr = self.lr(step)
        self.write_step_inputs(step, lr)
        if self.graph is not None:
            self.graph.launch()
        else:
            self.step_work(s)
        self.stats.copy_to_host(self.stats_host, stream=s)
        s.synchronize()                          # the step's only sync
        loss, grad_norm = self.stats_host
        if self.launches == "graph" and self.graph is None:
            self.capture()
        return float(loss) / t.n_microbatches, float(grad_norm), lr

    def write_step_inputs(self, step, lr):
        """What step `step` reads that changes from step to step, into the pinned host buffers and
        from there to the device: two asynchronous copies on the run's stream, queued before the
        step's work. The slots are free: the last step's sync waited for their last copies."""
        t, m, s = self.cfg.train, self.cfg.model, self.stream
        for micro in range(t.n_microbatches):
            self.batches_host[micro, 0], self.batches_host[micro, 1] = D.get_batch(
                self.train_tokens, t.batch_size, t.seq_len, t.seed, step, micro)
            key = R.dropout_key(t.seed, step, micro)
            self.keys_host[micro] = [R.block_keys(key, l) for l in range(m.n_layer)]
        applied = step - (self.scaler.skipped if self.scaler else 0)       # steps AdamW applied before this one
        self.hyper_host[:3] = R.adamw_hyper(applied + 1, lr, t.beta1, t.beta2)   # AdamW's t counts from 1
        self.batches.copy_to_device(self.batches_host, stream=s)
        self.scalars.copy_to_device(self.scalars_host, stream=s)

    def step_work(self, stream):
        """Every launch of a step, in order, on `stream`: the run's stream (eager) or a graph
        builder (capture). Nothing here depends on the step number: the step's token ids, keys,
        lr and bias corrections are read from the device buffers write_step_inputs fills."""
        t, model = self.cfg.train, self.model
        optim.zero(self.stats, stream=stream)
        with model.launching_on(stream):
            for tokens, targets, keys in self.micro_inputs:
                model.forward(tokens, targets, keys=keys)
                model.backward(dloss=self.loss_scale())
                residual.residual_add(self.loss_sum, self.loss_sum, model.buf["loss"], stream=stream)
        # the mean over microbatches (and with fp16, undoing the loss scale: exact, a power of two)
        optim.grad_scale(model.grads, self.norm, 0.0, 1.0 / (t.n_microbatches * self.loss_scale()), stream=stream)
        optim.grad_norm(self.norm, self.partial, model.grads, stream=stream)
        optim.grad_scale(model.grads, self.norm, t.clip_norm, 1.0, stream=stream)          # clip by global norm
        # the divergence guard is on the device: with a NaN or infinite loss or norm in stats,
        # k_adamw leaves the weights, m and v as they were (the host only learns of it at the
        # step's sync); either way it clears the gradient for the next step
        optim.adamw(model.params, model.grads, self.adam_m, self.adam_v, self.decay, self.hyper,
                    t.beta1, t.beta2, t.eps, t.weight_decay, self.stats, stream=stream)

    def compile_kernels(self):
        """Before the first step: every kernel a step, an evaluation and the sampler launch,
        compiled on compile_workers processes at once (andrea_numba.precompile) instead of one
        after another at its first launch, or loaded from the kernel cache where an earlier run
        compiled the same sources (andrea_numba.kernel_cache). Nothing runs on the GPU; a kernel
        that is not compiled here is compiled at its first launch, as without this."""
        if SIMULATOR:
            return
        cache = KernelCache.open(log=self.log)   # None when ANDREA_KERNEL_CACHE=off or not writable
        if cache is None and self.compile_workers < 1:
            return
        t0 = time.time()
        try:
            launches = self.kernel_launches()
        except Exception as e:                  # compiled at their first launch instead, as without this
            self.log(f"compiling ahead: skipped, the launches could not be recorded "
                     f"({type(e).__name__}: {' '.join(str(e).split())[:200]})")
            return
        report = compile_ahead(launches, self.compile_workers, log=self.log, cache=cache)
        for name, why in report["failed"]:
            self.log(f"compiling ahead: {name} left to its first launch ({why})")
        self.start["kernels"] = time.time() - t0
        self.timings["compile_s"] = self.timings.get("compile_s", 0.0) + self.start["kernels"]

    def start_parts(self, age: float, step_s: float) -> str:
        """Where a process's start went, for the first step's line: its age when setup began, setup
        (allocations, data, the memory plan), the kernels compiled or loaded ahead, the first step
        itself, and the rest of the age."""
        parts = [(name, self.start.get(name)) for name in ("before setup", "setup", "kernels")]
        parts.append(("the step", step_s))
        known = [(name, v) for name, v in parts if v is not None]
        rest = age - sum(v for _, v in known)
        return ", ".join(f"{name} {v:.2f} s" for name, v in known + [("other", rest)])

    def kernel_launches(self) -> list:
        """(kernel, argument types) of every launch of a training step, an evaluation, the sampler's
        forward and a step of its decoder, recorded without running them (andrea_numba.precompile)."""
        s = self.stream
        launches = record_launches(lambda: self.step_work(s),
                                   lambda: self.model.forward(self.eval_x[0], self.eval_y[0]),
                                   lambda: self.sampler.forward(self.sample_buf, self.sample_buf),
                                   *([lambda: self.decoder.work(s)] if self.decoder is not None else []))
        s.synchronize()                          # the recorded forwards copied their token ids in
        return launches

    @property
    def tokens_per_step(self) -> int:
        """Tokens an optimiser step trains on: its microbatches' B x T each."""
        t = self.cfg.train
        return t.batch_size * t.seq_len * t.n_microbatches

    def average_mfu(self, tokens: int, timings: dict) -> str:
        """MFU over `tokens` trained in timings["train_s"] seconds, leaving out the first step of
        each process (timings "first_steps", "first_steps_s": it loads every kernel and runs
        eagerly) when there were others; the text for the summary line."""
        per_step = self.tokens_per_step
        n_first, first_s, total_s = timings.get("first_steps", 0), timings.get("first_steps_s", 0.0), timings["train_s"]
        if tokens > n_first * per_step and total_s > first_s > 0:
            rate, what = (tokens - n_first * per_step) / (total_s - first_s), "over its steps after the first"
        else:
            rate, what = (tokens / total_s if total_s else 0.0), "over its steps"
        return f"{format_mfu(mfu(rate, self.flops_token, self.peak))} {what}"

    def loss_scale(self) -> float:
        """The loss scale of the next step (1 without fp16). A captured graph holds it: the trainer
        drops the graph when the scale changes, and the next step runs eagerly and captures anew."""
        return 1.0 if self.scaler is None else self.scaler.scale

    def capture(self):
        """Record step_work into a CUDA graph, once, after an eager step has compiled and run every
        kernel (a capture records launches; it must not compile or allocate). A capture that fails
        leaves the run eager, said in the log and the state."""
        t0 = time.time()
        try:
            self.graph = StepGraph(self.stream, self.step_work)
        except Exception as e:                  # the driver's or cuda.core's error: keep training, eagerly
            self.launches, self.launches_why = "eager", f"the CUDA graph capture failed: {' '.join(str(e).split())}"
            self.log(f"launches: {self.describe_launches()}; training on kernel by kernel")
            self.write_state()
            return
        self.log(f"launches: the step captured as a CUDA graph in {time.time() - t0:.2f} s; replayed from now on")

    def evaluate(self):
        """Mean validation loss over eval_batches fixed microbatches (the same ones every time).
        Eager: each batch's forward launched kernel by kernel. In graph mode, from the second
        evaluation on (the first one is eager), one batch's forward and its loss sum are a CUDA
        graph that reads the model's token buffers: each batch is copied in, then the graph is
        replayed (the same launches: the same loss, bit for bit)."""
        t, s, b = self.cfg.train, self.stream, self.model.buf
        optim.zero(self.stats, stream=s)
        if self.launches == "graph" and self.eval_graph is None and self.eval_warm:
            try:
                self.eval_graph = StepGraph(s, lambda stream: self._eval_work(stream, b["tokens"], b["targets"]))
                self.log("evaluation: a batch's forward captured as a CUDA graph; replayed for every batch")
            except Exception as e:                # evaluate on eagerly; the training step's graph is unaffected
                self.eval_graph = False
                self.log(f"evaluation: eager (the capture failed: {' '.join(str(e).split())})")
        for i in range(t.eval_batches):
            if self.eval_graph:
                b["tokens"].copy_to_device(self.eval_x[i], stream=s)
                b["targets"].copy_to_device(self.eval_y[i].reshape(-1), stream=s)
                self.eval_graph.launch()
            else:
                self._eval_work(s, self.eval_x[i], self.eval_y[i])
        self.eval_warm = True
        self.stats.copy_to_host(self.stats_host, stream=s)
        s.synchronize()                          # the evaluation's one sync
        return float(self.stats_host[0]) / t.eval_batches

    def _eval_work(self, stream, tokens, targets):
        """One validation batch: its forward, its mean loss added into stats[0]."""
        with self.model.launching_on(stream):
            self.model.forward(tokens, targets)
        residual.residual_add(self.stats[0:1], self.stats[0:1], self.model.buf["loss"], stream=stream)

    def generate(self, prompt: str, n_tokens: int, seed: int, temperature=1.0, top_k=40) -> str:
        """Sample n_tokens after prompt: at fp32 and bf16 one position a token on the decoder's KV cache while
        the text fits seq_len, otherwise (and past it) with the sampler (a forward at B=1 over the
        last seq_len tokens, on the training model's buffers)."""
        return generate_text(self.sampler, self.tokenizer, prompt, n_tokens, seed, temperature, top_k,
                             self.sample_buf, forward=self.sampler_forward, decoder=self.decoder)

    def capture_decoder(self, stream, work):
        """The decoder's step as a CUDA graph in graph mode (Decoder.step asks on its second step);
        None when the run launches eagerly: the decoder does too."""
        return StepGraph(stream, work) if self.launches == "graph" else None

    def sampler_forward(self, buf):
        """The sampler's forward on the token ids in buf (the pinned [1, T] sample_buf). Eager: the
        forward launched kernel by kernel, buf copied in by it. In graph mode, from the sampler's
        second forward on (the first one compiles whatever the training step did not), buf is
        copied into the sampler's token buffer and the forward, captured once as a CUDA graph that
        reads that buffer, is replayed: one call instead of a launch per kernel for every sampled
        token. The graph replays the same launches: the same probabilities, bit for bit."""
        model, s = self.sampler, self.stream
        tokens = model.buf["tokens"]
        if self.launches == "graph" and self.sampler_graph is None and self.sampler_warm:
            try:
                self.sampler_graph = StepGraph(s, lambda stream: self._sampler_work(stream, tokens))
                self.log("sampling: the sampler's forward captured as a CUDA graph; replayed for every token")
            except Exception as e:                # sample on eagerly; the training step's graph is unaffected
                self.sampler_graph = False
                self.log(f"sampling: eager (the sampler's CUDA graph capture failed: {' '.join(str(e).split())})")
        if self.sampler_graph:
            tokens.copy_to_device(buf, stream=s)
            self.sampler_graph.launch()
        else:
            model.forward(buf, buf)
            self.sampler_warm = True

    def _sampler_work(self, stream, tokens):
        with self.sampler.launching_on(stream):
            self.sampler.forward(tokens, tokens)

    # -- run files --
    def last_checkpoint(self) -> str:
        """Where the run's last checkpoint stands, for a line that stops the run: after the file
        writer's job in flight, which may be writing one (a step's checkpoint is written while the
        next step runs)."""
        if not self.files.in_job():
            try:
                self.files.wait()
            except Exception as e:  # noqa: BLE001  (said in the line, which reports the stop first)
                return f"the last checkpoint's write failed ({' '.join(str(e).split())})"
        if self.checkpoint_step is None:
            return "no checkpoint had been written yet"
        return f"the last checkpoint ({self.run_dir / CHECKPOINT_FILE}, step {self.checkpoint_step}) is intact"

    def host_state(self):
        """The weights, m and v of this step, copied into the pinned host buffers (after the file
        writer's last job, which wrote from them, has ended), refused when any value is not finite."""
        self.files.wait()
        host = [a.copy_to_host(h, stream=self.stream)
                for a, h in zip((self.model.params, self.adam_m, self.adam_v), self.state_host)]
        self.stream.synchronize()                # the files are written from these host copies
        for name, a in zip(("weights", "Adam m", "Adam v"), host):
            if not np.all(np.isfinite(a)):
                raise TrainError(f"the {name} at step {self.step} hold NaN or infinite values, so no checkpoint "
                                 f"was written and {self.last_checkpoint()}; the run diverged: "
                                 f"{divergence_hints(self.cfg.train)}, then start a new run")
        return host

    def save(self, best_val: float | None = None, checkpoint: bool = False):
        """This step's best.bin (best_val: its validation loss) and/or checkpoint.bin, from one host
        copy, written by the file writer's thread (andrea_numba.filewriter) while training goes on."""
        step, (params, mm, vv) = self.step, self.host_state()
        scaler = None if self.scaler is None else self.scaler.to_dict()     # as it stands after this step

        def job(say):
            if best_val is not None:
                self._write_best(say, step, best_val, params, mm, vv)
            if checkpoint:
                self._write_checkpoint(say, step, params, mm, vv, scaler)
        self.files.start(job)

    def checkpoint(self):
        """checkpoint.bin of this step, written before this returns."""
        self.save(checkpoint=True)
        self.files.wait()

    def _write_checkpoint(self, say, step, params, mm, vv, scaler=None):
        t0 = time.time()

        def record(sha):                   # on disk, not yet in place: put both checksums on record
            self.previous_checkpoint_sha256 = self.checkpoint_sha256
            self.checkpoint_sha256, self.checkpoint_step = sha, step
            self.checkpoint_loss_scale = scaler
            self.write_state()

        save_checkpoint(self.run_dir / CHECKPOINT_FILE, step, params, mm, vv, before_replace=record)
        say(f"checkpoint: step {step} -> {self.run_dir / CHECKPOINT_FILE} ({time.time() - t0:.1f} s)")

    def _write_best(self, say, step, val_loss, params, mm, vv):
        """best.bin: the checkpoint of the lowest validation loss so far. The file is in place
        before its record goes into .state.json, and both before this step's checkpoint.bin, so a
        kill in between is undone by a resume replaying this evaluation (check_resume)."""
        sha = save_checkpoint(self.run_dir / BEST_FILE, step, params, mm, vv)
        self.best = {"file": BEST_FILE, "step": step, "val_loss": val_loss, "sha256": sha}
        self.write_state()
        say(f"best: val {val_loss:.4f} at step {step} -> {BEST_FILE}")

    def write_state(self):
        if not self.files.in_job():
            self.files.wait()                    # the writer's records first, in their order
        t = self.cfg.train
        step = self.checkpoint_step or 0
        config = self.cfg.to_dict()
        if config["data"]["source"] != "stdlib":
            config["data"]["source"] = path_record(self.run_dir, config["data"]["source"])
        data = {**self.meta, "dir": data_dir_record(self.run_dir, self.data_dir)}
        if isinstance(data.get("source"), str) and data["source"] != "stdlib":
            data["source"] = path_record(self.run_dir, data["source"])
        state = {"step": step, "config": config, "tokenizer": self.meta.get("tokenizer"), "data": data,
                 "tokens_seen": step * self.tokens_per_step, "n_params": self.n,
                 "timings": {**self.timings, "elapsed_s": round(self.elapsed(), 3)},
                 "checkpoint": CHECKPOINT_FILE, "checkpoint_sha256": self.checkpoint_sha256,
                 "previous_checkpoint_sha256": self.previous_checkpoint_sha256, "best": self.best,
                 "memory": self.memory, "device": self.device, "loss_scale": self.checkpoint_loss_scale,
                 **({"cublaslt_version": cublaslt.version()} if t.products == "cublas" else {}),
                 **({"kernels": {k.name: k.record(path_record(self.run_dir, k.path)) for k in self.kernels}}
                    if self.kernels else {}),
                 "launches": self.launches + (f" ({self.launches_why})" if self.launches_why else ""),
                 "time": time.time()}
        atomic_write_json(self.run_dir / STATE_FILE, state)

    def append(self, name, record):
        with open(self.run_dir / name, "a") as f:
            f.write(json.dumps(record) + "\n")

    # -- the loop --
    def stopped_early(self, step: int, best: dict | None) -> bool:
        """Early stopping (train.early_stop = E > 0): the evaluation at `step` is the E-th in a row
        without a validation loss below best.bin's. A function of the step and the best record
        only, so a resumed run stops where the uninterrupted one did, and knows it has stopped."""
        t = self.cfg.train
        return t.early_stop > 0 and best is not None and step - best["step"] >= t.early_stop * t.eval_interval

    def diverged(self, step: int, what: str) -> TrainError:
        return TrainError(f"training diverged at step {step} ({what}): the step was not applied and "
                          f"{self.last_checkpoint()}; {divergence_hints(self.cfg.train)} in the config, "
                          f"then start a new run (--config FILE --out NEW_DIR)")

    def run(self, steps=None):
        t = self.cfg.train
        last = t.steps if steps is None else steps
        tokens_per_step = self.tokens_per_step
        own_handlers = self.handlers is None
        if own_handlers:
            self.install_signal_handlers()
        t_start, done_here = time.time(), 0
        try:
            if self.stop_requested and self.step < last:       # a signal during setup
                self.log(f"stopped by signal before step {self.step + 1}; {self.last_checkpoint()}; "
                         f"resume with --resume {self.run_dir}")
                return 0
            while self.step < last:
                t0 = time.time()
                scale = self.loss_scale()
                loss, norm, lr = self.train_step(self.step)
                dt = time.time() - t0
                overflow = self.scaler is not None and math.isfinite(loss) and not math.isfinite(norm)
                if not (math.isfinite(loss) and (math.isfinite(norm) or overflow)) or \
                        (overflow and self.scaler.scale <= MIN_SCALE):
                    raise self.diverged(self.step + 1, f"loss {loss:.6g}, gradient norm {norm:.6g}")
                if self.scaler is not None:          # fp16: the step was applied, or skipped by AdamW
                    decision = self.scaler.update(not overflow, self.step + 1)
                    if decision:
                        self.log(decision)
                        self.graph = None            # the next step runs eagerly with the new scale, then is captured
                self.step += 1
                done_here += 1
                if done_here == 1:          # each process's first step loads every kernel: MFU leaves it out
                    self.timings["first_steps_s"] = self.timings.get("first_steps_s", 0.0) + dt
                    self.timings["first_steps"] = self.timings.get("first_steps", 0) + 1
                    age = process_age()
                    self.timings["first_step_s"] = round(age, 2) if age is not None else None
                    self.log(f"first step done {age:.1f} s after the process started ({self.start_parts(age, dt)})"
                             if age is not None else
                             f"first step done {time.monotonic() - self.launch_time:.1f} s after setup began")
                self.tokens_seen += tokens_per_step
                self.timings["train_s"] += dt
                rec = {"step": self.step, "train_loss": loss, "lr": lr, "grad_norm": None if overflow else norm,
                       "tokens_per_s": tokens_per_step / dt, "time": time.time()}
                if self.scaler is not None:
                    rec["loss_scale"] = scale
                    if overflow:
                        rec["skipped"] = True
                fp8 = self.model.fp8         # this step's FP8 record, before an evaluation's forward overwrites it
                if fp8 is not None and (self.step % self.log_every == 0 or self.step in (1, last)):
                    self.append(FP8_FILE, {"step": self.step, "tensors": fp8.record(self.cfg.model.n_layer)})
                if self.step % t.eval_interval == 0 or self.step == last:
                    val = rec["val_loss"] = self.evaluate()
                    if not math.isfinite(val):
                        raise TrainError(f"training diverged at step {self.step}: the validation loss is {val} "
                                         f"(training loss {loss:.6g}); nothing of this step was saved and "
                                         f"{self.last_checkpoint()}; {divergence_hints(t)} in the config, "
                                         f"then start a new run (--config FILE --out NEW_DIR)")
                rec["elapsed_s"] = round(self.elapsed(), 3)
                self.append(LOSS_FILE, rec)
                if self.step % self.log_every == 0 or "val_loss" in rec or self.step == last:
                    eta = (time.time() - t_start) / done_here * (last - self.step)
                    val = f" | val {rec['val_loss']:.4f}" if "val_loss" in rec else ""
                    self.log(f"step {self.step:>6}/{last} | loss {loss:.4f}{val} | lr {lr:.2e} | norm {norm:.3f} | "
                             f"{rec['tokens_per_s']:,.0f} tok/s | "
                             f"{format_mfu(mfu(rec['tokens_per_s'], self.flops_token, self.peak))} | ETA {format_eta(eta)}")
                new_best = None
                if "val_loss" in rec:
                    self.files.wait()            # best.bin's record, as the writer left it
                    if self.best is None or rec["val_loss"] < self.best["val_loss"]:
                        new_best = rec["val_loss"]
                best = self.best if new_best is None else {"step": self.step, "val_loss": new_best}
                if self.step % t.sample_interval == 0 or self.step == last:
                    try:
                        text = self.generate("\n", t.sample_tokens, seed=t.seed * 1_000_003 + self.step)
                    except ValueError as e:          # probabilities with NaN: the weights overflow
                        raise TrainError(f"training diverged at step {self.step}: sampling failed ({e}); "
                                         f"{self.last_checkpoint()}; {divergence_hints(t)} in the config, then "
                                         f"start a new run (--config FILE --out NEW_DIR)") from None
                    self.append(SAMPLES_FILE, {"step": self.step, "prompt": "\n", "text": text, "time": time.time()})
                # the signal flags are read ONCE per step: a signal landing between a test of
                # "checkpoint?" and one of "stop?" must not stop the run without its checkpoint
                stop, saves = self.stop_requested, self.save_requests
                early = "val_loss" in rec and self.stopped_early(self.step, best)
                ckpt = (self.step % t.checkpoint_interval == 0 or self.step == last or stop or early
                        or saves != self.saves_done)
                if ckpt:
                    self.saves_done = saves
                if new_best is not None or ckpt:  # best.bin before this step's checkpoint: see _write_best
                    self.save(best_val=new_best, checkpoint=ckpt)
                if early or stop:
                    self.files.wait()            # the checkpoint is on disk before the run says it stopped
                if early:
                    self.log(f"early stop at step {self.step}: {t.early_stop} evaluations without a validation loss "
                             f"below {self.best['val_loss']:.4f} (step {self.best['step']}, in {BEST_FILE}); "
                             f"the run is finished")
                    return 0
                if stop:                          # the checkpoint was written just above
                    self.log(f"stopped by signal at step {self.step}; resume with --resume {self.run_dir}")
                    return 0
                self.files.poll()                 # a finished write's lines, and its error
            self.files.wait()
            return 0
        finally:
            failing = sys.exc_info()[0] is not None
            if own_handlers:
                self.restore_signal_handlers()
            try:
                self.files.wait()                 # a write in flight ends before the run does
            except BaseException:
                if not failing:                   # (an error already on its way out wins)
                    raise
            self.report_memory()

    def report_memory(self):
        """Planned bytes against what the device lost to this run (free memory before setup minus
        free memory now): the loop allocates nothing, so only compiled kernel code adds to it."""
        if SIMULATOR or not hasattr(self, "memory"):
            return
        used = self.free_before - cuda.current_context().get_memory_info()[0]
        self.memory["used_after_training_bytes"] = used
        mib = lambda b: f"{b / 2**20:,.1f} MiB"
        self.log(f"memory: planned {mib(self.planned_bytes)}, allocated by setup "
                 f"{mib(self.memory['allocated_by_setup_bytes'])}, in use after training {mib(used)}")
        self.write_state()

    def install_signal_handlers(self):
        """SIGTERM and SIGINT: checkpoint the step being trained, then stop; SIGUSR1: checkpoint and
        go on. The handlers only set flags, which the loop reads at a step boundary."""
        def stop(signum, frame):
            self.stop_requested = True

        def save(signum, frame):
            self.save_requests += 1

        self.handlers = {}
        for sig, h in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (getattr(signal, "SIGUSR1", None), save)):
            if sig is not None:
                self.handlers[sig] = signal.signal(sig, h)
        return self.handlers

    def restore_signal_handlers(self):
        for sig, h in (self.handlers or {}).items():
            signal.signal(sig, h)
        self.handlers = None


def format_eta(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    mnt, s = divmod(rem, 60)
    return f"{h}h{mnt:02d}m" if h else f"{mnt}m{s:02d}s"


# ----------------------------------------------------------------------------------------------
# command line

# flags that would make a resumed run another run: --resume refuses them
RESUME_FIXED = (("data", "--data"), ("batch_size", "--batch-size"), ("seq_len", "--seq-len"), ("seed", "--seed"),
                ("microbatches", "--microbatches"), ("precision", "--precision"), ("products", "--products"),
                ("out", "--out"), ("kernel", "--kernel"))


def build_config(args) -> Config:
    cfg = load_config(args.config or args.size or "12M")
    train = {k: v for k, v in (("steps", args.steps), ("seed", args.seed), ("batch_size", args.batch_size),
                               ("n_microbatches", args.microbatches), ("seq_len", args.seq_len),
                               ("precision", args.precision), ("products", args.products)) if v is not None}
    if (args.precision or "").startswith("fp8") and args.products is None:
        train["products"] = "cublas"      # FP8 products run through cuBLASLt only
    if args.kernel and args.precision is None:
        train["precision"] = "fp32"       # the kernel exercises are fp32 kernels, whatever the config's default
    raw = cfg.to_dict()
    raw["train"].update(train)
    source = args.data or raw["data"]["source"]
    if source != "stdlib":                # a corpus file: by its absolute path, whatever the working directory
        if not Path(source).is_file():
            raise D.missing_corpus(source)
        raw["data"]["source"] = str(Path(source).resolve())
    if train or raw != cfg.to_dict():
        cfg = config_from_dict(raw, origin="command line")
    return validate(cfg)


def resume_config(run_dir: Path, state: dict, steps: int | None) -> Config:
    """The run's own config from its state, a relative corpus path read relative to the run
    directory (runs written before paths were kept that way: to the working directory)."""
    for key, kind in (("step", int), ("data", dict)):
        if key in state and (not isinstance(state[key], kind) or isinstance(state[key], bool)):
            raise RunDirError(f"{run_dir / STATE_FILE}: '{key}' is not {'an integer' if kind is int else 'an object'}: "
                              f"restore the file or start a new run")
    if not isinstance(state.get("step"), int) or state["step"] < 0:
        raise RunDirError(f"{run_dir / STATE_FILE} has no step count ('step'): restore the file or start a new run")
    raw = json.loads(json.dumps(state["config"]))
    if steps is not None and isinstance(raw.get("train"), dict):
        raw["train"]["steps"] = steps
    data = raw.get("data")
    if isinstance(data, dict) and isinstance(data.get("source"), str) and data["source"] not in ("", "stdlib"):
        src = Path(data["source"])
        if not src.is_absolute() and (path_of(run_dir, data["source"]).exists() or not src.exists()):
            data["source"] = str(path_of(run_dir, data["source"]))
    return config_from_dict(raw, origin=str(run_dir / STATE_FILE))


def parser() -> Parser:
    ap = Parser(prog="python -m andrea_numba.train", description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--size", help="tiny, 12M or 120M (default 12M)")
    g.add_argument("--config", help="a config JSON file instead of a size")
    g.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its checkpoint "
                   "(with its own settings: only --steps, --log-every, --no-graph and --compile-workers may be given)")
    ap.add_argument("--data", help="a UTF-8 text file to train on (default: the config's source)")
    ap.add_argument("--out", help="run directory (default runs/<config name>)")
    ap.add_argument("--steps", type=positive_int, help="optimiser steps (default: the config's; with --resume, "
                    "a larger number trains a run further)")
    ap.add_argument("--seed", type=seed_type, help="seed of initialisation and data order")
    ap.add_argument("--batch-size", type=positive_int, help="sequences per microbatch")
    ap.add_argument("--microbatches", type=positive_int, help="microbatches per optimiser step")
    ap.add_argument("--seq-len", type=positive_int, help="tokens per sequence")
    ap.add_argument("--precision", metavar="P", help="of the products (linear ops and attention): fp32 (the "
                    "reference), bf16 or fp16 (their inputs rounded to it, fp32 sums; fp16 with dynamic loss "
                    "scaling; weights, gradients, AdamW, LayerNorm, the softmax and the loss stay fp32); fp8-fwd, "
                    "fp8-e5m2 or fp8-all: the linear layers' products in FP8 (E4M3 forward; the backward bf16, "
                    "E5M2 gradients or E4M3: Ada or Hopper GPUs, through cuBLASLt, so --products cublas); "
                    "default: the config's")
    ap.add_argument("--products", metavar="R", help="who computes the linear ops' products: numba (our "
                    "tensor-core kernels) or cublas (cuBLASLt through nvmath-python, pip install -e \".[cublas]\"; "
                    "a GPU only); default: the config's")
    ap.add_argument("--log-every", type=positive_int, default=10, help="print a progress line every N steps")
    ap.add_argument("--no-graph", action="store_true", help="launch every kernel of every step from Python "
                    "instead of replaying the step as a CUDA graph (the same results, bit for bit; slower)")
    ap.add_argument("--compile-workers", type=nonneg_int, default=None, metavar="N",
                    help="processes that compile the kernels before the first step (default: one per CPU, "
                    f"at most {MAX_WORKERS}; 0: each kernel is compiled at its first launch, in this process)")
    ap.add_argument("--kernel", type=your_kernels.flag, action="append", metavar="EXERCISE=FILE",
                    help="train with your kernel: a kernel exercise's file, graded first, in the engine's place "
                    f"(fp32 only: the run is fp32 unless --precision says otherwise; once per exercise: "
                    f"{', '.join(your_kernels.SLOTS)}); a resumed run keeps its own")
    return ap


def start_resume(args, log, launch_time) -> tuple[Trainer | None, RunLock]:
    """The Trainer of a run to resume and its directory's lock, checked through (nothing written);
    no Trainer for a finished run."""
    for attr, flag in RESUME_FIXED:
        if getattr(args, attr) is not None:
            raise TrainError(f"{flag} cannot be given with --resume: a resumed run keeps its own settings "
                             f"(only --steps, --log-every, --no-graph and --compile-workers may change); drop {flag}, or start a "
                             f"new run with --out")
    run_dir = Path(args.resume)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is a file, not a run directory: give --resume the directory of a run")
    lock = RunLock(run_dir)
    if run_dir.is_dir():
        lock.check()
    try:
        state = read_run_state(run_dir)
        cfg = resume_config(run_dir, state, args.steps)
        check_device(cfg, resuming=True)
        trainer = Trainer(cfg, run_dir, data_dir_of(run_dir, state), log, args.log_every, launch_time,
                          graph=not args.no_graph, compile_workers=compile_workers(args))
        found = trainer.check_resume(state)
    except BaseException:
        lock.release()
        raise
    if found["best"] is not None and trainer.stopped_early(found["step"], found["best"]):
        log(f"{run_dir} is finished: it stopped early at step {found['step']:,}, {cfg.train.early_stop} evaluations "
            f"after its best validation loss ({found['best']['val_loss']:.4f} at step {found['best']['step']:,}, "
            f"in {BEST_FILE}); nothing was changed")
        return None, lock
    if found["step"] >= cfg.train.steps:
        log(f"{run_dir} is finished: it trained all {found['step']:,} of its steps; to train it further, give "
            f"more steps: --resume {run_dir} --steps {2 * found['step']} (nothing was changed)")
        return None, lock
    try:
        trainer.kernels = resumed_kernels(run_dir, state, cfg)     # the run's own, graded again
    except BaseException:
        lock.release()
        raise
    return trainer, lock


def start_new(args, log, launch_time) -> tuple[Trainer, RunLock]:
    """The Trainer of a new run and its directory's lock, checked through (nothing written)."""
    cfg = build_config(args)
    run_dir = Path(args.out or f"runs/{cfg.name}")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--out {run_dir} is a file, not a directory: choose another --out")
    lock = RunLock(run_dir)
    if run_dir.is_dir():
        lock.check()
    try:
        has_state, has_ck = (run_dir / STATE_FILE).exists(), (run_dir / CHECKPOINT_FILE).exists()
        if has_state and not has_ck:
            raise RunDirError(f"{run_dir} holds a run that stopped before its first checkpoint: start it again "
                              f"from step 0 with --resume {run_dir}, choose another --out, or delete the directory")
        if has_state or has_ck:
            raise RunDirError(f"{run_dir} already holds a run: continue it with --resume {run_dir}, "
                              f"choose another --out, or delete the directory")
        check_device(cfg)
        kernels = your_kernels.prepare(args.kernel, cfg)        # graded, loaded and checked, or refused
    except BaseException:
        lock.release()
        raise
    return Trainer(cfg, run_dir, None, log, args.log_every, launch_time, graph=not args.no_graph,
                   compile_workers=compile_workers(args), kernels=kernels), lock


def resumed_kernels(run_dir: Path, state: dict, cfg: Config) -> list[YourKernel]:
    """The --kernel files a run started with (its state's record), graded and checked again; each must
    still hold the bytes the run trained with."""
    found = your_kernels.recorded(state, str(run_dir / STATE_FILE))
    for name, r in found.items():
        if not path_of(run_dir, r["file"]).is_file():
            raise KernelError(f"the run trained with your {name} from {path_of(run_dir, r['file'])}, which is gone: "
                              f"restore it to resume, or start a new run with --out")
    wanted = [(name, path_of(run_dir, r["file"])) for name, r in found.items()]
    return your_kernels.prepare(wanted, cfg, expect={name: r["sha256"] for name, r in found.items()})


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc), interpreter start-up and imports
    included; None where that cannot be read."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rpartition(")")[2].split()[19])      # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def compile_workers(args) -> int:
    return default_workers() if args.compile_workers is None else args.compile_workers


def main(argv=None) -> int:
    launch_time = time.monotonic()
    args = parser().parse_args(argv)
    if SIMULATOR:       # a diverging run's overflows would print numpy's warnings from every simulated thread
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"andrea_numba\.kernels\.")
    log = lambda s: print(s, flush=True)
    trainer = lock = None
    try:
        if not SIMULATOR and not cuda.is_available():
            raise TrainError("no CUDA GPU found: train on a machine with an NVIDIA GPU, or set "
                             "NUMBA_ENABLE_CUDASIM=1 to run the tiny size in the simulator (slow)")
        if args.resume:
            trainer, lock = start_resume(args, log, launch_time)
            if trainer is None:
                return 0
        else:
            trainer, lock = start_new(args, log, launch_time)
        trainer.install_signal_handlers()      # from here on a signal stops the run at a step boundary
        # every refusal is behind us: from here on the run directory is ours to write
        run_dir = trainer.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        lock.claim()
        dirs = [run_dir] + ([trainer.data_dir] if path_record(run_dir, trainer.data_dir) == DATA_DIR else [])
        removed = [remove_stale_temporaries(d) for d in dirs]
        if sum(r[0] for r in removed):
            log(f"removed {sum(r[0] for r in removed)} temporary file(s) left by an interrupted write "
                f"({sum(r[1] for r in removed):,} bytes freed)")
        if not args.resume:
            cfg = trainer.cfg
            log(f"{cfg.name}: {n_params(cfg.model):,} parameters, {device_name()}, run directory {run_dir}")
        trainer.setup(resume=bool(args.resume))
        trainer.compile_kernels()
        t0, tokens0 = time.time(), trainer.tokens_seen
        before = {k: trainer.timings.get(k, 0) for k in ("train_s", "first_steps_s", "first_steps")}
        trainer.write_state()
        code = trainer.run()
        here = {k: trainer.timings.get(k, 0) - v for k, v in before.items()}    # this process's steps
        average = trainer.average_mfu(trainer.tokens_seen - tokens0, here)
        wall = time.monotonic() - launch_time
        mine = (f"{time.time() - t0:.1f} s of training ({average}), total wall time "
                f"{wall:.1f} s ({wall / 60:.1f} min) from launch to exit")
        if tokens0:                          # resumed: the run's tokens, time and MFU, and this process's
            run_mfu = trainer.average_mfu(trainer.tokens_seen, trainer.timings)    # over the run's processes
            log(f"done: step {trainer.step}, {trainer.tokens_seen:,} tokens in the run ({trainer.elapsed():.1f} s "
                f"of wall time over its processes, {run_mfu}); this process: "
                f"{trainer.tokens_seen - tokens0:,} tokens, {mine}")
        else:
            log(f"done: step {trainer.step}, {trainer.tokens_seen:,} tokens, {mine}")
        return code
    except (ConfigError, CheckpointError, D.DataError, RunDirError, TrainError, PlanError, LossScaleError,
            KernelError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        return 2
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        print(f"error: {e.strerror or e}{where}: check the path and its permissions", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted before the run started; nothing was written", file=sys.stderr, flush=True)
        return 130
    finally:
        if trainer is not None and trainer.handlers is not None:
            trainer.restore_signal_handlers()
        if lock is not None:
            lock.release()


if __name__ == "__main__":
    sys.exit(main())
