"""Model FLOPs utilisation (MFU): the model's FLOPs a second over the GPU's dense peak.

    f = flops_per_token(m, T)                 # a training token: forward + backward
    peak = peak_flops("NVIDIA H100 80GB HBM3", "bf16")        # 989.4e12, or None: unknown GPU
    mfu(tokens_per_s, f, peak)                # 0.38 for 38%, None where the peak is unknown

The FLOPs are counted as nanoGPT and the PaLM paper count them: a weight takes part in one
multiply-add (2 FLOPs) per token in the forward and two in the backward (its input's gradient and
its own), 6 FLOPs per weight per token, over every weight a product reads: the blocks' and the
token embedding's, which is also the classifier. The position embedding is a lookup, no product.
Attention adds the scores and the weighted sum, 2 T C multiply-adds per layer and token forward,
counted whole as though nothing were masked (the causal mask skips half): 12 L C T with the
backward. LayerNorm, GELU, softmax and AdamW are left out: a few percent of the step's FLOPs.

The peak is the GPU's dense rate (no 2:4 sparsity) at the run's precision, from the vendor's data
sheet, looked up by the device name; an unknown GPU gives None ("MFU unknown"). fp32 runs are
measured against the fp32 peak of the CUDA cores: the engine's 3xTF32 products run on tensor cores,
but the work is fp32's, as PyTorch fp32 with TF32 off does it. The FP8 scopes run part of their
products in FP8 and the rest in bf16: they are measured against the bf16 peak.
"""
from __future__ import annotations

from .layout import n_params

# Dense peak TFLOP/s by precision, by the first name fragment found in the device name
# (SXM parts; "H100 PCIe" before "H100", so the PCIe card is not read as the SXM one).
PEAKS = (
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.2}),
    ("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
)


def flops_per_token(m, T: int) -> float:
    """FLOPs of one training token (forward + backward) of model config m at sequence length T."""
    product_weights = n_params(m) - m.context_length * m.d_model      # all but the position embedding
    return 6.0 * product_weights + 12.0 * m.n_layer * m.d_model * T


def peak_flops(device: str, precision: str) -> float | None:
    """The dense peak in FLOP/s of the named GPU at the precision (an FP8 scope: bf16's), or None."""
    key = precision if precision in ("fp32", "fp16", "bf16") else "bf16"
    for fragment, peaks in PEAKS:
        if fragment in device:
            return peaks[key] * 1e12
    return None


def mfu(tokens_per_s: float, flops_token: float, peak: float | None) -> float | None:
    """The fraction of the peak the model's FLOPs reach at this token rate (None: peak unknown)."""
    return None if not peak else tokens_per_s * flops_token / peak


def format_mfu(value: float | None) -> str:
    return "MFU unknown" if value is None else f"MFU {100 * value:.1f}%"
