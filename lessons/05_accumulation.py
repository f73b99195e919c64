"""Lesson 05: gradient accumulation over microbatches, shown on the engine's real buffers.

What it teaches
    1. GPUModel.backward ADDS into the flat gradient buffer (+=); it never overwrites it.
    2. Zero the buffer, run microbatch 1 forward + backward: the buffer holds g1. Run microbatch 2
       WITHOUT zeroing: it now holds g1 + g2, exactly what the NumPy twin gives for the sum.
    3. Scaling by 1/2 (andrea_numba.kernels.optim.grad_scale, the trainer's k_grad_scale) turns
       the sum into the gradient of the MEAN loss over both microbatches, which is the gradient of
       one batch of 2 sequences: two small microbatches train like one big batch, at half the
       activation memory (lesson 04).
    4. A bar chart of the per-tensor gradient norms of microbatch 1, microbatch 2 and their sum.

How to run (the kernels run in Numba's CUDA simulator without a GPU: about 10-20 s)

    python lessons/05_accumulation.py
    python lessons/05_accumulation.py --interactive --figures figs/

Open it in Jupyter or VS Code as a notebook: the `# %%` lines are cells.
"""
# %%
import _common as C

args = C.start(__doc__)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import reference as R  # noqa: E402
from andrea_numba.config import load_config  # noqa: E402
from andrea_numba.gpu_model import GPUModel  # noqa: E402
from andrea_numba.kernels import optim  # noqa: E402
from andrea_numba.layout import init_params, param_layout  # noqa: E402

cfg = load_config("tiny")
m = cfg.model
B, T = 1, 8
params = init_params(m, seed=1337)
specs = param_layout(m)


def norms(flat):
    """Per-tensor L2 norm of a flat vector, in layout order."""
    return np.array([np.linalg.norm(flat[s.offset:s.end].astype(np.float64)) for s in specs])


def twin_grad(tokens, targets):
    """d(mean loss)/d(params) from the NumPy twin, in float64 on the same float32 weights."""
    p64 = params.astype(np.float64)
    loss, acts = R.model_forward(p64, m, tokens.astype(np.int64), targets.astype(np.int64))
    return float(loss), R.model_backward(p64, m, acts)


text = b"for i in range(n):\n    total += i\n"
ids = np.frombuffer(text, dtype=np.uint8).astype(np.int32)
mb = [(ids[None, s:s + T].copy(), ids[None, s + 1:s + T + 1].copy()) for s in (0, 19)]

SHOW = [("wte", (ord("i"), 0)), ("h1.mlp.w_2", (3, 5)), ("lnf.g", (2,))]
flat_idx = {name: {s.name: s for s in specs}[name].offset
            + int(np.ravel_multi_index(idx, {s.name: s for s in specs}[name].shape)) for name, idx in SHOW}


def grads_to_host():
    """The gradient buffer copied to the host, on the model's stream (where its kernels run), then
    waited for: the numbers are final only once the stream has done everything queued before."""
    out = model.grads.copy_to_host(stream=model.stream)
    model.stream.synchronize()
    return out


def show(label_values):
    rows = []
    for name, idx in SHOW:
        i = flat_idx[name]
        rows.append([f"{name}[{', '.join(map(str, idx))}]"] + [v[i] for _, v in label_values])
    rows.append(["norm (whole vector)"] + [float(np.linalg.norm(v.astype(np.float64))) for _, v in label_values])
    C.table(rows, header=["gradient entry"] + [lbl for lbl, _ in label_values],
            fmt=[""] + [".9f"] * len(label_values))


# %%
C.step("A GPUModel and two microbatches")
model = GPUModel(m, B, T)
model.params.copy_to_device(params, stream=model.stream)
C.say(f"""
    {cfg.name} ({sum(s.size for s in specs):,} parameters) on device buffers allocated once, at
    microbatch B = {B}, T = {T}. The weights go in as one flat vector. Two microbatches of one
    sequence each, bytes of a small program:
""")
for k, (x, y) in enumerate(mb, 1):
    print(f"    microbatch {k}: input {bytes(x[0].astype(np.uint8))!r:<14} -> targets {bytes(y[0].astype(np.uint8))!r}")
print()

# %%
C.step("Zero the gradient buffer, then microbatch 1: forward and backward")
model.zero_grads()
model.forward(*mb[0])
loss1 = model.read_loss()
model.backward()
buf1 = grads_to_host()
tl1, g1 = twin_grad(*mb[0])
C.say("""
    zero_grads launches k_zero over the whole flat gradient. forward saves the activations;
    backward adds d(loss of microbatch 1)/d(params) into the gradient buffer. We copy the buffer
    to the host to look at it, and compute the same gradient with the NumPy twin (float64).
""")
show([("buffer (kernels)", buf1), ("twin g1", g1)])
d1 = float(np.max(np.abs(buf1 - g1)))
C.say(f"""
    Loss {loss1:.6f} on the kernels, {tl1:.6f} in the twin. Largest |buffer - g1| over all entries:
    {d1:.1e} (float32 kernels against a float64 twin: the last digits differ, nothing more).
""")

