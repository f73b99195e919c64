"""Sampling with a KV cache: one position per token instead of the whole context again.

Attention is causal: position t's output reads positions 0..t only, and a block's k and v of a
position, once computed, never change while the sequence grows. So a decoder keeps every block's
k and v of the positions seen so far (the cache, [L, context, C] each) and computes one row for
each new token at position t:

    x = wte[token] + wpe[t]                                    # [1, 1, C]
    per block l:
        q, k, v = qkv(LN1(x));  K[l, t], V[l, t] = k, v        # the cache grows by one row
        y = softmax(q K[l, :t+1]^T / sqrt(hs)) V[l, :t+1]      # per head: one query against t+1 keys
        x = x + W_O(y);  x = x + mlp(LN2(x))
    logits = LNf(x) @ wte^T                                    # [V]

The same logits as model_logits(params, m, tokens[:t+1])[0, t], in float64 to 1e-12: the same
sums in another order. A step costs the products of one row and attention over t+1 keys, where
the whole forward costs t+1 rows and (t+1)^2 scores. Past the context (t = context_length) the
positions no longer fit wpe: a sampler starts a new cache on the last tokens (sample.py).
At a precision of the products (precision="bf16": the sampler of a bf16 run) every product rounds
its inputs as the whole forward's do at that precision (reference/precision.py, mm), attention's
as the flash twin does (reference/attn.py, _low_precision_pv: the scores in base 2 against an integer
maximum); no dropout.

Then the token is drawn from the probabilities (draw): softmax(logits / temperature) over the
top_k most likely, and the first token whose running sum of those weights passes u times their
total, u uniform in [0, 1): what numpy's Generator.choice does with its next uniform number, so a
sampler that draws every u of a sample first (rng.random(n)) draws the tokens choice would.
"""
import math

import numpy as np

from andrea_numba.config import ModelConfig
from andrea_numba.layout import views

from .attn import _low_precision_pv
from .attn_out import attn_out_fwd
from .attn_qkv import attn_qkv_fwd
from .embed import embed_fwd
from .layernorm import layernorm_fwd
from .mlp import mlp_fwd
from .precision import current, higher, mm, products_in
from .residual import residual_add


class KVCache:
    """The decoder of one sequence: step(token) -> the logits [V] at the next position. precision:
    of the products (None or "fp32": exact; "bf16": their inputs rounded), as model_logits's."""

    def __init__(self, params, m: ModelConfig, precision=None):
        self.P, self.m, self.precision = views(params, m), m, precision
        shape = (m.n_layer, m.context_length, m.d_model)        # K[l, t]: block l's k of position t
        self.K, self.V = np.zeros(shape, params.dtype), np.zeros(shape, params.dtype)
        self.t = 0                                                # positions in the cache

    def step(self, token: int) -> np.ndarray:
        if self.t >= self.m.context_length:
            raise ValueError(f"the cache holds {self.m.context_length} positions (the context length): start a new one")
        with products_in(self.precision):
            return self._step(token)

    def _step(self, token: int) -> np.ndarray:
        P, m, t = self.P, self.m, self.t
        H, hs = m.n_head, m.d_model // m.n_head
        x = embed_fwd(np.array([[token]]), P["wte"], P["wpe"][t:t + 1])            # [1, 1, C] at position t
        for l in range(m.n_layer):
            p = f"h{l}."
            ln1 = layernorm_fwd(x, P[p + "ln1.g"], P[p + "ln1.b"], m.ln_eps)[0]
            q, self.K[l, t], self.V[l, t] = (a[0, 0] for a in attn_qkv_fwd(
                ln1, P[p + "attn.w_q"], P[p + "attn.w_k"], P[p + "attn.w_v"]))
            qh = q.reshape(H, hs)                                                  # [H, hs]
            Kh = self.K[l, :t + 1].reshape(t + 1, H, hs).transpose(1, 0, 2)        # [H, t+1, hs]
            Vh = self.V[l, :t + 1].reshape(t + 1, H, hs).transpose(1, 0, 2)
            y = attend(qh, Kh, Vh)                                                 # [H, hs]
            x = residual_add(x, attn_out_fwd(y.reshape(1, 1, -1), P[p + "attn.w_o"]))
            ln2 = layernorm_fwd(x, P[p + "ln2.g"], P[p + "ln2.b"], m.ln_eps)[0]
            x = residual_add(x, mlp_fwd(ln2, P[p + "mlp.w_1"], P[p + "mlp.w_2"])[0])
        self.t += 1
        lnf = layernorm_fwd(x, P["lnf.g"], P["lnf.b"], m.ln_eps)[0]
        with higher():                                                             # as model_logits
            return mm(lnf, P["wte"].T)[0, 0]


def attend(qh, Kh, Vh):
    """One query a head against its keys: qh [H, hs], Kh, Vh [H, t+1, hs] -> y [H, hs], y_h =
    softmax(s_h) V_h with s_h = q_h K_h^T / sqrt(hs) (the keys are all in the past: no mask). With
    exact products, the softmax and then the product. At a precision of the products, the flash
    twin's own (reference/attn.py, _low_precision_pv): the scores in base 2, p = 2^(s - M) against
    the integer M = ceil(max s), y = mm(p, V) / sum p."""
    hs = qh.shape[1]
    s = mm(qh[:, None, :], Kh.transpose(0, 2, 1)) * (1.0 / math.sqrt(hs))      # [H, 1, t+1]
    if current() is None:
        e = np.exp(s[:, 0] - s[:, 0].max(axis=1, keepdims=True))
        return np.einsum("hu,hud->hd", e / e.sum(axis=1, keepdims=True), Vh)
    return _low_precision_pv(s, 1.0, Vh)[:, 0]


def draw_cdf(p, temperature=1.0, top_k=40) -> np.ndarray:
    """The cumulative distribution [V] that draw picks from: softmax-of-the-kept weights q of the
    probabilities p after temperature and top-k, summed in order and ending at exactly 1."""
    logits = np.log(np.maximum(np.asarray(p, np.float64), 1e-30)) / max(temperature, 1e-6)
    if top_k and top_k < len(logits):
        kth = np.partition(logits, -top_k)[-top_k]               # the top_k-th largest: ties all kept
        logits = np.where(logits >= kth, logits, -np.inf)
    q = np.exp(logits - logits.max())
    cdf = np.cumsum(q / q.sum())
    return cdf / cdf[-1]


def draw(p, u: float, temperature=1.0, top_k=40) -> int:
    """The token drawn from probabilities p [V] with the uniform number u in [0, 1), after temperature
    and top-k (k_decode_draw's twin): rng.choice(V, p=q) for softmax-of-the-kept weights q, given
    u = the generator's next rng.random()."""
    return int(np.searchsorted(draw_cdf(p, temperature, top_k), u, side="right"))
