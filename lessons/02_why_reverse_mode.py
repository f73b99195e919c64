"""Lesson 02: why training uses reverse mode. Count the passes, then time them on the tiny model.

What it teaches
    1. Forward mode pushes ONE input direction through the model per pass: the gradient of a
       loss with n parameters needs n passes. For ANDREA-120M that is 124,392,960 passes.
    2. Reverse mode pulls the gradient of ONE output (the loss) back to every input in one
       backward pass, which costs about twice a forward.
    3. FLOP counts turn this into time: a forward costs ~2 * n_params FLOPs per token, so one
       8 x 1024 batch of ANDREA-120M is ~2 TFLOP forward; forward mode for the whole gradient
       would take about a year on an H200, reverse mode under a second.
    4. On the tiny model (3,792 parameters) with the NumPy twin: one forward-mode directional
       derivative (a centred difference along one parameter), all 3,792 of them, against one
       reverse pass that gives all 3,792 gradients at once. Timed, and checked to agree.

How to run (NumPy only, no kernels; about 9 s on a 2-core CPU, most of it the 7,584 forward passes)

    python lessons/02_why_reverse_mode.py
    python lessons/02_why_reverse_mode.py --interactive --figures figs/

Open it in Jupyter or VS Code as a notebook: the `# %%` lines are cells.
"""
# %%
import time

import _common as C

args = C.start(__doc__)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import reference as R  # noqa: E402
from andrea_numba.config import load_config  # noqa: E402
from andrea_numba.layout import init_params, n_params, param_layout  # noqa: E402

big = load_config("120M")
tiny = load_config("tiny")
N_BIG = n_params(big.model)
N_TINY = n_params(tiny.model)

# %%
C.step("Count the passes")
C.say(f"""
    Training needs dL/dp for EVERY parameter p. There are two ways to run the chain rule of
    lesson 01 through a big graph.

    Forward mode starts at one input, sets its "tangent" to 1 (all other inputs 0) and carries
    the derivative forward beside the values, link by link, up to the loss. One pass gives
    dL/dp for that one p. A gradient of n parameters needs n passes.

    Reverse mode starts at the loss with dL/dL = 1 and carries the gradient backward, link by
    link, to every input at once. One backward pass gives dL/dp for ALL p. It costs about two
    forwards (each matrix product y = x W needs two products back: dx = dy W^T and dW = x^T dy),
    plus the forward that saved the activations.

    The 120M model ({big.name}) has n_params = {N_BIG:,}:
""")
C.table([("forward mode", f"{N_BIG:,}", "one per parameter"),
         ("reverse mode", "1 forward + 1 backward", "about 3 forwards in all")],
        header=("method", "passes for one gradient", "cost"))

# %%
C.step("Estimate the time with FLOP counts (ANDREA-120M, one 8 x 1024 batch)")
t = big.train
tokens = t.batch_size * t.seq_len
fwd_flops = 2 * N_BIG * tokens
bwd_flops = 2 * fwd_flops
C.say(f"""
    A forward pass multiplies every weight by one number and adds the product, per token: about
    2 FLOPs (one multiply, one add) per parameter per token. (Attention's own products, Q K^T and
    att V, add roughly 15% at 1024 tokens; the estimate leaves them out, and the embedding lookup
    is counted although it does no arithmetic. It is a rule of thumb, good to a factor 1.3.)

    One batch is {t.batch_size} x {t.seq_len} = {tokens:,} tokens:

        forward   ~ {f"2 * {N_BIG:,} * {tokens:,}":<28} = {fwd_flops:.3e} FLOPs
        backward  ~ {"2 * forward":<28} = {bwd_flops:.3e} FLOPs
""")
# Measured on an H200 (CHANGELOG.md): our kernels take 265.1 ms forward and 609.2 ms backward
# for ANDREA-120M at 8 x 1024, i.e. about 7.7 TFLOP/s on the forward by the estimate above.
fwd_s, bwd_s = 0.2651, 0.6092
rate = fwd_flops / fwd_s
year = 365.25 * 24 * 3600
forward_mode_s = N_BIG * fwd_s          # one (dual-number) forward per parameter, at best
central_diff_s = 2 * N_BIG * fwd_s      # two forwards per parameter
reverse_s = fwd_s + bwd_s
C.say(f"""
    Our kernels, measured on an NVIDIA H200 (CHANGELOG.md), run this forward in
    {fwd_s * 1e3:.1f} ms and the backward in {bwd_s * 1e3:.1f} ms: {rate / 1e12:.1f} TFLOP/s by this count.
    Turn the pass counts into time:
""")
C.table([("reverse mode: 1 forward + 1 backward", f"{reverse_s:.3f} s", ""),
         ("forward mode: n_params forwards", f"{forward_mode_s:,.0f} s", f"{forward_mode_s / year:.2f} years"),
         ("centred differences: 2 n_params forwards", f"{central_diff_s:,.0f} s", f"{central_diff_s / year:.2f} years")],
        header=("gradient of one batch by", "time on one H200", ""))
C.say(f"""
    The ratio is the whole story: forward mode is {forward_mode_s / reverse_s:,.0f} times slower for ONE
    gradient, and a training run needs thousands of them. Reverse mode (backpropagation) is the
    only way a model of this size is trained. The price is memory: the backward needs the
    activations the forward saved (lesson 04).
""")

