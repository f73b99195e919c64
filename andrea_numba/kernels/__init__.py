"""The engine's Numba CUDA kernels: one module per op, each beside its NumPy twin. A module holds the
simple pair the lessons teach (v1) and the launchers the recipes run (andrea_numba/recipes.py names
them, per precision and GPU class), and what those call; every other rung of the ladder lives in
the lab (lab/<module>.py, with the module's VERSIONS table), which the engine never imports.

    module      the lessons' pair; the engine's launchers (fp32 / bf16 on Hopper)   NumPy twin
    embed       embed_fwd_v1, embed_bwd_v1; embed_bwd_v5                          reference/embed.py
    layernorm   layernorm_fwd_v1, layernorm_bwd_v1; layernorm_bwd_v4 (LNf), and the residual add
                fused in: residual_layernorm_fwd_v1 / _v3, residual_layernorm_bwd_v5 / _v6
                                                                                  reference/layernorm.py
    attn_qkv    attn_qkv_fwd_v1, attn_qkv_bwd_v1; v7 / v15                        reference/attn_qkv.py
    attn        attn_fwd_v1, attn_bwd_v1; v2 (GPUModel(flash=False))              reference/attn.py
    attn_flash  attn_flash_fwd_v1, attn_flash_bwd_v1; v8 + v10 / v14 (attn_flash_v3.py,
                attn_flash_v13.py): saves lse [B, H, T], not att                  reference/attn.py
    attn_out    attn_out_fwd_v1, attn_out_bwd_v1; v7 / v15                        reference/attn_out.py
    mlp         mlp_fwd_v1, mlp_bwd_v1; v12 / v19                                 reference/mlp.py
    residual    residual_add_v1, residual_add_bwd_v1 (the engine fuses it)        reference/residual.py
    dropout     dropout_fwd_v1, dropout_bwd_v1 (and dropout_factor, which the attention kernels
                call on their probabilities)                                      reference/dropout.py
    loss        loss_fwd_v1, loss_bwd_v1; v9 + v7 / v18 + v16 (the loss owns the tied output
                projection logits = x @ wte^T)                                    reference/loss.py
    matmul      matmul_v1, the products the linear ops run (v8 in fp32, v18 on Hopper)
                                                                                  reference/matmul.py
    optim       grad_norm_v1, grad_scale_v1, adamw_v3, zero_v1                    reference/optim.py
    fp8         the FP8 quantize kernels                                          reference/fp8.py
    common      block_sum, block_max, blocks, SIMULATOR
    operands    the 16-bit copies of a product's operands (round_into) and their scratch (COPIES, HELD)
    cublaslt    the library route: the linear ops with every product through cuBLASLt (linear_ops)
    fp8_products  the linear ops with FP8 products through cuBLASLt

Imports run downwards, never in a circle (tests/test_imports.py checks it), all at the top of a module:
    bottom      common, ptx (one-instruction device functions), tile_loop, operands, tma, wgmma
    tiles       split_tile, warp_tile, simt_tile, half_tile, wgmma_tile, wgmma_mn, wgmma_ring, wgmma_tma
    products    matmul (make_tile serves the linear ops their tiles)
    ops         embed, layernorm, residual, dropout, attn, attn_flash_* (attn_flash: the index),
                attn_qkv, attn_out, mlp, loss, optim, fp8 (the quantize kernels)
    library     cublaslt, fp8_products: above the ops whose products they replace

The conventions of every module (as llm.c's dev/cuda keeps them for every version of a kernel):
- Kernels are module-level names numbered by their rung of the op's ladder: k_layernorm_bwd_params_v1.
  A launcher is a Python function named after its twin plus the rung (layernorm_bwd_v4) that picks
  grid and block and launches its kernels. The lab's VERSIONS = {"layernorm_bwd": {1: ..., 4: ...}}
  lists every rung; the harness (andrea_numba.check: the engine's; python -m lab.check: the whole
  ladder), the tests and lab/bench/kernels.py read them through the op cases of andrea_numba/cases.py.
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
