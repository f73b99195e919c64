"""Time one forward + backward of the whole model on the GPU, beside PyTorch for the same shapes.

    python lab/bench/step_time.py                      # 12M at 16 x 512 and 120M at 8 x 1024
    python lab/bench/step_time.py --sizes 12M --json out.json
    python lab/bench/step_time.py --attention both     # flash attention (the engine's) and attention v2
    python lab/bench/step_time.py --flash-version 3 4  # flash attention v3 and v4 in the engine's place
    python lab/bench/step_time.py --mlp-version 6      # the MLP's v6 in place of the engine's
    python lab/bench/step_time.py --recipe fp32 tf32x3t simt  # the engine's fp32 recipe and two lab rungs

Prints a table: size, batch, forward ms, backward ms, tokens/s, and, when PyTorch is installed
(it is not a dependency of the project), the same GPT written in PyTorch in fp32 (TF32 off, as
our kernels) and in bf16 autocast, with PyTorch fp32's peak memory (torch.cuda.max_memory_allocated)
beside our buffers. "x fp32" is PyTorch fp32's time over ours: above 1, ours is faster. Ours is
timed twice: launched from Python (fwd ms, bwd ms: eager, as the harness and --no-graph run it)
and as one CUDA graph of the forward + backward replayed (graph ms: the trainer's way, the GPU's
time without the launch cost; on a GPU only).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))          # lab/ and andrea_numba/ from a checkout

from andrea_numba import cli
from andrea_numba.config import load_config
from andrea_numba.gpu_model import GPUModel
from lab import mlp as lab_mlp
from lab import attn_flash as lab_attn_flash
from lab import matmul as lab_matmul
from andrea_numba.kernels.common import SIMULATOR
from andrea_numba.layout import init_params, n_params
from lab.recipes import NAMES, flash_number, get, variant

SHAPES = {"tiny": (2, 16), "12M": (16, 512), "120M": (8, 1024)}


def time_ours(m, B, T, iters, flash=True, recipe="fp32"):
    model = GPUModel(m, B, T, flash=flash, recipe=recipe)
    model.params.copy_to_device(init_params(m, 0))
    rng = np.random.default_rng(0)
    tokens = cuda.to_device(rng.integers(0, m.vocab_size, (B, T)).astype(np.int32))
    targets = cuda.to_device(rng.integers(0, m.vocab_size, (B, T)).astype(np.int32))
    model.forward(tokens, targets)          # compile every kernel
    model.backward()
    cuda.synchronize()
    fwd, bwd = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        model.forward(tokens, targets)
        cuda.synchronize()
        t1 = time.perf_counter()
        model.backward()
        cuda.synchronize()
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
    return float(np.median(fwd)), float(np.median(bwd)), model.read_loss(), model.nbytes, graph_ms(model, tokens, targets, iters)


def graph_ms(model, tokens, targets, iters):
    """ms of one forward + backward recorded once as a CUDA graph and replayed (as the trainer
    replays its step): the GPU's time without Python's launches. None where graphs do not run."""
    if SIMULATOR:
        return None
    from andrea_numba.train import StepGraph

    def work(builder):
        with model.launching_on(builder):
            model.forward(tokens, targets)
            model.backward()
    try:
        graph = StepGraph(model.stream, work)
    except Exception as e:                   # noqa: BLE001 (reported; the eager times stand)
        print(f"graph capture failed ({' '.join(str(e).split())})", file=sys.stderr)
        return None
    return graph.replay_ms(iters)


def torch_gpt(m, B, T, device="cuda"):
    """The same GPT in PyTorch, fp32 with TF32 off, on the GPU (PyTorch imported here: it is not a
    dependency of the project); device "cpu" builds it on the host, to try the code without a GPU."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    C, H = m.d_model, m.n_head

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv = nn.Linear(C, 3 * C, bias=False)
            self.o = nn.Linear(C, C, bias=False)
            self.fc1, self.fc2 = nn.Linear(C, 4 * C, bias=False), nn.Linear(4 * C, C, bias=False)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            x = x + self.o(y)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(m.vocab_size, C), nn.Embedding(m.context_length, C)
            self.blocks = nn.ModuleList(Block() for _ in range(m.n_layer))
            self.lnf = nn.LayerNorm(C)

        def forward(self, idx, tgt):
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for b in self.blocks:
                x = b(x)
            logits = self.lnf(x) @ self.wte.weight.T
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))

    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()   # this size's peak, not an earlier size's in the same run
    model = GPT().to(device)
    idx = torch.randint(0, m.vocab_size, (B, T), device=device)
    tgt = torch.randint(0, m.vocab_size, (B, T), device=device)
    return model, idx, tgt


