"""The KV-cache decoder twin (reference/decode.py): one position a step gives the logits of the
whole forward at that position, and the CPU sampler on it draws the same tokens as before."""
import numpy as np
import pytest

import reference as R
from andrea_numba.config import load_config
from andrea_numba.layout import init_params
from reference.decode import KVCache


def _params(m, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    p = init_params(m, seed).astype(np.float64)
    return (p + rng.standard_normal(p.size) * 0.05).astype(dtype)      # LN gains and biases off 1 and 0


def test_each_step_gives_the_whole_forwards_logits_at_its_position():
    m = load_config("tiny").model
    params = _params(m)
    tokens = np.random.default_rng(1).integers(0, m.vocab_size, size=m.context_length)
    full = R.model_logits(params, m, tokens[None, :])[0]                  # [T, V]
    cache = KVCache(params, m)
    for t, token in enumerate(tokens):
        np.testing.assert_allclose(cache.step(int(token)), full[t], rtol=0, atol=1e-12 * np.abs(full[t]).max())
    with pytest.raises(ValueError, match="context length"):
        cache.step(0)


def test_at_bf16_each_step_gives_the_bf16_whole_forwards_logits():
    """KVCache(precision="bf16") against model_logits at bf16 (every product's inputs rounded, the
    flash twin's attention): the same rounded values, summed in another order, so float64 close;
    and far from the exact logits (the rounding is there)."""
    m = load_config("tiny").model
    params = _params(m)
    tokens = np.random.default_rng(1).integers(0, m.vocab_size, size=m.context_length)
    full = R.model_logits(params, m, tokens[None, :], "bf16")[0]
    exact = R.model_logits(params, m, tokens[None, :])[0]
    cache = KVCache(params, m, "bf16")
    for t, token in enumerate(tokens):
        got = cache.step(int(token))
        np.testing.assert_allclose(got, full[t], rtol=0, atol=1e-12 * np.abs(full[t]).max())
        assert np.abs(got - exact[t]).max() > 1e-4 * np.abs(exact[t]).max()


def test_a_wrong_cache_row_changes_the_next_logits():
    """The cache is read: a k row of an earlier position overwritten moves the next step's logits."""
    m = load_config("tiny").model
    params = _params(m)
    a, b = KVCache(params, m), KVCache(params, m)
    for token in (3, 5, 7):
        a.step(token), b.step(token)
    b.K[0, 1] += 0.5
    assert np.abs(a.step(9) - b.step(9)).max() > 1e-6


def test_the_cpu_sampler_draws_the_tokens_it_drew_with_the_whole_forward():
    """sample.generate_cpu (on the cache, exact products) against the loop it replaced: the whole
    forward of the last context_length tokens for every token, past the context included, each
    token drawn by numpy's Generator.choice from softmax(logits / 0.8) over the 5 most likely."""
    from andrea_numba.sample import generate_cpu

    class Bytes:
        def encode(self, s):
            return list(s.encode())

        def decode(self, ids):
            return bytes(ids).decode("latin-1")
    m = load_config("tiny").model
    params = _params(m, 3, np.float32)
    n = m.context_length + 5                                             # past the context: the window slides
    ids, rng, old = list(b"ab"), np.random.default_rng(11), []
    for _ in range(n):
        logits = R.model_logits(params, m, np.array([ids[-m.context_length:]]))[0, -1].astype(np.float64)
        p = np.exp(logits - logits.max())
        scaled = np.log(np.maximum(p / p.sum(), 1e-30)) / 0.8
        scaled[scaled < np.sort(scaled)[-5]] = -np.inf
        q = np.exp(scaled - scaled.max())
        ids.append(int(rng.choice(len(q), p=q / q.sum())))
        old.append(ids[-1])
    assert generate_cpu(params, m, Bytes(), "ab", n, 11, 0.8, 5) == bytes(old).decode("latin-1")
