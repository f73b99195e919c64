"""Lesson 3: one backward step, traced op by op.

    python lessons/03_one_backward_step.py                  # prints the whole trace and exits
    python lessons/03_one_backward_step.py --interactive    # pauses after every op, for a class

On ANDREA-tiny (3,792 parameters) we run a training forward pass once, with dropout on (p = 0.1
at every site: the attention probabilities, the attention output, the MLP output), then walk the
backward pass by hand, in the order the engine runs it: from dL/dlogits back to the embeddings.
At every op we print
  - the gradient coming in (its shape and norm),
  - the saved tensors from the forward pass that the op reads,
  - what goes out: grad_input (passed further back) and the parameter gradients,
  - the CUDA kernel's result beside the NumPy twin's (the kernel runs on float32 copies of the
    very same inputs; without a GPU it runs in Numba's CUDA simulator),
  - a finite-difference check of a few entries of each parameter gradient: nudge one weight by
    +-h, run the whole model forward twice, and compare (L(w+h) - L(w-h)) / 2h with the entry.
    The dropout masks are drawn from a key, not from a random state: every forward of the check
    draws the same masks, so the mask is fixed and the loss is a smooth function of the weights.
At the end the gradients we collected are put into one flat vector and compared with
reference.model_backward: the trace *is* the engine's backward, spelled out.
"""
# %%
import math
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as lesson  # noqa: E402  (sets NUMBA_ENABLE_CUDASIM=1 when there is no GPU, before numba loads)

import numpy as np  # noqa: E402

import reference as R  # noqa: E402
from andrea_numba.cases import CASES, Dims, call  # noqa: E402
from andrea_numba.check import to_dev, to_host  # noqa: E402
from andrea_numba.config import load_config  # noqa: E402
from andrea_numba.layout import init_params, param_layout, views  # noqa: E402

args = lesson.start(__doc__)
say, step = print, lesson.step          # the trace is printed as is: its columns line up

# %% [markdown]
# ## The forward pass
# %%
cfg = load_config("tiny")
m = cfg.model
B, T = 2, 8
rng = np.random.default_rng(0)
params = init_params(m, seed=0).astype(np.float64)
params += 0.1 * rng.standard_normal(params.size)        # larger than GPT-2's init: clearer gradients
P = views(params, m)
text = b"def f(x):\n    return x\n"
tokens = np.frombuffer(text[:B * T], dtype=np.uint8).reshape(B, T).astype(np.int64)
targets = np.frombuffer(text[1:B * T + 1], dtype=np.uint8).reshape(B, T).astype(np.int64)
DROPOUT = 0.1
KEY = R.dropout_key(seed=0, step=0, micro=0)           # the trainer's key of step 0, microbatch 0
loss_value, acts = R.model_forward(params, m, tokens, targets, DROPOUT, KEY)
step("the forward pass")
say(f"ANDREA-tiny: L={m.n_layer} blocks, C={m.d_model}, H={m.n_head} heads, V={m.vocab_size} byte tokens")
say(f"a batch of B={B} sequences of T={T} bytes: {text[:B * T]!r}")
say(f"loss = {float(loss_value):.6f}   (uniform guessing would give ln(256) = {math.log(256):.4f})")
say("the forward pass saved, per block: x_in, ln1 (+ mean, rstd), q, k, v, att, y, x_mid, ln2 "
    "(+ mean, rstd), h_pre, h; then lnf and probs.")
say(f"dropout p = {DROPOUT}: no mask is saved. Each site's mask is a hash of a key and the element's index\n"
    f"(key {KEY:#010x} for this step and microbatch, one sub-key per block and site): the backward draws it again.")

# %% helpers


def f32(a):
    return np.asarray(a, dtype=np.float32)


def norm(a):
    return float(np.sqrt(np.sum(np.asarray(a, dtype=np.float64) ** 2)))