# %%
C.step("Microbatch 2 WITHOUT zeroing: the buffer holds the sum")
model.forward(*mb[1])
loss2 = model.read_loss()
model.backward()
buf12 = grads_to_host()
tl2, g2 = twin_grad(*mb[1])
show([("buffer now", buf12), ("twin g2", g2), ("twin g1 + g2", g1 + g2)])
d12 = float(np.max(np.abs(buf12 - (g1 + g2))))
d2 = float(np.max(np.abs(buf12 - g2)))
C.say(f"""
    Every backward kernel that writes a parameter gradient ADDS to it (grads += ...), like the
    `+=` into one buffer of lesson 01's fork. So after the second backward the buffer is g1 + g2:
    largest |buffer - (g1 + g2)| = {d12:.1e}, while |buffer - g2| reaches {d2:.1e}, so it is not g2
    alone. This is accumulation, and it is also the classic bug: forget zero_grads between
    optimiser steps and every step adds the stale gradients of all the steps before it.
""")
assert d12 < 1e-4 * np.max(np.abs(g1 + g2)), d12

# %%
C.step("Scale by 1/2 on the device: the gradient of the mean loss")
norm_dummy = cuda.to_device(np.zeros(1, np.float32), stream=model.stream)   # read only when clipping
optim.grad_scale(model.grads, norm_dummy, 0.0, 0.5, stream=model.stream)    # max_norm = 0: a plain scaling by 1/2
mean_buf = grads_to_host()
both = (np.concatenate([mb[0][0], mb[1][0]]), np.concatenate([mb[0][1], mb[1][1]]))
tl_both, g_both = twin_grad(*both)
show([("buffer * 1/2", mean_buf), ("twin (g1+g2)/2", (g1 + g2) / 2), ("twin, one batch of 2", g_both)])
dm = float(np.max(np.abs(mean_buf - g_both)))
C.say(f"""
    grad_scale(grads, norm, 0.0, 0.5) multiplies the buffer by 1/2 in place (max_norm = 0 means
    no clipping, so the norm argument is not read). The trainer does exactly this with
    1 / n_microbatches before clipping.

    The loss is the MEAN over positions, and both microbatches have the same number of tokens, so
    the mean of the two losses, ({loss1:.6f} + {loss2:.6f}) / 2 = {(loss1 + loss2) / 2:.6f}, is the
    loss of ONE batch holding both sequences ({tl_both:.6f} in the twin at B = 2). Its gradient is
    therefore (g1 + g2) / 2. Largest |scaled buffer - twin gradient at B = 2| = {dm:.1e}.

    Two microbatches of 1 sequence give the gradient of a batch of 2, with the activations of
    only one sequence in memory at a time.
""")
assert dm < 1e-4 * np.max(np.abs(g_both)), dm

# %%
C.step("Per-tensor gradient norms: microbatch 1, microbatch 2, their sum")
n1, n2, n12 = norms(buf1), norms(buf12 - buf1), norms(buf12)
names = [s.name for s in specs]
fig, ax = plt.subplots(figsize=(12, 4.5))
xs = np.arange(len(names))
w = 0.28
ax.bar(xs - w, n1, w, label="microbatch 1 (g1)")
ax.bar(xs, n2, w, label="microbatch 2 (g2)")
ax.bar(xs + w, n12, w, label="buffer after both (g1 + g2)")
ax.set_yscale("log")
ax.set_xticks(xs)
ax.set_xticklabels(names, rotation=70, ha="right", fontsize=8)
ax.set_ylabel("L2 norm of the tensor's gradient")
ax.set_title("gradient accumulation: per-tensor norms (log scale)")
ax.legend(frameon=False)
C.savefig(fig, "05_grad_norms.png")
top = np.argsort(-n12)[:6]
C.table([(names[i], n1[i], n2[i], n12[i], n1[i] + n2[i]) for i in top],
        header=("tensor (largest 6)", "|g1|", "|g2|", "|g1 + g2|", "|g1| + |g2|"), fmt=("", ".5f", ".5f", ".5f", ".5f"))
C.say("""
    The norm of the sum is never more than the sum of the norms (triangle inequality) and is
    usually less: where the two microbatches disagree, their gradients partly cancel; where they
    agree, they add up. Averaging over more data keeps the directions most sequences agree on;
    that is why a larger batch gives a less noisy step. (wte leads the list: it is used twice,
    as the embedding and as the tied output projection, and both uses add their shares.)
""")

C.finish()
