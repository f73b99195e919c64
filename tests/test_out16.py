"""Products "bf16o": bf16s with the activation operands of the bf16 products written in bf16 by the
ops that make them (gpu_model.OUT16): flash attention v14 writes y's bf16 copy y16 beside y and dq,
dk, dv in bf16; residual_layernorm_bwd v6 writes the residual stream's gradient's bf16 copy
d_resid16. Each value is the fp32 number the op wrote before, rounded as the products' operand copy
rounded it (ties to even). Its loss (v18/v16, LOGITS_KINDS) leaves the logits in probs and saves M
and se a row, from which the backward recomputes the softmax with the forward's own operations.
So the loss and every gradient are bit for bit bf16s's, with dropout (where the branches read a
masked copy of d_resid and the products round it themselves) and without. The memory plan counts
the new buffers and the half-size d_q, d_k, d_v."""
import numpy as np
import pytest

from andrea_numba import gpu_model as G
from andrea_numba.config import load_config
from andrea_numba.layout import init_params


@pytest.mark.parametrize("p_drop", [0.0, 0.25], ids=["no-dropout", "dropout"])
def test_bf16o_gives_bf16s_bits(p_drop):
    m = load_config("tiny").model
    B, T = 1, 8
    rng = np.random.default_rng(13)
    tokens, targets = (rng.integers(0, m.vocab_size, (B, T)).astype(np.int32) for _ in range(2))
    key = {"dropout_key": 12345} if p_drop else {}
    runs = []
    for kind in ("bf16s", "bf16o"):
        model = G.GPUModel(m, B, T, products=kind, dropout=p_drop)
        assert model.out16 is model.loss_stats is (kind == "bf16o")
        model.params.copy_to_device(init_params(m, 4))
        model.forward(tokens, targets, **key)
        model.backward()
        runs.append((model.read_loss(), model.grads.copy_to_host()))
        if kind == "bf16o":          # probs holds the logits; probs_row still gives a row's softmax
            row = model.probs_row(3)
            assert abs(float(row.sum()) - 1.0) < 1e-5 and row.min() >= 0
    assert runs[0][0] == runs[1][0]
    assert np.array_equal(runs[0][1].view(np.uint32), runs[1][1].view(np.uint32))
    if not p_drop:                   # the last residual + LayerNorm backward's bf16 copy of d_resid
        d = model.buf["d_resid"].copy_to_host()
        want = ((d.view(np.uint32).astype(np.uint64) + 0x7FFF + ((d.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
        assert np.array_equal(model.buf["d_resid16"].copy_to_host(), want)


def test_out16_buffers_and_the_plan():
    m = load_config("tiny").model
    plain = {s.name: s for s in G.buffer_specs(m, 2, 8, params16=True, saved16=True)}
    out16 = {s.name: s for s in G.buffer_specs(m, 2, 8, params16=True, saved16=True, out16=True, loss_stats=True)}
    assert set(out16) - set(plain) == {"y16", "d_resid16", "loss_stats"}
    for name in G.OUT16:
        assert out16[name].dtype == np.uint16 and 2 * out16[name].nbytes == plain[name].nbytes
    assert out16["y16"].nbytes == out16["y"].nbytes // 2 and out16["y"].dtype == np.float32
    assert G.writes_out16("bf16o", m) and not G.writes_out16("bf16s", m)
    odd = m.__class__(**{**m.__dict__, "d_model": 6, "n_head": 2})       # head size 3: v14 writes pairs
    assert not G.writes_out16("bf16o", odd)
    assert G.GPUModel(m, 2, 8, products="bf16o").nbytes == sum(s.nbytes for s in out16.values()) + sum(
        G.products_scratch("bf16o", 16, m.d_model, m.vocab_size).values())