def time_torch(m, B, T, iters, bf16, compiled=False):
    """Median seconds of one forward + backward of PyTorch's GPT (fp32 or bf16 autocast), and its
    peak memory in GB; compiled: the model through torch.compile first (its compile time excluded:
    three untimed calls come first)."""
    import gc

    import torch
    gc.collect()                                  # the last call's model gone: each peak is its own
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model, idx, tgt = torch_gpt(m, B, T)
    if compiled:
        model = torch.compile(model)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else torch.autocast("cuda", enabled=False)
    times = []
    for i in range(iters + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with ctx:
            loss = model(idx, tgt)
        loss.backward()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=False)
    return float(np.median(times)), torch.cuda.max_memory_allocated() / 1e9


def time_torch_train_step(m, tr, B, T, iters):
    """Median seconds of PyTorch fp32's whole training step as the trainer runs one (config `tr`):
    tr.n_microbatches forward + backward passes of B x T (the gradients added up, each loss
    divided by n_microbatches), the global norm clipped to tr.clip_norm, torch.optim.AdamW's step
    (its default implementation on CUDA, weight decay on the 2-D tensors as ours) and zero_grad."""
    import torch
    model, idx, tgt = torch_gpt(m, B, T)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tr.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=tr.lr, betas=(tr.beta1, tr.beta2), eps=tr.eps)
    times = []
    for i in range(iters + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(tr.n_microbatches):
            loss = model(idx, tgt) / tr.n_microbatches
            loss.backward()
        if tr.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tr.clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=False)
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv=None):
    ap = cli.Parser(prog="python lab/bench/step_time.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", choices=list(SHAPES), default=["12M", "120M"])
    ap.add_argument("--iters", type=cli.int_range(1, 10_000), default=5)
    ap.add_argument("--json", type=cli.file_to_write(".json"), help="write the results here too")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    ap.add_argument("--torch-train-step", action="store_true",
                    help="also time PyTorch fp32's whole training step as the size's config runs one "
                         "(its microbatches, clipping, AdamW): the reference of the trainer's step")
    ap.add_argument("--torch-compile", action="store_true",
                    help="also time PyTorch's bf16 autocast through torch.compile (its compile time excluded)")
    ap.add_argument("--attention", choices=("flash", "plain", "both"), default="flash",
                    help="flash attention (the engine's default), attention v2 (saves the probabilities), or both")
    ap.add_argument("--flash", action="store_const", const="both", dest="attention", help="the same as --attention both")
    ap.add_argument("--recipe", nargs="+", choices=NAMES, default=["fp32"],
                    help="the recipes to time: the engine's (andrea_numba/recipes.py) or the lab's rungs "
                         "(lab/recipes.py); default fp32")
    ap.add_argument("--flash-version", nargs="+", type=int, choices=sorted(lab_attn_flash.VERSIONS["attn_flash_bwd"])[1:],
                    help="flash attention versions to time (default: the model's own: the engine's in fp32, v11 "
                         "with bf16 products, v12 with fp16)")
    ap.add_argument("--mlp-version", type=int, choices=sorted(v for v in lab_mlp.VERSIONS["mlp_fwd"] if v >= 5),
                    help="run the MLP's launchers of this version in the model (5 and 6: the k-major tiles)")
    ap.add_argument("--tma-matmul", nargs="+", type=int, choices=(18, 19, 23), default=[18],
                    help="with products on TMA (bf16t, bf16s, bf16-hopper): time each with these matmul versions "
                         "(18, the engine's; 19 and 23: the split-K slices added in the product's kernel)")
    args = ap.parse_args(argv)
    flash_versions = args.flash_version or [None]          # None: the model's own (by its products' precision)
    rows, train_steps = [], []         # train_steps: a line for each size's PyTorch training step
    for size in args.sizes:
        m = load_config(size).model
        B, T = SHAPES[size]
        torch_row = {}
        try:
            if args.no_torch:
                raise ImportError
            torch_row["torch_fp32_ms"], torch_row["torch_fp32_peak_GB"] = time_torch(m, B, T, args.iters, bf16=False)
            torch_row["torch_fp32_ms"] *= 1e3
            torch_row["torch_bf16_ms"], torch_row["torch_bf16_peak_GB"] = time_torch(m, B, T, args.iters, bf16=True)
            torch_row["torch_bf16_ms"] *= 1e3
            if args.torch_compile:          # PyTorch bf16 through torch.compile
                ms, _ = time_torch(m, B, T, args.iters, bf16=True, compiled=True)
                torch_row["torch_bf16_compiled_ms"] = ms * 1e3
                train_steps.append(f"PyTorch bf16 autocast through torch.compile, {size}: {ms * 1e3:.2f} ms a "
                                   f"forward + backward")
            if args.torch_train_step:
                tr = load_config(size).train
                step_s = time_torch_train_step(m, tr, tr.batch_size, tr.seq_len, args.iters)
                torch_row.update(torch_train_step_ms=step_s * 1e3, torch_train_step_shape=[tr.n_microbatches, tr.batch_size, tr.seq_len],
                                 torch_train_step_tokens_per_s=tr.n_microbatches * tr.batch_size * tr.seq_len / step_s)
                train_steps.append(f"PyTorch fp32 training step, {size}: {tr.n_microbatches} x {tr.batch_size} x "
                                   f"{tr.seq_len} forward + backward, clipping, AdamW: {step_s * 1e3:.2f} ms, "
                                   f"{torch_row['torch_train_step_tokens_per_s']:,.0f} tokens/s")
        except ImportError:
            pass
        for name in args.recipe:
            recipe = get(name)
            runs = [(False, None)] if args.attention != "flash" else []
            runs += [(True, v or flash_number(recipe)) for v in flash_versions] if args.attention != "plain" else []
            tma = args.tma_matmul if recipe.tensor_maps else [18]
            for (flash, fv), mm in ((r, v) for r in runs for v in tma):
                with lab_matmul.tma_matmul(mm):                # (18: the engine's)
                    fwd, bwd, loss, nbytes, graph = time_ours(
                        m, B, T, args.iters, flash=flash,
                        recipe=variant(recipe, args.mlp_version, fv if flash else None))
                row = {"size": size, "recipe": name + ("" if mm == 18 else f"/mm{mm}"), "flash": flash,
                       "flash_version": fv,
                       "mlp_version": args.mlp_version, "B": B, "T": T,
                       "params": n_params(m),
                       "fwd_ms": fwd * 1e3, "bwd_ms": bwd * 1e3, "tokens_per_s": B * T / (fwd + bwd), "graph_ms": graph,
                       "loss": loss, "buffers_GB": nbytes / 1e9, **torch_row}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    head = (f"{'size':<6} {'recipe':<12} {'flash':<5} {'B x T':>9} {'fwd ms':>8} {'bwd ms':>8} {'tok/s':>9} "
            f"{'GB':>6} {'torch fp32 ms':>14} {'x fp32':>7} {'torch GB':>9} {'torch bf16 ms':>14} {'bf16 GB':>8} "
            f"{'graph ms':>9} {'graph x fp32':>13} {'graph x bf16':>13}")
    print(head)
    for r in rows:
        ours = r["fwd_ms"] + r["bwd_ms"]
        print(f"{r['size']:<6} {r['recipe']:<12} {'v%d' % r['flash_version'] if r['flash'] else 'no':<5} {r['B']:>4} x {r['T']:<4} "
              f"{r['fwd_ms']:>8.1f} {r['bwd_ms']:>8.1f} {r['tokens_per_s']:>9.0f} {r['buffers_GB']:>6.2f} "
              f"{r.get('torch_fp32_ms', float('nan')):>14.1f} {r.get('torch_fp32_ms', float('nan')) / ours:>7.2f} "
              f"{r.get('torch_fp32_peak_GB', float('nan')):>9.2f} {r.get('torch_bf16_ms', float('nan')):>14.1f} "
              f"{r.get('torch_bf16_peak_GB', float('nan')):>8.2f} {r['graph_ms'] or float('nan'):>9.1f} "
              f"{r.get('torch_fp32_ms', float('nan')) / (r['graph_ms'] or float('nan')):>13.2f} "
              f"{r.get('torch_bf16_ms', float('nan')) / (r['graph_ms'] or float('nan')):>13.2f}")
    for line in train_steps:
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
