"""Lesson 04: where gradients live. One flat vector, one layout, and the memory a run needs.

What it teaches
    1. Every parameter tensor of the model is a VIEW into one flat float32 vector (the table of
       ANDREA-tiny from andrea_numba.layout.layout_table). Writing into a view writes the vector.
    2. The gradient, Adam's m and Adam's v use the very same layout: element i of each belongs to
       the same weight, so the optimiser is one loop over n_params elements.
    3. The checkpoint is those vectors on disk: an 8-byte header, then weights, m and v.
    4. The memory plan of ANDREA-120M at batch 8 x 1024, computed by the engine
       (andrea_numba.plan: memory_plan, format_plan): the saved activations dwarf the weights. The
       probabilities of plain attention, L x B x H x T x T floats, would dwarf them all: the
       engine's flash attention never stores them.
    5. What a smaller microbatch saves (the same tokens per step in more, smaller microbatches).

How to run (no kernels are launched; the plan is arithmetic on buffer shapes; a few seconds)

    python lessons/04_where_gradients_live.py
    python lessons/04_where_gradients_live.py --interactive --figures figs/

Open it in Jupyter or VS Code as a notebook: the `# %%` lines are cells.
"""
# %%
import _common as C

args = C.start(__doc__)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from andrea_numba.plan import format_plan, memory_plan  # noqa: E402
from andrea_numba.checkpoint import HEADER, checkpoint_bytes  # noqa: E402
from andrea_numba.config import load_config  # noqa: E402
from andrea_numba.gpu_model import buffer_specs  # noqa: E402
from andrea_numba.layout import init_params, layout_table, n_params, param_layout, views  # noqa: E402

MiB, GiB = 2**20, 2**30
tiny = load_config("tiny").model

# %%
C.step("The flat parameter layout of ANDREA-tiny")
C.say("""
    The model's learnable tensors are laid end to end in ONE float32 vector. Each has a name, a
    shape and an offset (the index of its first element). The order is fixed once, in
    andrea_numba/layout.py, and shared by the NumPy twin, the CUDA engine and the checkpoint:
""")
print("\n".join("    " + line for line in layout_table(tiny).splitlines()))
print()
C.say(f"""
    "weight decay: yes" marks the 2-D tensors (embeddings and linear weights): AdamW shrinks those,
    not the LayerNorm gains and biases. The total, {n_params(tiny):,}, is the vector's length.
""")

# %%
C.step("Tensors are views into the vector, not copies")
flat = init_params(tiny, seed=1337)
P = views(flat, tiny)
w = P["h1.mlp.w_2"]
spec = {s.name: s for s in param_layout(tiny)}["h1.mlp.w_2"]
C.say(f"""
    views(flat, m) returns a dict of NumPy views. P["h1.mlp.w_2"] has shape {w.shape}, but its
    memory is flat[{spec.offset}:{spec.end}]: element (r, c) lives at flat[{spec.offset} + r * {w.shape[1]} + c].
""")
before = float(flat[spec.offset + 1 * w.shape[1] + 2])
w[1, 2] = 42.0
after = float(flat[spec.offset + 1 * w.shape[1] + 2])
C.table([(f"flat[{spec.offset} + 1*8 + 2] before", f"{before:.6f}"), ("after P['h1.mlp.w_2'][1, 2] = 42", f"{after:.6f}"),
         ("np.shares_memory(flat, w)", np.shares_memory(flat, w))], header=("", "value"))
w[1, 2] = before
C.say("""
    Nothing was copied: the write into the 2-D view changed the flat vector. The same works on
    the GPU (a device-array slice reshaped is a view too), which is how GPUModel hands each kernel
    its own tensor while the optimiser sees one vector.
""")