def kernel(op, outs, **values):
    """Run the engine's backward kernels of `op` (its launcher, as andrea_numba/cases.py names it)
    on float32 copies of the values the twin got. outs: name -> shape of what it returns; written
    outputs start as NaN, += outputs (case.accumulate) at zero, work buffers as NaN (integer ones -7)."""
    case = CASES[op]
    dims = Dims.of(m, B, T)
    d = {k: to_dev(v if v.dtype.kind == "i" else f32(v)) for k, v in values.items() if isinstance(v, np.ndarray)}
    d.update({k: to_dev(np.zeros(s, np.float32) if k in case.accumulate else np.full(s, np.nan, np.float32))
              for k, s in outs.items()})
    d.update({k: to_dev(np.full(shape(dims), np.nan if np.dtype(dtype).kind == "f" else -7, dtype))
              for k, (shape, dtype) in case.scratch.items()})       # integers: -7, a value no index takes
    scalars = {k: v for k, v in values.items() if not isinstance(v, np.ndarray)}
    call(case.engine("bwd"), {**scalars, **d})
    return {k: to_host(d[k]) for k in outs}


def loss_at(flat):
    return float(R.model_forward(flat, m, tokens, targets, DROPOUT, KEY)[0])      # the same masks


SPECS = {s.name: s for s in param_layout(m)}


def finite_difference(name, grad, n=3, h=1e-4):
    """Check n entries of the gradient of parameter tensor `name` by centred differences. h = 1e-4:
    the float64 loss (near 5) is rounded by about 1e-15, so (L(w+h) - L(w-h)) / 2h carries an
    error near 1e-11, small beside even a 1e-5 entry; the truncation error (h^2 / 6 times the
    third derivative) stays far below 1e-7 relative here."""
    s = SPECS[name]
    picks = np.random.default_rng(zlib.crc32(name.encode())).choice(s.size, size=min(n, s.size), replace=False)
    for i in picks:
        flat = params.copy()
        flat[s.offset + i] += h
        up = loss_at(flat)
        flat[s.offset + i] -= 2 * h
        num = (up - loss_at(flat)) / (2 * h)
        ana = float(np.ravel(grad)[i])
        rel = abs(ana - num) / max(1e-8, abs(ana) + abs(num))
        idx = [int(j) for j in np.unravel_index(i, s.shape)]
        why = f"   (position {idx[0]} >= T = {T}: no token sits there, so it has no gradient)" \
            if name == "wpe" and idx[0] >= T else ""
        say(f"      finite difference {name}{idx}: backward {ana:+.6e}  numeric {num:+.6e}  rel {rel:.1e}{why}")
        FD.append(rel)


def report(op, kernel_name, incoming, reads, outgoing, kernel_out, params_checked=()):
    """Print one op of the trace."""
    step(f"{op}: {kernel_name}")
    for name, g in incoming.items():
        say(f"   in : {name:<10} {str(list(np.shape(g))):<14} norm {norm(g):.4e}")
    say(f"   reads saved: {', '.join(reads)}")
    for name, g in outgoing.items():
        k = kernel_out.get(name)
        diff = "" if k is None else f"   kernel vs twin max|diff| {np.max(np.abs(k - g)):.1e}"
        DIFFS.append(0.0 if k is None else float(np.max(np.abs(k - g)) / max(1e-30, np.max(np.abs(g)))))
        say(f"   out: {name:<10} {str(list(np.shape(g))):<14} norm {norm(g):.4e}{diff}")
    for pname, g in params_checked:
        finite_difference(pname, g)


GRADS = {s.name: np.zeros(s.shape) for s in param_layout(m)}
DIFFS, FD = [], []
N, C, F, H = B * T, m.d_model, 4 * m.d_model, m.n_head

# %% [markdown]
# ## The backward pass: the loss and the tied output projection
# %%
dx, dwte = R.loss_bwd(1.0, acts["lnf"], P["wte"], acts["probs"], targets)
GRADS["wte"] += dwte
k = kernel("loss", dict(dx=(N, C), dwte=P["wte"].shape), dloss=1.0, x=acts["lnf"].reshape(N, C), wte=P["wte"],
           probs=acts["probs"].reshape(N, -1), targets=targets.reshape(N).astype(np.int32))
report("loss (tied output projection + cross-entropy)", "k_loss_bwd  <->  reference.loss.loss_bwd",
       {"dloss": np.array(1.0)}, ["probs [B,T,V]", "lnf [B,T,C]", "wte", "targets"],
       {"dx": dx, "dwte": dwte}, {"dx": k["dx"].reshape(dx.shape), "dwte": k["dwte"]})
