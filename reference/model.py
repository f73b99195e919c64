"""The whole model in NumPy: forward to the loss, backward to the flat gradient.

    x = wte[tokens] + wpe[:T]                        embed
    for each block l:
        x = x + drop(W_O(attn(qkv(LN1(x)))))         layernorm, attn_qkv, attn, attn_out, dropout, residual
        x = x + drop(mlp(LN2(x)))                    layernorm, mlp, dropout, residual
    loss = cross_entropy(LNf(x) @ wte^T, targets)    layernorm, loss (the tied projection)

Dropout (training only, as in GPT-2) acts at three sites per block: on the attention
probabilities inside attn, and on the attention and MLP outputs before they join the residual
stream. A training forward gets dropout_p and a key (dropout.dropout_key(seed, step, microbatch));
each site's mask comes from dropout.block_keys(key, l) (site_key(key, 3 * l + site)), so nothing random is stored and
the backward draws the same masks. Without a key (evaluation, sampling) nothing is dropped.

Parameters and gradients are flat vectors in the layout of andrea_numba.layout; the dtype of
`params` (float32 or float64) is the dtype of every computation. The saved activations are one
dict, one entry per tensor, the same names the CUDA engine uses for its buffers:

    tokens, targets   [B, T] int
    x0                [B, T, C]    embedding output = input of block 0
    per block l, in acts["blocks"][l]:
      x_in            [B, T, C]    residual stream entering the block
      ln1, ln1_mean, ln1_rstd      [B, T, C], [B, T], [B, T]
      q, k, v         [B, T, C]
      att             [B, H, T, T] softmax probabilities
      y               [B, T, C]    attention output, heads side by side
      x_mid           [B, T, C]    residual stream after the attention half
      ln2, ln2_mean, ln2_rstd
      h_pre, h        [B, T, 4C]   MLP hidden before and after GELU
    x_out             [B, T, C]    residual stream after the last block
    lnf, lnf_mean, lnf_rstd
    losses            [B, T]       per-position cross-entropy
    probs             [B, T, V]    softmax of the logits
"""
import numpy as np

from andrea_numba.config import ModelConfig
from andrea_numba.layout import views

from .attn import attn_bwd, attn_flash_bwd, attn_flash_fwd, attn_fwd
from .attn_out import attn_out_bwd, attn_out_fwd
from .attn_qkv import attn_qkv_bwd, attn_qkv_fwd
from .dropout import block_keys, dropout_bwd, dropout_fwd
from .embed import embed_bwd, embed_fwd
from .layernorm import layernorm_bwd, layernorm_fwd
from .loss import loss_bwd, loss_fwd
from .mlp import mlp_bwd, mlp_fwd
from .precision import FP8_SCOPES, as_grad, backward_products, current, higher, mm, products_in
from .residual import residual_add, residual_add_bwd


def _trunk(params, m: ModelConfig, tokens, dropout_p=0.0, dropout_key=None):
    """Embedding, the L blocks and the final LayerNorm; returns the saved activations."""
    P = views(params, m)
    eps, H = m.ln_eps, m.n_head
    p_drop = dropout_p if dropout_key is not None else 0.0
    x = embed_fwd(tokens, P["wte"], P["wpe"])
    acts = {"tokens": tokens, "x0": x, "blocks": [], "dropout": (p_drop, dropout_key)}
    for l in range(m.n_layer):
        p = f"h{l}."
        k_att, k_ao, k_mlp = block_keys(dropout_key, l)
        a = {"x_in": x}
        a["ln1"], a["ln1_mean"], a["ln1_rstd"] = layernorm_fwd(x, P[p + "ln1.g"], P[p + "ln1.b"], eps)
        a["q"], a["k"], a["v"] = attn_qkv_fwd(a["ln1"], P[p + "attn.w_q"], P[p + "attn.w_k"], P[p + "attn.w_v"])
        if current() is None:       # exact products: attention saving its probabilities (lessons read att)
            a["y"], a["att"] = attn_fwd(a["q"], a["k"], a["v"], H, p_drop, k_att)
        else:                       # bf16 / fp16 products: the engine runs flash attention v11 / v12, whose
            # twin rounds the same products' inputs (reference/attn.py); at an FP8 scope in bf16 (higher)
            with higher():
                a["y"], a["lse"] = attn_flash_fwd(a["q"], a["k"], a["v"], H, p_drop, k_att)
        attn_out = dropout_fwd(attn_out_fwd(a["y"], P[p + "attn.w_o"]), p_drop, k_ao)
        x = a["x_mid"] = residual_add(x, attn_out)
        a["ln2"], a["ln2_mean"], a["ln2_rstd"] = layernorm_fwd(x, P[p + "ln2.g"], P[p + "ln2.b"], eps)
        mlp_out, a["h_pre"], a["h"] = mlp_fwd(a["ln2"], P[p + "mlp.w_1"], P[p + "mlp.w_2"])
        x = residual_add(x, dropout_fwd(mlp_out, p_drop, k_mlp))
        acts["blocks"].append(a)
    acts["x_out"] = x
    acts["lnf"], acts["lnf_mean"], acts["lnf_rstd"] = layernorm_fwd(x, P["lnf.g"], P["lnf.b"], eps)
    return acts


