"""The whole model on the GPU: forward to the loss and backward to the flat gradient, chained from
the kernels of andrea_numba.kernels over device buffers allocated once.

    model = GPUModel(model_config, B, T)        # allocates every buffer, once; makes its own stream
    model.params.copy_to_device(flat_params)     # flat float32 vector, layout of andrea_numba.layout
    model.forward(tokens, targets)               # [B, T] int32 host or device arrays
    model.backward()                             # grads += d loss / d params
    model.read_loss()                            # 4 bytes to the host: waits for the stream

The saved activations have the names of the NumPy twin (reference/model.py) and are stacked over
layers: acts["ln1"][l] is block l's LN1 output. Nothing is allocated after __init__:
forward and backward only launch kernels on the buffers of `buffer_specs`.
"""
from __future__ import annotations

from dataclasses import dataclass

import contextlib
import inspect

import numpy as np
from numba import cuda

from .config import ModelConfig
import reference.dropout as D
from reference.precision import FP8_SCOPES

from .kernels import attn, cublaslt, dropout, embed, fp8_products, layernorm
from .kernels.matmul import splitk_work
from .kernels.tma import MAP_BYTES, TMAPS, TensorMaps
from .kernels.optim import zero
from .layout import n_params, views
from .recipes import LINEAR, OUT16, SAVED16, Recipe, resolve


@dataclass(frozen=True)
class BufferSpec:
    name: str
    shape: tuple
    dtype: type
    kind: str          # "params", "grads", "activations" (saved for backward), "scratch"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