say("   dL/dlogits = (probs - onehot(targets)) / (B*T): softmax and cross-entropy together have the\n"
    "   simplest gradient of the whole model; dx = dlogits @ wte, dwte = dlogits^T @ lnf")
say("   (wte's finite-difference check waits for the end: the embedding adds the other share)")

dln, dg, db = dx, None, None
dx, dg, db = R.layernorm_bwd(dln, acts["x_out"], acts["lnf_mean"], acts["lnf_rstd"], P["lnf.g"])
GRADS["lnf.g"] += dg
GRADS["lnf.b"] += db
k = kernel("layernorm", dict(dx=(N, C), dg=(C,), db=(C,)), dout=dln.reshape(N, C), x=acts["x_out"].reshape(N, C),
           mean=acts["lnf_mean"].reshape(N), rstd=acts["lnf_rstd"].reshape(N), g=P["lnf.g"])
report("final LayerNorm", "k_layernorm_bwd  <->  reference.layernorm.layernorm_bwd", {"dlnf": dln},
       ["x_out", "lnf_mean", "lnf_rstd", "lnf.g"], {"dx": dx, "dg": dg, "db": db},
       {"dx": k["dx"].reshape(dx.shape), "dg": k["dg"], "db": k["db"]}, [("lnf.g", dg), ("lnf.b", db)])