def model_forward(params, m: ModelConfig, tokens, targets, dropout_p=0.0, dropout_key=None, precision=None):
    """tokens, targets [B, T] int -> (loss as a 0-d array of params' dtype, acts for backward).
    dropout_key (with dropout_p > 0): a training forward with dropout; None: nothing dropped.
    precision: of the linear ops' products (None: exact; "bf16": their inputs rounded)."""
    assert tokens.shape[1] <= m.context_length, "sequence longer than the context"
    with products_in(precision):
        acts = _trunk(params, m, tokens, dropout_p, dropout_key)
        acts["targets"], acts["precision"] = targets, precision
        with higher():              # the classifier: bf16 at an FP8 scope (reference/precision.py)
            loss, acts["losses"], acts["probs"] = loss_fwd(acts["lnf"], views(params, m)["wte"], targets)
    return loss, acts


def model_logits(params, m: ModelConfig, tokens, precision=None):
    """tokens [B, T] -> logits [B, T, V] (no targets, nothing saved): for sampling and evaluation."""
    with products_in(precision):
        acts = _trunk(params, m, tokens)
        with higher():
            return mm(acts["lnf"], views(params, m)["wte"].T)


def model_backward(params, m: ModelConfig, acts, dloss: float = 1.0):
    """Gradient of dloss x the mean loss with respect to every parameter, as a flat vector like
    params (dloss is 1 but for loss scaling: fp16's products, andrea_numba/loss_scale.py)."""
    with products_in(acts.get("precision")), backward_products():    # the forward's precision of the products
        return _backward(params, m, acts, dloss)


def _backward(params, m: ModelConfig, acts, dloss=1.0):
    """model_backward's work, the products at the precision products_in set."""
    P = views(params, m)
    grads = np.zeros_like(params)
    G = views(grads, m)                     # views: += below writes into the flat vector
    H = m.n_head
    p_drop, dropout_key = acts.get("dropout", (0.0, None))
    # at an FP8 scope: the gradients that reach the linear layers' products marked as such (their
    # operand in E5M2 at "fp8-e5m2"), attention's and the classifier's products in bf16 (higher)
    g = as_grad if current() in FP8_SCOPES else (lambda a: a)
    with higher():
        dx, dwte = loss_bwd(dloss, acts["lnf"], P["wte"], acts["probs"], acts["targets"])
    G["wte"] += dwte                        # the tied projection's share of wte's gradient
    dx, dg, db = layernorm_bwd(dx, acts["x_out"], acts["lnf_mean"], acts["lnf_rstd"], P["lnf.g"])
    G["lnf.g"] += dg
    G["lnf.b"] += db
    for l in reversed(range(m.n_layer)):
        p, a = f"h{l}.", acts["blocks"][l]
        k_att, k_ao, k_mlp = block_keys(dropout_key, l)
        # x_out = x_mid + drop(mlp(LN2(x_mid)))
        dx_mid, dmlp = residual_add_bwd(dx)
        dmlp = g(dropout_bwd(dmlp, p_drop, k_mlp))
        dln2, dw_1, dw_2 = mlp_bwd(dmlp, a["ln2"], a["h_pre"], a["h"], P[p + "mlp.w_1"], P[p + "mlp.w_2"])
        G[p + "mlp.w_1"] += dw_1
        G[p + "mlp.w_2"] += dw_2
        dx_ln, dg, db = layernorm_bwd(dln2, a["x_mid"], a["ln2_mean"], a["ln2_rstd"], P[p + "ln2.g"])
        G[p + "ln2.g"] += dg
        G[p + "ln2.b"] += db
        dx_mid = residual_add(dx_mid, dx_ln)          # x_mid fed two branches: their gradients add
        # x_mid = x_in + drop(W_O(attn(qkv(LN1(x_in)))))
        dx_in, dattn_out = residual_add_bwd(dx_mid)
        dattn_out = g(dropout_bwd(dattn_out, p_drop, k_ao))
        dy, dw_o = attn_out_bwd(dattn_out, a["y"], P[p + "attn.w_o"])
        G[p + "attn.w_o"] += dw_o
        if "att" in a:
            dq, dk, dv = attn_bwd(dy, a["q"], a["k"], a["v"], a["att"], H, p_drop, k_att)
        else:
            with higher():
                dq, dk, dv = map(g, attn_flash_bwd(dy, a["q"], a["k"], a["v"], a["y"], a["lse"], H, p_drop, k_att))
        dln1, dw_q, dw_k, dw_v = attn_qkv_bwd(dq, dk, dv, a["ln1"],
                                              P[p + "attn.w_q"], P[p + "attn.w_k"], P[p + "attn.w_v"])
        G[p + "attn.w_q"] += dw_q
        G[p + "attn.w_k"] += dw_k
        G[p + "attn.w_v"] += dw_v
        dx_ln, dg, db = layernorm_bwd(dln1, a["x_in"], a["ln1_mean"], a["ln1_rstd"], P[p + "ln1.g"])
        G[p + "ln1.g"] += dg
        G[p + "ln1.b"] += db
        dx = residual_add(dx_in, dx_ln)
    dwte, dwpe = embed_bwd(dx, acts["tokens"], m.vocab_size, m.context_length)
    G["wte"] += dwte
    G["wpe"] += dwpe
    return grads
