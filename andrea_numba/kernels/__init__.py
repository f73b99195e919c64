"""The engine's Numba CUDA kernels: one module per op, each beside its NumPy twin. A module holds the
simple pair the lessons teach (the op's plain name: layernorm_fwd, layernorm_bwd) and the launchers
the recipes run (andrea_numba/recipes.py names them, per precision and GPU class), each named by what
it is: _tf32x3 (fp32-accurate products from three TF32 products on tensor cores), _fp16 and _bf16
(16-bit products on mma.sync, fp32 sums), _bf16_wgmma (Hopper's wgmma, operands by TMA). Each
declares its rung of the op's ladder (@rung(N)); every other rung lives in the lab (lab/<module>.py,
with the module's VERSIONS table), which the engine never imports.

    module      the lessons' pair; the engine's launchers                            NumPy twin
    embed       embed_fwd, embed_bwd; embed_bwd_sorted (every recipe)                reference/embed.py
    layernorm   layernorm_fwd, layernorm_bwd; layernorm_bwd_two_stage (LN1 of block 0, LNf), and
                the residual add fused in: residual_layernorm_fwd / _vec4 (bf16 output),
                residual_layernorm_bwd_partials / _bf16 (bf16 gradient copy)   reference/layernorm.py
    attn_qkv    attn_qkv_fwd, attn_qkv_bwd; _tf32x3, _fp16, _bf16, _bf16_wgmma       reference/attn_qkv.py
    attn        attn_fwd, attn_bwd; attn_fwd_tiled (GPUModel(flash=False))          reference/attn.py
    attn_flash  attn_flash_fwd, attn_flash_bwd; _tf32x3 and _fp16 (attn_flash_tf32x3.py), _bf16 and
                _bf16_out16 (attn_flash_bf16.py): saves lse [B, H, T], not att      reference/attn.py
    attn_out    attn_out_fwd, attn_out_bwd; _tf32x3, _fp16, _bf16, _bf16_wgmma       reference/attn_out.py
    mlp         mlp_fwd, mlp_bwd; _tf32x3, _fp16, _bf16, _bf16_wgmma                 reference/mlp.py
    residual    residual_add, residual_add_bwd (the engine fuses it)                 reference/residual.py
    dropout     dropout_fwd, dropout_bwd (and dropout_factor, which the attention kernels
                call on their probabilities)                                         reference/dropout.py
    loss        loss_fwd, loss_bwd; _tf32x3, _fp16, _bf16, _bf16_wgmma (the loss owns the tied
                output projection logits = x @ wte^T)                                reference/loss.py
    matmul      matmul_naive and matmul (shared tiles), the products the linear ops run:
                matmul_tf32x3, matmul_fp16, matmul_bf16, matmul_bf16_wgmma (and its
                cp.async ring, matmul_bf16_wgmma_cp_async); TILE_FAMILIES     reference/matmul.py
    optim       grad_norm, grad_scale, adamw, zero                                   reference/optim.py
    decode      the KV-cache decoder's step, one position: decode_qkv (the embedding
                in the first), decode_attention (chunks of keys), decode_matvec_add,
                decode_mlp_up, decode_logits (with the softmax), decode_draw (the next
                token; andrea_numba/decode.py chains them)                   reference/decode.py
    fp8         the FP8 quantize kernels                                          reference/fp8.py
    common      block_sum, block_max, blocks, SIMULATOR
    operands    the 16-bit copies of a product's operands (round_into) and their scratch (COPIES, HELD)
    cublaslt    the library route: the linear ops with every product through cuBLASLt (linear_ops)
    fp8_products  the linear ops with FP8 products through cuBLASLt

Imports run downwards, never in a circle (tests/test_imports.py checks it), all at the top of a module:
    bottom      common, ptx (one-instruction device functions), tile_loop, operands, tma, wgmma
    tiles       split_tile, warp_tile, half_tile, wgmma_tile, wgmma_mn, wgmma_tma
    products    matmul (make_tile serves the linear ops their tiles)
    ops         embed, layernorm, residual, dropout, attn, attn_flash_* (attn_flash: the index),
                attn_qkv, attn_out, mlp, loss, optim, fp8 (the quantize kernels), decode
    library     cublaslt, fp8_products: above the ops whose products they replace

The conventions of every module (as llm.c's dev/cuda keeps them for every version of a kernel):
- A launcher is a Python function that picks grid and block and launches its kernels: the lessons'
  one is named after its twin (layernorm_bwd), an engine one after its twin and what it is
  (layernorm_bwd_two_stage), with @rung(N) saying which rung of the op's ladder it is. The lab's
  VERSIONS = {"layernorm_bwd": {1: ..., 4: ...}} lists every rung; the harness (andrea_numba.check:
  the engine's; python -m lab.check: the whole ladder), the tests and lab/bench/kernels.py read them
  through the op cases of andrea_numba/cases.py. Kernels (k_...) are module-level names.
- Arguments: the outputs, then work buffers, then exactly the twin's arguments in the twin's order
  (llm.c's order: outputs, inputs, weights, sizes), then the keywords `block` and `stream`.
  `block` is what the launcher's docstring says (threads per block, a product's tile shape,
  attention's (rows, threads per row)); `@blocks(gpu=..., sim=...)` declares the ones the harness
  checks and the benchmark times, the first being the default. `stream` is the CUDA stream: the
  engine passes its own, never the legacy default stream.
- Each kernel carries the math it computes in its docstring or a comment.
- Arrays are float32 device arrays (token ids int32); rows of activations are B*T positions.
- A backward writes (=) its grad_input and adds (+=) into parameter-gradient buffers, so
  microbatches accumulate until zero.
- Deterministic: no float atomics; every sum has a fixed order (a loop in one thread, or
  common.block_sum's tree). The same inputs and launch give bit-identical outputs.
- Arithmetic stays in float32: scalars are passed as numpy.float32 and sizes are converted with
  float32(n) before they meet a float (lab/bench/ptxcheck.py counts float64 instructions).
- Every launcher has GPU block sizes and smaller simulator ones, since the CUDA simulator runs each
  thread as a Python thread.
"""
