"""The Numba CUDA kernels: one module per op of the kernel table, each beside its NumPy twin.

    module          kernels                                   NumPy twin
    embed           k_embed_fwd, k_embed_bwd                  reference/embed.py
    layernorm       k_layernorm_fwd, k_layernorm_bwd          reference/layernorm.py
    attn_qkv        k_attn_qkv_fwd, k_attn_qkv_bwd            reference/attn_qkv.py
    attn            k_attn_fwd, k_attn_bwd                    reference/attn.py
    attn_out        k_attn_out_fwd, k_attn_out_bwd            reference/attn_out.py
    mlp             k_mlp_fwd, k_mlp_bwd                      reference/mlp.py
    residual        k_residual_add, k_residual_add_bwd        reference/residual.py
    loss            k_loss_fwd, k_loss_bwd                    reference/loss.py
                    (the loss pair owns the tied output projection logits = x @ wte^T)
    optim           k_grad_norm_partial, k_grad_norm_final,   reference/optim.py
                    k_grad_scale, k_adamw, k_zero
    matmul          k_matmul_v1, k_matmul_v2 (tiled)          the products inside the linear ops
    common          block_sum, launch sizes, SIMULATOR

Conventions, the same in every module:
- Each kernel carries the math it computes in its docstring or a comment.
- Beside each kernel, a plain Python launch function named after the twin's function
  (layernorm_fwd, layernorm_bwd, ...) that picks grid and block and launches. The engine and the
  agreement harness call these, never the kernels directly.
- Arguments run outputs first, then inputs, then weights, then sizes and scalars (llm.c's order),
  and the last is `stream=0`.
- Arrays are float32 device arrays (token ids int32); rows of activations are B*T positions.
- A backward writes (=) its grad_input and adds (+=) into parameter-gradient buffers, so
  microbatches accumulate until zero_grads.
- Deterministic: no float atomics; every sum has a fixed order (a loop in one thread, or
  common.block_sum's tree). The same inputs and launch give bit-identical outputs.
- Arithmetic stays in float32: scalars are passed as numpy.float32 and sizes are converted with
  float32(n) before they meet a float (bench/ptxcheck.py counts float64 instructions).
- Every launch has a GPU size and a smaller simulator size (common.SIMULATOR), since the CUDA
  simulator runs each thread as a Python thread.
- A faster kernel is a new numbered version (k_matmul_v2) checked by the same harness; the
  simple one stays for the lessons.
"""
