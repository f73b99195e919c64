"""The lab's recipe bf16s and the engine's bf16-hopper: the same products as the lab's bf16t, each
operand rounded elsewhere, the same bits. bf16s reads every weight from params16, a bf16 copy of the
parameters rounded once at the start of each forward (Recipe.bf16_weights), where bf16t's products
round each weight into a scratch copy (twice a step). bf16-hopper is bf16s with the activation operands of the bf16 products written in bf16 by
the ops that make them (recipes.OUT16): flash attention v14 writes y's bf16 copy y16 beside y and
dq, dk, dv in bf16; residual_layernorm_bwd v6 writes the residual stream's gradient's bf16 copy
d_resid16; and its loss (v18/v16, Recipe.keeps_logits) leaves the logits in probs and saves M and se a row,
from which the backward recomputes the softmax with the forward's own operations. Each rounding is
the one the products' operand copy would have made (ties to even), so the loss and every gradient
are bit for bit bf16t's, with dropout (where the branches read a masked copy of d_resid and the
products round it themselves) and without. The memory plan counts the new buffers."""
import dataclasses

import numpy as np
import pytest

from andrea_numba import gpu_model as G
from andrea_numba.recipes import OUT16
from lab.recipes import get as recipe
from andrea_numba.config import load_config
from andrea_numba.layout import init_params, n_params
from reference.precision import round_bf16


def _step(kind, p_drop, tokens, targets, check=None, n_layer=None):
    """(loss, gradients) of one forward + backward of the tiny model (or with n_layer blocks) with
    these products."""
    m = load_config("tiny").model
    m = dataclasses.replace(m, n_layer=n_layer or m.n_layer)
    model = G.GPUModel(m, *tokens.shape, recipe=recipe(kind), dropout=p_drop)
    params = init_params(m, 4)
    model.params.copy_to_device(params)
    model.forward(tokens, targets, **({"dropout_key": 12345} if p_drop else {}))
    model.backward()
    if check:
        check(model, params)
    return model.read_loss(), model.grads.copy_to_host()


def _bits16(a):
    return (round_bf16(a).view(np.uint32) >> 16).astype(np.uint16)


def _params16_holds_the_rounded_parameters(model, params):
    assert model.params16 and not model.out16
    assert np.array_equal(model.buf["params16"].copy_to_host(), _bits16(params))
    assert model.W["h0.attn.w_q"].dtype == np.uint16 and model.P["h0.attn.w_q"].dtype == np.float32


def _out16_buffers_hold_the_rounded_values(model, params):
    assert model.out16 and model.loss_stats
    d = model.buf["d_resid"].copy_to_host()          # the last residual + LayerNorm backward's copy of it
    assert np.array_equal(model.buf["d_resid16"].copy_to_host(), _bits16(d))
    for l in range(model.m.n_layer):
        assert np.array_equal(model.buf["y16"][l].copy_to_host(), _bits16(model.buf["y"][l].copy_to_host()))
    row = model.probs_row(3)                         # probs holds the logits; probs_row still a softmax
    assert abs(float(row.sum()) - 1.0) < 1e-5 and row.min() >= 0


# Without dropout the tiny model's two blocks (every layer's y16, the residual gradient's bf16 copy
# between the blocks); with dropout one block, which runs the same ops (flash v14 and the residual
# LayerNorms with dropout, the products rounding the masked d_resid themselves) in half the time.
@pytest.mark.parametrize("p_drop, kinds, n_layer", [(0.0, ("bf16t", "bf16s", "bf16-hopper"), None),
                                                    (0.25, ("bf16t", "bf16-hopper"), 1)], ids=["no-dropout", "dropout"])
def test_bf16s_and_bf16_hopper_give_bf16t_bits(p_drop, kinds, n_layer):
    rng = np.random.default_rng(13)
    V = load_config("tiny").model.vocab_size
    tokens, targets = (rng.integers(0, V, (1, 8)).astype(np.int32) for _ in range(2))
    checks = {"bf16s": _params16_holds_the_rounded_parameters,
              "bf16-hopper": None if p_drop else _out16_buffers_hold_the_rounded_values}
    (l0, g0), *rest = [_step(kind, p_drop, tokens, targets, checks.get(kind), n_layer) for kind in kinds]
    for loss, grads in rest:
        assert loss == l0 and np.array_equal(grads.view(np.uint32), g0.view(np.uint32))


def test_the_buffers_and_the_plan():
    m = load_config("tiny").model
    plain = {s.name: s for s in G.buffer_specs(m, 2, 8, saved16=True)}
    with_copy = {s.name: s for s in G.buffer_specs(m, 2, 8, saved16=True, params16=True)}
    assert set(with_copy) - set(plain) == {"params16"} and with_copy["params16"].nbytes == 2 * n_params(m)
    out16 = {s.name: s for s in G.buffer_specs(m, 2, 8, params16=True, saved16=True, out16=True, loss_stats=True)}
    assert set(out16) - set(with_copy) == {"y16", "d_resid16", "loss_stats"}
    for name in OUT16:
        assert out16[name].dtype == np.uint16 and 2 * out16[name].nbytes == with_copy[name].nbytes
    assert out16["y16"].nbytes == out16["y"].nbytes // 2 and out16["y"].dtype == np.float32
    assert recipe("bf16-hopper").writes_out16(m) and not recipe("bf16s").writes_out16(m)
    odd = m.__class__(**{**m.__dict__, "d_model": 6, "n_head": 2})       # head size 3: v14 writes pairs
    assert not recipe("bf16-hopper").writes_out16(odd)
    assert G.GPUModel(m, 2, 8, recipe=recipe("bf16s")).nbytes == G.GPUModel(m, 2, 8, recipe=recipe("bf16t")).nbytes + 2 * n_params(m)
    assert G.GPUModel(m, 2, 8, recipe="bf16-hopper").nbytes == sum(s.nbytes for s in out16.values()) + sum(
        G.products_scratch("bf16-hopper", 16, m.d_model, m.vocab_size).values())
