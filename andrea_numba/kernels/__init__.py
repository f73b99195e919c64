"""The Numba CUDA kernels: one module per op of the kernel table, each beside its NumPy twin.

    module      launchers (VERSIONS)                          NumPy twin
    embed       embed_fwd v1, embed_bwd v1 v2                  reference/embed.py
    layernorm   layernorm_fwd v1 v2, layernorm_bwd v1-v4       reference/layernorm.py
                (and residual_layernorm_fwd v1, residual_layernorm_bwd v1 v2: the residual add fused in)
    attn_qkv    attn_qkv_fwd v1, attn_qkv_bwd v1               reference/attn_qkv.py
    attn        attn_fwd v1 v2, attn_bwd v1 v2                 reference/attn.py
    attn_flash  attn_flash_fwd v1, attn_flash_bwd v1           reference/attn.py (attn_flash_*)
                (flash attention: saves lse [B, H, T], not att; a checked case the engine does not use yet)
    attn_out    attn_out_fwd v1, attn_out_bwd v1               reference/attn_out.py
    mlp         mlp_fwd v1, mlp_bwd v1                         reference/mlp.py
    residual    residual_add v1, residual_add_bwd v1           reference/residual.py
    dropout     dropout_fwd v1, dropout_bwd v1                 reference/dropout.py
                (and dropout_factor, which the attention kernels call on their probabilities)
    loss        loss_fwd v1, loss_bwd v1                       reference/loss.py
                (the loss pair owns the tied output projection logits = x @ wte^T)
    matmul      matmul v1 v2 (tiled)                           reference/matmul.py
                (the products inside the linear ops)
    optim       grad_norm, grad_scale, adamw, zero             reference/optim.py
    common      block_sum, block_max, blocks, SIMULATOR
    operands    the 16-bit copies of a product's operands (round_into) and their scratch (COPIES, HELD)
    cublaslt    the library route: the same products through cuBLASLt (matmul v20-v22), and the
                linear ops with every product there (linear_ops)
    fp8_products  FP8 products through cuBLASLt (matmul v24), and the linear ops with them

Imports run downwards, never in a circle (tests/test_imports.py checks it), all at the top of a module:
    bottom      common, ptx (one-instruction device functions), tile_loop, operands, tma, wgmma
    tiles       split_tile, warp_tile, simt_tile, half_tile, wgmma_tile, wgmma_mn, wgmma_ring, wgmma_tma
    products    matmul (the ladder of products; make_tile serves the linear ops their tiles)
    ops         embed, layernorm, residual, dropout, attn, attn_flash_* (attn_flash: the table),
                attn_qkv, attn_out, mlp, loss, optim, fp8 (the quantize kernels)
    library     cublaslt, fp8_products: above the ops whose products they replace
This package imports the library route last, to add its products to matmul.VERSIONS (below).

The ladder, the same in every module (as llm.c's dev/cuda keeps every version of a kernel):
- Kernels are module-level names numbered by version: k_layernorm_bwd_params_v1, _v2. A version
  of a launcher is a Python function named after its twin plus the version (layernorm_bwd_v2)
  that picks grid and block and launches its kernels. `VERSIONS = {"layernorm_bwd": {1: ..., 2:
  ...}}` lists them; the module-level name without a version (layernorm_bwd) is the one the engine
  uses. A faster version is added beside the simple one, which stays for the lessons.
- The agreement harness (andrea_numba.check), the tests and bench/kernels.py read VERSIONS through
  the op cases of andrea_numba/cases.py: a new version is checked and timed without another edit.
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
  float32(n) before they meet a float (bench/ptxcheck.py counts float64 instructions).
- Every launcher has GPU block sizes and smaller simulator ones, since the CUDA simulator runs each
  thread as a Python thread.
"""
