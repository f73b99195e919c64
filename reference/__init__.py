"""The NumPy reference twin: every op of the model as a forward and a backward in plain NumPy.

One module per op, named after the CUDA kernel table (k_layernorm_fwd <-> layernorm_fwd):
embed, layernorm, attn_qkv, attn, attn_out, mlp, residual, loss, and dropout (applied inside
attention and to the attention and MLP outputs); the whole model in `model`;
clipping and AdamW in `optim`; rounding to formats below fp32 (bfloat16) in `precision`. Arrays
follow the dtype of their inputs (float32 or float64).
"""
from .attn import attn_bwd, attn_flash_bwd, attn_flash_fwd, attn_fwd
from .attn_out import attn_out_bwd, attn_out_fwd
from .attn_qkv import attn_qkv_bwd, attn_qkv_fwd
from .dropout import block_keys, dropout_bwd, dropout_fwd, dropout_key, site_key
from .embed import embed_bwd, embed_fwd
from .layernorm import layernorm_bwd, layernorm_fwd, residual_layernorm_bwd, residual_layernorm_fwd
from .loss import loss_bwd, loss_fwd
from .matmul import matmul
from .mlp import gelu, gelu_grad, mlp_bwd, mlp_fwd
from .model import model_backward, model_forward, model_logits
from .precision import error_bound, mm, products_in, round_bf16, round_fp16
from .optim import adamw, adamw_hyper, adamw_zero, clip_grad_norm, grad_norm, grad_scale, lr_at, zero
from .residual import residual_add, residual_add_bwd