def buffer_specs(m: ModelConfig, B: int, T: int, training: bool = True, own_params: bool = True,
                 flash: bool = True, saved16: bool = False, params16: bool = False,
                 out16: bool = False, loss_stats: bool = False) -> list[BufferSpec]:
    """Every device buffer of a forward + backward at batch B x T (the optimiser's m and v live
    with the trainer). One line per tensor, llm.c style. training=False: forward only (no
    gradients, no backward scratch); own_params=False: the parameters live in another model;
    flash=True (the engine's): flash attention, which saves lse [L, B, H, T] instead of att
    [L, B, H, T, T]. The rest follow the recipe (Recipe.buffer_flags): saved16=True (bf16_saved):
    the LayerNorms' outputs and the GELU's, read only by bf16 products, saved as bf16 (uint16 bit
    patterns, half the bytes; recipes.SAVED16), the LayerNorms writing into the fp32 scratch ln_out
    first where they cannot write bf16 themselves; params16=True (bf16_weights): a bf16 copy of the
    parameters, rounded once a forward, that the products read their weights from; out16=True
    (bf16_outputs): the bf16 outputs of recipes.OUT16's comment (y16, d_resid16; d_q, d_k, d_v as
    bf16); loss_stats=True (keeps_logits, training): the loss's row maxima and sums of exponentials,
    with which its backward recomputes the softmax from the logits left in probs."""
    L, C, V, H = m.n_layer, m.d_model, m.vocab_size, m.n_head
    N, F, P = B * T, 4 * m.d_model, n_params(m)
    f32, i32 = np.float32, np.int32
    S = lambda name, shape, kind, dtype=f32: BufferSpec(
        name, shape, np.uint16 if (saved16 and name in SAVED16) or (out16 and name in OUT16) else dtype, kind)
    specs = [S("params16", (P,), "params", np.uint16)] if params16 else []  # bf16 copy, rounded each forward
    specs += [
        S("params", (P,), "params"),                 # flat parameter vector
        S("grads", (P,), "grads"),                   # flat gradient, same layout
        S("tokens", (B, T), "activations", i32),     # input token ids
        S("targets", (N,), "activations", i32),      # next-token ids
        S("keys", (L, D.SITES), "activations", np.uint64),  # dropout's keys of the last forward, per block and site
        S("x", (L + 1, N, C), "activations"),        # residual stream: x[l] enters block l, x[L] leaves
        S("ln1", (L, N, C), "activations"),          # LN1 output
        S("ln1_mean", (L, N), "activations"),
        S("ln1_rstd", (L, N), "activations"),
        S("q", (L, N, C), "activations"),
        S("k", (L, N, C), "activations"),
        S("v", (L, N, C), "activations"),
        S("lse", (L, B, H, T), "activations") if flash else    # flash: the rows' log-sum-exp
        S("att", (L, B, H, T, T), "activations"),   # softmax probabilities
        S("y", (L, N, C), "activations"),            # attention output, heads side by side
        *([S("y16", (L, N, C), "activations", np.uint16)] if out16 else []),   # ... rounded to bf16 (flash v14)
        S("x_mid", (L, N, C), "activations"),        # residual stream between attention and MLP
        S("ln2", (L, N, C), "activations"),
        S("ln2_mean", (L, N), "activations"),
        S("ln2_rstd", (L, N), "activations"),
        S("h_pre", (L, N, F), "activations"),        # MLP hidden before GELU
        S("h", (L, N, F), "activations"),            # after GELU
        S("lnf", (N, C), "activations"),
        S("lnf_mean", (N,), "activations"),
        S("lnf_rstd", (N,), "activations"),
        S("losses", (N,), "activations"),            # per-position cross-entropy
        S("probs", (N, V), "activations"),           # softmax of the logits; backward turns it into dlogits
        *([S("loss_stats", (2, N), "activations")] if loss_stats else []),   # ... or the logits, with M and se a row
        S("loss", (1,), "activations"),              # mean loss
        S("branch", (N, C), "scratch"),              # output of attn_out / mlp before the residual add
        *([S("ln_out", (N, C), "scratch")] if saved16 else []),   # a LayerNorm's fp32 output, then rounded into ln1, ln2, lnf
        # backward scratch, each named after the gradient it holds (d_name = dL/d name):
        S("d_resid", (N, C), "scratch"),             # the residual stream: x[l+1], then x_mid, then x[l] (backward)
        *([S("d_resid16", (N, C), "scratch", np.uint16)] if out16 else []),   # ... rounded to bf16 (LN bwd v6)
        S("d_branch", (N, C), "scratch"),            # with dropout: a branch output's gradient, d_resid masked
        S("d_ln_out", (N, C), "scratch"),            # a LayerNorm's output (lnf, ln2, ln1)
        S("d_y", (N, C), "scratch"),                 # attention output
        S("d_q", (N, C), "scratch"),
        S("d_k", (N, C), "scratch"),
        S("d_v", (N, C), "scratch"),
        S("d_h_pre", (N, F), "scratch"),             # MLP hidden before GELU
        S("d_rowdot", (B, H, T), "scratch") if flash else     # flash: D = dy . y per row
        S("d_scores", (B, H, T, T), "scratch"),      # attention scores: datt, then ds (one layer at a time)
        S("embed_links", (2, N), "scratch", i32),    # embed_bwd's per-token lists
        S("splitk", (splitk_work(C, N),), "scratch"),   # split-K partial products (the MLP's forward too), LayerNorms' partial dg, db
    ]
    backward_only = {"grads", "embed_links", "splitk"} | {s.name for s in specs if s.name.startswith("d_")}
    return [s for s in specs
            if (training or s.name not in backward_only) and (own_params or s.name != "params")]