# %% [markdown]
# ## The blocks, last to first
# %%
for l in reversed(range(m.n_layer)):
    p, a = f"h{l}.", acts["blocks"][l]
    key_att, key_ao, key_mlp = R.block_keys(KEY, l)        # one key per site of this block
    say(f"\n========== block {l} ==========")
    # x_out = x_mid + drop(mlp(ln2(x_mid)))
    dx_mid, ddrop = R.residual_add_bwd(dx)
    k = kernel("residual", dict(dx=(dx.size,), df=(dx.size,)), dout=dx.reshape(-1))
    report(f"block {l} residual (MLP side)", "k_residual_add_bwd", {"d x_out": dx}, ["nothing"],
           {"d x_mid (skip)": dx_mid, "d drop(mlp_out)": ddrop},
           {"d x_mid (skip)": k["dx"].reshape(dx.shape), "d drop(mlp_out)": k["df"].reshape(dx.shape)})

    dmlp = R.dropout_bwd(ddrop, DROPOUT, key_mlp)
    k = kernel("dropout", dict(dx=(dx.size,)), dout=ddrop.reshape(-1), dropout_p=DROPOUT, dropout_key=key_mlp)
    report(f"block {l} dropout on the MLP output", "k_dropout_bwd  <->  reference.dropout.dropout_bwd",
           {"d drop(mlp_out)": ddrop}, ["nothing: the mask is drawn again from its key"], {"d mlp_out": dmlp},
           {"d mlp_out": k["dx"].reshape(dmlp.shape)})
    say(f"   {np.mean(dmlp == 0):.0%} of the gradient entries are zero: the dropped elements pass no gradient,\n"
        f"   the kept ones are scaled by 1/(1-p) = {1 / (1 - DROPOUT):.4f}")

    dln2, dw1, dw2 = R.mlp_bwd(dmlp, a["ln2"], a["h_pre"], a["h"], P[p + "mlp.w_1"], P[p + "mlp.w_2"])
    GRADS[p + "mlp.w_1"] += dw1
    GRADS[p + "mlp.w_2"] += dw2
    k = kernel("mlp", dict(dx=(N, C), dw_1=(C, F), dw_2=(F, C)), dout=dmlp.reshape(N, C), x=a["ln2"].reshape(N, C),
               h_pre=a["h_pre"].reshape(N, F), h=a["h"].reshape(N, F), w_1=P[p + "mlp.w_1"], w_2=P[p + "mlp.w_2"])
    report(f"block {l} MLP", "k_mlp_bwd  <->  reference.mlp.mlp_bwd", {"d mlp_out": dmlp},
           ["ln2", "h_pre (for GELU')", "h", "w_1", "w_2"], {"d ln2": dln2, "dw_1": dw1, "dw_2": dw2},
           {"d ln2": k["dx"].reshape(dln2.shape), "dw_1": k["dw_1"], "dw_2": k["dw_2"]},
           [(p + "mlp.w_1", dw1), (p + "mlp.w_2", dw2)])

    dx_ln, dg, db = R.layernorm_bwd(dln2, a["x_mid"], a["ln2_mean"], a["ln2_rstd"], P[p + "ln2.g"])
    GRADS[p + "ln2.g"] += dg
    GRADS[p + "ln2.b"] += db
    k = kernel("layernorm", dict(dx=(N, C), dg=(C,), db=(C,)), dout=dln2.reshape(N, C), x=a["x_mid"].reshape(N, C),
               mean=a["ln2_mean"].reshape(N), rstd=a["ln2_rstd"].reshape(N), g=P[p + "ln2.g"])
    report(f"block {l} LN2", "k_layernorm_bwd", {"d ln2": dln2}, ["x_mid", "ln2_mean", "ln2_rstd", "ln2.g"],
           {"dx": dx_ln, "dg": dg, "db": db}, {"dx": k["dx"].reshape(dx_ln.shape), "dg": k["dg"], "db": k["db"]},
           [(p + "ln2.g", dg), (p + "ln2.b", db)])

    dx_mid = R.residual_add(dx_mid, dx_ln)
    say("   x_mid fed two paths (the skip and LN2): their gradients add, with k_residual_add")
    # x_mid = x_in + drop(attn_out(attn(qkv(ln1(x_in)))))
    dx_in, ddrop = R.residual_add_bwd(dx_mid)
    dattn = R.dropout_bwd(ddrop, DROPOUT, key_ao)
    k = kernel("dropout", dict(dx=(dx.size,)), dout=ddrop.reshape(-1), dropout_p=DROPOUT, dropout_key=key_ao)
    report(f"block {l} dropout on the attention output", "k_dropout_bwd", {"d drop(attn_out)": ddrop},
           ["nothing"], {"d attn_out": dattn}, {"d attn_out": k["dx"].reshape(dattn.shape)})
    dy, dwo = R.attn_out_bwd(dattn, a["y"], P[p + "attn.w_o"])
    GRADS[p + "attn.w_o"] += dwo
    k = kernel("attn_out", dict(dy=(N, C), dw_o=(C, C)), dout=dattn.reshape(N, C), y=a["y"].reshape(N, C),
               w_o=P[p + "attn.w_o"])
    report(f"block {l} attention output W_O", "k_attn_out_bwd", {"d attn_out": dattn}, ["y", "w_o"],
           {"dy": dy, "dw_o": dwo}, {"dy": k["dy"].reshape(dy.shape), "dw_o": k["dw_o"]}, [(p + "attn.w_o", dwo)])

    dq, dk, dv = R.attn_bwd(dy, a["q"], a["k"], a["v"], a["att"], H, DROPOUT, key_att)
    k = kernel("attn", dict(dq=(B, T, C), dk=(B, T, C), dv=(B, T, C)), dy=dy, q=a["q"], k=a["k"], v=a["v"],
               att=a["att"], n_head=H, dropout_p=DROPOUT, dropout_key=key_att)
    report(f"block {l} causal attention", "k_attn_bwd  <->  reference.attn.attn_bwd", {"dy": dy},
           ["q", "k", "v", "att (softmax probabilities, before dropout; the mask is drawn again)"],
           {"dq": dq, "dk": dk, "dv": dv}, {"dq": k["dq"], "dk": k["dk"], "dv": k["dv"]})

    dln1, dwq, dwk, dwv = R.attn_qkv_bwd(dq, dk, dv, a["ln1"], P[p + "attn.w_q"], P[p + "attn.w_k"], P[p + "attn.w_v"])
    for name, g in (("attn.w_q", dwq), ("attn.w_k", dwk), ("attn.w_v", dwv)):
        GRADS[p + name] += g
    k = kernel("attn_qkv", dict(dx=(N, C), dw_q=(C, C), dw_k=(C, C), dw_v=(C, C)), dq=dq.reshape(N, C),
               dk=dk.reshape(N, C), dv=dv.reshape(N, C), x=a["ln1"].reshape(N, C),
               w_q=P[p + "attn.w_q"], w_k=P[p + "attn.w_k"], w_v=P[p + "attn.w_v"])
    report(f"block {l} Q, K, V projections", "k_attn_qkv_bwd", {"dq": dq, "dk": dk, "dv": dv},
           ["ln1", "w_q", "w_k", "w_v"], {"d ln1": dln1, "dw_q": dwq, "dw_k": dwk, "dw_v": dwv},
           {"d ln1": k["dx"].reshape(dln1.shape), "dw_q": k["dw_q"], "dw_k": k["dw_k"], "dw_v": k["dw_v"]},
           [(p + "attn.w_q", dwq), (p + "attn.w_v", dwv)])

    dx_ln, dg, db = R.layernorm_bwd(dln1, a["x_in"], a["ln1_mean"], a["ln1_rstd"], P[p + "ln1.g"])
    GRADS[p + "ln1.g"] += dg
    GRADS[p + "ln1.b"] += db
    k = kernel("layernorm", dict(dx=(N, C), dg=(C,), db=(C,)), dout=dln1.reshape(N, C), x=a["x_in"].reshape(N, C),
               mean=a["ln1_mean"].reshape(N), rstd=a["ln1_rstd"].reshape(N), g=P[p + "ln1.g"])
    report(f"block {l} LN1", "k_layernorm_bwd", {"d ln1": dln1}, ["x_in", "ln1_mean", "ln1_rstd", "ln1.g"],
           {"dx": dx_ln, "dg": dg, "db": db}, {"dx": k["dx"].reshape(dx_ln.shape), "dg": k["dg"], "db": k["db"]},
           [(p + "ln1.g", dg)])
    dx = R.residual_add(dx_in, dx_ln)
    say("   x_in fed two paths (the skip and LN1): their gradients add")