# %%
C.step("The gradient, Adam m and Adam v share the layout")
grads = np.zeros_like(flat)
adam_m, adam_v = np.zeros_like(flat), np.zeros_like(flat)
G = views(grads, tiny)
G["lnf.g"][3] += 0.5          # what a backward does: += into a named view of the gradient vector
i = {s.name: s for s in param_layout(tiny)}["lnf.g"].offset + 3
C.say(f"""
    grads, m and v are three more vectors of {n_params(tiny):,} floats with the same offsets. A
    backward writes G["lnf.g"][3] += 0.5; that lands in grads[{i}], and the weight it belongs to is
    params[{i}], its Adam moments m[{i}] and v[{i}]. So AdamW needs no names at all: one thread per
    index i reads params[i], grads[i], m[i], v[i] (andrea_numba/kernels/optim.py, k_adamw), and
    the global gradient norm is one reduction over one vector.
""")
C.table([("params", flat[i]), ("grads", grads[i]), ("adam m", adam_m[i]), ("adam v", adam_v[i])],
        header=(f"vector[{i}]", "value"), fmt=("", ".4f"))

# %%
C.step("The checkpoint: the vectors on disk")
big_cfg = load_config("120M")
big = big_cfg.model
rows = []
for name, m in (("ANDREA-tiny", tiny), (big_cfg.name, big)):
    n = n_params(m)
    rows += [(name, "header: int32 step, int32 n_params", HEADER.itemsize),
             (name, "weights: n_params float32", 4 * n), (name, "Adam m: n_params float32", 4 * n),
             (name, "Adam v: n_params float32", 4 * n), (name, "total file", checkpoint_bytes(n))]
C.table([(a, b, f"{c:,}", f"{c / MiB:,.2f}") for a, b, c in rows], header=("model", "part", "bytes", "MiB"))
C.say(f"""
    Little-endian, packed, nothing else: 8 + 12 * n_params bytes. The gradient is NOT saved: it
    is zeroed after every step and rebuilt by the next backward. m and v ARE saved: they are the
    optimiser's memory of past gradients, and without them a resumed run would take different
    steps (lesson 06). For 120M the file is {checkpoint_bytes(n_params(big)) / GiB:.2f} GiB.
""")

# %%
C.step("The memory plan of ANDREA-120M at batch 8 x 1024")
plan = memory_plan(big_cfg)
t = big_cfg.train
C.say(f"""
    Before its first step the trainer lists every buffer it will allocate on the GPU, by kind,
    and refuses to start if they do not fit. This is the engine's own plan (andrea_numba.plan.memory_plan,
    printed by format_plan) for {big_cfg.name}, microbatch {t.batch_size} x {t.seq_len}:
""")
print("\n".join("    " + line for line in format_plan(plan).splitlines()))
print()
by_kind = {}
for kind, _, nb in plan:
    by_kind[kind] = by_kind.get(kind, 0) + nb
total = sum(by_kind.values())
C.table([(k, f"{v / MiB:,.1f}", f"{100 * v / total:.1f}%") for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])],
        header=("kind", "MiB", "share"))
C.say("""
    params and grads: one float each per parameter. optimizer: Adam's m and v (a float each) and
    the one-byte weight-decay mask. activations: what the forward saves for the backward. scratch:
    the backward's temporary gradients of one layer at a time (reused by every layer). step: the
    token batches and the step's scalars (dropout keys, learning rate), copied in before each step.
    sampler: the text samples printed during training are drawn one position a token on a KV cache
    (each block's k and v of every position so far, 2 x n_layer x seq_len x d_model floats, and a
    few rows); past seq_len the sampler's whole forward runs on the first row of the training
    model's buffers.
""")

# %%
C.step("Which saved tensor is largest, and why")
acts = sorted([r for r in plan if r[0] == "activations"], key=lambda r: -r[2])
shapes = {s.name: s.shape for s in buffer_specs(big, t.batch_size, t.seq_len)}
C.table([(name, " x ".join(map(str, shapes[name])), f"{nb / MiB:,.1f}") for _, name, nb in acts[:8]],
        header=("activation", "shape", "MiB"))