class GPUModel:
    """training=False builds a forward-only model (sampling, evaluation at another batch size);
    params=<device array> makes it use another model's parameter vector instead of its own;
    share=<GPUModel> (with training=False, at a B x T no larger) runs on the first elements of
    that model's buffers and its parameters, allocating nothing: the trainer's sampler.
    recipe=<Recipe or name> (andrea_numba/recipes.py; default "fp32") says which kernel computes
    each op and in which format each saved tensor is kept; self.precision is its products'
    precision, the twin's (reference.model at that precision computes the same).
    flash=True (the default) runs the recipe's flash attention (no [B, H, T, T] buffer); flash=False
    attention v2 (kernels/attn.py, fp32 recipes only), which saves the probabilities. The two agree
    to float32 rounding, not bit for bit: a run keeps one. On the H200 flash attention was faster at
    12M and 120M and needs 5.2 GB less at 120M (docs/kernels.md)."""

    def __init__(self, m: ModelConfig, B: int, T: int, stream=None, training=True, params=None,
                 dropout: float = 0.0, flash: bool = True, recipe: Recipe | str = "fp32", share=None):
        assert T <= m.context_length, f"T={T} exceeds the context length {m.context_length}"
        recipe = resolve(recipe)
        self.m, self.B, self.T, self.N = m, B, T, B * T
        self.recipe = recipe
        self.precision = recipe.precision           # of the products: the twin's precision
        self.fp8 = None                     # the FP8 products' scratch and record (fp8_products.FP8)
        kernels = dict(recipe.kernels)
        if recipe.library is not None:      # the library route: every product through cuBLASLt (one line
            if recipe.library in FP8_SCOPES:            # if it cannot run here); FP8 linear layers
                ops = fp8_products.linear_ops(recipe.library, B * T, m.d_model, m.vocab_size, m.n_layer)
                self.fp8 = fp8_products.FP8
            else:
                ops = cublaslt.linear_ops(recipe.library, B * T, m.d_model, m.vocab_size)
            kernels.update({op: (ops[op + "_fwd"], ops[op + "_bwd"]) for op in LINEAR})
        self.kernels = kernels              # op -> (forward, backward): what every launch below reads
        if recipe.operand_copies:           # matmul v13's bf16 copies: reserved before the first step
            cublaslt.COPIES.reserve(*cublaslt.operand_elements(B * T, m.d_model, m.vocab_size))
        if recipe.held_copies:              # ... and the copies an op rounds once for two products
            cublaslt.HELD.reserve(cublaslt.held_elements(B * T, m.d_model))
        if recipe.tensor_maps:              # ... and the table of TMA tensor maps (matmul_bf16_wgmma)
            TMAPS.reserve()
        self.mlp_fwd_takes_work = "work" in inspect.signature(self.mlp_fwd).parameters   # v11 on
        self.dropout = dropout                      # used by a forward given a dropout_key
        if share is not None:               # a forward on another model's memory (the trainer's sampler)
            assert not training, "a model on another model's buffers runs forward only"
            params, flash = share.params, share.flash
        assert flash or recipe.precision == "fp32", f"attention v2 has fp32 products only, not {recipe.name}'s"
        self.flash = flash
        self.out16 = flash and recipe.writes_out16(m)       # (recipes.OUT16)
        # every launch and copy of this model goes to one stream, never the legacy default stream
        self.stream = cuda.stream() if stream is None else stream
        self.training = training
        self.saved16 = recipe.bf16_saved            # LN and GELU outputs saved as bf16 (SAVED16)
        self.params16 = recipe.bf16_weights         # the products' weights from a bf16 copy (params16)
        # a training model of a recipe that keeps the logits: the loss forward leaves the logits in probs
        # and saves M and se a row in loss_stats; the backward recomputes the softmax from them
        # (forward-only models, the sampler's, write the softmax itself)
        self.loss_stats = recipe.keeps_logits and training
        self.specs = buffer_specs(m, B, T, training, own_params=params is None, flash=flash, saved16=self.saved16,
                                  params16=self.params16, out16=self.out16, loss_stats=self.loss_stats)
        if share is None:
            self.buf = {s.name: cuda.device_array(s.shape, dtype=s.dtype, stream=self.stream) for s in self.specs}
        else:                               # the first elements of each of its buffers: nothing allocated
            self.buf = {s.name: _prefix(share.buf[s.name], s.shape) for s in self.specs}
        self.params = self.buf["params"] if params is None else params
        self.P = views(self.params, m)               # named device views into the flat vectors
        # the weights the linear ops' products read: views of params16 (bf16 bit patterns, rounded
        # from params at the start of each forward) or of params themselves
        self.W = views(self.buf["params16"], m) if self.params16 else self.P
        if training:
            self.grads = self.buf["grads"]
            self.G = views(self.grads, m)
            zero(self.grads, stream=self.stream)

    # the linear ops' launchers, read from self.kernels at each launch (a benchmark or a test that
    # wraps self.kernels' entries wraps these too)
    qkv_fwd = property(lambda self: self.kernels["attn_qkv"][0])
    qkv_bwd = property(lambda self: self.kernels["attn_qkv"][1])
    out_fwd = property(lambda self: self.kernels["attn_out"][0])
    out_bwd = property(lambda self: self.kernels["attn_out"][1])
    mlp_fwd = property(lambda self: self.kernels["mlp"][0])
    mlp_bwd = property(lambda self: self.kernels["mlp"][1])
    loss_fwd = property(lambda self: self.kernels["loss"][0])
    loss_bwd = property(lambda self: self.kernels["loss"][1])

    @property
    def nbytes(self) -> int:
        """Its buffers' bytes (with cuBLASLt's workspace when the library computes its products, and
        the scratch of 16-bit operand copies when the library or matmul v13 does)."""
        held = products_scratch(self.recipe, self.N, self.m.d_model, self.m.vocab_size, self.m.n_layer)
        return sum(s.nbytes for s in self.specs) + sum(held.values())

    def forward(self, tokens, targets, dropout_key=None, keys=None):
        """tokens, targets [B, T] int32: host arrays (copied into the model's buffers on its stream;
        asynchronously when they live in pinned memory) or device arrays, read where they are (the
        trainer's batches, which a captured CUDA graph reads again at every replay); backward reads
        the same ones. A training forward drops with the model's probability, given its keys:
        dropout_key, a number (reference.dropout_key(seed, step, microbatch)) whose block keys are
        copied into the model's `keys` buffer, or keys, a uint64 device array [n_layer, 3] that
        holds them already (the trainer's, written before each step). Without either (evaluation,
        sampling) nothing is dropped."""
        b, P, m, s = self.buf, self.P, self.m, self.stream
        B, T, C = self.B, self.T, m.d_model
        inputs = {}
        for name, arr in (("tokens", tokens), ("targets", targets)):
            if isinstance(arr, np.ndarray):             # host memory: copied into the model's buffer
                arr = np.ascontiguousarray(arr.reshape(b[name].shape), dtype=np.int32)  # itself when it is
                b[name].copy_to_device(arr, stream=s)
                arr = b[name]
            assert arr.dtype == np.int32, f"{name}: int32 token ids, got {arr.dtype}"
            inputs[name] = arr.reshape(b[name].shape)
        self.inputs = inputs
        b = {**b, **inputs}                             # the buffers, with this forward's token ids
        x, eps, H = b["x"], m.ln_eps, m.n_head
        # dropout: probability p_drop, one key per block and site (reference/dropout.py), each
        # passed to the kernels as a one-element view of a device array; the backward draws the
        # same masks from the views kept here. p = 0: the kernels read a key but drop nothing.
        p_drop = self.dropout if dropout_key is not None or keys is not None else 0.0
        if p_drop and keys is None:
            keys = b["keys"]
            keys.copy_to_device(np.array([D.block_keys(dropout_key, l) for l in range(m.n_layer)], np.uint64),
                                stream=s)
        keys = b["keys"] if keys is None else keys
        self.keys = [[keys[l, i:i + 1] for i in range(D.SITES)] for l in range(m.n_layer)]
        self.p_drop = p_drop
        # an MLP launcher that splits its products over K (mlp v11, v12) takes the split-K buffer,
        # free during the forward; a model without one (forward only) runs those products whole
        mlp_work = {"work": b.get("splitk")} if self.mlp_fwd_takes_work else {}
        if self.fp8 is not None:     # this step's FP8 records from slot 0 (fp8_products.FP8Workspace)
            self.fp8.begin()
        if self.params16:        # every weight rounded to bf16 once (ties to even, as each product would round it)
            cublaslt.round_into(b["params16"], self.params.reshape(1, self.params.shape[0]), "bf16", s)
        W = self.W
        embed_fwd = self.kernels["embed"][0]
        ln_fwd = self.kernels["layernorm"][0]
        fused_ln_fwd = self.kernels["residual_layernorm"][0]
        embed_fwd(x[0].reshape(B, T, C), b["tokens"], P["wte"], P["wpe"], stream=s)

        def ln(saved):
            """Where a LayerNorm writes its output: the saved buffer, or with saved16 the fp32 scratch
            ln_out, which keep() then rounds into the saved bf16 buffer (ties to even, as the products
            that read it would round it)."""
            return b["ln_out"] if self.saved16 else saved

        def keep(saved):
            if self.saved16:
                cublaslt.round_into(_flat(saved), b["ln_out"], "bf16", s)

        def residual_ln(resid, saved, mean, rstd, x_in, f, g, beta):
            """resid = x_in + f and saved = LN(resid): the recipe's residual_layernorm forward; with
            saved16 (its v3) it writes the bf16 output itself where the rows are whole 16-byte chunks,
            and v1 writes the fp32 ln_out, then rounded, where they are not."""
            if self.saved16 and not layernorm.fits_vec4(resid, saved, x_in, f):
                layernorm.residual_layernorm_fwd(resid, ln(saved), mean, rstd, x_in, f, g, beta, eps, stream=s)
                keep(saved)
            else:
                fused_ln_fwd(resid, saved, mean, rstd, x_in, f, g, beta, eps, stream=s)
        # the first LayerNorm has no residual sum before it; every later one is fused with the
        # residual add that makes its input (the recipe's residual_layernorm)
        ln_fwd(ln(b["ln1"][0]), b["ln1_mean"][0], b["ln1_rstd"][0], x[0],
                                P["h0.ln1.g"], P["h0.ln1.b"], eps, stream=s)
        keep(b["ln1"][0])
        for l in range(m.n_layer):
            p = f"h{l}."
            k_att, k_ao, k_mlp = self.keys[l]
            self.qkv_fwd(b["q"][l], b["k"][l], b["v"][l], b["ln1"][l],
                         W[p + "attn.w_q"], W[p + "attn.w_k"], W[p + "attn.w_v"], stream=s)
            qkv = [b[n][l].reshape(B, T, C) for n in ("q", "k", "v")]
            # y, and with out16 its bf16 copy y16, the operand of attn_out's products
            y16 = {"y16": b["y16"][l].reshape(B, T, C)} if self.out16 else {}
            if self.flash:
                self.kernels["attention"][0](b["y"][l].reshape(B, T, C), b["lse"][l], *qkv, H, p_drop, k_att, stream=s,
                                          **y16)
            else:
                attn.attn_fwd_tiled(b["y"][l].reshape(B, T, C), b["att"][l], *qkv, H, p_drop, k_att, stream=s)
            self.out_fwd(b["branch"], self.y_operand(l), W[p + "attn.w_o"], stream=s)
            if p_drop:                                              # in place: branch = drop(branch)
                dropout.dropout_fwd(_flat(b["branch"]), _flat(b["branch"]), p_drop, k_ao, stream=s)
            # x_mid = x[l] + branch, then ln2 = LN2(x_mid): one kernel
            residual_ln(b["x_mid"][l], b["ln2"][l], b["ln2_mean"][l], b["ln2_rstd"][l], x[l], b["branch"],
                        P[p + "ln2.g"], P[p + "ln2.b"])
            self.mlp_fwd(out=b["branch"], h_pre=b["h_pre"][l], h=b["h"][l], x=b["ln2"][l],
                         w_1=W[p + "mlp.w_1"], w_2=W[p + "mlp.w_2"], stream=s, **mlp_work)
            if p_drop:
                dropout.dropout_fwd(_flat(b["branch"]), _flat(b["branch"]), p_drop, k_mlp, stream=s)
            # x[l+1] = x_mid + branch, then the next LayerNorm: block l+1's LN1, or LNf after the last
            if l + 1 < m.n_layer:
                nxt, q = (b["ln1"][l + 1], b["ln1_mean"][l + 1], b["ln1_rstd"][l + 1]), f"h{l + 1}.ln1."
            else:
                nxt, q = (b["lnf"], b["lnf_mean"], b["lnf_rstd"]), "lnf."
            residual_ln(x[l + 1], nxt[0], *nxt[1:], b["x_mid"][l], b["branch"], P[q + "g"], P[q + "b"])
        stats = {"stats": b["loss_stats"]} if self.loss_stats else {}
        self.loss_fwd(b["loss"], b["losses"], b["probs"], b["lnf"], W["wte"], b["targets"], stream=s, **stats)

    def backward(self, dloss: float = 1.0):
        """Adds dloss * d(mean loss)/d(params) into grads (+=: call zero_grads between optimiser
        steps); dloss is 1 but for loss scaling (andrea_numba/loss_scale.py). Uses the activations
        of the last forward; turns probs into dlogits in place."""
        assert self.training, "this model was built with training=False: it has no gradient buffers"
        b, P, G, m, s = {**self.buf, **self.inputs}, self.P, self.G, self.m, self.stream   # forward's token ids
        W = self.W                  # the products' weights (params16: as the forward rounded them)
        B, T, C, H = self.B, self.T, m.d_model, m.n_head
        x, bt = b["x"], lambda name: b[name].reshape(B, T, C)        # [N, C] buffers seen as [B, T, C]
        # One buffer carries the residual stream's gradient down the blocks. A residual add
        # x_out = x_in + f passes d x_out on to both x_in and f unchanged (residual_add_bwd copies
        # it twice), so the branch reads d_resid itself, and each fused residual + LayerNorm
        # backward adds its LayerNorm's part into d_resid in place: d_resid holds d x[l+1], then
        # d x_mid, then d x[l]. Only dropout needs a copy: the branch's gradient is then the
        # masked d_resid, in d_branch.
        d_resid, d_branch = b["d_resid"], b["d_branch"]
        d_ln_out = b["d_ln_out"]
        work = b["splitk"]          # split-K partial products; the LayerNorms' partial dg, db sums
        stats = {"stats": b["loss_stats"]} if self.loss_stats else {}
        self.loss_bwd(d_ln_out, G["wte"], b["probs"], work, dloss, b["lnf"], W["wte"], b["probs"], b["targets"],
                      stream=s, **stats)
        self.kernels["layernorm"][1](d_resid, G["lnf.g"], G["lnf.b"], work, d_ln_out, x[m.n_layer],
                                b["lnf_mean"], b["lnf_rstd"], P["lnf.g"], stream=s)
        p_drop = self.p_drop
        # with out16 (no dropout) each residual + LayerNorm backward also writes d_resid's bf16 copy,
        # the operand of the products of the branch below it; the last block's MLP reads d_resid after
        # LNf's backward, which writes none (its products round it themselves)
        resid16 = self.out16 and not p_drop
        fused_ln_bwd = self.kernels["residual_layernorm"][1]   # v6 writes d_resid16 when given d16
        fresh16 = False             # d_resid16 holds d_resid as it is now

        def branch_grad(key):
            """A branch's upstream gradient: d_resid itself (its bf16 copy where one was written), or
            with dropout its masked copy."""
            if not p_drop:
                return b["d_resid16"] if fresh16 else d_resid
            dropout.dropout_bwd(_flat(d_branch), _flat(d_resid), p_drop, key, stream=s)
            return d_branch

        def residual_ln_bwd(g, bias, saved_x, mean, rstd, gamma):
            """d_resid += the LayerNorm's grad_input (in place: both paths into its input), with
            resid16 into d_resid16 too (residual_layernorm_bwd v6)."""
            if resid16:
                fused_ln_bwd(d_resid, d_resid, g, bias, work, d_resid, d_ln_out, saved_x, mean, rstd, gamma,
                             d16=b["d_resid16"], stream=s)
            else:
                fused_ln_bwd(d_resid, d_resid, g, bias, work, d_resid, d_ln_out, saved_x, mean, rstd, gamma, stream=s)
            return resid16
        for l in reversed(range(m.n_layer)):
            p = f"h{l}."
            k_att, k_ao, k_mlp = self.keys[l]
            # x[l+1] = x_mid + drop(mlp(LN2(x_mid)))
            self.mlp_bwd(d_ln_out, G[p + "mlp.w_1"], G[p + "mlp.w_2"], b["d_h_pre"], work, branch_grad(k_mlp),
                         b["ln2"][l], b["h_pre"][l], b["h"][l], W[p + "mlp.w_1"], W[p + "mlp.w_2"], stream=s)
            # both paths into x_mid: d_resid (the skip path's, in place) += LN2's grad_input
            fresh16 = residual_ln_bwd(G[p + "ln2.g"], G[p + "ln2.b"], b["x_mid"][l], b["ln2_mean"][l],
                                      b["ln2_rstd"][l], P[p + "ln2.g"])
            # x_mid = x[l] + drop(W_O(attn(qkv(LN1(x[l])))))
            self.out_bwd(b["d_y"], G[p + "attn.w_o"], work, branch_grad(k_ao), self.y_operand(l), W[p + "attn.w_o"],
                         stream=s)
            qkv = [b[n][l].reshape(B, T, C) for n in ("q", "k", "v")]
            if self.flash:
                self.kernels["attention"][1](bt("d_q"), bt("d_k"), bt("d_v"), b["d_rowdot"], bt("d_y"), *qkv,
                                          b["y"][l].reshape(B, T, C), b["lse"][l], H, p_drop, k_att, stream=s)
            else:
                attn.attn_bwd_tiled(bt("d_q"), bt("d_k"), bt("d_v"), b["d_scores"], bt("d_y"), *qkv,
                              b["att"][l], H, p_drop, k_att, stream=s)
            self.qkv_bwd(d_ln_out, G[p + "attn.w_q"], G[p + "attn.w_k"], G[p + "attn.w_v"], work,
                         b["d_q"], b["d_k"], b["d_v"], b["ln1"][l],
                         W[p + "attn.w_q"], W[p + "attn.w_k"], W[p + "attn.w_v"], stream=s)
            # both paths into x[l]: d_resid (the skip path's, in place) += LN1's grad_input
            fresh16 = residual_ln_bwd(G[p + "ln1.g"], G[p + "ln1.b"], x[l], b["ln1_mean"][l], b["ln1_rstd"][l],
                                      P[p + "ln1.g"])
        self.kernels["embed"][1](G["wte"], G["wpe"], b["embed_links"], d_resid.reshape(B, T, C), b["tokens"],
                        m.vocab_size, m.context_length, stream=s)

    def y_operand(self, l: int):
        """Layer l's attention output as attn_out's products read it: y [N, C], or with out16 its
        bf16 copy y16 (the same bits once rounded)."""
        return self.buf["y16"][l] if self.out16 else self.buf["y"][l]

    def zero_grads(self):
        zero(self.grads, stream=self.stream)

    @contextlib.contextmanager
    def launching_on(self, stream):
        """Inside the block every launch of this model goes to `stream` instead of its own: the
        trainer passes a CUDA graph builder while it captures a training step (train.py)."""
        own, self.stream = self.stream, stream
        try:
            yield self
        finally:
            self.stream = own

    def probs_row(self, row: int):
        """Softmax over the vocabulary at one position (row = b*T + t), copied to the host
        (waits for the stream: a host sync)."""
        out = self.buf["probs"][row].copy_to_host(stream=self.stream)
        if self.loss_stats:          # probs holds the logits: the softmax from the row's M and se
            m_se = self.buf["loss_stats"][:, row].copy_to_host(stream=self.stream)
            self.stream.synchronize()
            return (np.exp(out - m_se[0]) / m_se[1]).astype(np.float32)
        self.stream.synchronize()
        return out

    def read_loss(self) -> float:
        """Mean loss of the last forward (copies 4 bytes to the host and waits: a host sync)."""
        out = self.buf["loss"].copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return float(out[0])


