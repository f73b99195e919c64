"""The KV-cache decoder on the GPU: one position per token, the twin of reference/decode.py.

    dec = Decoder(m, params, T)          # params: a GPUModel's flat device vector; allocates once
                                         # (precision="bf16": the products of a bf16 run)
    drawn = dec.sample(ids, u, temperature, top_k)   # the prompt ids, then len(u) tokens drawn on the GPU

    dec.reset()                          # or step by step: a new sequence, position 0
    dec.feed(ids)                        # the ids it has not read yet, one step (position) each
    p = dec.probs_row()                  # softmax of the last position's logits, on the host (a sync)

The whole forward computes every position of the context again for each drawn token. Attention is
causal, so a block's k and v of a position never change as the sequence grows: the decoder keeps
them (K and V, [n_layer, T, C] each, the twin's cache) and a step computes one row, the new
position's, with the kernels of kernels/decode.py (their docstring has the math and the tiling),
attending over the cached keys. Its logits are the whole forward's at that position, to fp32
rounding (tests/test_decode_gpu.py).

The step ends by drawing the next token (k_decode_draw: temperature, top-k and the draw of
numpy's Generator.choice, given the uniform number the host drew for that position) and writing
it where the next step reads its token. So `sample` sends the prompt, the uniform numbers and the
settings once, runs one step per position with no wait in between, and copies the drawn tokens
back at the end: one host sync a sample, where drawing on the host cost one a token (the copy of
the probabilities, the draw in NumPy, the copy of the token back). During the prompt the draw
waits for its first position (draw[0]); after reset, and so for feed, that lies past the window.

What changes from token to token lives on the device: the token ids (tokens [T + 1]), the position
t (pos [1], set to 0 by reset and moved on by the step's logits kernel), the cache, and the draw's
inputs (uniform [T + 1], draw [2] = first position drawn and top_k, temperature [1]). So every step
is the same launches with the same arguments (`work`): the first step runs them eagerly (Numba
compiles the kernels), and with `capture` the second records them once as a CUDA graph
(graphs.StepGraph) that every later step replays: one call a token. The step's scratch is
allocated with the cache too: attention's partial softmax of each chunk of keys, and the int32
counters with which the last block of a launch finds itself (zero between launches: every buffer
is zeroed when allocated, and each last block sets its counter back).

PRECISIONS: fp32 and bf16, the products of the run's recipe. At fp32 every product is a plain fp32
sum; at bf16 (precision="bf16") the same kernels round each product's inputs to bf16 and sum in
fp32, as training's products did (kernels/decode.py, PRECISION; the twin: KVCache(precision=
"bf16")). A sampler at fp16 or an FP8 scope runs the whole forward. The window T is
the sampler's (context_length for python -m andrea_numba.sample, seq_len for the trainer's
samples); a step computes positions 0..T-1, and the one at T-1 draws the token of position T. Past
that every position moves, and the sampler goes back to the whole forward (sample.generate).
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from .config import ModelConfig
from .gpu_model import BufferSpec
from .kernels import decode as kd
from .layout import views

PRECISIONS = ("fp32", "bf16")           # the recipes' precisions a decoder computes at


def decode_specs(m: ModelConfig, T: int) -> list[BufferSpec]:
    """Every device buffer of a decoder of window T, one line each (kind "sampler")."""
    L, C, V, H = m.n_layer, m.d_model, m.vocab_size, m.n_head
    nch = kd.attention_chunks(T)
    f32, i32 = np.float32, np.int32
    S = lambda name, shape, dtype=f32: BufferSpec(name, shape, dtype, "sampler")
    return [
        S("k_cache", (L, T, C)),        # K[l, u]: block l's k of position u (rows 0..t filled)
        S("v_cache", (L, T, C)),        # V[l, u]: its v
        S("tokens", (T + 1,), i32),     # the sequence's token ids, position by position (T: drawn, never fed)
        S("pos", (1,), i32),            # t: the position the next step computes
        S("uniform", (T + 1,), np.float64),   # u_t: the uniform number that draws position t's token
        S("draw", (2,), i32),           # [the first position drawn (past the window: none), top_k]
        S("temperature", (1,), np.float64),
        S("x", (C,)),                   # the residual stream of position t
        S("q", (C,)),                   # its query
        S("y", (C,)),                   # attention's output, heads side by side
        S("h", (4 * C,)),               # the MLP's hidden units after the GELU
        S("logits", (V,)),
        S("probs", (V,)),               # softmax(logits): what the host draws from
        S("attn_m", (H, nch)),          # attention's chunk p of head h: its scores' maximum m_p (an integer),
        S("attn_l", (H, nch)),          #   l_p = sum_u 2^(s_u - m_p) over its keys (scores in base 2)
        S("attn_acc", (H, nch, C // H)),   # and sum_u 2^(s_u - m_p) v_u
        S("attn_done", (H,), i32),      # attention's blocks of head h done so far (0 between launches)
        S("logits_done", (1,), i32),    # the classifier's blocks done so far (0 between launches)
    ]


class Decoder:
    """The decoder of one sequence at a time, on the weights `params` (a flat float32 device vector,
    the layout of andrea_numba/layout.py: a GPUModel's, shared, not copied). T: the window (at most
    context_length). stream: where every launch and copy goes (default: its own). capture(stream,
    work): records work as a graph with a launch() method
    (graphs.StepGraph), or returns None (run eagerly); None: always eager. log: where it says how
    its steps run. precision: of the products, the run's (PRECISIONS)."""

    def __init__(self, m: ModelConfig, params, T: int | None = None, stream=None, capture=None, log=None,
                 precision: str = "fp32"):
        T = m.context_length if T is None else T
        assert T <= m.context_length, f"T={T} exceeds the context length {m.context_length}"
        assert precision in PRECISIONS, f"a decoder computes at {' or '.join(PRECISIONS)}, not {precision}"
        self.m, self.T, self.precision = m, T, precision
        self.stream = cuda.stream() if stream is None else stream
        self.specs = decode_specs(m, T)
        # zeroed once: a new allocation holds whatever an earlier buffer left there, and a step past
        # the positions fed (a benchmark's replays) would read those bits as token ids, far outside wte
        self.buf = {s.name: cuda.to_device(np.zeros(s.shape, s.dtype), stream=self.stream) for s in self.specs}
        self.buf["draw"].copy_to_device(np.array([kd.NEVER, 0], np.int32), stream=self.stream)   # draws nothing
        self.P = views(params, m)
        # pinned host buffers, what travels between host and GPU (asynchronous copies)
        self.tokens_host = cuda.pinned_array(T + 1, np.int32)
        self.uniform_host = cuda.pinned_array(T + 1, np.float64)
        self.draw_host = cuda.pinned_array(2, np.int32)
        self.temperature_host = cuda.pinned_array(1, np.float64)
        self.probs_host = cuda.pinned_array(m.vocab_size, np.float32)
        self.capture, self.log = capture, log or (lambda line: None)
        self.graph = None                   # the step as a graph once captured (False: eager for good)
        self.warm = False                   # a step ran eagerly (compiled): ready to capture
        self.n = 0                          # positions of the sequence fed so far
        self.queued = False                 # a copy from a pinned buffer may still be queued (feed)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    def work(self, stream):
        """Every launch of one step, in order, on `stream` (the decoder's, or a graph builder that
        records them). Nothing here depends on the position: the kernels read it from pos."""
        b, P, m = self.buf, self.P, self.m
        eps, pos = m.ln_eps, b["pos"]
        bf16 = self.precision == "bf16"         # the products round their inputs to bf16
        for l in range(m.n_layer):
            p = f"h{l}."
            K, V = b["k_cache"][l], b["v_cache"][l]
            # q, and this position's k and v into the cache's row t (block 0 embeds the token first)
            kd.decode_qkv(b["q"], K, V, pos, b["x"], P[p + "ln1.g"], P[p + "ln1.b"], eps,
                          P[p + "attn.w_q"], P[p + "attn.w_k"], P[p + "attn.w_v"],
                          b["tokens"], P["wte"], P["wpe"], l == 0, stream=stream, bf16=bf16)
            kd.decode_attention(b["y"], b["attn_m"], b["attn_l"], b["attn_acc"], b["attn_done"],    # keys 0..t
                                b["q"], K, V, pos, stream=stream, bf16=bf16)
            kd.decode_matvec_add(b["x"], b["y"], P[p + "attn.w_o"], stream=stream, bf16=bf16)      # x += y @ W_o
            kd.decode_mlp_up(b["h"], b["x"], P[p + "ln2.g"], P[p + "ln2.b"], eps, P[p + "mlp.w_1"], stream=stream,
                             bf16=bf16)
            kd.decode_matvec_add(b["x"], b["h"], P[p + "mlp.w_2"], stream=stream, bf16=bf16)       # x += h @ W_2
        # the logits, their softmax into probs, and t += 1; then the token of position t drawn
        kd.decode_logits(b["probs"], b["logits"], b["logits_done"], pos, b["x"], P["lnf.g"], P["lnf.b"], eps,
                         P["wte"], stream=stream, bf16=bf16)
        kd.decode_draw(b["tokens"], pos, b["probs"], b["uniform"], b["draw"], b["temperature"], stream=stream)

    def step(self):
        """One position: work on the decoder's stream, or the replay of its graph. With `capture` the
        first step runs eagerly (it compiles the kernels; a capture records launches and must not
        compile) and the second records the step once; a capture that fails (said in the log)
        leaves the decoder eager. The graph replays the same launches: the same bits."""
        if self.graph is None and self.warm and self.capture is not None:
            try:
                self.graph = self.capture(self.stream, self.work) or False
                if self.graph:
                    self.log("sampling: the decoder's step captured as a CUDA graph; replayed for every token")
            except Exception as e:              # decode on eagerly
                self.graph = False
                self.log(f"sampling: the decoder runs eagerly (its CUDA graph capture failed: {' '.join(str(e).split())})")
        if self.graph:
            self.graph.launch()
        else:
            self.work(self.stream)
            self.warm = True

    def reset(self):
        """A new sequence: position 0 (on the device), nothing fed, nothing drawn."""
        kd.decode_start(self.buf["pos"], self.buf["draw"], stream=self.stream)
        self.n = 0

    def begin(self, ids, uniforms, temperature=1.0, top_k=40):
        """A new sequence that draws on the GPU: the prompt ids (at least one, at most T) and the
        draw's inputs sent, no step run yet. The step at position t >= len(ids) - 1 draws the token
        of position t + 1 with uniforms[t + 1 - len(ids)] (reference.decode.draw's u: the draws of
        Generator.choice), at most T + 1 - len(ids) of them (the step at position T - 1 draws the
        last). Returns the number of steps that draw them all."""
        n0, n = len(ids), len(uniforms)
        if not 1 <= n0 <= self.T or n0 + n - 1 > self.T:
            raise ValueError(f"a prompt of {n0} tokens and {n} draws do not fit the decoder's {self.T} positions")
        b, s = self.buf, self.stream
        if self.queued:
            s.synchronize()             # no copy still queued reads the pinned buffers written below
        self.queued = True
        self.reset()
        self.tokens_host[:n0] = ids
        self.uniform_host[n0:n0 + n] = uniforms
        self.draw_host[:] = (n0, top_k or 0)
        self.temperature_host[0] = temperature
        b["tokens"][:n0].copy_to_device(self.tokens_host[:n0], stream=s)
        b["uniform"][n0:n0 + n].copy_to_device(self.uniform_host[n0:n0 + n], stream=s)
        b["draw"].copy_to_device(self.draw_host, stream=s)
        b["temperature"].copy_to_device(self.temperature_host, stream=s)
        return n0 + n - 1

    def sample(self, ids, uniforms, temperature=1.0, top_k=40) -> list[int]:
        """begin, then one step a position with no host wait between them (positions 0 .. len(ids) +
        len(uniforms) - 2), then the drawn ids copied back: the prompt's continuation, drawn on
        the GPU. One host sync."""
        steps = self.begin(ids, uniforms, temperature, top_k)
        for _ in range(steps):
            self.step()
        self.n = steps
        n0, n = len(ids), len(uniforms)
        if n == 0:
            return []
        self.buf["tokens"][n0:n0 + n].copy_to_host(self.tokens_host[n0:n0 + n], stream=self.stream)
        self.stream.synchronize()
        self.queued = False
        return [int(v) for v in self.tokens_host[n0:n0 + n]]

    def feed(self, ids):
        """Step through the positions of ids not fed yet (the prompt at first, then each drawn token):
        their token ids into the pinned host buffer, one asynchronous copy of them to the device, one
        step each. Each slot of the host buffer is written once a sequence, so no copy still queued
        reads a slot that changed (a new sequence first waits for any copy still queued)."""
        n, end = self.n, len(ids)
        if end > self.T:
            raise ValueError(f"the decoder holds {self.T} positions: a longer sequence runs the whole forward")
        if end <= n:
            return
        if self.queued and n == 0:
            self.stream.synchronize()   # slots of the host buffer that a queued copy may still read
        self.tokens_host[n:end] = ids[n:end]
        self.buf["tokens"][n:end].copy_to_device(self.tokens_host[n:end], stream=self.stream)
        self.queued = True
        for _ in range(n, end):
            self.step()
        self.n = end

    def probs_row(self):
        """Softmax over the vocabulary at the last position fed, as float32 [V] on the host: the pinned
        buffer itself, valid until the next call (copies it and waits for the stream: a host sync)."""
        self.buf["probs"].copy_to_host(self.probs_host, stream=self.stream)
        self.stream.synchronize()
        self.queued = False
        return self.probs_host

    def read(self, name: str):
        """A decoder buffer on the host (tests, inspection): waits for the stream."""
        out = self.buf[name].copy_to_host(stream=self.stream)
        self.stream.synchronize()
        self.queued = False
        return out
