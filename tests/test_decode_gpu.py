"""The KV-cache decoder on the GPU (andrea_numba/decode.py, kernels/decode.py), in the simulator:
each step gives the twin's logits at its position (reference/decode.py) and the whole forward's
probabilities, its position lives on the device, a step replayed from a recorded graph gives the
eager step's bits, and sampling on it draws the tokens of the whole forward, past the context too.
On a GPU the first three tests run as well (the fp32 and bf16 decoders against their twins, at
the GPU's blocks); the others record graphs or patch the simulator's memory.

Tolerance of the logits. The decoder computes in fp32 (unit roundoff u = 2^-24, about 6e-8) what
the twin computes here in float64 from the same float32 weights: exact by comparison. A sum of K
products in fp32 is off by at most about K u times the sum of its terms' sizes (K <= 4C = 32 in
ANDREA-tiny: the MLP's second product), and each block adds such errors into the residual stream,
which the next LayerNorm scales by its gain over the row's spread. Two blocks and the classifier
give a few times 32 u, about 2e-6, of the logits' scale; TOL allows 1e-5 of the row's largest
|logit| (the distance measured is about 2e-7). Attention that misses the position's own key moves
the logits by far more than that (the planted bug below).

A bf16 decoder (precision="bf16") rounds each product's inputs to bf16, as its twin does
(KVCache(precision="bf16")). The decoder's inputs to a product are the twin's values to fp32
rounding, so both round them to the same bf16 unless one lies within about 1e-7 of its own size
of the midpoint between two bf16 values, a chance of about 3e-5 a value; then the logits move by a
bf16 step of that input, some 1e-3. The positions below round none that way: the distance is the
fp32 one (measured 5e-8), under the same TOL; the exact twin's logits lie some 300 TOL away
(measured at least 2.6e-3). A product that skips its rounding (q in the scores, the powers e in
attention's sum, the classifier's LNf(x) were each tried) moves the logits by 1e-3 or more.
"""
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

from andrea_numba import train as tr
from andrea_numba.config import load_config
from andrea_numba.decode import Decoder
from andrea_numba.gpu_model import GPUModel
from andrea_numba.kernels import decode as kd
from andrea_numba.kernels.common import SIMULATOR
from andrea_numba.layout import init_params
from andrea_numba.sample import generate
from reference.decode import KVCache

sys.path.insert(0, str(Path(__file__).parent))
from test_step_graph import RECORDER, FakeStepGraph  # noqa: E402

pytestmark = pytest.mark.skipif(not SIMULATOR and not cuda.is_available(), reason="needs the simulator or a GPU")
SIM_ONLY = pytest.mark.skipif(not SIMULATOR, reason="records graphs or patches memory as the simulator runs them")

TOL = 1e-5            # of the row's largest |logit|: the module's docstring
PROBS_RTOL = 1e-4     # of each probability: p = exp(l - lse) carries the logits' absolute error as a relative one


def _model(n_layer=2, seed=0):
    """ANDREA-tiny (n_layer blocks) with weights off their init (LayerNorm gains and biases off 1
    and 0): (config, float32 params)."""
    m = dataclasses.replace(load_config("tiny").model, n_layer=n_layer)
    rng = np.random.default_rng(seed)
    p = init_params(m, seed).astype(np.float64)
    return m, (p + rng.standard_normal(p.size) * 0.05).astype(np.float32)


def _distance(got, want) -> float:
    """max |got - want| over the row's largest |want|: the comparison of every test here."""
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def _decode_each(m, params, tokens, precision="fp32"):
    """Feed tokens one by one to a decoder on params: [(logits, probs)] at each position, and the decoder."""
    dec = Decoder(m, cuda.to_device(params), precision=precision)
    dec.reset()
    rows = []
    for t in range(len(tokens)):
        dec.feed(tokens[:t + 1])
        rows.append((dec.read("logits"), dec.probs_row().copy()))
    return rows, dec


