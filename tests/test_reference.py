"""The NumPy twin: float32 and float64 agree, dtypes follow the inputs, and the model behaves."""
import math

import numpy as np
import pytest

import reference as R
from andrea_numba.config import load_config
from andrea_numba.cases import CASES, OPS, VARIANTS
from andrea_numba.gradcheck import DIMS
from andrea_numba.layout import decay_mask, init_params, n_params

pytestmark = [pytest.mark.xdist_group("reference")]   # one worker of `pytest -n` runs the module: its module fixture once


@pytest.fixture(scope="module")
def tiny():
    return load_config("tiny")


def _batch(cfg, seed=0, B=2):
    rng = np.random.default_rng(seed)
    T = cfg.train.seq_len
    return rng.integers(0, cfg.model.vocab_size, (B, T)), rng.integers(0, cfg.model.vocab_size, (B, T))


@pytest.mark.parametrize("op", OPS + VARIANTS)
def test_each_op_float32_matches_float64_and_keeps_its_dtype(op):
    case, rng = CASES[op], np.random.default_rng(5)
    f64 = case.make(DIMS, rng)
    f32 = {k: (v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v) for k, v in f64.items()}
    out64, out32 = case.forward(f64), case.forward(f32)
    up64 = {k: np.asarray(v) for k, v in case.upstream_for(out64, rng).items()}
    up32 = {k: v.astype(np.float32) for k, v in up64.items()}
    g64, g32 = case.backward({**f64, **out64, **up64}), case.backward({**f32, **out32, **up32})
    for a, b in [(out64[k], out32[k]) for k in out64] + [(g64[k], g32[k]) for k in g64]:
        assert np.asarray(b).dtype == np.float32
        assert np.asarray(a).dtype == np.float64
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(a).max())))


def test_model_float32_matches_float64(tiny):
    m = tiny.model
    p32 = init_params(m, seed=3)
    tokens, targets = _batch(tiny, 3)
    l32, a32 = R.model_forward(p32, m, tokens, targets)
    l64, a64 = R.model_forward(p32.astype(np.float64), m, tokens, targets)
    g32, g64 = R.model_backward(p32, m, a32), R.model_backward(p32.astype(np.float64), m, a64)
    assert l32.dtype == g32.dtype == np.float32 and l64.dtype == g64.dtype == np.float64
    assert abs(float(l32) - float(l64)) < 1e-5
    np.testing.assert_allclose(g32, g64, rtol=0, atol=2e-5 * np.abs(g64).max())


def test_initial_loss_is_near_uniform(tiny):
    m = tiny.model
    loss, _ = R.model_forward(init_params(m, 0).astype(np.float64), m, *_batch(tiny))
    assert abs(float(loss) - math.log(m.vocab_size)) < 0.05     # small init: logits near 0


def test_attention_is_causal():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 6, 8)) for _ in range(3))
    y, att = R.attn_fwd(q, k, v, 2)
    k2, v2 = k.copy(), v.copy()
    k2[:, 4:] += 1.0
    v2[:, 4:] -= 1.0                                       # change only the future of position 3
    y2, _ = R.attn_fwd(q, k2, v2, 2)
    np.testing.assert_array_equal(y[:, :4], y2[:, :4])
    assert not np.allclose(y[:, 4:], y2[:, 4:])
    assert np.all(np.triu(att[0, 0], 1) == 0) and np.allclose(att.sum(-1), 1)


def test_embed_backward_sums_repeated_tokens():
    tokens = np.array([[2, 2, 1]])
    dout = np.arange(9, dtype=float).reshape(1, 3, 3)
    dwte, dwpe = R.embed_bwd(dout, tokens, 5, 4)
    assert dwte.shape == (5, 3) and dwpe.shape == (4, 3)
    np.testing.assert_array_equal(dwte[2], dout[0, 0] + dout[0, 1])
    np.testing.assert_array_equal(dwte[1], dout[0, 2])
    assert np.all(dwte[[0, 3, 4]] == 0) and np.all(dwpe[3] == 0)


def test_training_steps_lower_the_loss(tiny):
    """A few AdamW steps on one batch: the twin is a complete optimiser loop."""
    m, t = tiny.model, tiny.train
    p = init_params(m, 0).astype(np.float64)
    mm, vv, mask = np.zeros_like(p), np.zeros_like(p), decay_mask(m, np.float64)
    tokens, targets = _batch(tiny)
    losses = []
    for step in range(1, 21):
        loss, acts = R.model_forward(p, m, tokens, targets)
        g, norm = R.clip_grad_norm(R.model_backward(p, m, acts), t.clip_norm)
        p, mm, vv = R.adamw(p, g, mm, vv, mask, step, 1e-2, t.beta1, t.beta2, t.eps, t.weight_decay)
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 1.0


def test_clip_grad_norm():
    g = np.array([3.0, 4.0])
    c, norm = R.clip_grad_norm(g, 1.0)
    assert norm == 5.0 and np.allclose(c, [0.6, 0.8])
    c, norm = R.clip_grad_norm(g, 10.0)
    assert np.array_equal(c, g)
    c, _ = R.clip_grad_norm(g, 0.0)                       # 0 turns clipping off
    assert np.array_equal(c, g)


def test_adamw_first_step_and_decoupled_decay():
    p = np.array([1.0, 1.0])
    g = np.array([0.5, -2.0])
    mask = np.array([1.0, 0.0])
    p1, m, v = R.adamw(p, g, np.zeros(2), np.zeros(2), mask, 1, 0.1, 0.9, 0.95, 1e-8, 0.5)
    # step 1: m_hat = g, v_hat = g^2, so the update is lr * sign(g); decay only where mask is 1
    np.testing.assert_allclose(p1, [1.0 - 0.1 * (1.0 + 0.5 * 1.0), 1.0 + 0.1], rtol=1e-7)
    np.testing.assert_allclose(m, 0.1 * g)
    np.testing.assert_allclose(v, 0.05 * g * g)


def test_lr_schedule():
    kw = dict(lr=1.0, min_lr=0.1, warmup_steps=10, total_steps=110)
    assert R.lr_at(0, **kw) == pytest.approx(0.1)
    assert R.lr_at(9, **kw) == pytest.approx(1.0)
    assert R.lr_at(60, **kw) == pytest.approx(0.55)
    assert R.lr_at(110, **kw) == pytest.approx(0.1)
    assert R.lr_at(500, **kw) == pytest.approx(0.1)
    assert R.lr_at(60, decay="constant", **kw) == 1.0


def test_model_logits_match_the_loss(tiny):
    m = tiny.model
    p = init_params(m, 1).astype(np.float64)
    tokens, targets = _batch(tiny, 1)
    logits = R.model_logits(p, m, tokens)
    lse = np.log(np.exp(logits).sum(-1))
    picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    loss, _ = R.model_forward(p, m, tokens, targets)
    assert float(loss) == pytest.approx(float((lse - picked).mean()), rel=1e-12)
    assert logits.shape == (2, tiny.train.seq_len, m.vocab_size)
    assert n_params(m) == p.size