# %%
C.step("The tiny model: one reverse pass gives every gradient")
m = tiny.model
params = init_params(m, 1337).astype(np.float64)      # float64: a clean comparison with differences
text = b"def add(a, b): return a + b"
ids = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
T = 8
tok, tgt = ids[None, :T], ids[None, 1:T + 1]
C.say(f"""
    {tiny.name}: {m.n_layer} layers, {m.n_head} heads, d_model {m.d_model}, vocab {m.vocab_size}:
    n_params = {N_TINY:,}. One sequence of {T} byte tokens, {text[:T]!r}, predicting the next byte.
    The NumPy twin (reference/model.py) in float64: model_forward, then model_backward.
""")
reps = 20
t0 = time.perf_counter()
for _ in range(reps):
    loss, acts = R.model_forward(params, m, tok, tgt)
t_fwd = (time.perf_counter() - t0) / reps
t0 = time.perf_counter()
for _ in range(reps):
    loss, acts = R.model_forward(params, m, tok, tgt)
    grad = R.model_backward(params, m, acts)
t_rev = (time.perf_counter() - t0) / reps
C.table([("loss", f"{float(loss):.6f}"), ("one forward", f"{t_fwd * 1e3:.2f} ms"),
         ("forward + backward (reverse mode)", f"{t_rev * 1e3:.2f} ms"),
         ("gradients it returns", f"{grad.size:,}")], header=("", "value"))

# %%
C.step("Forward mode, one parameter at a time")
C.say(f"""
    A directional derivative along one parameter p_i: perturb p_i by +-h and run the forward
    twice, numeric_i = (L(p + h e_i) - L(p - h e_i)) / 2h. (True forward mode with dual numbers
    would take ONE pass per parameter at a somewhat higher cost each; the count is the same
    order.) Now do it for all {N_TINY:,} parameters: {2 * N_TINY:,} forward passes.
""")
h = 1e-5
numeric = np.empty_like(params)
t0 = time.perf_counter()
for i in range(N_TINY):
    old = params[i]
    params[i] = old + h
    lp = float(R.model_forward(params, m, tok, tgt)[0])
    params[i] = old - h
    lm = float(R.model_forward(params, m, tok, tgt)[0])
    params[i] = old
    numeric[i] = (lp - lm) / (2 * h)
t_fwd_mode = time.perf_counter() - t0
C.table([("forward mode (centred differences)", f"{2 * N_TINY:,} forwards", f"{t_fwd_mode:.2f} s"),
         ("reverse mode", "1 forward + 1 backward", f"{t_rev * 1e3:.2f} ms"),
         ("ratio", "", f"{t_fwd_mode / t_rev:,.0f}x")],
        header=("all gradients by", "passes", "time"))

# %%
C.step("They agree")
specs = {s.name: s for s in param_layout(m)}
d = ord("d")
picks = [("wte", (d, 3)), ("wte", (5, 3)), ("wpe", (2, 1)), ("h0.attn.w_q", (0, 7)), ("h1.mlp.w_2", (5, 0)),
         ("h1.ln2.g", (2,)), ("lnf.b", (5,))]
rows = []
for name, idx in picks:
    i = specs[name].offset + int(np.ravel_multi_index(idx, specs[name].shape))
    label = f"{name}[{', '.join(map(str, idx))}]"
    rows.append((label, i, grad[i], numeric[i], abs(grad[i] - numeric[i])))
C.table(rows, header=("parameter", "flat index", "reverse mode", "centred difference", "|diff|"),
        fmt=("", "", ".10f", ".10f", ".1e"))
rel = float(np.max(np.abs(grad - numeric)) / np.max(np.abs(grad) + np.abs(numeric)))
C.say(f"""
    Over all {N_TINY:,} parameters the largest difference, relative to the largest gradient, is
    {rel:.1e} (andrea_numba.gradcheck's relative error: at 1e-7 or below the backward is right).
    The same numbers, from one pass instead of {2 * N_TINY:,}.

    Look at the two wte rows: row {d} is the byte 'd', which occurs in the text, and row 5 is a
    byte that never does. Both have a gradient, because wte is also the output projection: every
    row scores its byte as the next token at every position, so the loss pushes every row (lesson
    01's fork: the embedding and the loss add their shares into row {d}).
""")
assert rel < 1e-6, rel

# %%
C.step("How the cost grows with the number of parameters")
sizes = np.array([N_TINY, 12_692_736, N_BIG], dtype=float)
names = ["tiny", "12M", "120M"]
fig, ax = plt.subplots(figsize=(7, 4))
ax.loglog(sizes, sizes, "o-", label="forward mode: n passes")
ax.loglog(sizes, np.full_like(sizes, 3.0), "s-", label="reverse mode: ~3 forward-equivalents")
for x, nme in zip(sizes, names):
    ax.annotate(nme, (x, x), textcoords="offset points", xytext=(-10, 8))
ax.set_xlabel("parameters n")
ax.set_ylabel("forward-pass equivalents per gradient")
ax.set_title("cost of one gradient")
ax.legend(frameon=False)
C.savefig(fig, "02_passes.png")
C.say(f"""
    Forward mode's cost grows with n; reverse mode's does not. On the tiny model forward mode is
    merely slow ({t_fwd_mode:.1f} s here against {t_rev * 1e3:.1f} ms); on the 120M model it is
    {N_BIG:,} passes.

    Forward mode still has its uses: when there are few inputs and many outputs (a Jacobian with
    more rows than columns) it wins, and a single directional derivative is a cheap test of a
    backward. That is how gradcheck uses it.
""")

C.finish()
