"""Flash attention (kernels/attn_flash.py): its twin is attention's twin with lse saved instead of
att; its kernels agree with that twin at a shape of several query and key tiles with T not a
multiple of any tile, rerun bit for bit, and without dropout give the y of attention's v2 kernels.
(The harness rows of the "attn_flash" case are checked in test_kernels.py, its twin's backward
against centred differences in test_gradcheck.py.) A few seconds in the simulator."""
import math

import numpy as np
import pytest
from numba import cuda

import reference as R
from andrea_numba import check
from andrea_numba.cases import CASES, Dims
from andrea_numba.kernels import attn, attn_flash

B, T, C, H = 2, 21, 16, 2          # hs = 8; in the simulator: 3 key tiles of 8, 3 or 6 query tiles, the last partial
KEY = 0x5EED1234


def _qkv(rng, dtype=np.float64):
    return [rng.standard_normal((B, T, C)).astype(dtype) for _ in range(4)]      # q, k, v, dy


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_twin_equals_attention_twin(p):
    q, k, v, dy = _qkv(np.random.default_rng(0))
    y, att = R.attn_fwd(q, k, v, H, p, KEY)
    y2, lse = R.attn_flash_fwd(q, k, v, H, p, KEY)
    assert lse.shape == (B, H, T)
    np.testing.assert_allclose(y2, y, rtol=0, atol=1e-12)
    # lse is what att is made of: att[t, u] = exp(s[t, u] - lse[t]) for u <= t
    s = np.einsum("bthd,buhd->bhtu", q.reshape(B, T, H, -1), k.reshape(B, T, H, -1)) / math.sqrt(C // H)
    causal = np.tril(np.ones((T, T), dtype=bool))
    np.testing.assert_allclose(np.where(causal, np.exp(s - lse[..., None]), 0.0), att, rtol=0, atol=1e-12)
    for g, g2 in zip(R.attn_bwd(dy, q, k, v, att, H, p, KEY), R.attn_flash_bwd(dy, q, k, v, y2, lse, H, p, KEY)):
        np.testing.assert_allclose(g2, g, rtol=0, atol=1e-12)


def test_the_case_saves_no_t_by_t_buffer():
    case = CASES["attn_flash"]
    assert case.fwd_out == ("y", "lse") and case.upstream == {"dy": "y"}
    assert set(case.scratch) == {"d_rowdot"}
    assert case.scratch["d_rowdot"][0](Dims(B, T, C, H, 7, T)) == (B, H, T)


def _run(block, q, k, v, dy, p, key):
    """Forward, then backward on the forward's y and lse; outputs and work buffer poisoned with NaN."""
    nan = lambda *shape: cuda.to_device(np.full(shape, np.nan, np.float32))
    q_d, k_d, v_d, dy_d = (cuda.to_device(a) for a in (q, k, v, dy))
    y, lse = nan(B, T, C), nan(B, H, T)
    attn_flash.attn_flash_fwd_v1(y, lse, q_d, k_d, v_d, H, p, key, block=block)
    dq, dk, dv, d_rowdot = nan(B, T, C), nan(B, T, C), nan(B, T, C), nan(B, H, T)
    attn_flash.attn_flash_bwd_v1(dq, dk, dv, d_rowdot, dy_d, q_d, k_d, v_d, y, lse, H, p, key, block=block)
    return {name: a.copy_to_host() for name, a in dict(y=y, lse=lse, dq=dq, dk=dk, dv=dv).items()}


@pytest.fixture(scope="module")
def runs():
    """Both simulator blocks, dropout on, each run twice; and the twin in float64 on the same inputs."""
    q, k, v, dy = _qkv(np.random.default_rng(1), np.float32)
    p = 0.25
    got = {block: [_run(block, q, k, v, dy, p, KEY) for _ in range(2)] for block in attn_flash.attn_flash_fwd_v1.blocks}
    q64, k64, v64, dy64 = (a.astype(np.float64) for a in (q, k, v, dy))
    y, lse = R.attn_flash_fwd(q64, k64, v64, H, p, KEY)
    dq, dk, dv = R.attn_flash_bwd(dy64, q64, k64, v64, y, lse, H, p, KEY)
    return got, dict(y=y, lse=lse, dq=dq, dk=dk, dv=dv)


def test_kernels_agree_with_the_twin_across_tiles(runs):
    got, ref = runs
    assert len(got) >= 2
    for block, (first, _) in got.items():
        for name, r in ref.items():
            row = check.compare("attn_flash", name, first[name], r, check.OP_TOL)
            assert row["ok"] and row["rel_err"] < 1e-5, (block, row)


def test_kernels_rerun_bit_identical(runs):
    got, _ = runs
    for block, (first, second) in got.items():
        for name in first:
            assert np.array_equal(first[name], second[name]), (block, name)


def test_without_dropout_y_equals_attention_v2():
    q, k, v, _ = _qkv(np.random.default_rng(2), np.float32)
    block = attn_flash.attn_flash_fwd_v1.blocks[0]
    y, lse = cuda.device_array((B, T, C), np.float32), cuda.device_array((B, H, T), np.float32)
    attn_flash.attn_flash_fwd_v1(y, lse, q, k, v, H, block=block)
    y2, att = cuda.device_array((B, T, C), np.float32), cuda.device_array((B, H, T, T), np.float32)
    attn.attn_fwd_v2(y2, att, q, k, v, H, block=block)
    np.testing.assert_allclose(y.copy_to_host(), y2.copy_to_host(), rtol=1e-5, atol=1e-6)
    # and lse rebuilds v2's probabilities
    q64, k64 = (a.astype(np.float64).reshape(B, T, H, -1) for a in (q, k))
    s = np.einsum("bthd,buhd->bhtu", q64, k64) / math.sqrt(C // H)
    P = np.where(np.tril(np.ones((T, T), dtype=bool)), np.exp(s - lse.copy_to_host()[..., None]), 0.0)
    np.testing.assert_allclose(P, att.copy_to_host(), rtol=0, atol=1e-6)


def test_the_model_with_flash_attention_holds_no_T_by_T_buffer_and_agrees():
    """GPUModel(flash=True): lse [L, B, H, T] and d_rowdot [B, H, T] instead of att and d_scores;
    the loss of a training forward (dropout on) agrees with the engine's attention to float32."""
    import numpy as np

    from andrea_numba.config import load_config
    from andrea_numba.gpu_model import GPUModel, buffer_specs
    from andrea_numba.layout import init_params

    m = load_config("tiny").model
    B, T = 2, 8
    names = {s.name: s.shape for s in buffer_specs(m, B, T, flash=True)}
    assert "att" not in names and "d_scores" not in names
    assert names["lse"] == (m.n_layer, B, m.n_head, T) and names["d_rowdot"] == (B, m.n_head, T)
    assert not any(len(s) >= 2 and tuple(s[-2:]) == (T, T) for s in names.values())     # nothing T x T
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, m.vocab_size, (B, T)).astype(np.int32)
    targets = rng.integers(0, m.vocab_size, (B, T)).astype(np.int32)
    losses = []
    for flash in (False, True):
        model = GPUModel(m, B, T, dropout=0.1, flash=flash)
        model.params.copy_to_device(init_params(m, 0))
        model.forward(tokens, targets, dropout_key=12345)
        losses.append(model.read_loss())
    assert abs(losses[0] - losses[1]) < 1e-5 * abs(losses[0])
