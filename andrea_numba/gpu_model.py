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

from .kernels import attn, attn_flash, attn_out, attn_qkv, cublaslt, dropout, embed, fp8_products, layernorm, loss, mlp
from .kernels import matmul
from .kernels.matmul import splitk_work
from .kernels.tma import MAP_BYTES, TMAPS, TensorMaps
from .kernels.optim import zero
from .kernels.common import SIMULATOR
from .layout import n_params, views


# Saved as bf16 with products "bf16a" (buffer_specs(saved16=True)): the activations whose every
# reader is a bf16 product, which rounds its inputs to bf16 (ties to even) before it multiplies, so
# keeping them rounded changes no bit the products see: LN1's, LN2's and LNf's outputs (the inputs of
# the Q, K, V, W_1 and logits products and of their weight gradients) and the GELU's output h (W_2's
# and dW_2's). Not y, the attention output: flash attention's backward reads it in fp32 (D = dy . y).
SAVED16 = ("ln1", "ln2", "lnf", "h")
# With products "bf16o" (buffer_specs(out16=True)) the ops that make a bf16 product's operand write
# it in bf16 themselves, where the operand copy (cublaslt.round_into) rounded their fp32 output
# before: flash attention v14 writes y's bf16 copy y16 beside y (which its backward still reads in
# fp32) and dq, dk, dv in bf16 only (d_q, d_k, d_v are uint16); residual_layernorm_bwd v6 writes the
# residual stream's gradient's bf16 copy d_resid16, which the next block down's attn_out and MLP
# backward products read. Each is the fp32 value rounded as the copy rounded it: the same bits.
OUT16 = ("d_q", "d_k", "d_v")


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
    [L, B, H, T, T]; saved16=True (products "bf16a"): the LayerNorms' outputs and the GELU's,
    read only by bf16 products, saved as bf16 (uint16 bit patterns, half the bytes; SAVED16),
    the LayerNorms writing into the fp32 scratch ln_out first; params16=True (products "bf16s"): a
    bf16 copy of the parameters, rounded once a forward, that the products read their weights from;
    out16=True (products "bf16o"): the bf16 outputs of OUT16's comment (y16, d_resid16; d_q, d_k,
    d_v as bf16); loss_stats=True (LOGITS_KINDS, training): the loss's row maxima and sums of
    exponentials, with which its backward recomputes the softmax from the logits left in probs."""
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
    flash=True (the default) runs flash attention (kernels/attn_flash.py, the module's engine
    version: v8's forward and v10's backward, on tensor cores, no [B, H, T, T] buffer); flash=False attention v2
    (kernels/attn.py, which saves the probabilities). The two agree to float32 rounding, not bit
    for bit: a run keeps one. On the H200 flash attention was faster at 12M and 120M and needs
    5.2 GB less at 120M (docs/kernels-h200.md).
    share=<GPUModel> (with training=False, at a B x T no larger) runs on the first elements of
    that model's buffers and its parameters, allocating nothing: the trainer's sampler.
    products="tf32x3w" (the default) runs the linear ops' v7 (mlp v12: its GELU a pass of its
    own, its C-wide products split over K in the split-K buffer; the loss forward's v9, its softmax
    rows on as few threads as they need): 3xTF32 on the swizzled k-major tiles of kernels/split_tile.py, the small parts truncated
    by the tensor core (matmul v8); "tf32x3t" their v6 (mlp v7), the same sums on v6's tiles
    (matmul v7); "tf32x3k" their v5, the same tiles with both parts rounded (matmul v6);
    "tf32x3s" their v4 (split planes, matmul v5); "tf32x3" their v3 (warp tiles, matmul v4);
    "simt2" their v8 (mlp v10): no tensor cores, SIMT multiply-adds on the k-major tiles of
    kernels/simt_tile.py (matmul v9); "simt" their v2 (SIMT warp tiles, matmul v3). All are
    fp32-accurate. "bf16w" runs their bf16 versions (attn_qkv, attn_out v9, mlp v13, loss_fwd
    v10, loss_bwd v9: matmul v10's tiles, every product's inputs rounded to bf16, fp32 sums); its
    twin is reference.model at precision "bf16" (self.precision); "f16w" the same in fp16;
    "bf16l" their bf16 versions on matmul v12's tiles (attn_qkv,
    attn_out v11, mlp v15, loss_fwd v12, loss_bwd v11: each operand rounded once into bf16 shared
    tiles, fragments read with ldmatrix); "bf16a" the same through matmul v13 (attn_qkv, attn_out
    v12, mlp v16, loss_fwd v13, loss_bwd v12: bf16 copies of the operands, copied to shared memory
    by cp.async); "bf16r" the same through matmul v16 (attn_qkv, attn_out v13, mlp v17, loss_fwd v14,
    loss_bwd v13: Hopper's wgmma where no activation would be copied transposed, v13 for the weight
    gradients; a gradient rounded once for its two products; the loss's softmax in two passes and
    dlogits written in bf16); "bf16m" the same on matmul v17 alone (attn_qkv, attn_out v14, mlp v18,
    loss_fwd v15, loss_bwd v14: wgmma for every product, an operand with k down its columns read
    through the transpose bits); "bf16t" the same on
    matmul v18 (attn_qkv, attn_out v15, mlp v19, loss_fwd v17, loss_bwd v15: v17's products with
    TMA copies from a producer warp, mbarriers and persistent blocks; the softmax with its row in
    registers); "bf16s" bf16t reading every weight from params16, a bf16 copy of the parameters
    rounded once a forward; "bf16o" (the engine's --precision bf16 on a Hopper) bf16s with the
    products' activation operands written in bf16 by the ops that make them (OUT16: flash attention
    v14, residual_layernorm_bwd v6) and its training loss keeping the logits (loss v18/v16,
    LOGITS_KINDS). "cublas", "cublas-bf16",
    "cublas-fp16" run every product of the linear ops through cuBLASLt in fp32, bf16 or fp16
    (kernels/cublaslt.py: the library route, on a GPU with nvmath-python). With bf16 or fp16
    products flash attention runs with products at that precision too (v13, v12: FLASH_VERSION), as
    the twin at that precision does.
    mlp_version=<n> runs the MLP's launchers of that version instead (the benchmarks' --mlp-version);
    flash_version=<n> flash attention's (their --flash-version)."""

    def __init__(self, m: ModelConfig, B: int, T: int, stream=None, training=True, params=None,
                 dropout: float = 0.0, flash: bool = True, products: str = "tf32x3w", share=None,
                 mlp_version: int | None = None, flash_version: int | None = None):
        assert T <= m.context_length, f"T={T} exceeds the context length {m.context_length}"
        assert products in PRODUCTS, f"products must be one of {sorted(PRODUCTS)}, got {products!r}"
        self.m, self.B, self.T, self.N = m, B, T, B * T
        # the linear ops' launchers, by version (PRODUCTS)
        self.products = products
        self.precision = PRECISION.get(products, "fp32")     # of the products: the twin's precision
        v = PRODUCTS[products]
        self.fp8 = None                     # the FP8 products' scratch and record (fp8_products.FP8)
        if v is None:                       # the library route: every product through cuBLASLt (one line
            if self.precision in FP8_SCOPES:                # if it cannot run here); FP8 linear layers
                ops = fp8_products.linear_ops(self.precision, B * T, m.d_model, m.vocab_size, m.n_layer)
                self.fp8 = fp8_products.FP8
            else:
                ops = cublaslt.linear_ops(LIBRARY_PRECISION[products], B * T, m.d_model, m.vocab_size)
            self.qkv_fwd, self.qkv_bwd = ops["attn_qkv_fwd"], ops["attn_qkv_bwd"]
            self.out_fwd, self.out_bwd = ops["attn_out_fwd"], ops["attn_out_bwd"]
            self.mlp_fwd, self.mlp_bwd = ops["mlp_fwd"], ops["mlp_bwd"]
            self.loss_fwd, self.loss_bwd = ops["loss_fwd"], ops["loss_bwd"]
        else:
            self.qkv_fwd, self.qkv_bwd = attn_qkv.VERSIONS["attn_qkv_fwd"][v], attn_qkv.VERSIONS["attn_qkv_bwd"][v]
            self.out_fwd, self.out_bwd = attn_out.VERSIONS["attn_out_fwd"][v], attn_out.VERSIONS["attn_out_bwd"][v]
            vm = MLP_VERSION.get(products, v) if mlp_version is None else mlp_version
            self.mlp_fwd, self.mlp_bwd = mlp.VERSIONS["mlp_fwd"][vm], mlp.VERSIONS["mlp_bwd"][vm]
            self.loss_fwd = loss.VERSIONS["loss_fwd"][LOSS_FWD_VERSION.get(products, v)]
            self.loss_bwd = loss.VERSIONS["loss_bwd"][LOSS_BWD_VERSION.get(products, v)]
        if products in COPIES_KINDS:        # matmul v13's bf16 copies: reserved before the first step
            cublaslt.COPIES.reserve(*cublaslt.operand_elements(B * T, m.d_model, m.vocab_size))
        if products in HELD_KINDS:          # ... and the copies an op rounds once for two products
            cublaslt.HELD.reserve(cublaslt.held_elements(B * T, m.d_model))
        if products in TMA_KINDS:           # ... and the table of TMA tensor maps (matmul v18), and v19's
            TMAPS.reserve()                 # split-K counters (every v18 launch passes them)
            matmul.COUNTS.reserve()
        self.mlp_fwd_takes_work = "work" in inspect.signature(self.mlp_fwd).parameters   # v11 on
        self.dropout = dropout                      # used by a forward given a dropout_key
        if share is not None:               # a forward on another model's memory (the trainer's sampler)
            assert not training, "a model on another model's buffers runs forward only"
            params, flash = share.params, share.flash
        self.flash = flash
        # flash attention's launchers: the engine's (attn_flash.attn_flash_fwd / _bwd, read at each
        # launch) in fp32; with bf16 or fp16 products, the version with products at that precision
        # (FLASH_VERSION); flash_version=<n> runs version n instead (the benchmarks' --flash-version)
        v_flash = flash_version_for(products) if flash_version is None else flash_version
        self.flash_version = v_flash
        self.out16 = flash and writes_out16(products, m) and v_flash == OUT16_FLASH      # (OUT16)
        self.flash_pair = attn_flash.flash_pair(v_flash) if v_flash is not None else None
        # every launch and copy of this model goes to one stream, never the legacy default stream
        self.stream = cuda.stream() if stream is None else stream
        self.training = training
        self.saved16 = products in SAVED16_KINDS     # LN and GELU outputs saved as bf16 (SAVED16)
        self.params16 = products in SHADOW_KINDS     # the products' weights from a bf16 copy (params16)
        # a training model of LOGITS_KINDS: the loss forward leaves the logits in probs and saves M and
        # se a row in loss_stats; the backward recomputes the softmax from them (forward-only models,
        # the sampler's, write the softmax itself)
        self.loss_stats = products in LOGITS_KINDS and training
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

    @property
    def nbytes(self) -> int:
        """Its buffers' bytes (with cuBLASLt's workspace when the library computes its products, and
        the scratch of 16-bit operand copies when the library or matmul v13 does)."""
        held = products_scratch(self.products, self.N, self.m.d_model, self.m.vocab_size, self.m.n_layer)
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
        embed.embed_fwd(x[0].reshape(B, T, C), b["tokens"], P["wte"], P["wpe"], stream=s)

        def ln(saved):
            """Where a LayerNorm writes its output: the saved buffer, or with saved16 the fp32 scratch
            ln_out, which keep() then rounds into the saved bf16 buffer (ties to even, as the products
            that read it would round it)."""
            return b["ln_out"] if self.saved16 else saved

        def keep(saved):
            if self.saved16:
                cublaslt.round_into(_flat(saved), b["ln_out"], "bf16", s)

        def residual_ln(resid, saved, mean, rstd, x_in, f, g, beta):
            """resid = x_in + f and saved = LN(resid): the engine's residual_layernorm_fwd; with saved16
            its v3, which writes the bf16 output itself, where the rows are whole 16-byte chunks."""
            if self.saved16 and layernorm.fits_v3(resid, saved, x_in, f):
                layernorm.residual_layernorm_fwd_v3(resid, saved, mean, rstd, x_in, f, g, beta, eps, stream=s)
            else:
                layernorm.residual_layernorm_fwd(resid, ln(saved), mean, rstd, x_in, f, g, beta, eps, stream=s)
                keep(saved)
        # the first LayerNorm has no residual sum before it; every later one is fused with the
        # residual add that makes its input (layernorm.residual_layernorm_fwd)
        layernorm.layernorm_fwd(ln(b["ln1"][0]), b["ln1_mean"][0], b["ln1_rstd"][0], x[0],
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
                self.flash_launchers()[0](b["y"][l].reshape(B, T, C), b["lse"][l], *qkv, H, p_drop, k_att, stream=s,
                                          **y16)
            else:
                attn.attn_fwd(b["y"][l].reshape(B, T, C), b["att"][l], *qkv, H, p_drop, k_att, stream=s)
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
        layernorm.layernorm_bwd(d_resid, G["lnf.g"], G["lnf.b"], work, d_ln_out, x[m.n_layer],
                                b["lnf_mean"], b["lnf_rstd"], P["lnf.g"], stream=s)
        p_drop = self.p_drop
        # with out16 (no dropout) each residual + LayerNorm backward also writes d_resid's bf16 copy,
        # the operand of the products of the branch below it; the last block's MLP reads d_resid after
        # LNf's backward, which writes none (its products round it themselves)
        resid16 = self.out16 and not p_drop
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
                layernorm.residual_layernorm_bwd_v6(d_resid, d_resid, g, bias, work, d_resid, d_ln_out, saved_x, mean,
                                                    rstd, gamma, d16=b["d_resid16"], stream=s)
            else:
                layernorm.residual_layernorm_bwd(d_resid, d_resid, g, bias, work, d_resid, d_ln_out, saved_x, mean,
                                                 rstd, gamma, stream=s)
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
                self.flash_launchers()[1](bt("d_q"), bt("d_k"), bt("d_v"), b["d_rowdot"], bt("d_y"), *qkv,
                                          b["y"][l].reshape(B, T, C), b["lse"][l], H, p_drop, k_att, stream=s)
            else:
                attn.attn_bwd(bt("d_q"), bt("d_k"), bt("d_v"), b["d_scores"], bt("d_y"), *qkv,
                              b["att"][l], H, p_drop, k_att, stream=s)
            self.qkv_bwd(d_ln_out, G[p + "attn.w_q"], G[p + "attn.w_k"], G[p + "attn.w_v"], work,
                         b["d_q"], b["d_k"], b["d_v"], b["ln1"][l],
                         W[p + "attn.w_q"], W[p + "attn.w_k"], W[p + "attn.w_v"], stream=s)
            # both paths into x[l]: d_resid (the skip path's, in place) += LN1's grad_input
            fresh16 = residual_ln_bwd(G[p + "ln1.g"], G[p + "ln1.b"], x[l], b["ln1_mean"][l], b["ln1_rstd"][l],
                                      P[p + "ln1.g"])
        embed.embed_bwd(G["wte"], G["wpe"], b["embed_links"], d_resid.reshape(B, T, C), b["tokens"],
                        m.vocab_size, m.context_length, stream=s)

    def y_operand(self, l: int):
        """Layer l's attention output as attn_out's products read it: y [N, C], or with out16 its
        bf16 copy y16 (the same bits once rounded)."""
        return self.buf["y16"][l] if self.out16 else self.buf["y"][l]

    def flash_launchers(self):
        """(forward, backward) of flash attention: the pair of this model's precision or flash_version,
        else the engine's (attn_flash's module names, read at each launch)."""
        return self.flash_pair or (attn_flash.attn_flash_fwd, attn_flash.attn_flash_bwd)

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


# products= of GPUModel: the version of the linear ops (attn_qkv, attn_out, mlp, loss) it runs;
# the MLP's own number where it differs (its v6 is v5 with another store loop, not a product kind)
# "bf16w": every product of the linear ops in bf16 (matmul v10's tiles: inputs rounded to bf16 as
# they are read, fp32 sums), the engine's tf32x3w versions otherwise (attention, LayerNorm, the
# softmax and the loss, the optimiser stay fp32): issue 11's first form of --precision bf16
# "f16w": the same in fp16 (matmul v11's tiles), for --precision fp16 with loss scaling
# "cublas", "cublas-bf16", "cublas-fp16": the library route (kernels/cublaslt.py): the same ops with every
# product through cuBLASLt in fp32 (an SGEMM), bf16 or fp16, the engine's kernels for the rest (None:
# no version of ours); on a GPU with nvmath-python only
LIBRARY_PRECISION = {"cublas": "fp32", "cublas-bf16": "bf16", "cublas-fp16": "fp16",
                     # issue 12: the linear layers' products in FP8 at a scope (kernels/fp8_products.py)
                     "cublas-fp8-fwd": "fp8-fwd", "cublas-fp8-e5m2": "fp8-e5m2", "cublas-fp8-all": "fp8-all"}
# "bf16l": bf16 products on matmul v12's tiles (bf16 shared tiles read with ldmatrix: attn_qkv, attn_out
# v11, mlp v15, loss_fwd v12, loss_bwd v11)
# "bf16a": bf16 products through matmul v13 (each operand rounded once into a bf16 copy in
# cublaslt.COPIES, copied to shared memory by cp.async: attn_qkv, attn_out v12, mlp v16, loss_fwd
# v13, loss_bwd v12)
# "bf16r": bf16a's ops through matmul v16: Hopper's wgmma (v15) where no activation needs a transposed
# copy, v13 for the weight gradients; the loss with two passes over the logits and dlogits written in
# bf16 (attn_qkv, attn_out v13, mlp v17, loss_fwd v14, loss_bwd v13)
# "bf16m": the same ops on matmul v17 alone: wgmma for every product, an operand stored with k down its
# columns read M- or N-major through wgmma's transpose bits (attn_qkv, attn_out v14, mlp v18, loss_fwd
# v15, loss_bwd v14)
# "bf16t": the same ops on matmul v18: v17's tiles copied by TMA from a producer warp, mbarriers, persistent
# blocks, a tile per product (attn_qkv, attn_out v15, mlp v19, loss_fwd v17: the softmax reads the logits
# once, loss_bwd v15)
# "bf16s": bf16t's ops with every weight rounded to bf16 once a forward into params16 (one pass over
# the parameters) instead of once a product (twice a step: the forward's product and the backward's
# dx): the same bits, one launch instead of about 120 at 120M
# "bf16o": bf16s with the products' activation operands written in bf16 by the ops that make them
# (OUT16's comment: flash attention v14, residual_layernorm_bwd v6): the same bits, five copies of
# [N, C] a layer fewer; its loss keeps the logits (loss_fwd v18, loss_bwd v16: LOGITS_KINDS)
PRODUCTS = {"simt": 2, "tf32x3": 3, "tf32x3s": 4, "tf32x3k": 5, "tf32x3t": 6, "tf32x3w": 7, "simt2": 8, "bf16w": 9,
            "f16w": 10, "bf16l": 11, "bf16a": 12, "bf16r": 13, "bf16m": 14, "bf16t": 15, "bf16s": 15, "bf16o": 15,
            **{kind: None for kind in LIBRARY_PRECISION}}
MLP_VERSION = {"tf32x3t": 7, "tf32x3w": 12, "simt2": 10, "bf16w": 13, "f16w": 14, "bf16l": 15, "bf16a": 16, "bf16r": 17,
               "bf16m": 18, "bf16t": 19, "bf16s": 19, "bf16o": 19}
LOSS_FWD_VERSION = {"tf32x3w": 9, "bf16w": 10, "f16w": 11, "bf16l": 12, "bf16a": 13, "bf16r": 14, "bf16m": 15, "bf16t": 17, "bf16s": 17, "bf16o": 18}   # the loss forward's, where not the linear ops'
PRODUCTS_FOR = {"fp32": "tf32x3w", "bf16": "bf16o", "fp16": "f16w"}   # train.precision -> the engine's products
# flash attention's version by the products' precision (kernels/attn_flash_v13.py: v13 bf16; attn_flash_lowp.py:
# v12 fp16, and v11, bf16's before v13);
# the twin at that precision runs the flash twin, which rounds the same products (reference/model.py)
FLASH_VERSION = {"bf16": 13, "fp16": 12, **{scope: 13 for scope in FP8_SCOPES}}   # FP8 scopes: attention in bf16
LIBRARY_FOR = {p: kind for kind, p in LIBRARY_PRECISION.items()}         # ... with train.products "cublas"


def products_scratch(products: str, N: int, C: int, V: int, n_layer: int = 1) -> dict:
    """What a model of these products holds beside its buffers, by name (bytes), for N = B*T rows,
    width C and vocabulary V: cuBLASLt's workspace when the library computes the products, and the
    scratch of 16-bit operand copies (cublaslt.COPIES) when the library does in bf16 or fp16 or
    matmul v13 does (COPIES_KINDS), and the scratch where an op keeps a gradient rounded once for its
    two products (cublaslt.HELD, HELD_KINDS). GPUModel.nbytes and the memory plan (plan.py) count these."""
    held = {}
    if PRODUCTS[products] is None:
        held["cublaslt_workspace"] = cublaslt.WORKSPACE_BYTES
    copies = cublaslt.scratch_bytes(PRECISION.get(products, "fp32"), N, C, V)
    if copies and (PRODUCTS[products] is None or products in COPIES_KINDS):
        held["operands_16bit"] = copies
    if products in HELD_KINDS:
        held["operands_held_16bit"] = 2 * cublaslt.held_elements(N, C)
    if products in TMA_KINDS:
        held["tma_tensor_maps"] = TensorMaps.SLOTS * MAP_BYTES
    if PRECISION.get(products) in FP8_SCOPES:
        held["operands_fp8"] = fp8_products.scratch_bytes(N, C, n_layer)
    return held


# kinds whose products run wgmma, an instruction of Hopper GPUs only (sm_90a: compute capability 9.0)
# -> the kind a run gets on any other GPU (the same math on mma.sync, other sums)
WGMMA_KINDS = {"bf16r": "bf16a", "bf16m": "bf16a", "bf16t": "bf16a", "bf16s": "bf16a", "bf16o": "bf16a"}


def wgmma_runs_here() -> bool:
    """Whether this process's GPU runs wgmma (compute capability 9.0); the simulator runs its twin."""
    if SIMULATOR:
        return True
    try:
        return tuple(cuda.get_current_device().compute_capability) == (9, 0)
    except Exception:                   # no GPU here: no wgmma either
        return False


def products_kind(precision: str, products: str = "numba") -> str:
    """GPUModel's products= for a run's train.precision and train.products (numba: PRODUCTS_FOR,
    cublas: LIBRARY_FOR), on a GPU that is not a Hopper the kind's fallback (WGMMA_KINDS)."""
    kind = (LIBRARY_FOR if products == "cublas" else PRODUCTS_FOR)[precision]
    return WGMMA_KINDS[kind] if kind in WGMMA_KINDS and not wgmma_runs_here() else kind
# products -> the precision of the twin that matches it (every other kind: fp32)
COPIES_KINDS = {"bf16a", "bf16r", "bf16m", "bf16t", "bf16s", "bf16o"}       # our products that take 16-bit copies of their operands (cublaslt.COPIES)
SAVED16_KINDS = {"bf16a", "bf16r", "bf16m", "bf16t", "bf16s", "bf16o"}      # ... and whose models save SAVED16 as bf16 (their products read it as it is)
HELD_KINDS = {"bf16r", "bf16m", "bf16t", "bf16s", "bf16o"}                 # ... and whose ops round a gradient once for two products (cublaslt.HELD)
TMA_KINDS = {"bf16t", "bf16s", "bf16o"}                          # ... and whose products read through TMA tensor maps (tma.TMAPS)
SHADOW_KINDS = {"bf16s", "bf16o"}                       # ... and whose products read their weights from params16
OUT16_KINDS = {"bf16o"}                                 # ... and whose ops write the products' operands in bf16 (OUT16)
OUT16_FLASH = 14                                        # the flash attention version that does (kernels/attn_flash_v13.py)
LOGITS_KINDS = {"bf16o"}     # ... and whose training loss keeps the logits in probs, saving M and se a row (loss v18/v16)
LOSS_BWD_VERSION = {"bf16o": 16}                        # the loss backward's, where not the linear ops'


def flash_version_for(products: str):
    """The flash attention version a model of these products runs: OUT16_FLASH for OUT16_KINDS, else
    FLASH_VERSION's for their precision (None: the engine's fp32 pair, attn_flash's module names)."""
    return OUT16_FLASH if products in OUT16_KINDS else FLASH_VERSION.get(PRECISION.get(products, "fp32"))


def writes_out16(products: str, m: ModelConfig) -> bool:
    """Whether a flash-attention model of these products and shapes writes OUT16's bf16 operands:
    products in OUT16_KINDS and an even head size (flash v14 writes channel pairs as words)."""
    return products in OUT16_KINDS and (m.d_model // m.n_head) % 2 == 0
PRECISION = {"bf16w": "bf16", "bf16l": "bf16", "bf16a": "bf16", "bf16r": "bf16", "bf16m": "bf16", "bf16t": "bf16", "bf16s": "bf16", "bf16o": "bf16", "f16w": "fp16",
             **{kind: p for kind, p in LIBRARY_PRECISION.items() if p != "fp32"}}


def _flat(a):
    return a.reshape(a.size)


def _prefix(a, shape):
    """The first prod(shape) elements of device array a, seen as an array of `shape` (a view)."""
    n = int(np.prod(shape))
    assert n <= a.size, f"a buffer of {a.size} elements cannot hold {shape}"
    return _flat(a)[:n].reshape(shape)