# %% [markdown]
# ## The embeddings
# %%
dwte, dwpe = R.embed_bwd(dx, tokens, m.vocab_size, m.context_length)
GRADS["wte"] += dwte
GRADS["wpe"] += dwpe
k = kernel("embed", dict(dwte=P["wte"].shape, dwpe=P["wpe"].shape), dout=dx, tokens=tokens.astype(np.int32),
           vocab_size=m.vocab_size, context_length=m.context_length)
report("token + position embedding", "k_embed_bwd  <->  reference.embed.embed_bwd", {"d x0": dx}, ["tokens"],
       {"dwte (embedding share)": dwte, "dwpe": dwpe}, {"dwte (embedding share)": k["dwte"], "dwpe": k["dwpe"]},
       [("wpe", dwpe)])
used = np.unique(tokens)
say(f"   only the {len(used)} token ids present in the batch get an embedding-share gradient: "
    f"{bytes(used.astype(np.uint8))!r}")
step("wte: both shares together")
say("wte is used twice, as the token embedding and as the output projection; its gradient is the sum:")
finite_difference("wte", GRADS["wte"], n=4)

# %% [markdown]
# ## The whole gradient, and pictures
# %%
step("the trace is the engine's backward")
flat = np.concatenate([GRADS[s.name].ravel() for s in param_layout(m)])
engine = R.model_backward(params, m, acts)
same = np.max(np.abs(flat - engine))
say(f"our collected flat gradient vs reference.model_backward: max|diff| = {same:.1e}")
say(f"kernel vs twin, worst relative difference over every tensor of the trace: {max(DIFFS):.1e} (float32 vs float64)")
say(f"finite differences, worst relative error of {len(FD)} checked entries: {max(FD):.1e} (float64, h=1e-4)")

names = [s.name for s in param_layout(m)]
import matplotlib.pyplot as plt  # noqa: E402  (_common chose the headless backend)

fig, ax = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]})
ax[0].bar(range(len(names)), [norm(GRADS[n]) for n in names], color="tab:blue")
ax[0].set_xticks(range(len(names)), names, rotation=70, fontsize=7)
ax[0].set_ylabel("gradient norm")
ax[0].set_title("gradient norm of every parameter tensor, one backward step")
ax[1].imshow(acts["blocks"][0]["att"][0, 0], cmap="viridis")
ax[1].set_title("attention of block 0, head 0\n(rows: query t, columns: key u <= t)")
ax[1].set_xlabel("key position u")
ax[1].set_ylabel("query position t")
fig.tight_layout()
lesson.savefig(fig, "03_gradients_and_attention.png")
ok = same < 1e-12 and max(DIFFS) < 1e-4 and max(FD) < 1e-6
say("all agree" if ok else "DISAGREEMENT: see above")
lesson.finish()
sys.exit(0 if ok else 1)