L, B, H, T, C_, V = big.n_layer, t.batch_size, big.n_head, t.seq_len, big.d_model, big.vocab_size
att = 4 * L * B * H * T * T
plain = sum(s.nbytes for s in buffer_specs(big, t.batch_size, t.seq_len, flash=False))   # attention v2's buffers
flash = sum(s.nbytes for s in buffer_specs(big, t.batch_size, t.seq_len))                 # the engine's
C.say(f"""
    The largest are `probs` (B*T x V = {B * T:,} x {V:,}: a softmax over the whole vocabulary at
    every position) and the MLP's hidden layer (`h_pre`, `h`: 4C = {4 * C_} wide, kept before and
    after GELU).

    Missing from the list is what plain attention saves for its backward: `att`, the softmax
    probabilities, one T x T matrix per layer, sequence and head, L x B x H x T x T = {L} x {B} x
    {H} x {T} x {T} floats = {att / GiB:.2f} GiB, more than probs, h_pre and h together. It grows
    with T SQUARED: every token attends to every earlier token. The engine runs flash attention
    (kernels/attn_flash.py): it saves one number per row instead, the log-sum-exp `lse`
    (L x B x H x T floats = {L * B * H * T * 4 / MiB:.1f} MiB), and its backward recomputes the
    probabilities tile by tile. GPUModel(flash=False) runs plain attention (attention v2), whose
    buffers hold `att` and a T x T scratch: {plain / GiB:.2f} GiB against flash attention's
    {flash / GiB:.2f} GiB.

    Why activations dominate: weights, gradients and Adam's m and v are 4 x n_params floats
    ({4 * 4 * n_params(big) / GiB:.2f} GiB), whatever the batch. Activations are kept for EVERY
    token of the microbatch, in every layer, because the backward (lesson 02's price for reverse
    mode) needs them: they scale with B*T, and attention's with B*T*T.
""")

# %%
C.step("What a smaller microbatch saves")
tokens_per_step = t.batch_size * t.seq_len * t.n_microbatches
rows, kinds_by_b = [], {}
for b in (8, 4, 2, 1):
    p = memory_plan(big_cfg, b)
    kk = {}
    for kind, _, nb in p:
        kk[kind] = kk.get(kind, 0) + nb
    kinds_by_b[b] = kk
    n_micro = tokens_per_step // (b * t.seq_len)
    rows.append((b, n_micro, f"{kk['activations'] / GiB:.2f}", f"{kk['scratch'] / GiB:.2f}",
                 f"{(kk['params'] + kk['grads'] + kk['optimizer']) / GiB:.2f}", f"{sum(kk.values()) / GiB:.2f}"))
C.table(rows, header=("microbatch B", "microbatches/step", "activations GiB", "scratch GiB",
                      "weights+grads+Adam GiB", "total GiB"))
C.say(f"""
    The run takes {tokens_per_step:,} tokens per optimiser step ({t.n_microbatches} microbatches of {t.batch_size} x {t.seq_len}). Halving
    the microbatch halves the activations and the scratch, and doubling the number of microbatches
    keeps the step the same: gradients add up over microbatches (lesson 05). The fixed part,
    weights + gradients + Adam, does not shrink; on a small GPU it is the floor. This is what the
    trainer suggests when a plan does not fit: "use --batch-size b --microbatches n". The price
    is time: smaller launches use the GPU less well.
""")
bs = [8, 4, 2, 1]
order = ["params", "grads", "optimizer", "activations", "scratch", "step", "sampler"]
fig, ax = plt.subplots(figsize=(7, 4.5))
bottom = np.zeros(len(bs))
for kind in order:
    vals = np.array([kinds_by_b[b].get(kind, 0) / GiB for b in bs])
    ax.bar([str(b) for b in bs], vals, bottom=bottom, label=kind)
    bottom += vals
ax.set_xlabel("microbatch size B (sequences of 1024 tokens)")
ax.set_ylabel("GiB on the GPU")
ax.set_title(f"{big_cfg.name}: memory plan by kind")
ax.legend(frameon=False)
C.savefig(fig, "04_memory_plan.png")

C.finish()