def products_scratch(recipe: Recipe | str, N: int, C: int, V: int, n_layer: int = 1) -> dict:
    """What a model of this recipe holds beside its buffers, by name (bytes), for N = B*T rows,
    width C and vocabulary V: cuBLASLt's workspace when the library computes the products, the
    scratch of 16-bit operand copies (cublaslt.COPIES) when the library does in bf16 or fp16 or our
    products copy their operands (operand_copies), the scratch where an op keeps a gradient rounded
    once for its two products (cublaslt.HELD, held_copies), the TMA tensor maps, the FP8 operands.
    GPUModel.nbytes and the memory plan (plan.py) count these."""
    recipe = resolve(recipe)
    held = {}
    if recipe.library is not None:
        held["cublaslt_workspace"] = cublaslt.WORKSPACE_BYTES
    copies = cublaslt.scratch_bytes(recipe.precision, N, C, V)
    if copies and (recipe.library is not None or recipe.operand_copies):
        held["operands_16bit"] = copies
    if recipe.held_copies:
        held["operands_held_16bit"] = 2 * cublaslt.held_elements(N, C)
    if recipe.tensor_maps:
        held["tma_tensor_maps"] = TensorMaps.SLOTS * MAP_BYTES
    if recipe.precision in FP8_SCOPES:
        held["operands_fp8"] = fp8_products.scratch_bytes(N, C, n_layer)
    return held


def _flat(a):
    return a.reshape(a.size)


def _prefix(a, shape):
    """The first prod(shape) elements of device array a, seen as an array of `shape` (a view)."""
    n = int(np.prod(shape))
    assert n <= a.size, f"a buffer of {a.size} elements cannot hold {shape}"
    return _flat(a)[:n].reshape(shape)
