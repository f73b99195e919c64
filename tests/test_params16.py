"""Products "bf16s": bf16t's linear ops reading every weight from params16, a bf16 copy of the
parameters rounded once at the start of each forward (gpu_model.SHADOW_KINDS), instead of each
product rounding its weight into a scratch copy (twice a step: the forward's product and the
backward's dx). Rounding is the same (ties to even) and the products read the same bits, so the
loss and every gradient are bit for bit bf16t's; the copy is one more buffer of 2 bytes a
parameter, which the memory plan counts."""
import numpy as np

from andrea_numba import gpu_model as G
from andrea_numba.config import load_config
from andrea_numba.layout import init_params, n_params
from reference.precision import round_bf16


def test_bf16s_gives_bf16t_bits_and_rounds_each_weight_once_a_forward():
    m = load_config("tiny").model
    B, T = 1, 8
    rng = np.random.default_rng(11)
    tokens, targets = (rng.integers(0, m.vocab_size, (B, T)).astype(np.int32) for _ in range(2))
    runs = []
    for kind in ("bf16t", "bf16s"):
        model = G.GPUModel(m, B, T, products=kind)
        assert model.params16 is (kind == "bf16s")
        params = init_params(m, 4)
        model.params.copy_to_device(params)
        model.forward(tokens, targets)
        model.backward()
        runs.append((model.read_loss(), model.grads.copy_to_host()))
        if kind == "bf16s":          # the copy holds every parameter rounded to bf16 (ties to even)
            want = (round_bf16(params).view(np.uint32) >> 16).astype(np.uint16)
            assert np.array_equal(model.buf["params16"].copy_to_host(), want)
            assert model.W["h0.attn.w_q"].dtype == np.uint16 and model.P["h0.attn.w_q"].dtype == np.float32
    assert runs[0][0] == runs[1][0]
    assert np.array_equal(runs[0][1].view(np.uint32), runs[1][1].view(np.uint32))


def test_params16_is_a_buffer_of_its_own_and_the_plan_counts_it():
    m = load_config("tiny").model
    with_copy = {s.name: s for s in G.buffer_specs(m, 2, 8, params16=True)}
    plain = {s.name for s in G.buffer_specs(m, 2, 8)}
    assert with_copy["params16"].nbytes == 2 * n_params(m) and "params16" not in plain
    assert G.GPUModel(m, 2, 8, products="bf16s").nbytes == G.GPUModel(m, 2, 8, products="bf16t").nbytes + 2 * n_params(m)