def test_each_step_gives_the_twins_logits_and_the_whole_forwards_probabilities():
    m, params = _model()
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, m.vocab_size, size=m.context_length)]
    rows, dec = _decode_each(m, params, tokens)
    twin = KVCache(params.astype(np.float64), m)
    for t, (logits, _) in enumerate(rows):
        assert _distance(logits, twin.step(tokens[t])) <= TOL, t
    # the cache holds the twin's k and v of every position
    for name, want in (("k_cache", twin.K), ("v_cache", twin.V)):
        assert _distance(dec.read(name), want) <= TOL, name
    # the whole forward (the engine's fp32 kernels) over the same tokens: its probabilities at each
    # position are the decoder's at that position
    model = GPUModel(m, 1, m.context_length, training=False)
    model.params.copy_to_device(params)
    ids = np.array([tokens], np.int32)
    model.forward(ids, ids)
    full = model.buf["probs"].copy_to_host()
    for t, (_, probs) in enumerate(rows):
        np.testing.assert_allclose(probs, full[t], rtol=PROBS_RTOL, atol=0, err_msg=f"position {t}")
    # the position lives on the device: it moved on once a step, to the window's end
    assert dec.read("pos")[0] == dec.n == m.context_length
    with pytest.raises(ValueError, match="longer sequence runs the whole forward"):
        dec.feed(tokens + [0])
    # a new sequence starts at position 0; the same tokens (three in one feed) give the same bits
    dec.reset()
    assert dec.read("pos")[0] == 0 and dec.n == 0
    dec.feed(tokens[:3])
    assert dec.read("pos")[0] == 3
    assert dec.read("logits").tobytes() == rows[2][0].tobytes()


def test_a_bf16_decoder_gives_the_bf16_twins_logits_and_not_the_exact_ones():
    """The decoder of a bf16 run against the twin at bf16 (every product's inputs rounded) and the
    exact twin, position by position (the module's docstring: the tolerance at bf16)."""
    m, params = _model()
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    rows, dec = _decode_each(m, params, tokens, "bf16")
    bf16 = KVCache(params.astype(np.float64), m, "bf16")
    exact = KVCache(params.astype(np.float64), m)
    for t, (logits, _) in enumerate(rows):
        assert _distance(logits, bf16.step(tokens[t])) <= TOL, t
        assert _distance(logits, exact.step(tokens[t])) > 100 * TOL, t
    for name, want in (("k_cache", bf16.K), ("v_cache", bf16.V)):
        assert _distance(dec.read(name)[:, :len(tokens)], want[:, :len(tokens)]) <= TOL, name


def test_attention_that_misses_its_own_key_fails_the_comparison(monkeypatch):
    """A planted bug: attention over keys 0..t-1 only (the position's own key left out) from t = 1
    on. The comparison of the test above catches it at every such position."""
    attention = kd.decode_attention

    def keys_before_t(*args, **kw):
        t = int(args[-1].copy_to_host()[0])
        attention(*args[:-1], cuda.to_device(np.array([max(t - 1, 0)], np.int32)), **kw)
    monkeypatch.setattr(kd, "decode_attention", keys_before_t)
    m, params = _model()
    tokens = [3, 5, 7, 9]
    rows, _ = _decode_each(m, params, tokens)
    twin = KVCache(params.astype(np.float64), m)
    dist = [_distance(logits, twin.step(tok)) for (logits, _), tok in zip(rows, tokens)]
    assert dist[0] <= TOL                                  # t = 0: keys 0..0 either way
    assert min(dist[1:]) > 100 * TOL, dist


@SIM_ONLY
def test_a_replayed_step_gives_the_eager_steps_bits():
    """The same launches serve every token: a step recorded once (the stand-in graph of
    tests/test_step_graph.py records the launches given the builder as their stream, and fails on
    any copy during the capture) and replayed gives the eager decoder's bits at every position.
    The first step runs eagerly, the second is captured."""
    m, params = _model(n_layer=1)
    tokens = [11, 0, 200, 37, 37]
    eager, _ = _decode_each(m, params, tokens)
    with pytest.MonkeyPatch.context() as mp:
        RECORDER.patch(mp)
        FakeStepGraph.captured.clear()
        dec = Decoder(m, cuda.to_device(params), capture=lambda stream, work: tr.StepGraph(stream, work))
        dec.reset()
        dec.feed(tokens[:1])
        assert dec.warm and dec.graph is None                       # eager: compiled
        replayed = []
        for t in range(1, len(tokens)):
            dec.feed(tokens[:t + 1])
            replayed.append(dec.read("logits"))
        assert FakeStepGraph.captured == [dec.graph]
    assert len(dec.graph.builder.launches) == 5 * m.n_layer + 2      # 5 a block, the logits (softmax, t += 1), the draw
    assert [r.tobytes() for r in replayed] == [logits.tobytes() for logits, _ in eager[1:]]


