"""Dropout's counter-based mask: the right keep rate, no visible correlation, the kernels draw the
twin's mask bit for bit, and the model's masks depend on (seed, step, microbatch) alone."""
import numpy as np
import pytest
from numba import cuda

import reference as R
import reference.dropout as D
from andrea_numba.config import load_config
from andrea_numba.gpu_model import GPUModel
from andrea_numba.kernels import dropout as K
from andrea_numba.layout import init_params


@pytest.mark.parametrize("p", [0.05, 0.1, 0.2, 0.5, 0.9])
def test_keep_rate_is_one_minus_p(p):
    n = 1 << 20
    keep = D.keep_mask(n, p, D.dropout_key(1337, 7, 1))
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(keep.mean() - (1 - p)) < 5 * sigma


def test_p_zero_keeps_everything_and_changes_no_bit():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert D.keep_mask(1000, 0.0, 12345).all()
    out = cuda.device_array(1000, np.float32)
    K.dropout_fwd(out, cuda.to_device(x), 0.0, 12345)
    assert np.array_equal(out.copy_to_host(), x)


def test_neighbours_and_keys_are_uncorrelated():
    n, p = 1 << 18, 0.5
    a = D.keep_mask(n, p, 99).astype(np.float64)
    b = D.keep_mask(n, p, 100).astype(np.float64)            # the next key
    bound = 5 / np.sqrt(n)
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < bound     # element i and i + 1
    assert abs(np.corrcoef(a[:-64], a[64:])[0, 1]) < bound   # a row apart
    assert abs(np.corrcoef(a, b)[0, 1]) < bound              # two keys


def test_keys_of_steps_microbatches_and_sites_differ():
    keys = {D.dropout_key(1337, step, micro) for step in range(2000) for micro in range(4)}
    assert len(keys) == 8000
    sites = {D.site_key(D.dropout_key(1337, 5, 0), s) for s in range(3 * 48)}
    assert len(sites) == 3 * 48
    assert D.dropout_key(1337, 5, 0) != D.dropout_key(1338, 5, 0)


def test_kernel_draws_the_twin_mask_bit_for_bit():
    n, p, key = 777, 0.3, D.dropout_key(3, 4, 1)
    out = cuda.device_array(n, np.float32)
    K.dropout_fwd(out, cuda.to_device(np.ones(n, np.float32)), p, key)
    got = out.copy_to_host()
    assert np.array_equal(got != 0, D.keep_mask(n, p, key))
    assert np.all(got[got != 0] == np.float32(1 / (1 - p)))
    dx = cuda.device_array(n, np.float32)
    K.dropout_bwd(dx, cuda.to_device(np.full(n, 2.0, np.float32)), p, key)
    assert np.array_equal(dx.copy_to_host(), 2 * got)


def test_a_key_read_from_the_device_draws_the_same_masks():
    """The engine passes its keys in device memory (so a captured CUDA graph replays each step's
    keys): the dropout and attention kernels give the same bits as with the key as a number."""
    from andrea_numba.kernels import attn, attn_flash
    rng = np.random.default_rng(2)
    key = D.dropout_key(5, 6, 1)
    on_device = cuda.to_device(np.array([0, key, 0], np.uint64))[1:2]       # a view, as the engine's
    x = cuda.to_device(rng.standard_normal(300).astype(np.float32))
    outs = []
    for k in (key, on_device):
        out = cuda.device_array(300, np.float32)
        K.dropout_fwd(out, x, 0.3, k)
        dx = cuda.device_array(300, np.float32)
        K.dropout_bwd(dx, out, 0.3, k)
        outs.append((out.copy_to_host(), dx.copy_to_host()))
    assert all(np.array_equal(a, b) for a, b in zip(*outs))
    B, T, C, H = 1, 9, 8, 2
    q, kk, v, dy = (cuda.to_device(rng.standard_normal((B, T, C)).astype(np.float32)) for _ in range(4))
    for fwd, bwd, saved in ((attn.attn_fwd_tiled, attn.attn_bwd_tiled, (B, H, T, T)),
                            (attn_flash.attn_flash_fwd_tf32x3, attn_flash.attn_flash_bwd_tf32x3, (B, H, T))):
        runs = []
        for k in (key, on_device):
            y, s, grads = cuda.device_array((B, T, C), np.float32), cuda.device_array(saved, np.float32), \
                [cuda.device_array((B, T, C), np.float32) for _ in range(3)]
            fwd(y, s, q, kk, v, H, 0.4, k)
            if saved == (B, H, T):
                bwd(*grads, cuda.device_array((B, H, T), np.float32), dy, q, kk, v, y, s, H, 0.4, k)
            else:
                bwd(*grads, cuda.device_array(saved, np.float32), dy, q, kk, v, s, H, 0.4, k)
            runs.append([a.copy_to_host() for a in (y, *grads)])
        assert all(np.array_equal(a, b) for a, b in zip(*runs)), fwd.__name__


def test_attention_drops_probabilities_not_the_saved_softmax():
    """att holds the probabilities before dropout (rows sum to 1); y uses the dropped ones."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 6, 4)) for _ in range(3))
    y0, att0 = R.attn_fwd(q, k, v, 2)
    y1, att1 = R.attn_fwd(q, k, v, 2, 0.5, 11)
    assert np.array_equal(att0, att1)
    assert np.allclose(att1.sum(-1), 1.0)
    assert not np.allclose(y0, y1)


def test_model_masks_depend_on_the_key_alone():
    """Two training forwards with the same key give the same loss bit for bit; another key another
    loss; a forward without a key (evaluation) drops nothing and equals a model without dropout."""
    m = load_config("tiny").model
    B, T = 2, 8
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, m.vocab_size, (B, T)).astype(np.int32)
    targets = rng.integers(0, m.vocab_size, (B, T)).astype(np.int32)
    params = init_params(m, 0)
    model, plain = GPUModel(m, B, T, dropout=0.2), GPUModel(m, B, T)
    model.params.copy_to_device(params)
    plain.params.copy_to_device(params)

    def loss(mdl, key=None):
        mdl.forward(tokens, targets, dropout_key=key)
        return mdl.read_loss()

    k1, k2 = R.dropout_key(1337, 0, 0), R.dropout_key(1337, 0, 1)
    assert loss(model, k1) == loss(model, k1)
    assert loss(model, k1) != loss(model, k2)
    assert loss(model) == loss(plain) == loss(plain, k1)      # no key, or p = 0: nothing dropped
