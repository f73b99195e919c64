"""One flat parameter vector, one layout.

Every learnable tensor of the model is a view into one flat float32 vector `params` of n_params
elements. Gradients, Adam's m and v and the checkpoint use the identical layout, so the optimiser
is one loop over n_params and a checkpoint is three flat arrays. The NumPy twin, the CUDA engine
and the checkpoint all take offsets from `param_layout`; docs/layout.md shows the table.

Order (C = d_model, V = vocab_size, T = context_length, L = n_layer):

    wte                    [V, C]    token embedding, also the tied output projection
    wpe                    [T, C]    position embedding
    for l in 0 .. L-1:
      h{l}.ln1.g, .ln1.b   [C]       LayerNorm before attention (gamma, beta)
      h{l}.attn.w_q        [C, C]    y = x @ W, W stored [in, out]
      h{l}.attn.w_k        [C, C]
      h{l}.attn.w_v        [C, C]
      h{l}.attn.w_o        [C, C]    attention output projection (a residual output)
      h{l}.ln2.g, .ln2.b   [C]       LayerNorm before the MLP
      h{l}.mlp.w_1         [C, 4C]
      h{l}.mlp.w_2         [4C, C]   MLP output projection (a residual output)
    lnf.g, lnf.b           [C]       final LayerNorm
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .config import ModelConfig


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple
    offset: int            # first element in the flat vector

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def decay(self) -> bool:
        """AdamW's weight decay applies to matrices (embeddings and linear weights), not to LayerNorm."""
        return len(self.shape) == 2


def param_layout(m: ModelConfig) -> list[ParamSpec]:
    """Every learnable tensor's name, shape and offset in the flat vector, in layout order."""
    return list(_layout(m))


@functools.cache         # a pure function of the (frozen) config: the twin's forward asks for it every call
def _layout(m: ModelConfig) -> tuple:
    C, V, T = m.d_model, m.vocab_size, m.context_length
    shapes = [("wte", (V, C)), ("wpe", (T, C))]
    for l in range(m.n_layer):
        p = f"h{l}."
        shapes += [
            (p + "ln1.g", (C,)), (p + "ln1.b", (C,)),
            (p + "attn.w_q", (C, C)), (p + "attn.w_k", (C, C)), (p + "attn.w_v", (C, C)),
            (p + "attn.w_o", (C, C)),
            (p + "ln2.g", (C,)), (p + "ln2.b", (C,)),
            (p + "mlp.w_1", (C, 4 * C)), (p + "mlp.w_2", (4 * C, C)),
        ]
    shapes += [("lnf.g", (C,)), ("lnf.b", (C,))]
    specs, offset = [], 0
    for name, shape in shapes:
        specs.append(ParamSpec(name, shape, offset))
        offset += specs[-1].size
    return tuple(specs)


def n_params(m: ModelConfig) -> int:
    return _layout(m)[-1].end


def views(flat: np.ndarray, m: ModelConfig) -> dict:
    """name -> view of `flat` with the tensor's shape (no copy: writes go into `flat`).
    Works for NumPy arrays and for Numba device arrays alike."""
    layout = _layout(m)
    assert flat.shape == (layout[-1].end,), f"flat vector has shape {flat.shape}, layout needs ({layout[-1].end},)"
    return {s.name: flat[s.offset:s.end].reshape(s.shape) for s in layout}


def decay_mask(m: ModelConfig, dtype=np.float32) -> np.ndarray:
    """Flat vector: 1 where AdamW applies weight decay (2-D tensors), 0 elsewhere."""
    mask = np.zeros(n_params(m), dtype=dtype)
    for s in param_layout(m):
        if s.decay:
            mask[s.offset:s.end] = 1
    return mask


def init_params(m: ModelConfig, seed: int, dtype=np.float32) -> np.ndarray:
    """GPT-2 initialisation, deterministic from `seed`: matrices ~ normal(0, 0.02), the residual
    output projections (attn.w_o, mlp.w_2) scaled by 1/sqrt(2L), LayerNorm gamma 1 and beta 0.
    Tensors are drawn in layout order from one generator, so the result depends on seed and shape only."""
    rng = np.random.default_rng(seed)
    flat = np.empty(n_params(m), dtype=dtype)
    for s in param_layout(m):
        if s.name.endswith(".g"):
            flat[s.offset:s.end] = 1.0
        elif s.name.endswith(".b"):
            flat[s.offset:s.end] = 0.0
        else:
            std = 0.02
            if s.name.endswith(("attn.w_o", "mlp.w_2")):
                std *= 1.0 / math.sqrt(2 * m.n_layer)
            flat[s.offset:s.end] = rng.standard_normal(s.size, dtype=np.float32) * np.float32(std)
    return flat


def layout_table(m: ModelConfig) -> str:
    """The layout as a Markdown table (docs/layout.md is generated from it)."""
    rows = ["| name | shape | offset | elements | weight decay |", "|---|---|---|---|---|"]
    for s in param_layout(m):
        rows.append(f"| {s.name} | {list(s.shape)} | {s.offset:,} | {s.size:,} | {'yes' if s.decay else 'no'} |")
    rows.append(f"| **total** | | | **{n_params(m):,}** | |")
    return "\n".join(rows)