class Bytes:
    def encode(self, s):
        return list(s.encode())

    def decode(self, ids):
        return bytes(ids).decode("latin-1")


@SIM_ONLY
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sampling_on_the_decoder_draws_the_whole_forwards_tokens_past_the_context_too(precision):
    """sample.generate with a decoder against the loop it replaces (the whole forward of the last
    context_length tokens for each token), the same seed: a 12-token prompt and 6 draws, the first 5
    on the decoder (the sequence fits the 16-token context), the last on the whole forward. At bf16
    (the sampler of a bf16 run) the whole forward is the bf16 recipe's (its products round their
    inputs, its attention is the bf16 flash kernels') and the decoder rounds as it does."""
    from andrea_numba.recipes import recipe_for
    m, params = _model(n_layer=1, seed=3)
    model = GPUModel(m, 1, m.context_length, training=False, recipe=recipe_for(precision))
    assert model.precision == precision
    model.params.copy_to_device(params)
    prompt = "abcdefghijkl"
    whole = generate(model, Bytes(), prompt, 6, 11, 0.8, 5)
    dec = Decoder(m, model.params, stream=model.stream, precision=precision)
    assert generate(model, Bytes(), prompt, 6, 11, 0.8, 5, decoder=dec) == whole
    assert dec.n == m.context_length and dec.read("pos")[0] == m.context_length     # it decoded to the end


@SIM_ONLY
def test_a_sample_drawn_on_the_gpu_is_the_one_the_host_draws_step_by_step():
    """Decoder.sample (the prompt, then every draw on the device, one sync at the end) against the
    decoder stepped from the host: feed, copy the probabilities, draw with the twin
    (reference.decode.draw), the same uniform numbers. A one-token prompt fills the window: 16
    draws, the last from the step at position 15 into the slot past the window. One more draw, or
    an empty prompt, does not fit."""
    from reference.decode import draw
    m, params = _model(n_layer=1, seed=2)
    dec = Decoder(m, cuda.to_device(params))
    u = np.random.default_rng(4).random(m.context_length)
    drawn = dec.sample([7], u, 0.9, 4)
    assert list(dec.read("tokens")[1:]) == drawn and dec.n == m.context_length
    dec.reset()
    ids = [7]
    for i in range(m.context_length):
        dec.feed(ids)
        ids.append(draw(dec.probs_row(), u[i], 0.9, 4))
    assert drawn == ids[1:]
    for ids, n in (([7], m.context_length + 1), ([], 1), ([1] * (m.context_length + 1), 0)):
        with pytest.raises(ValueError, match="do not fit"):
            dec.sample(ids, np.zeros(n))


@SIM_ONLY
def test_steps_past_the_fed_positions_read_token_zero_on_reused_memory(monkeypatch):
    """A benchmark times a step by replaying it without feeding (lab/bench/decode_speed.py): those
    steps read token ids nobody wrote. On a GPU a new allocation holds whatever an earlier buffer
    left there, and a float's bits read as a token id index wte far out of bounds: the block
    variants of a benchmark that made a new decoder for each variant died with
    CUDA_ERROR_ILLEGAL_ADDRESS at one of them, whatever its block. Here every allocation is filled
    with such bits first: the decoder zeroes its buffers, so those steps read token 0."""
    real = cuda.device_array

    def reused(shape, dtype=np.float32, **kw):
        a = real(shape, dtype=dtype, **kw)
        a.copy_to_device(np.full(shape, 0x7F7F7F7F, np.int32).view(np.float32).astype(dtype, copy=False)
                         if np.dtype(dtype) == np.float32 else np.full(shape, 0x7F7F7F7F, dtype))
        return a
    monkeypatch.setattr(cuda, "device_array", reused)
    m, params = _model(n_layer=1)
    dec = Decoder(m, cuda.to_device(params))
    dec.reset()
    dec.feed([5, 6])
    dec.step()                                   # position 2: no token fed there
    assert dec.read("pos")[0] == 3
    twin = KVCache(params.astype(np.float64), m)
    for tok in (5, 6, 0):
        want = twin.step(tok)
    assert _distance(dec.read("logits"), want) <= TOL
